"""The emulator as a backend: the fallback when no accelerator kernel is present.

Covers: every scheme qconform defines (emulator/). Two paths:

- ``path=fast`` (default): dequantize the weights once (cached by a content hash
  of the checkpoint tensors; at most one dequantized copy), then one fp32 BLAS
  matmul per call: declared as fp32 accumulation (A16 schemes; the others use
  the exact path);
- ``path=exact``: the reference linear of emulator/linear.py on every call.

The exact path returns the canonical result bit for bit (or the variant named by its
parameters); the fast path returns what its declaration says (fp32 accumulation of the
exactly dequantized weights, within the declared interval, not the canonical bits), and
the suite judges each against its own declaration. Parameters select variants, e.g.
``emulator:act_rounding=rhaz`` or ``emulator:mx_scale_rule=even``: the backend
then *declares* those variants, and a run against the canonical declaration
shows whether the suite catches the difference.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from emulator import __version__ as emulator_version
from emulator.declaration import declared_output, declared_weight
from emulator.formats.fast_matmul import matmul_rows
from emulator.fast_linear import exact_int_matmul_for
from emulator.numerics.floats import round_float32_array, round_float64_array
from emulator.quantize_only import quantize_reference
from emulator.variants import FIELD_AXES, VARIANT_AXES, VariantError, axis

from .base import SCHEMES, Availability, Backend, Case, Declared, Prepared, Support, no, yes

#: parameters that name emulator variants: every Declared.variants key of the vocabulary (docs/variants.md)
VARIANT_KEYS = tuple(VARIANT_AXES)
#: Declared fields a parameter may set (``output`` follows the case; the emulator's arithmetic is always declared)
FIELD_KEYS = tuple(k for k in FIELD_AXES if k not in ("output", "arithmetic"))
#: parameters that are not variants
OWN_PARAMS = ("path", "declare")


class EmulatorBackend(Backend):
    name = "emulator"
    covers = "qconform's NumPy reference emulator (emulator/), canonical semantics or a named variant"
    priority = -100  # the fallback: chosen only when nothing else can implement a case

    def __init__(self, **params: str):
        super().__init__(**params)
        unknown = sorted(set(params) - set(VARIANT_KEYS) - set(FIELD_KEYS) - set(OWN_PARAMS))
        if unknown:
            raise ValueError(f"emulator: unknown parameter(s) {', '.join(unknown)}; known: "
                             + ", ".join(OWN_PARAMS + FIELD_KEYS + VARIANT_KEYS))
        try:  # every value checked against the vocabulary now, not at the first case
            self._variants = {k: axis(k).parse(v) for k, v in params.items() if k in VARIANT_KEYS}
            self._fields = {k: axis(k).parse(v) for k, v in params.items() if k in FIELD_KEYS}
        except VariantError as e:
            raise ValueError(f"emulator: {e}") from None
        # declare=canonical: compute the named variant but *claim* canonical semantics, i.e. a
        # kernel whose declaration is wrong; the suite must catch it (docs/conformance.md#proof).
        self.declare = params.get("declare", "self")
        if self.declare not in ("self", "canonical"):
            raise ValueError(f"emulator: declare must be self or canonical, got {self.declare!r}")
        self.path = params.get("path", "fast")
        if self.path not in ("fast", "exact"):
            raise ValueError(f"emulator: path must be fast or exact, got {self.path!r}")
        self._cache: dict[str, np.ndarray] = {}
        #: the W8A8 fast path's exact integer GEMM engine (emulator/fast_linear.py ``exact_int_matmul_for``;
        #: None: NumPy's); qconform_torch sets its own (speed only: every correct engine gives the same sums)
        self.int_engine = None

    def availability(self) -> Availability:
        return Availability(True, "always available (NumPy)", emulator_version, "cpu")

    def can_implement(self, case: Case) -> Support:
        if case.scheme == "w4a16-moe" and case.weight_format != "gptq":
            return no("MoE is defined for GPTQ symmetric int4 experts only")
        zr = self.params.get("zero_read", "canonical")
        if zr.startswith("v1") and case.weight_format == "gptq" and case.zero_convention == "v2":
            return no(f"zero_read={zr} reads v1 zero points; this checkpoint stores v2 (literal) zeros")
        return yes()

    def schemes(self) -> list[str]:
        return list(SCHEMES)

    def uses_fast_path(self, case: Case) -> bool:
        """The fp32 BLAS path: A16 schemes whose named variants only change the weights (the path rounds
        neither activations nor outputs other than canonically, and accumulates in fp32)."""
        weights_only = all(axis(k).stage.value == "weights" for k in self._variants)
        fields_ok = set(self._fields) <= {"weight_dtype", "accumulate"} and \
            self._fields.get("accumulate", "float32") == "float32"
        return self.path == "fast" and case.spec.activations == "a16" and weights_only and fields_ok

    def computed(self, case: Case) -> Declared:
        """What this instance actually computes (its variants), whatever it declares.

        The fast path is an fp32 BLAS product of exactly dequantized weights, so it honestly
        declares fp32 accumulation; the exact path accumulates exactly.
        """
        fields = dict(self._fields)
        fields.setdefault("accumulate", "float32" if self.uses_fast_path(case) else "exact")
        if fields.get("act_compute_dtype") == "none":
            fields["act_compute_dtype"] = None
        return Declared(variants=dict(self._variants), output=case.output_dtype, notes=f"emulator path={self.path}",
                        **fields)

    def declared(self, case: Case) -> Declared:
        if self.declare == "canonical":
            return dataclasses.replace(self.computed(case), variants={}, notes="claims canonical semantics")
        return self.computed(case)

    def prepare(self, case: Case, tensors: dict) -> Prepared:
        # The content hash is computed once per layer; run() then finds the cached weight by key.
        h = hashlib.sha256(repr(case.to_json()).encode())
        for k in sorted(tensors):
            a = np.ascontiguousarray(tensors[k])
            h.update(k.encode() + str(a.dtype).encode() + str(a.shape).encode() + a.tobytes())
        return Prepared(case, {"tensors": tensors, "key": h.hexdigest()})

    def _weight(self, prepared: Prepared) -> np.ndarray:
        key = prepared.data["key"]
        if key not in self._cache:
            case = prepared.case
            # hold at most one dequantized copy of a layer; a same-shape layer reuses its buffer
            # (its pages are already mapped: no fresh-page zeroing by the kernel)
            old = [a for a in self._cache.values() if isinstance(a, np.ndarray)]
            self._cache.clear()
            buf = old[0] if old and old[0].shape == (case.N, case.K) and old[0].dtype == np.float32 else None
            del old
            self._cache[key] = np.ascontiguousarray(
                declared_weight(case, prepared.data["tensors"], self.computed(case), out=buf), dtype=np.float32)
        return self._cache[key]

    def quantize(self, prepared: Prepared, x: np.ndarray) -> dict:
        """Quantize-only cases: the reference of emulator/quantize_only.py under this instance's variants."""
        return quantize_reference(prepared.case, np.asarray(x), self.computed(prepared.case))

    def uses_fast_w8a8(self, case: Case) -> bool:
        # canonical symmetric int8 activations only: any named activation variant, and asymmetric (azp)
        # activations, take the exact path (this path quantizes symmetrically)
        return (self.path == "fast" and case.scheme == "w8a8" and case.weight_format == "ct-int-quantized"
                and case.act_symmetric and not self._variants and not self._fields)

    def run(self, prepared: Prepared, x: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        case = prepared.case
        tensors = prepared.data["tensors"]
        bias = inputs.get("bias")
        if self.uses_fast_path(case):
            w = self._weight(prepared)  # float32, exact dequantized values
            # fp32 BLAS by row blocks, as declared; the same blocks and calls as the uncached path
            # (qconform_torch/blocked.py), so both give the same bits
            y = matmul_rows(np.asarray(x, dtype=np.float32), w)
            if bias is not None:
                y += np.asarray(bias, dtype=np.float32)
            return round_float32_array(y, case.output_dtype)
        if self.uses_fast_w8a8(case):
            return self._run_w8a8(prepared, np.asarray(x, dtype=np.float32), bias)
        return declared_output(case, tensors, np.asarray(x, np.float32), bias, inputs.get("router_logits"),
                               self.computed(case)).astype(np.float32)

    def _run_w8a8(self, prepared: Prepared, x32: np.ndarray, bias) -> np.ndarray:
        """Canonical W8A8 (docs/formats/activations.md) with NumPy's IEEE fp32 ops, exact int sums (sgemm over K-chunks).

        fl32(amax / 127), fl32(x / scale) and np.rint (RNE) are exactly the canonical steps; every
        chunk of <= 1024 int8 x int8 products sums exactly in fp32 (emulator.fast_linear.ExactIntMatmul).
        The conformance suite checks this path against the exact reference on every case.
        """
        case = prepared.case
        key = prepared.data["key"] + ":w8a8"
        if key not in self._cache:
            t = prepared.data["tensors"]
            self._cache.clear()
            ws = np.asarray(t["weight_scale"]).astype(np.float32).astype(np.float64).reshape(1, -1)
            self._cache[key] = (exact_int_matmul_for(np.asarray(t["weight"]), a_max=128,
                                                                engine=self.int_engine), ws)  # codes in [-128, 127]
        wq, ws = self._cache[key]
        if np.isnan(x32).any():
            raise ValueError("x: NaN in activations: per-token int8 quantization is undefined for NaN input")
        amax = np.abs(x32).max(axis=1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            scale = (amax / np.float32(127.0)).astype(np.float32)
            quot = x32 / scale  # float32 / float32: one IEEE division per element
        zero_rows = (amax == 0)[:, 0]
        if zero_rows.any():
            quot[zero_rows] = 0.0
        if (scale == 0).any():  # underflowed scales: 0/0 -> NaN -> code 0 (x/0 = +-Inf saturates below)
            np.nan_to_num(quot, copy=False, nan=0.0, posinf=np.inf, neginf=-np.inf)
        np.rint(quot, out=quot)
        np.clip(quot, -128, 127, out=quot)
        y = wq(quot)  # exact integer sums: fp32 sgemm over K-chunks of <= 1024 (emulator/linear.py)
        y *= scale.astype(np.float64) * ws  # sx * sw is exact in float64 (24 + 24 bits): one rounding
        if bias is not None:
            y += np.asarray(bias, dtype=np.float64)
        return round_float64_array(y, case.output_dtype)
