"""Backend registry, ``name:key=value`` parameters, and the dispatcher.

Semantics: docs/backends.md#registry.

Built-in backends are listed in ``BUILTIN`` (module:class, imported lazily so
a missing kernel library never breaks the registry). Third-party backends
register through the entry-point group ``qconform.backends``:

    [project.entry-points."qconform.backends"]
    mykernel = "mypkg.backend:MyKernelBackend"

The dispatcher ``select(case)`` returns the available backend with the highest
priority that can implement the case, else the emulator, and logs why it
skipped each other backend.
"""

from __future__ import annotations

import importlib
import logging
from importlib import metadata

from emulator.variants import Level

from .base import Availability, Backend, Case

__all__ = ["BUILTIN", "ENTRY_POINT_GROUP", "parse_spec", "registered", "create", "select", "Selection", "refusal",
           "dispatch_refusal"]

log = logging.getLogger("qconform.dispatch")

ENTRY_POINT_GROUP = "qconform.backends"

#: name -> "module:Class"; priority lives on the class (docs/backends.md#dispatcher)
BUILTIN = {
    "emulator": "backends.emulator:EmulatorBackend",
    "torch-cpu": "backends.torch_cpu:TorchCpuBackend",
    "ark": "backends.ark:ArkBackend",
    "zentorch": "backends.zentorch:ZentorchBackend",
    "vllm-cpu": "backends.vllm_cpu:VllmCpuBackend",
    "cuda": "backends.cuda:CudaBackend",
    "gemlite": "backends.gemlite:GemliteBackend",
    "bitsandbytes": "backends.bitsandbytes:BitsandbytesBackend",
    "xpu": "backends.xpu:XpuBackend",
    "torchao": "backends.torchao_mx:TorchaoMxBackend",
    "compressed-tensors": "backends.ct_forward:CompressedTensorsBackend",
    "onnx-reference": "backends.onnx_reference:OnnxReferenceBackend",
    "auto": "backends.auto:AutoBackend",
}


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """'name:key=value,key2=value2' -> (name, {key: value})."""
    name, _, rest = spec.partition(":")
    name = name.strip()
    if not name:
        raise ValueError(f"empty backend name in {spec!r}")
    params: dict[str, str] = {}
    if rest.strip():
        for item in rest.split(","):
            if "=" not in item:
                raise ValueError(f"backend parameter {item!r} in {spec!r} is not key=value")
            k, v = item.split("=", 1)
            params[k.strip()] = v.strip()
    return name, params


def _entry_points() -> dict[str, metadata.EntryPoint]:
    try:
        eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
    except TypeError:  # pragma: no cover - Python < 3.10
        eps = metadata.entry_points().get(ENTRY_POINT_GROUP, [])
    return {ep.name: ep for ep in eps}


def _extra() -> dict[str, str]:
    """Backends named in QCONFORM_EXTRA_BACKENDS="name=module:Class,..." (local development and tests)."""
    import os

    out = {}
    for item in os.environ.get("QCONFORM_EXTRA_BACKENDS", "").split(","):
        if item.strip():
            name, _, target = item.partition("=")
            if not target or ":" not in target:
                raise ValueError(f"QCONFORM_EXTRA_BACKENDS entry {item!r} is not name=module:Class")
            out[name.strip()] = target.strip()
    return out


def registered() -> dict[str, str]:
    """name -> where it comes from ('builtin', 'entry point <value>' or 'QCONFORM_EXTRA_BACKENDS')."""
    out = {n: "builtin" for n in BUILTIN}
    for n, ep in _entry_points().items():
        out.setdefault(n, f"entry point {ep.value}")
    for n in _extra():
        out.setdefault(n, "QCONFORM_EXTRA_BACKENDS")
    return out


class _Unloadable(Backend):
    """Stand-in for a backend whose adapter module itself cannot be imported."""

    def __init__(self, name: str, error: str):
        super().__init__()
        self.name = name
        self._error = error

    def availability(self) -> Availability:
        return Availability(False, f"adapter failed to load: {self._error}")

    def can_implement(self, case):  # pragma: no cover - never reached when unavailable
        from .base import no

        return no(self._error)

    def declared(self, case):  # pragma: no cover
        raise RuntimeError(self._error)

    def prepare(self, case, tensors):  # pragma: no cover
        raise RuntimeError(self._error)

    def run(self, prepared, x, **inputs):  # pragma: no cover
        raise RuntimeError(self._error)


def _load_class(target: str):
    mod, _, cls = target.partition(":")
    return getattr(importlib.import_module(mod), cls)


def create(spec: str) -> Backend:
    """Instantiate a backend from 'name[:key=value,...]'. Unknown names raise ValueError."""
    name, params = parse_spec(spec)
    extra = _extra()
    if name in BUILTIN or name in extra:
        try:
            cls = _load_class(BUILTIN.get(name) or extra[name])
        except Exception as e:  # an adapter import error must not hide the other backends
            return _Unloadable(name, f"{type(e).__name__}: {e}")
    else:
        eps = _entry_points()
        if name not in eps:
            known = ", ".join(sorted(registered()))
            raise ValueError(f"unknown backend {name!r}; registered: {known}")
        try:
            cls = eps[name].load()
        except Exception as e:
            return _Unloadable(name, f"entry point {eps[name].value} failed: {type(e).__name__}: {e}")
    return cls(**params)


class Selection:
    """The dispatcher's answer: the chosen backend and why each other one was skipped."""

    def __init__(self, backend: Backend, skipped: list[tuple[str, str]]):
        self.backend = backend
        self.skipped = skipped

    def __repr__(self) -> str:
        return f"Selection({self.backend.label}, skipped={self.skipped})"


#: the largest |activation code x weight code| of an int8 W8A8 product: asymmetric activations (q - zp) span
#: up to 255 in magnitude, int8 weights 128
INT8_PRODUCT_MAX = 255 * 128


def refusal(backend: Backend, case: Case, allow_opaque: bool = False, tensors: dict | None = None) -> str | None:
    """Why the dispatcher must not route ``case`` to ``backend`` although it can implement it.

    - a declared *semantic deviation* (emulator/variants.py levels: other weights, zero points, scales,
      activation scheme or granularity than the checkpoint defines, e.g. ARK through vLLM reading v1 GPTQ
      zero points without the +1, or per-tensor activations where the checkpoint is per-token): the suite
      certifies such a backend against its own declaration, but its answer is not the checkpoint's;
    - an int32 accumulator whose partial sums can wrap at this K (the declared interval assumes exact sums);
    - a kernel defect the adapter knows for this case (``Backend.known_defect``);
    - no declaration at all.
    """
    try:
        declared = backend.declared(case)
    except Exception as e:  # a backend that cannot say what it computes is not selected
        return f"no declaration ({type(e).__name__}: {e})"
    if declared.arithmetic == "opaque" and not allow_opaque:
        return (f"opaque arithmetic (judged by SQNR >= {declared.sqnr_floor_db:g} dB only, not by a declared "
                "interval): not dispatched unless opted in (select(..., allow_opaque=True), auto:opaque=allow)")
    semantic = [str(d) for d in declared.deviations(case, tensors) if d.level is Level.SEMANTIC]
    if semantic:
        return (f"declares {', '.join(semantic)}: a semantic deviation (it would compute other numbers than the "
                "checkpoint defines)")
    if declared.accumulate == "int32" and case.K * INT8_PRODUCT_MAX >= 2 ** 31:
        return (f"its int32 accumulator can wrap at K = {case.K} (|product| up to {INT8_PRODUCT_MAX}: K must stay "
                f"below {2 ** 31 // INT8_PRODUCT_MAX + 1} for every sum to fit)")
    defect = backend.known_defect(case)
    if defect:
        return f"known kernel defect for this case: {defect}"
    return None


def dispatch_refusal(backend: Backend, case: Case, allow_opaque: bool = False,
                     tensors: dict | None = None) -> str | None:
    """Why the dispatcher must not route ``case`` to ``backend``: unavailable here, cannot implement it, or
    ``refusal``; None where it may (``select``, and qconform_torch's certified dispatch on top of it)."""
    av = backend.availability()
    if not av.available:
        return f"unavailable: {av.reason}"
    sup = backend.can_implement(case)
    if not sup.ok:
        return f"cannot implement {case.describe()}: {sup.reason}"
    return refusal(backend, case, allow_opaque, tensors)


def select(case: Case, candidates: list[str] | None = None, *, allow_opaque: bool = False,
           tensors: dict | None = None) -> Selection:
    """Best available backend for ``case`` by priority; the emulator when nothing else can.

    ``allow_opaque``: also consider backends declaring ``arithmetic=opaque`` (judged by SQNR only).
    ``tensors``: the layer's checkpoint tensors, for the levels that depend on them (a GPTQ reading
    that ignores qzeros is canonical only where every field is the symmetric midpoint); without them
    such a backend is skipped, the conservative choice."""
    names = candidates if candidates is not None else list(registered())
    backends = []
    skipped: list[tuple[str, str]] = []
    for spec in names:
        try:
            backends.append(create(spec))
        except Exception as e:
            skipped.append((spec, f"cannot be created: {e}"))
    backends.sort(key=lambda b: -b.priority)
    for b in backends:
        if b.name in ("emulator", "auto"):  # the fallback comes last; "auto" is the dispatcher itself
            continue
        why_not = dispatch_refusal(b, case, allow_opaque, tensors)
        if why_not:
            skipped.append((b.label, why_not))
            continue
        for name, why in skipped:
            log.info("dispatch %s: skipped %s (%s)", case.describe(), name, why)
        log.info("dispatch %s: selected %s", case.describe(), b.label)
        return Selection(b, skipped)
    emu = next((b for b in backends if b.name == "emulator"), None) or create("emulator")
    for name, why in skipped:
        log.info("dispatch %s: skipped %s (%s)", case.describe(), name, why)
    log.info("dispatch %s: falling back to the emulator", case.describe())
    return Selection(emu, skipped)
