"""Failure localization, the output stage and the activations' NaN/Inf: hypotheses on the case's own output.

Semantics: docs/conformance.md#failure-localization. Run by conformance/judge/localize.py on the case's own
rows when the weight readback, the activation and bias probes found nothing (their summary would otherwise
be "the failure is in the product, the accumulation or the output rounding"). Each hypothesis is a concrete
output-stage or prologue bug written from the declared reference:

- the output rounded to another dtype first (float16 or bfloat16, then the output dtype: a double rounding);
- the output conversion saturating: +-Inf and overflow become +-(the output dtype's largest finite value);
- NaN/Inf activations replaced by finite values before the product (``nan_to_num``: NaN -> 0, +-Inf -> +-max
  of the activation dtype, or -> 0), judged by the verdict's own interval on the replaced rows.

A hypothesis is claimed when it reproduces at least 90 % of the failing outputs (the claim rule of the other
localizers) and every output it changes that passes still passes under it; the name carries one failing
element, observed against the reference.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from emulator.numerics.floats import format_of, round_to_dtype

__all__ = ["OwnOutput", "epilogue_hypotheses", "MIN_SHARE"]

#: the share of the failing outputs a hypothesis must reproduce
MIN_SHARE = 0.9


@dataclasses.dataclass(frozen=True)
class OwnOutput:
    """The case's own rows ``X`` (float32), the kernel's output ``y`` [M, N] (float64), where it is outside the
    declared interval (``bad``), the declared reference before the output rounding (``y_exact``), the output
    and activation dtypes, and ``judge(X, y)`` -> outside mask under the declaration for other rows X."""

    X: np.ndarray
    y: np.ndarray
    bad: np.ndarray
    y_exact: np.ndarray
    out_dtype: str
    act_dtype: str
    judge: Callable[[np.ndarray, np.ndarray], np.ndarray]


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return (a == b) | (np.isnan(a) & np.isnan(b))


def _example(o: OwnOutput, m: np.ndarray) -> str:
    idx = tuple(int(i[0]) for i in np.nonzero(m))
    return f"e.g. output {list(idx)}: observed {o.y[idx]:.6g}, reference {o.y_exact[idx]:.6g}"


def _output_forms(o: OwnOutput):
    """(name, output) of the output-stage hypotheses."""
    out = []
    with np.errstate(invalid="ignore", over="ignore"):
        for X in ("float16", "bfloat16"):
            if X != o.out_dtype:
                h = round_to_dtype(round_to_dtype(o.y_exact, X), o.out_dtype)
                out.append((f"the output rounded to {X} first, then to {o.out_dtype} (a double rounding: an epilogue "
                            f"buffer or conversion in {X})", h))
        mx = format_of(o.out_dtype).max_finite
        r = round_to_dtype(o.y_exact, o.out_dtype)
        h = np.where(np.isinf(r), np.sign(r) * mx, r)
        out.append((f"the output conversion saturates: +-Inf and overflow become +-{mx:.6g} (the largest finite "
                    f"{o.out_dtype}; a satfinite conversion)", h))
    return out


def _claims(o: OwnOutput, explained: np.ndarray, keeps: bool) -> bool:
    n_bad = int(o.bad.sum())
    return bool(n_bad and keeps and int((explained & o.bad).sum()) >= MIN_SHARE * n_bad)


def epilogue_hypotheses(o: OwnOutput) -> "list[tuple[str, str]]":
    """[(stage, hypothesis text)] of the hypotheses that explain the failing outputs (best first)."""
    if not o.bad.any():
        return []
    fits = []
    for name, h in _output_forms(o):
        ok = _same(o.y, h)
        # every output it changes that passes must still agree with it (or it meets the failures by chance)
        changed = ~_same(h, round_to_dtype(o.y_exact, o.out_dtype))
        if _claims(o, ok, bool(ok[changed & ~o.bad].mean() >= MIN_SHARE) if (changed & ~o.bad).any() else True):
            fits.append((int((ok & o.bad).sum()), "epilogue", f"{name}: reproduces {int((ok & o.bad).sum())} of "
                         f"{int(o.bad.sum())} failing output(s), {_example(o, ok & o.bad)}"))
    nonfin = ~np.isfinite(o.X)
    if nonfin.any():
        amax = format_of(o.act_dtype).max_finite
        for what, nan, inf in (("NaN -> 0, +-Inf -> +-max", 0.0, amax), ("NaN -> 0, +-Inf kept", 0.0, np.inf),
                               ("NaN and +-Inf -> 0", 0.0, 0.0)):
            Xr = np.nan_to_num(o.X.astype(np.float64), nan=nan, posinf=inf, neginf=-inf).astype(np.float32)
            try:
                bad_r = o.judge(Xr, o.y)
            except (ValueError, TypeError):
                continue
            if _claims(o, ~bad_r, not (bad_r & ~o.bad).any()):
                fits.append((int((~bad_r & o.bad).sum()), "activations",
                             f"NaN/Inf activations replaced by finite values before the product (nan_to_num: {what} of "
                             f"{o.act_dtype}): the outputs of the replaced rows lie inside that input's interval, "
                             f"{_example(o, o.bad & ~bad_r)}"))
                break
    fits.sort(key=lambda f: -f[0])
    return [(s, t) for _, s, t in fits]


def int_bias_hypotheses(X: np.ndarray, W: np.ndarray, bias: np.ndarray, act_scale: np.ndarray, w_scale: np.ndarray,
                        out_dtype: str) -> list:
    """(name, output) for a bias folded into the integer accumulator, on rows X whose activation quantization is
    exact (outputs X W^T + bias): the bias rounded to the accumulator's grid, RNE(bias / (sx sw)) * sx sw, and
    not added (what an all-zero row, sx = 0, shows for either)."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        y = X.astype(np.float64) @ W.T
        ss = np.asarray(act_scale, np.float64).reshape(-1, 1) * np.asarray(w_scale, np.float64).reshape(1, -1)
        b = np.asarray(bias, np.float64).reshape(1, -1)
        bi = np.where(ss > 0, np.rint(b / np.where(ss > 0, ss, 1.0)), 0.0)
        return [("bias folded into the int32 accumulator: RNE(bias / (sx * sw)) added to the integer dot, so it is "
                 "rounded to a multiple of sx * sw (and vanishes on an all-zero row, where sx = 0)",
                 round_to_dtype(y + bi * ss, out_dtype)),
                ("bias not added", round_to_dtype(y, out_dtype))]
