"""Backend registry, ``name:key=value`` parameters, and the dispatcher.

Semantics: docs/backends.md#registry.

Built-in backends are listed in ``BUILTIN`` (module:class, imported lazily so
a missing kernel library never breaks the registry). Third-party backends
register through the entry-point group ``qconform.backends``:

    [project.entry-points."qconform.backends"]
    mykernel = "mypkg.backend:MyKernelBackend"

``select(case)`` asks the dispatcher (backends/dispatch.py ``Dispatcher``) once: the available
backend with the highest priority that may take the case, else the emulator; it logs why it
skipped each other backend.
"""

from __future__ import annotations

import importlib
from importlib import metadata

from .base import Availability, Backend, Case
from .dispatch import INT8_PRODUCT_MAX, Dispatcher, Policy, dispatch_refusal, refusal
from .dispatch import Choice as Selection

__all__ = ["BUILTIN", "ENTRY_POINT_GROUP", "parse_spec", "registered", "create", "select", "Selection", "refusal",
           "dispatch_refusal", "INT8_PRODUCT_MAX", "dispatcher"]

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


def select(case: Case, candidates: list[str] | None = None, *, allow_opaque: bool = False,
           tensors: dict | None = None, activations=None) -> Selection:
    """Best available backend for ``case`` by declaration and priority; the emulator when nothing else can.

    A one-off question to a fresh ``Dispatcher`` (backends/dispatch.py) under its declaration-and-priority
    policy: callers that ask repeatedly hold a Dispatcher instead (its instances and choices are kept).
    ``allow_opaque``: also consider backends declaring ``arithmetic=opaque`` (judged by SQNR only).
    ``tensors``: the layer's checkpoint tensors, for the levels that depend on them (a GPTQ reading
    that ignores qzeros is canonical only where every field is the symmetric midpoint); without them
    such a backend is skipped, the conservative choice. ``activations``: the input [M, K] the answer is for,
    on which each activation quantizer variant's level is judged (an amax clamp is more than rounding on rows
    whose range lies below it)."""
    return dispatcher(candidates=candidates, allow_opaque=allow_opaque).choose(case, tensors=tensors,
                                                                               activations=activations)


def dispatcher(policy: Policy | None = None, **options) -> Dispatcher:
    """A ``Dispatcher`` (backends/dispatch.py) over this registry's backends; ``options`` as its own."""
    import sys

    return Dispatcher(policy, registry=sys.modules[__name__], **options)
