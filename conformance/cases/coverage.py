"""Coverage by construction: each scheme's feature space as data, and the covering design the profiles
draw their coverage cases from.

Semantics: docs/conformance.md#coverage. ``TABLES`` holds one table per scheme (as TestFloat holds one
case table per operation): its factors (format features, shape classes, value classes) and each factor's
classes. ``design(scheme, seed)`` is a greedy pairwise covering design over the table (AETG-style: each
new row starts from an uncovered pair and fills the other factors with the class that covers the most
uncovered pairs, a fixed seed breaking ties): every pair of classes of two factors that can occur
together lies in some row, hence every single class. ``CONSTRAINTS`` says which combinations the formats
allow (AWQ is asymmetric; GPTQ packs K by 8; ...); a pair no valid row holds is *infeasible* and
recorded as such. ``realize`` turns a row into a ``Case`` and the value class's generator
(``vc-<class>``, conformance/cases/coverage_values.py); ``case_classes`` reads the format and shape classes back
from the realized case, and ``coverage_values.realized`` checks the value class in its tensors, so a
class counts as covered only where the case really has it. A class added to a table reaches every
profile that draws a design (``PROFILES[...]["coverage"]``, conformance/cases/specs.py). The docs table and a
bundle's coverage record: conformance/report/coverage.py. This module imports nothing of the suite.
"""

from __future__ import annotations

import functools
import itertools
import random

from backends.base import Case

__all__ = ["TABLES", "FACTOR_KINDS", "VALUE_CLASS_DOCS", "VALUE_MIN_K", "W8A8_ASYM", "NAN_SCALE", "ACT_ORDER_VALUES",
           "CONSTRAINTS", "design",
           "design_specs", "realize", "case_classes", "profile_coverage", "pick_n", "pick_k", "m_class", "n_class", "k_class"]

#: which factors are format features, shape classes and value classes (the docs group them so)
FACTOR_KINDS = {
    "format": ("format", "weights", "activations", "zero_convention", "act_order", "grouping", "groups", "bias",
               "act_dtype", "scale_dtype", "experts", "routing"),
    "shape": ("M", "N", "K"),
    "value": ("values",),
}

ACT = ("bfloat16", "float16", "float32")
M_CLASSES = ("M=1", "M%4!=0", "M%8!=0", "M%8==0")
N_CLASSES = ("N-min", "N%8!=0", "N%16!=0", "N%32!=0", "N%64!=0", "N%64==0")
K_CLASSES = ("K-min", "K%8!=0", "K%32!=0", "K%64!=0", "K%128!=0", "K%256!=0", "K%256==0")
GROUPING = ("channel", "g32", "g64", "g128")
GROUPS = ("1", "2", "many")
#: the activation amax classes (per token row, per tensor, per MX block): where rounding rules and
#: power-of-two scale rules part
AMAX = ("amax=2^k", "amax=2^k-ulp", "amax=2^k+ulp", "amax=1.5*2^k-ulp", "amax=1.5*2^k+ulp", "amax=1.75*2^k")
#: value classes of integer weights (codes, zero points, float scales)
W_INT = ("ordinary", "w-one-signed", "w-constant-rows", "code-eq-zero", "w-saturation", "scale-subnormal",
         "scale-extreme", "scale-negative")
#: value classes of MXFP4 weights (E2M1 codes, E8M0 scale bytes)
W_MX = ("ordinary", "w-one-signed", "w-constant-rows", "w-saturation", "scale-subnormal", "scale-extreme",
        "nan-scale", "nan-scale-zero-codes", "nan-scale-one-signed")
#: the E8M0 0xFF classes: each one NaN output column next to finite ones
NAN_SCALE = ("nan-scale", "nan-scale-zero-codes", "nan-scale-one-signed")
#: NaN/Inf activations, each alone, with rows whose outputs stay finite
NONFINITE_ACT = ("nan-act", "inf-act")
INT8_ACT = AMAX + ("act-one-signed", "act-constant-rows")
MX_ACT = AMAX + ("act-one-signed", "act-constant-rows", "act-saturation", "act-byte0-fine-steps")
#: act-order value classes (examples/independent-kernels/round3/README.md, gidx_sorted_uniform): only where a g_idx
#: (GPTQ) or weight_g_idx (compressed-tensors) is stored, i.e. under act order (CONSTRAINTS)
ACT_ORDER_VALUES = ("g_idx-unequal-groups",)
#: asymmetric W8A8 edge classes (examples/independent-kernels/README.md, suite holes 1-3): each exists only under
#: asymmetric activations (CONSTRAINTS), where the azp compensation and the zero point live
W8A8_ASYM = ("w-rowsum-beyond-int16", "azp-int32-saturation", "azp-int8-domain", "act-code-saturation")
#: the smallest K of a case of a value class (``realize`` picks a K of the row's K class at least this large)
VALUE_MIN_K = {"w-rowsum-beyond-int16": 512}

VALUE_CLASS_DOCS = {
    "ordinary": "random codes, zero points and scales packed by the format's packer (MoE: quantized Gaussian "
                "experts), Gaussian activations",
    "amax=2^k": "every activation row / tensor / MX block has amax exactly 2^k (k varies)",
    "amax=2^k-ulp": "amax one ulp (of the activation dtype) below 2^k",
    "amax=2^k+ulp": "amax one ulp above 2^k",
    "amax=1.5*2^k-ulp": "amax one ulp below 1.5 * 2^k",
    "amax=1.5*2^k+ulp": "amax one ulp above 1.5 * 2^k",
    "amax=1.75*2^k": "amax exactly 1.75 * 2^k",
    "act-one-signed": "activation rows (per tensor: the tensor; MX: blocks) of one sign: all positive, all "
                      "negative, positive with a zero",
    "act-constant-rows": "every other activation row holds one non-zero value (the others ordinary)",
    "act-saturation": "MX activation blocks whose largest element scales above 6 (E2M1 saturates)",
    "nan-act": "one NaN activation; every other row finite (its outputs stay finite)",
    "inf-act": "+Inf in one row, -Inf in another; the last row finite",
    "w-one-signed": "weight rows whose dequantized values all share one sign (codes on one side of the zero point)",
    "w-constant-rows": "a weight row of one code, one zero point and one scale: a constant dequantized row",
    "code-eq-zero": "a weight row whose codes all equal its zero point (dequantizes to zeros), and 1 in 8 "
                    "codes elsewhere",
    "w-saturation": "codes at both ends of the code range in every group of row 0 (int: 0 and 2^b - 1; int8: "
                    "+-127; MXFP4: +-6)",
    "scale-subnormal": "weight scales subnormal in the scale dtype (MXFP4: E8M0 bytes 0x00/0x01)",
    "scale-extreme": "the largest weight scales that keep outputs finite (fp16 2^14; bf16/fp32 2^60; E8M0 "
                     "0xFE with codes +-0.5), activations scaled down to match",
    "nan-scale": "one E8M0 byte 0xFF (NaN) block, every other input finite: one NaN output column, the rest finite",
    "nan-scale-zero-codes": "one E8M0 byte 0xFF (NaN) block whose 32 codes are all +-0 (NaN * 0 is NaN; a 0xFF "
                            "decoded as 2^128 gives 0): one NaN output column, the rest finite",
    "nan-scale-one-signed": "one E8M0 byte 0xFF (NaN) block whose non-zero codes share one sign, under activations "
                            "of one sign over that block in every row (a 0xFF decoded as 2^128 gives +-Inf, not "
                            "NaN): one NaN output column, the rest finite",
    "scale-negative": "weight scales of both signs: every other group (channel-wise: every other output channel) "
                      "negated, as auto-round's symmetric writer stores them (docs/formats/gptq.md#errors); one "
                      "scale in all: negative",
    "g_idx-unequal-groups": "act order with a g_idx (weight_g_idx) of unequal group sizes, randomly permuted: "
                            "two groups: G + G/4 and G - G/4 columns; more: one group empty, the others of random "
                            "sizes (docs/formats/gptq.md: any map into [0, K/G)), so group != rank // G",
    "act-byte0-fine-steps": "MX activation blocks of amax 2^-125 .. 1.5 * 2^-125 (E8M0 scale byte 0, 2^-127) holding "
                            "elements that need the finest E2M1 step there (+-2^-128, +-1.5 * 2^-127); W4A4: the "
                            "weight blocks they meet have byte 0xFE and codes +-0.5, so the products are normal",
    "router-ties": "router logits tied across the top-k boundary in every row",
    "w-rowsum-beyond-int16": "asymmetric activations; K >= 512 and weight rows 0 (all positive) and 1 (all negative) "
                             "of near-saturated codes: |sum_k q[n, k]| > 32767, so an azp compensation "
                             "zp * rowsum(W) kept in int16 wraps",
    "azp-int32-saturation": "asymmetric fp32 activations, one-ulp rows [-2^e, -2^e + ulp, ...]: -min / scale = "
                            "255 * 2^24 is past int32, the zero point saturates at 2^31 - 1 and every code is 0",
    "azp-int8-domain": "asymmetric fp32 activations, rows whose fl32(-128 - min / scale) rounds: the int8-domain "
                       "zero point RNE(fl32(-128 - m)) differs from the uint8-domain RNE(-m) - 128",
    "act-code-saturation": "asymmetric activations: rows whose max / scale and -128 - min / scale are both ties that "
                           "round up (min = -153.5, max = 101.5, scale 1; bf16: +-127.5), times 2^j: code 128 "
                           "before saturation",
}

_INT_SCHEME_FACTORS = {"bias": ("no", "yes"), "act_dtype": ACT}
_SHAPES = {"M": M_CLASSES, "N": N_CLASSES, "K": K_CLASSES}
#: MXFP4 blocks are 32 wide: K is a multiple of 32
_MX_K = tuple(k for k in K_CLASSES if k not in ("K%8!=0", "K%32!=0"))
_MX_SHAPES = {"M": M_CLASSES, "N": N_CLASSES, "K": _MX_K}
#: GPTQ experts pack K and I (= N) by 8
_MOE_SHAPES = {"M": M_CLASSES, "N": tuple(n for n in N_CLASSES if n != "N%8!=0"),
               "K": tuple(k for k in K_CLASSES if k != "K%8!=0")}

#: scheme -> factor -> its classes. The data the ci and certification coverage cases are generated from.
TABLES: dict[str, dict[str, tuple]] = {
    "w4a16": {"format": ("gptq", "awq", "ct-pack-quantized"), "weights": ("sym", "asym"),
              "zero_convention": ("v1", "v2", "none"), "act_order": ("off", "g_idx", "weight_g_idx"),
              "grouping": GROUPING, "groups": GROUPS, **_INT_SCHEME_FACTORS,
              "scale_dtype": ("float16", "bfloat16", "float32"), **_SHAPES,
              "values": W_INT + ACT_ORDER_VALUES + NONFINITE_ACT},
    "w8a16": {"format": ("gptq", "ct-int-quantized"), "weights": ("sym", "asym"), "zero_convention": ("v1", "v2", "none"),
              "act_order": ("off", "g_idx"), "grouping": GROUPING, "groups": GROUPS, **_INT_SCHEME_FACTORS,
              "scale_dtype": ("float16", "bfloat16", "float32"), **_SHAPES,
              "values": W_INT + ACT_ORDER_VALUES + NONFINITE_ACT},
    "w8a8": {"format": ("ct-int-quantized",), "activations": ("sym", "asym"), **_INT_SCHEME_FACTORS,
             "scale_dtype": ("float32", "bfloat16", "float16"), **_SHAPES, "values": W_INT + INT8_ACT + W8A8_ASYM},
    "w4a8": {"format": ("gptq", "ct-pack-quantized"), "zero_convention": ("v1", "none"), "grouping": GROUPING,
             "groups": GROUPS, **_INT_SCHEME_FACTORS, "scale_dtype": ("float16", "bfloat16", "float32"), **_SHAPES,
             "values": W_INT + INT8_ACT},
    "w4a16-mxfp4": {"format": ("ct-mxfp4",), "groups": GROUPS, **_INT_SCHEME_FACTORS, **_MX_SHAPES,
                    "values": W_MX + NONFINITE_ACT},
    "w4a4-mxfp4": {"format": ("ct-mxfp4",), "groups": GROUPS, **_INT_SCHEME_FACTORS, **_MX_SHAPES,
                   "values": W_MX + MX_ACT + NONFINITE_ACT},
    "w4a16-moe": {"format": ("gptq",), "grouping": GROUPING, "groups": GROUPS, "experts": ("E2", "E4", "E8"),
                  "routing": ("top1", "top2", "all"), "act_dtype": ACT, "scale_dtype": ("float16", "bfloat16"),
                  **_MOE_SHAPES, "values": ("ordinary", "router-ties") + NONFINITE_ACT},
    "q-int8-token": {"activations": ("sym", "asym"), "act_dtype": ACT, "M": M_CLASSES, "K": K_CLASSES,
                     "values": ("ordinary",) + INT8_ACT},
    "q-uint8-tensor": {"act_dtype": ("float32",), "M": M_CLASSES, "K": K_CLASSES, "values": ("ordinary",) + INT8_ACT},
    "q-mxfp4": {"act_dtype": ACT, "M": M_CLASSES, "K": _MX_K, "values": ("ordinary",) + MX_ACT + NONFINITE_ACT},
}


# -- shapes ------------------------------------------------------------------------------------------
def _bits(scheme: str) -> int:
    return 8 if scheme in ("w8a16", "w8a8") else 4


def _group(grouping: "str | None", fmt: str) -> "int | None":
    """The group size of a grouping class (None: channel-wise); MXFP4 is always blocks of 32."""
    if fmt == "ct-mxfp4":
        return 32
    return None if grouping in (None, "channel") else int(grouping[1:])


def _valuation_class(v: int, prefix: str) -> str:
    for m in (8, 32, 64, 128, 256):
        if v % m:
            return f"{prefix}%{m}!=0"
    return f"{prefix}%256==0"


def m_class(m: int) -> str:
    if m == 1:
        return "M=1"
    return "M%4!=0" if m % 4 else ("M%8!=0" if m % 8 else "M%8==0")


def n_class(n: int) -> str:
    if n % 8:
        return "N%8!=0"
    for m in (16, 32, 64):
        if n % m:
            return f"N%{m}!=0"
    return "N%64==0"


def k_class(k: int) -> str:
    return _valuation_class(k, "K")


_M_VALUES = {"M=1": (1,), "M%4!=0": (3, 5), "M%8!=0": (12, 4), "M%8==0": (8, 16)}


def _n_legal(scheme: str, fmt: str, bits: int, g: "int | None", n: int) -> bool:
    if scheme == "w4a16-moe":  # w2 packs I by 8; its group is min(G, I)
        return n % 8 == 0 and (g is None or n % min(g, n) == 0)
    if fmt == "gptq":
        return n % (32 // bits) == 0
    if fmt == "awq":
        return n % 8 == 0
    return True


def _k_legal(scheme: str, fmt: str, bits: int, g: "int | None", k: int) -> bool:
    if fmt in ("gptq",) and k % (32 // bits):
        return False
    if fmt == "ct-mxfp4" or scheme == "q-mxfp4":
        return k % 32 == 0
    return g is None or k % g == 0


@functools.lru_cache(maxsize=None)
def pick_n(scheme: str, fmt: str, grouping: "str | None", cls: str, variant: int = 0) -> "int | None":
    """N of an N class for the format (None: no legal N has the class)."""
    bits, g = _bits(scheme), _group(grouping, fmt)
    legal = [n for n in range(1, 257) if _n_legal(scheme, fmt, bits, g, n)]
    cand = legal[:1] if cls == "N-min" else [n for n in legal if n_class(n) == cls and n >= 8]
    return cand[min(variant, len(cand) - 1, 2)] if cand else None


@functools.lru_cache(maxsize=None)
def _legal_ks(scheme: str, fmt: str, bits: int, g: "int | None") -> tuple:
    return tuple(k for k in range(1, 1025) if _k_legal(scheme, fmt, bits, g, k))


@functools.lru_cache(maxsize=None)
def pick_k(scheme: str, fmt: str, grouping: "str | None", groups: "str | None", cls: str,
           variant: int = 0, at_least: int = 0) -> "int | None":
    """K of a K class with the group count class, at least ``at_least`` (None: no legal K has all three)."""
    bits, g = _bits(scheme), _group(grouping, fmt)
    if fmt == "ct-mxfp4":
        g = 32

    def n_groups_ok(k):
        if groups is None:
            return True
        count = 1 if g is None else k // g
        return {"1": count == 1, "2": count == 2, "many": count >= 3}[groups]

    legal = [k for k in _legal_ks(scheme, fmt, bits, g) if n_groups_ok(k)]
    cand = legal[:1] if cls == "K-min" else [k for k in legal if k_class(k) == cls and k >= 8]
    cand = [k for k in cand if k >= at_least]
    return cand[min(variant, len(cand) - 1, 2)] if cand else None


# -- constraints ---------------------------------------------------------------------------------------
def _format_ok(scheme: str, r: dict) -> bool:
    fmt = r.get("format", "none")
    zc, ao, grouping = r.get("zero_convention"), r.get("act_order", "off"), r.get("grouping")
    w = r.get("weights")
    if zc is not None and (zc != "none") != (fmt == "gptq"):
        return False
    if zc == "v2" and w == "sym":
        return False
    if fmt == "awq" and w == "sym":
        return False
    if fmt == "ct-int-quantized" and (w == "asym" or grouping not in (None, "channel") or ao != "off"):
        return False
    if ao == "g_idx" and fmt != "gptq" or ao == "weight_g_idx" and fmt != "ct-pack-quantized":
        return False
    if ao != "off" and grouping == "channel":
        return False
    sd = r.get("scale_dtype")
    if sd == "float32" and fmt not in ("ct-pack-quantized", "ct-int-quantized"):
        return False
    if grouping == "channel" and r.get("groups") not in (None, "1"):
        return False
    if ao != "off" and r.get("groups") == "1":
        return False
    return True


def _shape_ok(scheme: str, r: dict) -> bool:
    fmt = r.get("format", "none")
    grouping = r.get("grouping")
    if "K" in r and pick_k(scheme, fmt, grouping, r.get("groups"), r["K"]) is None:
        return False
    if "N" in r and pick_n(scheme, fmt, grouping, r["N"]) is None:
        return False
    return True


def _value_ok(scheme: str, r: dict) -> bool:
    v = r["values"]
    if v in NONFINITE_ACT + ("act-constant-rows",) and r.get("M") == "M=1":
        return False  # finite rows (constant rows: non-constant rows) beside it need a second row
    if v in ("code-eq-zero", "scale-subnormal") + NONFINITE_ACT and r.get("N") == "N-min":
        return False  # one weight row, zero (or NaN): no ordinary output left to judge beside it
    if v == "w-saturation" and r.get("K") == "K-min" and (r.get("grouping") == "channel"
                                                           or r.get("format") == "ct-int-quantized"):
        return False  # channel-wise K-min is one column: it cannot hold both ends of the range
    if r.get("N") == "N-min" and (v in NAN_SCALE or v == "scale-extreme" and r.get("format") == "ct-mxfp4"):
        return False  # one output column, NaN (or 2^127 past fp16): nothing left to stay finite
    if v == "router-ties" and r.get("routing") == "all":  # no expert left out: no top-k boundary to tie at
        return False
    if v in VALUE_MIN_K and "K" in r and pick_k(scheme, r.get("format", "none"), r.get("grouping"), r.get("groups"),
                                                 r["K"], 0, VALUE_MIN_K[v]) is None:
        return False  # K-min: one column cannot hold a row sum past int16
    return True


def _value_feature_ok(scheme: str, r: dict) -> bool:
    v = r["values"]
    if v in ACT_ORDER_VALUES and r.get("act_order", "off") == "off":
        return False  # no g_idx stored without act order
    if v == "act-byte0-fine-steps" and r.get("act_dtype") == "float16":
        return False  # fp16 holds nothing near 2^-125: its blocks never reach scale byte 0
    return True


def _asym_value_ok(scheme: str, r: dict) -> bool:
    v = r["values"]
    if v in W8A8_ASYM and r.get("activations") != "asym":
        return False  # a zero point and its compensation exist only under asymmetric activations
    if v in ("azp-int32-saturation", "azp-int8-domain") and r.get("act_dtype") != "float32":
        return False  # a 16-bit row is at least 2^-7 (bf16) / 2^-10 (fp16) of min wide: -min / scale < 2^18
    return True


#: (factors read, predicate over a full assignment of them): the combinations the formats allow
CONSTRAINTS = (
    (("format", "weights", "zero_convention", "act_order", "grouping", "groups", "scale_dtype"), _format_ok),
    (("format", "grouping", "groups", "K"), _shape_ok),
    (("format", "grouping", "N"), _shape_ok),
    (("values", "M", "N", "routing", "K", "grouping", "format"), _value_ok),
    (("values", "act_order", "act_dtype"), _value_feature_ok),
    # asymmetric int8 activations of one element per row: min = max, scale 0, an all-zero output
    (("activations", "K"), lambda scheme, r: not (r.get("activations") == "asym" and r.get("K") == "K-min")),
    (("values", "activations", "act_dtype"), _asym_value_ok),
    (("experts", "routing"), lambda scheme, r: not (r.get("experts") == "E2" and r.get("routing") == "top2")),
)


class _Checker:
    """Exact local consistency: a partial row is allowed when every constraint has a satisfying
    assignment of its factors that agrees with the row (the allowed tuples are enumerated once)."""

    def __init__(self, scheme: str, table: dict):
        self.cons = []
        for factors, pred in CONSTRAINTS:
            fs = tuple(f for f in factors if f in table)
            if not fs:
                continue
            allowed = [dict(zip(fs, combo)) for combo in itertools.product(*(table[f] for f in fs))]
            allowed = [a for a in allowed if pred(scheme, a)]
            self.cons.append((fs, allowed))

        self.memo: dict = {}

    def ok(self, row: dict) -> bool:
        for i, (fs, allowed) in enumerate(self.cons):
            sub = tuple(f for f in fs if f in row)
            if not sub:
                continue
            proj = self.memo.get((i, sub))
            if proj is None:  # the allowed tuples projected on the assigned factors, once per subset
                proj = self.memo[(i, sub)] = {tuple(a[f] for f in sub) for a in allowed}
            if tuple(row[f] for f in sub) not in proj:
                return False
        return True


@functools.lru_cache(maxsize=None)
def _checker(scheme: str) -> _Checker:
    return _Checker(scheme, TABLES[scheme])


# -- the covering design --------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def design(scheme: str, seed: int = 0) -> tuple:
    """(rows, infeasible pairs) of a pairwise covering design over ``TABLES[scheme]``.

    Rows are dicts factor -> class. The first row is the smallest legal shape (M = 1, N-min, K-min);
    then, while a pair of classes is uncovered, a row is built around it greedily. A pair that no
    completion satisfies (after 20 seeded attempts) is infeasible: the formats do not allow it.
    """
    table = TABLES[scheme]
    factors = list(table)
    chk = _checker(scheme)
    rng = random.Random(f"qconform-coverage/{scheme}/{seed}")
    uncovered = {((f1, a), (f2, b)) for i, f1 in enumerate(factors) for f2 in factors[i + 1:]
                 for a in table[f1] for b in table[f2]}
    rows: list[dict] = []
    infeasible: set = set()

    def gain(row, f, lv):
        return sum(1 for g, gv in row.items() if (((g, gv), (f, lv)) if factors.index(g) < factors.index(f)
                                                    else ((f, lv), (g, gv))) in uncovered)

    def complete(row):
        order = [f for f in factors if f not in row]
        rng.shuffle(order)
        for f in order:
            levels = list(table[f])
            rng.shuffle(levels)
            levels.sort(key=lambda lv: -gain(row, f, lv))
            for lv in levels:
                if chk.ok({**row, f: lv}):
                    row[f] = lv
                    break
            else:
                return None
        return row

    def add(row):
        rows.append(row)
        for i, f1 in enumerate(factors):
            for f2 in factors[i + 1:]:
                uncovered.discard(((f1, row[f1]), (f2, row[f2])))

    smallest = {"M": "M=1", "N": "N-min", "K": "K-min"}
    for _ in range(20):
        row = complete({f: v for f, v in smallest.items() if f in table})
        if row:
            add(row)
            break
    while uncovered:
        pair = min(uncovered)
        (f1, a), (f2, b) = pair
        row = None
        if chk.ok({f1: a, f2: b}):
            for _ in range(20):
                row = complete({f1: a, f2: b})
                if row:
                    break
        if row is None:
            uncovered.discard(pair)
            infeasible.add(pair)
            continue
        add(row)
    return tuple(rows), frozenset(infeasible)


def realize(scheme: str, row: dict, variant: int = 0) -> tuple[Case, str]:
    """The Case of a design row and the generator of its value class."""
    fmt = row.get("format", "none")
    grouping = row.get("grouping")
    g = _group(grouping, fmt)
    bits = _bits(scheme)
    M = _M_VALUES[row["M"]][variant % len(_M_VALUES[row["M"]])]
    K = pick_k(scheme, fmt, grouping, row.get("groups"), row["K"], variant, VALUE_MIN_K.get(row["values"], 0))
    N = pick_n(scheme, fmt, grouping, row["N"], variant) if "N" in row else 0
    kw = dict(scheme=scheme, weight_format=fmt, M=M, N=N, K=K, act_dtype=row.get("act_dtype", "bfloat16"),
              bias=row.get("bias") == "yes")
    if fmt == "ct-mxfp4" or scheme == "q-mxfp4":
        kw["group_size"] = 32
    else:
        kw["group_size"] = -1 if g is None else g
    if scheme in ("w8a8", "q-int8-token"):
        kw["sym"] = row["activations"] == "sym"
    elif scheme == "q-uint8-tensor":
        kw["sym"] = False
    elif "weights" in row:
        kw["sym"] = row["weights"] == "sym"
    if fmt == "gptq":
        kw["zero_convention"] = row.get("zero_convention", "v1")
    if row.get("act_order", "off") != "off":
        kw["act_order"] = True
    if "scale_dtype" in row:
        kw["scale_dtype"] = row["scale_dtype"]
    if fmt != "none" and scheme != "w4a16-moe":
        kw["bits"] = bits
    if scheme == "w4a16-moe":
        E = int(row["experts"][1:])
        kw.update(E=E, top_k={"top1": 1, "top2": 2, "all": E}[row["routing"]], sym=True)
    return Case(**kw), "vc-" + row["values"]


def case_classes(case: Case, tensors: "dict | None" = None) -> dict:
    """The format and shape classes a case really has, read from its fields (and, for act order, from its
    tensors: a g_idx that is not ``arange(K) // G``): what the design's row claimed, checked."""
    import numpy as np

    s = case.scheme
    table = TABLES[s]
    out = {"M": m_class(case.M), "K": k_class(case.K)}
    if "N" in table:
        out["N"] = n_class(case.N)
    if "format" in table:
        out["format"] = case.weight_format
    if "weights" in table:
        out["weights"] = "sym" if case.sym else "asym"
    if "activations" in table:
        out["activations"] = "sym" if case.act_symmetric else "asym"
    if "zero_convention" in table:
        out["zero_convention"] = (case.zero_convention or "v1") if case.weight_format == "gptq" else "none"
    if "act_order" in table:
        ao = "off"
        if case.act_order:
            ao = "g_idx" if case.weight_format == "gptq" else "weight_g_idx"
            if tensors is not None:
                key = "g_idx" if case.weight_format == "gptq" else "weight_g_idx"
                gi = tensors.get(key)
                if gi is None or np.array_equal(np.asarray(gi), np.arange(case.K) // case.group):
                    ao = "off (no permuted g_idx in the tensors)"
        out["act_order"] = ao
    if "grouping" in table:
        out["grouping"] = "channel" if case.channelwise else f"g{case.group_size}"
    if "groups" in table:
        n = case.K // case.group
        out["groups"] = "1" if n == 1 else ("2" if n == 2 else "many")
    if "bias" in table:
        out["bias"] = "yes" if case.bias else "no"
    if "act_dtype" in table:
        out["act_dtype"] = case.act_dtype
    if "scale_dtype" in table:
        out["scale_dtype"] = case.scale_dtype
    if "experts" in table:
        out["experts"] = f"E{case.E}"
    if "routing" in table:
        out["routing"] = "all" if case.top_k == case.E else f"top{case.top_k}"
    if case.K == pick_k(s, case.weight_format if case.weight_format != "none" else "none",
                        out.get("grouping"), out.get("groups"), "K-min"):
        out["K-min"] = True
    return out


def design_specs(scheme: str, seeds=(0,)) -> list:
    """The coverage cases of ``scheme`` for design seeds ``seeds``: (row, Case, generator, design seed)."""
    out = []
    for d in seeds:
        rows, _ = design(scheme, d)
        for row in rows:
            case, gen = realize(scheme, row, d)
            out.append((row, case, gen, d))
    return out


# -- what a design covers ------------------------------------------------------------------------------
def profile_coverage(scheme: str, seeds=(0,)) -> dict:
    """Classes and pairs of ``TABLES[scheme]`` that the coverage cases of design seeds ``seeds`` hold, read
    from the realized cases (``case_classes``; the value class from the generator, whose realization
    coverage_values.realized checks)."""
    table = TABLES[scheme]
    seeds = tuple(seeds)
    factors = list(table)
    singles, pairs = set(), set()
    n = 0
    for _row, case, gen, _d in design_specs(scheme, seeds):
        n += 1
        cls = case_classes(case)
        cls["values"] = gen[3:]
        got = {(f, cls[f]) for f in factors if f in cls}
        if cls.get("K-min"):
            got.add(("K", "K-min"))
        if "N" in table and case.N == pick_n(scheme, case.weight_format, cls.get("grouping"), "N-min"):
            got.add(("N", "N-min"))
        singles |= got
        for a, b in itertools.combinations(sorted(got, key=lambda x: factors.index(x[0])), 2):
            if a[0] != b[0]:
                pairs.add((a, b))
    all_singles = {(f, v) for f in factors for v in table[f]}
    infeasible = set(design(scheme, seeds[0] if seeds else 0)[1])
    all_pairs = {((f1, a), (f2, b)) for i, f1 in enumerate(factors) for f2 in factors[i + 1:]
                 for a in table[f1] for b in table[f2]}
    feasible = all_pairs - infeasible
    return {"scheme": scheme, "design_seeds": list(seeds), "cases": n,
            "classes": len(all_singles), "classes_covered": len(all_singles & singles),
            "classes_missing": sorted(f"{f}={v}" for f, v in all_singles - singles),
            "pairs": len(all_pairs), "pairs_infeasible": len(infeasible), "pairs_feasible": len(feasible),
            "pairs_covered": len(feasible & pairs),
            "pairs_missing": sorted(f"{a[0]}={a[1]} x {b[0]}={b[1]}" for a, b in feasible - pairs)}
