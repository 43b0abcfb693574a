"""Where a run's workers go: the host's accelerators (``--devices``) and the units of work they pull.

Semantics: docs/scaling.md. The runner (``conformance.run.runner``) starts one isolated worker process per
*slot*; a slot is bound to one device by the environment variable the device's runtime reads before the
library loads (``CUDA_VISIBLE_DEVICES`` for NVIDIA, ``HIP_VISIBLE_DEVICES`` for AMD ROCm, ``ZE_AFFINITY_MASK``
for Intel GPUs), so a worker sees exactly one device, as device 0. NVIDIA devices are named by UUID, not
by index: CUDA's default enumeration order (``CUDA_DEVICE_ORDER=FASTEST_FIRST``) need not be
``nvidia-smi``'s PCI order, and an index could silently put two slots on one GPU.

Cases reach the slots as *units*: the cases of one kernel configuration (scheme, dtypes, shape), so that a
backend that compiles or autotunes per shape (Triton: gemlite) does so in as few workers as possible;
slots pull units from one queue, so a slow unit does not hold the others back.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import shutil
import subprocess
import threading
from collections import OrderedDict, deque
from pathlib import Path

__all__ = ["Device", "DeviceError", "Slot", "discover_devices", "parse_nvidia_smi", "intel_devices", "select_devices",
           "slots", "unit_key", "work_units", "UnitQueue",
           "add_options", "open_placement", "Placement"]

#: the environment variable each vendor's runtime reads to restrict a process to some devices
VISIBILITY_VARIABLE = {"nvidia": "CUDA_VISIBLE_DEVICES", "amd": "HIP_VISIBLE_DEVICES", "intel": "ZE_AFFINITY_MASK"}
NVIDIA_QUERY = ["nvidia-smi", "--query-gpu=index,name,uuid,pci.bus_id,driver_version", "--format=csv,noheader"]


class DeviceError(ValueError):
    """A --devices request this host cannot honour (a usage error: one line, exit 2)."""


@dataclasses.dataclass(frozen=True)
class Device:
    """One accelerator as the host lists it."""

    vendor: str  # nvidia | amd | intel
    index: int  # the host's own numbering (nvidia-smi index, render node order)
    model: str
    uuid: "str | None" = None
    pci: "str | None" = None
    driver: "str | None" = None

    @property
    def handle(self) -> str:
        """What the visibility variable names: the UUID where the vendor has one, else the index."""
        return self.uuid or str(self.index)

    def env(self) -> dict[str, str]:
        """The environment that makes this device the worker's only (and so its device 0)."""
        return {VISIBILITY_VARIABLE[self.vendor]: self.handle}

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def parse_nvidia_smi(text: str) -> list[Device]:
    """Devices from ``nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version --format=csv,noheader``."""
    out = []
    for row in csv.reader(io.StringIO(text)):
        if not row or not "".join(row).strip():
            continue
        if len(row) != 5:
            raise DeviceError(f"nvidia-smi printed a line of {len(row)} fields, expected 5: {','.join(row)!r}")
        idx, name, uuid, pci, driver = (f.strip() for f in row)
        if not idx.isdigit():
            raise DeviceError(f"nvidia-smi printed a device index that is not a number: {idx!r}")
        out.append(Device("nvidia", int(idx), name, uuid or None, pci or None, driver or None))
    return out


def intel_devices(drm: "str | Path" = "/sys/class/drm") -> list[Device]:
    """Intel GPUs from their DRM render nodes (vendor 0x8086), in render-node order (Level Zero's order)."""
    found = []
    for node in sorted(Path(drm).glob("renderD*"), key=lambda p: int(p.name[len("renderD"):] or 0)):
        try:
            vendor = (node / "device" / "vendor").read_text().strip()
        except OSError:
            continue
        if vendor != "0x8086":
            continue
        try:
            dev_id = (node / "device" / "device").read_text().strip()
        except OSError:
            dev_id = "?"
        pci = os.path.basename(os.path.realpath(node / "device"))
        found.append(Device("intel", len(found), f"Intel GPU {dev_id}", None, pci, None))
    return found


def discover_devices(run=subprocess.run) -> list[Device]:
    """The host's accelerators: NVIDIA through nvidia-smi, Intel through sysfs (no library is imported).

    A parent ``CUDA_VISIBLE_DEVICES`` (a scheduler's allocation) is honoured: only the GPUs it names, by index
    or UUID, are offered."""
    devices: list[Device] = []
    if shutil.which("nvidia-smi"):
        try:
            r = run(NVIDIA_QUERY, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            raise DeviceError(f"nvidia-smi failed: {e}") from None
        if r.returncode != 0:
            raise DeviceError(f"nvidia-smi failed (exit {r.returncode}): {(r.stderr or r.stdout).strip()[:200]}")
        devices += restrict_to_visible(parse_nvidia_smi(r.stdout), os.environ.get("CUDA_VISIBLE_DEVICES"))
    devices += intel_devices()
    return devices


def restrict_to_visible(devices: list[Device], visible: "str | None") -> list[Device]:
    """The NVIDIA devices a ``CUDA_VISIBLE_DEVICES`` value admits (None: all), in the value's order."""
    if visible is None:
        return devices
    chosen = []
    for tok in (t.strip() for t in visible.split(",")):
        if not tok:
            continue
        hit = [d for d in devices if (tok.isdigit() and d.index == int(tok)) or (d.uuid and d.uuid.startswith(tok))]
        if not hit:
            break  # CUDA stops at the first name it cannot resolve
        chosen.append(hit[0])
    return chosen


def select_devices(request: "str | None", available: list[Device]) -> list[Device]:
    """The devices a ``--devices`` value names: ``all`` or a comma list of indices.

    Refused (DeviceError): no device on the host, an unknown or repeated index, an empty list, and devices of
    different models in one run (a certification covers one device model: run each model apart)."""
    if request is None:
        return []
    text = request.strip()
    if not available:
        raise DeviceError(f"--devices {text}: this host lists no accelerator (nvidia-smi and /sys/class/drm found "
                          "none)")
    if text == "all":
        chosen = list(available)
    else:
        toks = [t.strip() for t in text.split(",")]
        if not toks or any(not t.isdigit() for t in toks):
            raise DeviceError(f"--devices {text!r}: expected 'all' or comma-separated device indices, e.g. 0,1")
        if len(set(toks)) != len(toks):
            raise DeviceError(f"--devices {text!r}: a device is named twice")
        by_index = {d.index: d for d in available}
        missing = [t for t in toks if int(t) not in by_index]
        if missing:
            raise DeviceError(f"--devices {text!r}: no device {', '.join(missing)} on this host (it lists "
                              f"{', '.join(str(d.index) for d in available)})")
        chosen = [by_index[int(t)] for t in toks]
    models = OrderedDict((d.model, None) for d in chosen)
    if len(models) > 1:
        groups = "; ".join(f"{m}: --devices {','.join(str(d.index) for d in chosen if d.model == m)}" for m in models)
        raise DeviceError(f"--devices {text}: devices of {len(models)} models in one run ({groups}); a "
                          "certification covers one device model: run each model apart")
    return chosen


@dataclasses.dataclass(frozen=True)
class Slot:
    """One worker process's place: its number and the device it may see (None: no device placement)."""

    number: int
    device: "Device | None" = None

    def env(self) -> dict[str, str]:
        return self.device.env() if self.device is not None else {}


def slots(jobs: int, devices: list[Device]) -> list[Slot]:
    """``jobs`` worker slots, spread round-robin over ``devices`` (at least one slot per device)."""
    if not devices:
        return [Slot(i) for i in range(max(1, jobs))]
    n = max(jobs, len(devices))
    return [Slot(i, devices[i % len(devices)]) for i in range(n)]


def unit_key(spec) -> tuple:
    """The kernel configuration a case runs: cases sharing it share a backend's compiled / autotuned kernel."""
    c = spec.case
    return (c.scheme, c.weight_format, c.bits, c.act_dtype, c.output_dtype, c.M, c.N, c.K, c.group_size)


def work_units(specs: list, jobs: int) -> list[list]:
    """Cases grouped by ``unit_key`` in first-seen order; a group larger than its share is split so that
    ``jobs`` slots still find work (at most ``ceil(len / (4 * jobs))`` cases a unit, at least one)."""
    groups: "OrderedDict[tuple, list]" = OrderedDict()
    for s in specs:
        groups.setdefault(unit_key(s), []).append(s)
    cap = max(1, -(-len(specs) // (4 * max(1, jobs))))
    units = []
    for g in groups.values():
        units += [g[i:i + cap] for i in range(0, len(g), cap)]
    return units


class UnitQueue:
    """The units of one backend's cases, pulled by its slots; devices retired mid-run and the cases they
    handed back (thread-safe). ``take`` waits while another slot still runs a unit (a retired device hands
    its unfinished cases back), so no slot ends while work may still come back."""

    def __init__(self, units: list[list]):
        self._units = deque(units)
        self._cond = threading.Condition()
        self._in_flight = 0
        self._retired: dict = {}  # device handle -> (device, why)

    def take(self, stopped=lambda: False) -> "list | None":
        """The next unit (call ``done`` after it), or None: nothing left and nothing in flight, or ``stopped()``."""
        with self._cond:
            while not self._units and self._in_flight and not stopped():
                self._cond.wait(0.25)
            if not self._units or stopped():
                return None
            self._in_flight += 1
            return self._units.popleft()

    def done(self) -> None:
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()

    def retire(self, device: Device, why: str, rest: list) -> None:
        """``device`` no longer works: its slots stop, and ``rest`` (its unfinished cases) goes back first."""
        with self._cond:
            self._retired[device.handle] = (device, why)
            if rest:
                self._units.appendleft(list(rest))
            self._cond.notify_all()

    def is_retired(self, device: "Device | None") -> bool:
        with self._cond:
            return device is not None and device.handle in self._retired

    def drain(self) -> list:
        """Every case still queued (the run's slots all ended: each device was retired)."""
        with self._cond:
            left = [s for u in self._units for s in u]
            self._units.clear()
            return left

    def retired_text(self) -> str:
        with self._cond:
            return "; ".join(f"device {d.index} ({d.model}): {why}" for d, why in self._retired.values())


def add_options(parser) -> None:
    """--devices, --executor, --address (qconform run, target, certify; docs/scaling.md)."""
    parser.add_argument("--devices", metavar="all|0,1,...",
                        help="place the worker slots on this host's accelerators, one device each (docs/scaling.md)")
    parser.add_argument("--executor", choices=("local", "dask"), default="local",
                        help="where worker processes run: this host (default) or a Dask cluster's nodes")
    parser.add_argument("--address", help="with --executor dask: the scheduler, e.g. tcp://head:8786")


@dataclasses.dataclass
class Placement:
    """Where a run's workers go: on these devices of this host, or through ``executor`` (a cluster)."""

    devices: list = dataclasses.field(default_factory=list)
    executor: object = None


def open_placement(args) -> Placement:
    """The placement the options ask for; a request this host cannot honour raises DeviceError (exit 2)."""
    executor_kind = getattr(args, "executor", "local") or "local"
    address = getattr(args, "address", None)
    request = getattr(args, "devices", None)
    if executor_kind == "local":
        if address:
            raise DeviceError("--address needs --executor dask")
        return Placement(select_devices(request, discover_devices()) if request is not None else [])
    if not address:
        raise DeviceError("--executor dask needs --address (the Dask scheduler, e.g. tcp://head:8786)")
    if request is not None:
        raise DeviceError("--devices places workers on this host; with --executor dask each node places its own "
                          "(start one Dask worker per device there: docs/scaling.md)")
    from conformance.run.remote import DaskExecutor

    return Placement([], DaskExecutor(address))
