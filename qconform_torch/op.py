"""``torch.ops.qconform.quant_linear``: one quantized checkpoint layer as a PyTorch custom op.

Semantics: docs/fallback.md#the-op.

    y = torch.ops.qconform.quant_linear(x, weights, layer, backend)

- ``x``: [M, K] float32 / float16 / bfloat16 activations; ``y``: [M, N] in x's dtype;
- ``weights``: the layer's checkpoint tensors as stored (packed codes, scales, zeros, g_idx, bias), in
  the order of ``roles(info)``;
- ``layer``: ``layer_spec(info, expert)``, the layer's ``LayerInfo`` as JSON (and, for stacked
  experts, which expert);
- ``backend``: ``"emulator"`` (the canonical reference: emulator/layers.py ``linear_layer``, equal
  to ``qconform linear`` bit for bit), ``"auto"`` (the op's ``Dispatcher``, backends/dispatch.py: the
  fastest, timed on the layer's first call at each shape class, of the backends whose declaration is
  canonical or a rounding-level variant for this layer's tensors and of the emulator backend's fast path;
  with certifications, certified kernels only) or a backend name.

Layers a Case cannot describe (GPTQModel packed-add v1 zeros, gpt-oss stacked experts, asymmetric
int8 weights) always run the reference, with that reason logged. Each layer's choice is logged once
(logger ``qconform.fallback``) with what was measured and the reason each other backend was skipped.

Memory: the canonical reference (``"emulator"``, and layers no kernel can take) runs by row blocks whose working set
stays within max(budget, 1 MiB) (qconform_torch/exact_blocks.py); prepared kernels (for the emulator backend: the
layer's dequantized fp32 weight) are kept in one scan-resistant cache bounded by ``set_cache_budget`` bytes
(``--cache-mb``; qconform_torch/prepared_cache.py: a stable set of layers that fits stays, the rest are streamed); a
layer it does not keep is prepared, run and dropped (the emulator backend's fast path: dequantized in row blocks of
max(budget, 16 MiB) straight into the sgemm, qconform_torch/blocked.py), so no full fp32 copy of a model is ever
held.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
from typing import NamedTuple

import numpy as np
import torch

from backends.dispatch import CertifiedFastest, Dispatcher, FallbackOnly, MeasuredFastest, shape_class
from backends.registry import create
from backends.registry import dispatcher as new_dispatcher
from emulator.checkpoint import LayerInfo
from emulator.declaration import declared_weight
from emulator.errors import UnsupportedFormatError
from emulator.layer_cases import case_tensors, layer_case
from emulator.layers import declared_activation, layer_bias
from emulator.tensorfile import Tensor

from .blocked import blocked_fast_linear
from .exact_blocks import exact_by_rows, validate_by_rows
from .host_state import op_thread_state
from .int_kernels import fastest_int_engine, m_class
from .prepared_cache import PreparedCache
from .torch_fast import TorchFastLinear, TorchW8A8Linear, ieee_fp32_matmul_refusal

__all__ = ["quant_linear", "layer_spec", "parse_spec", "roles", "to_numpy_tensor", "set_cache_budget", "cache_stats",
           "selections", "selection_lines", "DEFAULT_CACHE_MB", "use_certifications", "certifier", "clear_selections",
           "dispatcher", "use_floor", "use_fast_path_only", "w8a8_path_choices", "set_w8a8_path_choices"]

log = logging.getLogger("qconform.fallback")

#: torch dtype -> safetensors dtype name (what the emulator's readers expect)
_ST = {torch.int32: "I32", torch.int64: "I64", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
       torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32", torch.float64: "F64"}
_ACT = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
DEFAULT_CACHE_MB = 256


def roles(info: LayerInfo) -> list[str]:
    """The order of ``weights``: the layer's tensor roles, sorted."""
    return sorted(info.tensors)


def layer_spec(info: LayerInfo, expert: int | None = None) -> str:
    return json.dumps({"info": info.to_json(), "expert": expert}, sort_keys=True)


def parse_spec(spec: str) -> tuple[LayerInfo, int | None]:
    """(the layer's LayerInfo, its expert index or None) from a ``layer_spec`` string (parsed once per string)."""
    return _parse_spec(spec)


@functools.lru_cache(maxsize=4096)
def _parse_spec(spec: str) -> tuple[LayerInfo, int | None]:
    try:
        d = json.loads(spec)
        info = LayerInfo(**{**d["info"], "shape": tuple(d["info"]["shape"])})
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"quant_linear: layer is not a layer_spec() string ({type(e).__name__}: {e})") from None
    return info, d.get("expert")


def to_numpy_tensor(t: torch.Tensor) -> Tensor:
    """A torch tensor as the emulator's ``Tensor`` (NumPy data + safetensors dtype name); no copy but bf16."""
    if t.dtype not in _ST:
        raise ValueError(f"quant_linear: tensor dtype {t.dtype} is not one a checkpoint stores")
    t = t.detach().contiguous()
    data = t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()  # bf16 -> fp32 is exact
    return Tensor(data, _ST[t.dtype])


class _LayerTensors:
    """The part of ``emulator.checkpoint.Checkpoint`` the layer functions read, over in-memory tensors."""

    def __init__(self, info: LayerInfo, weights: list[torch.Tensor]):
        r = roles(info)
        if len(weights) != len(r):
            raise ValueError(f"quant_linear: {info.name}: expected {len(r)} weight tensors ({', '.join(r)}), "
                             f"got {len(weights)}")
        self._torch = {info.tensors[role]: w for role, w in zip(r, weights)}
        self._by_name: dict[str, Tensor] = {}  # converted when first read (a layer served from the cache reads few)

    def tensor(self, name: str, *, layer: str | None = None) -> Tensor:
        t = self._by_name.get(name)
        if t is None:
            t = self._by_name[name] = to_numpy_tensor(self._torch[name])
        return t

    def layer_tensors(self, info: LayerInfo) -> dict[str, Tensor]:
        return {role: self.tensor(name) for role, name in info.tensors.items()}


def _expert_slice(info: LayerInfo, weights: list[torch.Tensor], expert: int) -> tuple[LayerInfo, list[torch.Tensor]]:
    """One expert of a stacked [E, N, K] layer as a [1, N, K] layer (only its blocks are ever dequantized)."""
    E = info.shape[0]
    if not 0 <= expert < E:
        raise ValueError(f"quant_linear: {info.name}: expert {expert} out of range [0, {E})")
    sliced = [w[expert:expert + 1] for w in weights]
    return dataclasses.replace(info, shape=(1, *info.shape[1:])), sliced


# --------------------------------------------------------------------------------------------- cache


_CACHE = PreparedCache(DEFAULT_CACHE_MB << 20)


def set_cache_budget(mb: float) -> None:
    """Bound every fp32 / prepared-kernel cache of the op to ``mb`` MiB (0: nothing is cached)."""
    if mb < 0:
        raise ValueError(f"cache budget must be >= 0 MiB, got {mb}")
    _CACHE.reset(int(mb * (1 << 20)))
    _LANES.clear()


def cache_stats() -> dict:
    return _CACHE.stats()


def cached_entries() -> list[tuple[str, str]]:
    """(layer spec, what) of every entry the cache keeps now: ``what`` is the backend label of a prepared kernel
    (or ``reference`` for what the exact reference keeps)."""
    return [(k[0], k[1]) for k in _CACHE.keys() if isinstance(k, tuple) and len(k) >= 3]


def _prepared_bytes_estimate(case, weights) -> int:
    """What an emulator backend cache entry of the layer holds: its fp32 weight [N, K] and the layer's tensors."""
    return 4 * case.N * case.K + sum(int(w.untyped_storage().nbytes()) for w in weights)


def _nbytes(obj, seen=None) -> int:
    """Bytes of every array / tensor reachable from ``obj`` (dicts, lists, tuples, dataclass-free)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, torch.Tensor):
        return int(obj.untyped_storage().nbytes())
    if isinstance(obj, dict):
        return sum(_nbytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v, seen) for v in obj)
    return 0


def _prepared_bytes(backend, prepared) -> int:
    """What a prepared layer holds: every array of the kernel's prepared data (its repacked weights; the
    canonical tensors it keeps are counted although they share the module's storage: an upper bound),
    plus, for the emulator backend, the dequantized fp32 weight [N, K] it caches at the first run."""
    case = prepared.case
    return _nbytes(prepared.data) + (4 * case.N * case.K if backend.name == "emulator" else 0)


# --------------------------------------------------------------------------------------------- selection

#: the op's one dispatcher (backends/dispatch.py): its backend instances, the contenders admitted per
#: layer (judged on the layer's own tensors), the timings per shape class, the kernels that failed when
#: run, and the choice lines logged per layer. ``auto`` measures by default (docs/fallback.md#the-dispatcher).
_DISPATCH = new_dispatcher(MeasuredFastest())


def dispatcher() -> Dispatcher:
    """The op's dispatcher (one per process)."""
    return _DISPATCH


def use_certifications(certifier) -> None:
    """Certified dispatch for ``auto``: only backends ``certifier`` certifies for a layer's Case, timed against
    the emulator's fast path, the fastest kept; None: back to measured dispatch among every admitted backend.
    A certifier has ``labels()`` (the backend specs it knows) and ``why_not(label, version, case)`` (None:
    certified). The suite's is ``conformance.certify.CertificationStore(bundles)``, read from ``qconform
    certify`` bundles."""
    _DISPATCH.set_policy(MeasuredFastest() if certifier is None else CertifiedFastest(certifier))


def certifier():
    """The certifier ``auto`` uses now, or None."""
    return getattr(_DISPATCH.policy, "certifier", None)


def use_fast_path_only(why: str | None) -> None:
    """``auto`` runs every layer on the emulator backend's fast path (``why`` says why in each line); None:
    back to measured dispatch."""
    _DISPATCH.set_policy(MeasuredFastest() if why is None else FallbackOnly(why))


def use_floor(db: float | None) -> None:
    """With a model-level check asked for (``qconform model --check``): a contender whose output on its
    timing input is below ``db`` SQNR against the layer's reference is not chosen (None: no gate)."""
    _DISPATCH.floor_db = db
    _DISPATCH.set_policy(_DISPATCH.policy)


def clear_selections() -> None:
    """Forget every dispatch choice and its log lines (a new run: ``qconform model``)."""
    _DISPATCH.clear()
    _LANES.clear()
    _AUTO_LANES.clear()


def selections() -> dict[str, list[str]]:
    """What each layer ran on so far: layer name -> the choice lines logged for it."""
    out: dict[str, list[str]] = {}
    for spec, lines in _DISPATCH.notes.items():  # the experts of a stacked layer share its name: one line each
        seen = out.setdefault(parse_spec(spec)[0].name, [])
        seen.extend(l for l in lines if l not in seen)
    return out


def selection_lines(spec: str) -> list[str]:
    """The choice lines logged for the layer of ``spec`` (a QuantLinear's ``_spec``)."""
    return list(_DISPATCH.notes.get(spec, []))


def _log_choice(spec: str, name: str, line: str) -> None:
    """Once per layer and chosen backend (a new M that keeps the choice logs nothing new)."""
    if _DISPATCH.note(spec, line):
        log.info("%s: %s", name, line)


# --------------------------------------------------------------------------------------------- compute

def _identity(weights: list[torch.Tensor]) -> tuple:
    """Which tensors, storages and versions (in-place writes bump ``_version``) a layer's weights are."""
    return tuple((id(w), w.data_ptr(), w._version, tuple(w.shape), str(w.dtype)) for w in weights)


def _validate_once(spec: str, info: LayerInfo, src, weights: list[torch.Tensor]) -> None:
    """Every tensor checked as ``qconform dequant`` does (NaN scales, E8M0 0xFF, bias, shapes) before a
    kernel sees it; once per set of weight tensors and versions."""
    key = (spec, _identity(weights))
    # the mark lives on the first tensor object itself: it dies with it, so a freed tensor's address
    # reused by another can never inherit its validation
    seen = getattr(weights[0], "_qconform_validated", None) if weights else None
    if seen is not None and key in seen:
        return
    validate_by_rows(src, info, _CACHE.budget)
    if weights:
        if seen is None:
            seen = weights[0]._qconform_validated = set()
        seen.add(key)


def _reference_store(spec: str, weights: list[torch.Tensor]):
    """``store(what, make)``: the value the cache keeps for this layer's tensors (and versions) under ``what``, or
    ``make()`` (kept where the cache admits it; None is never kept). What the reference forms from a layer's
    tensors alone (its dequantized weight, its exact integer GEMM's prepared operands, that ``linear_layer``
    accepted them) is then formed once per layer, not per call (qconform_torch/exact_blocks.py ``reference``)."""
    ident = _identity(weights)
    packed = _nbytes(weights)

    def store(what, make):
        key = (spec, "reference", what, ident)
        got = _CACHE.get(key)
        if got is not None:
            return got[0]
        value = make()
        if value is not None:
            nbytes = int(value.nbytes) if isinstance(value, np.ndarray) else 0
            if isinstance(what, tuple) and what[0] == "int engine":  # its int8 operand and, at most, fp32 chunks
                nbytes = 5 * int(np.prod(what[2]))
            _CACHE.put(key, (value, list(weights)), nbytes + packed)
        return value
    return store


def _reference(src, info: LayerInfo, x: np.ndarray, dtype: str, layer=None) -> np.ndarray:
    """The canonical reference (``qconform linear``; a [1, N, K] layer is one stacked expert), by row blocks
    whose working set stays within max(cache budget, 1 MiB) (qconform_torch/exact_blocks.py); W8A8's exact
    accumulator on the faster of torch's int8 GEMM and NumPy's (qconform_torch/int_kernels.py). ``layer``:
    (spec, weights), whose tensors-only work the cache may keep (``_reference_store``)."""
    engine, store = fastest_int_engine, None
    if layer is not None:
        store = _reference_store(*layer)

        def engine(w, a_max, w_max=None):  # one prepared engine per weight array (and bound), not per call
            w = np.asarray(w)
            what = ("int engine", w.__array_interface__["data"][0], w.shape, w.strides, str(w.dtype), a_max, w_max)
            return store(what, lambda: fastest_int_engine(w, a_max, w_max))
    y, st = exact_by_rows(src, info, x, dtype, _CACHE.budget, int_engine=engine, weights=store)
    _CACHE.count_exact(st["blocks"] > 1, st["ambiguous"])
    return y


def run_layer(x: torch.Tensor, weights: list[torch.Tensor], spec: str, backend: str) -> np.ndarray:
    """The op's CPU computation, as a float32 NumPy array holding values of x's dtype, in ``op_thread_state``:
    NumPy's BLAS on this thread, IEEE gradual underflow (qconform_torch/host_state.py)."""
    with op_thread_state():
        return _run_layer(x, weights, spec, backend)


def _run_layer(x: torch.Tensor, weights: list[torch.Tensor], spec: str, backend: str) -> np.ndarray:
    info, expert = parse_spec(spec)
    weights_in = weights
    if x.dim() != 2 or x.shape[1] != info.shape[-1]:
        raise ValueError(f"quant_linear: {info.name}: x must be [M, K={info.shape[-1]}], got {list(x.shape)}")
    if x.dtype not in _ACT:
        raise ValueError(f"quant_linear: {info.name}: x must be float32, float16 or bfloat16, got {x.dtype}")
    dtype = _ACT[x.dtype]
    x32 = x.detach().float().contiguous().numpy()
    if expert is not None:
        if len(info.shape) != 3:
            raise ValueError(f"quant_linear: {info.name}: expert {expert} given for a 2-D layer")
        info, weights = _expert_slice(info, weights, int(expert))
    elif len(info.shape) != 2:
        raise ValueError(f"quant_linear: {info.name}: stacked experts {list(info.shape)} need an expert index")
    lane_key, auto_key, y = _lanes_of(spec, backend, dtype, expert, weights, x32)
    if y is not None:
        return y
    src = _LayerTensors(info, weights)
    if backend == "emulator":
        return _reference(src, info, x32, dtype, (spec, weights_in))
    _validate_once(spec, info, src, weights)
    try:
        case = layer_case(info, int(x.shape[0]), dtype, declared_activation(info))
    except UnsupportedFormatError as e:
        if backend != "auto":
            raise RuntimeError(f"backend {backend} cannot run {info.name}: {e}") from None
        _log_choice(spec, info.name, f"{info.format} -> emulator reference (no backend can take it: {e})")
        return _reference(src, info, x32, dtype, (spec, weights_in))
    bias = layer_bias(src, info)
    call = LayerCall(case, src, info, weights, spec)
    if backend != "auto":
        try:
            b = _DISPATCH.named(backend, case)
            _log_choice(spec, info.name, f"{case.scheme} {case.weight_format} -> {b.label} (named)")
            return _compute(b, call, x32, bias, lane_key)
        except Exception as e:  # noqa: BLE001 - one line naming the layer (a kernel's error may name none)
            raise RuntimeError(f"{info.name}: {' '.join(str(e).split())[:400]}" if str(e).startswith("backend ")
                               else f"{info.name}: backend {backend} failed ({type(e).__name__}: "
                                    f"{' '.join(str(e).split())[:400]})") from None

    def timer(b, bound):  # one warm-up (prepare, first touch), then the best of three runs on this input;
        # a run already 3x slower than the best contender so far is not repeated (it cannot win)
        y = _compute(b, call, x32, bias)
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            y = _compute(b, call, x32, bias)
            best = min(best, time.perf_counter() - t0)
            if best > 3 * bound:
                break
        return best, y

    choice = _DISPATCH.choose(case, tensors=lambda: case_tensors(src, info, case), layer=(spec, _identity(weights)),
                              timer=timer, reference=lambda: _reference(src, info, x32, dtype, (spec, weights_in)),
                              activations=x32)
    b = choice.backend
    if choice.output is not None and len(choice.times) > 1:  # measured on this call: drop the losers' entries
        _drop_timing_leftovers(spec, _identity(weights))
    fast_lane = auto_key if choice.fallback and choice.output is None else None
    try:
        y = choice.output if choice.output is not None else _compute(b, call, x32, bias, fast_lane)
    except Exception as e:  # noqa: BLE001 - a kernel that fails is skipped, with its error, never hidden
        why = " ".join(f"{type(e).__name__}: {e}".split())[:300]
        if choice.fallback:  # not even the fast path takes it: the reference answers (and says why)
            _log_choice(spec, info.name, f"{case.scheme} {case.weight_format} -> emulator reference (the emulator "
                                         f"backend's fast path failed: {why}) (skipped: {choice.skipped_text()})")
            return _reference(src, info, x32, dtype, (spec, weights_in))
        _DISPATCH.fail(case, b.label, why)
        log.warning("%s: %s failed when run (%s); asking the dispatcher without it", info.name, b.label, why)
        return _run_layer(x, weights_in, spec, backend)
    if fast_lane is not None and fast_lane in _LANES:
        _AUTO_LANES[fast_lane] = _DISPATCH.generation
    _log_choice(spec, info.name, choice.line(case))
    return y


def _lanes_of(spec: str, backend: str, dtype: str, expert, weights, x32: np.ndarray):
    """(lane key of a named backend, lane key of auto, y where a lane answers now else None). A named backend's
    layer served by a torch fast path entry before takes its lane; so does auto whose choice for this layer's
    shape class is the fast path, while the dispatcher's choices stand (no kernel to judge on the activations:
    the fast path is the canonical arithmetic)."""
    lane_key = (spec, backend, dtype) if expert is None and backend not in ("emulator", "auto") else None
    if lane_key is not None:
        y = _lane(lane_key, weights, x32)
        if y is not None:
            return lane_key, None, y
    auto_key = (spec, "auto", dtype, shape_class(int(x32.shape[0]))) if expert is None and backend == "auto" else None
    if auto_key is not None and _AUTO_LANES.get(auto_key) == _DISPATCH.generation:
        y = _lane(auto_key, weights, x32)
        if y is not None:
            return lane_key, auto_key, y
    return lane_key, auto_key, None


#: (spec, "auto", activation dtype, shape class) -> the dispatcher generation whose choice (the fast path) its lane
#: in ``_LANES`` stands for
_AUTO_LANES: dict[tuple, int] = {}


def _drop_timing_leftovers(spec: str, identity) -> None:
    """Drop this layer's cache entries of backends no measured shape class chose (prepared only to be timed)."""
    keep = _DISPATCH.chosen_labels()
    _CACHE.discard(lambda k: not (isinstance(k, tuple) and len(k) >= 3 and k[0] == spec and k[-1] == identity)
                   or k[1] in keep)


#: (spec, named backend, activation dtype) -> (weights' identity, cache key, bias, output dtype, (N, K) or None):
#: a named backend's layer the torch fast path served, checked, validated and logged before (``_lane``)
_LANES: dict[tuple, tuple] = {}


def _lane(lane_key, weights, x32: np.ndarray):
    """y for a layer already served by a torch fast path entry, with the same tensors (and versions): validated,
    dispatched and logged on an earlier call, its cache entry asked for as every call asks (the cache's request
    counts stay exact); None where anything differs (the full path then runs)."""
    lane = _LANES.get(lane_key)
    if lane is None or lane[0] != _identity(weights):
        return None
    _, key, bias, out_dtype, w8a8_shape = lane
    if w8a8_shape is not None and not _W8A8_CHOICE.get((*w8a8_shape, m_class(x32.shape[0]))):
        return None
    if w8a8_shape is None and ieee_fp32_matmul_refusal() is not None:
        return None
    entry = _CACHE.peek(key)
    if entry is None:
        return None
    _CACHE.get(key)
    return entry[0](x32, bias, out_dtype)


class LayerCall(NamedTuple):
    """One layer as a call sees it: its case, tensors (as given and as the checkpoint's layer), spec string."""

    case: object
    src: object
    info: LayerInfo
    weights: list
    spec: str


def _compute(b, call: LayerCall, x32: np.ndarray, bias, lane_key=None) -> np.ndarray:
    """``call.case`` on backend ``b``: the emulator backend's fast path by row blocks where the cache does not keep
    its fp32 weight (qconform_torch/blocked.py), else through the scan-resistant cache of prepared kernels
    (qconform_torch/prepared_cache.py)."""
    case, src, info, weights, spec = call
    if b.name == "emulator" and set(b.params) <= {"path"} and b.uses_fast_path(case):
        # one entry per layer whatever M is (the fp32 weight depends on the layer's tensors only)
        key = (spec, b.label, "fp32 weight", _identity(weights))
        nbytes = _prepared_bytes_estimate(case, weights)
        if not _CACHE.admits(key, nbytes):
            # not kept (over the budget, or the cache holds layers requested as often): dequantize row blocks
            # (max(budget, 16 MiB)) straight into the sgemm
            y = blocked_fast_linear(b, case, case_tensors(src, info, case), x32, bias, _CACHE.budget)
            if y is not None:
                _CACHE.count_streamed(key)
                return y
        elif ieee_fp32_matmul_refusal() is None:
            # kept: torch's fp32 GEMM on the kept weight (qconform_torch/torch_fast.py), where torch computes
            # float32 products in float32 (else NumPy's row blocks below)
            entry = _CACHE.get(key)
            if entry is None:
                w = declared_weight(case, case_tensors(src, info, case), b.computed(case))
                entry = (TorchFastLinear(w), list(weights))
                _CACHE.put(key, entry, nbytes)
            if lane_key is not None:
                _LANES[lane_key] = (_identity(weights), key, bias, case.output_dtype, None)
            return entry[0](x32, bias, case.output_dtype)
    elif b.name == "emulator" and set(b.params) <= {"path"} and b.uses_fast_w8a8(case):
        y = _torch_w8a8(b, case, src, info, weights, spec, x32, bias)
        if y is not None:
            if lane_key is not None:
                _LANES[lane_key] = (_identity(weights), (spec, b.label, "torch w8a8", _identity(weights)), bias,
                                    case.output_dtype, (case.N, case.K))
            return y
    return _run_prepared(b, case, src, info, weights, spec, x32, bias)


#: (N, K, M class) -> True where the torch W8A8 path measured faster than the backend's own (first call of each)
_W8A8_CHOICE: dict[tuple, bool] = {}


def w8a8_path_choices() -> dict[tuple, bool]:
    """(N, K, M class) -> True where the torch W8A8 path was kept, False where the backend's (measured so far)."""
    return dict(_W8A8_CHOICE)


def set_w8a8_path_choices(torch_ops: bool | None) -> None:
    """None: forget every measured choice (the next call of each class measures again); True / False: every
    class measured so far takes the torch ops / the backend's path (tests force each path this way)."""
    if torch_ops is None:
        _W8A8_CHOICE.clear()
    else:
        _W8A8_CHOICE.update({k: bool(torch_ops) for k in _W8A8_CHOICE})


def _torch_w8a8(b, case, src, info: LayerInfo, weights, spec: str, x32: np.ndarray, bias):
    """The emulator backend's canonical W8A8 fast path in torch ops (qconform_torch/torch_fast.py), one cache
    entry per layer whatever M is; None where it cannot take the layer or the backend's own path (NumPy steps,
    its exact integer GEMM on the faster engine) measured faster for this shape class. The first call of each
    (N, K, M class) runs both, checks they agree bit for bit (both are the canonical result) and times them."""
    key = (spec, b.label, "torch w8a8", _identity(weights))
    entry = _CACHE.get(key)
    if entry is None:
        t = case_tensors(src, info, case)
        mm = TorchW8A8Linear(t["weight"], t["weight_scale"])
        if not mm.usable:
            return None
        entry = (mm, list(weights))
        _CACHE.put(key, entry, mm.nbytes + _nbytes(weights))
    mm = entry[0]
    shape = (case.N, case.K, m_class(case.M))
    use = _W8A8_CHOICE.get(shape)
    if use is None:
        y_t = mm(x32, bias, case.output_dtype)
        # the backend's own path, prepared for this measurement only (not cached: it would take the budget of
        # the layers the cache keeps)
        kb = create(b.label)
        kb.int_engine = fastest_int_engine
        prep = kb.prepare(case, case_tensors(src, info, case))
        extra = {} if bias is None else {"bias": np.asarray(bias, np.float32)}

        def backend_path():
            return np.asarray(kb.run(prep, x32, **extra), dtype=np.float32)
        y_b = backend_path()
        if not np.array_equal(y_t, y_b, equal_nan=True):
            log.warning("%s: the torch W8A8 path disagreed with the emulator backend's at M = %d: the backend's "
                        "is used for %dx%d", info.name, case.M, case.N, case.K)
            _W8A8_CHOICE[shape] = False
            return y_b
        t_t = _best_of(lambda: mm(x32, bias, case.output_dtype))
        t_b = _best_of(backend_path)
        del kb, prep
        _W8A8_CHOICE[shape] = use = t_t <= t_b
        log.info("W8A8 fast path %dx%d, M <= %d: %s (torch ops %.2f ms, backend %.2f ms)", case.N, case.K, shape[2],
                 "torch ops" if use else "the backend's", t_t * 1e3, t_b * 1e3)
        return y_t
    return mm(x32, bias, case.output_dtype) if use else None


def _best_of(fn, n: int = 2) -> float:
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _prepared_key(spec: str, b, case, weights) -> tuple:
    return (spec, b.label, repr(case), _identity(weights))


def _run_prepared(b, case, src, info: LayerInfo, weights, spec: str, x32: np.ndarray, bias) -> np.ndarray:
    """Run ``case`` on backend ``b`` through the LRU cache of prepared kernels."""
    # the weights' identity is part of the key and the entry holds them: two checkpoints with identically
    # described layers never share an entry, and a cached entry's addresses cannot be reused meanwhile
    key = _prepared_key(spec, b, case, weights)
    prepared = _CACHE.get(key)
    if prepared is None:
        tensors = case_tensors(src, info, case)
        if b.name == "emulator":  # one backend instance per cached layer: it holds that layer's fp32 weight
            b = create(b.label)
            b.int_engine = fastest_int_engine  # its W8A8 accumulator: the faster exact engine here
        prepared = (b, b.prepare(case, tensors), list(weights))
        _CACHE.put(key, prepared, _prepared_bytes(b, prepared[1]))
    kernel, prep, _ = prepared
    extra = {} if bias is None else {"bias": np.asarray(bias, np.float32)}
    return np.asarray(kernel.run(prep, x32, **extra), dtype=np.float32)


@torch.library.custom_op("qconform::quant_linear", mutates_args=(), device_types="cpu")
def quant_linear(x: torch.Tensor, weights: list[torch.Tensor], layer: str, backend: str) -> torch.Tensor:
    """One quantized layer: y [M, N] (x's dtype) = x [M, K] through the layer's weights (module docstring)."""
    y = run_layer(x, weights, layer, backend)
    return torch.from_numpy(np.ascontiguousarray(y, dtype=np.float32)).to(x.dtype)


@quant_linear.register_fake
def _quant_linear_fake(x, weights, layer, backend):
    info, _ = parse_spec(layer)
    return x.new_empty((x.shape[0], info.shape[-2]))

