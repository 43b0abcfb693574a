"""The case list: deterministic, profile-dependent, shardable.

Semantics: docs/conformance.md#cases.

A ``CaseSpec`` is a ``Case`` (scheme, format, parameters, shapes, dtypes) plus
a tier, a generator name and a seed. Its ``case_id`` is a stable string; the
list for a (schemes, tiers, profile) is a pure function of its arguments, so
``--shard i/n`` on several hosts covers it exactly once and the shards' JSONL
files merge into one result set.
"""

from __future__ import annotations

import hashlib
import json
import time

from backends.base import Case

from conformance.cases.generators import GENERATORS, generators_for
from conformance.cases.specs import PROFILES, TIERS, CaseSpec

__all__ = ["TIERS", "PROFILES", "CaseSpec", "scheme_grid", "quantize_grid", "family_cases", "case_list", "shard", "list_hash", "parse_shard"]

def scheme_grid(shapes) -> list[Case]:
    """Every scheme x format x parameter combination, at the given (M, N, K) shapes."""
    out: list[Case] = []
    for (M, N, K) in shapes:
        for act in ("bfloat16", "float16"):
            for g in (32, 128):
                if K % g:
                    continue
                out += [
                    Case("w4a16", "gptq", M, N, K, group_size=g, sym=True, zero_convention="v1", act_dtype=act),
                    Case("w4a16", "gptq", M, N, K, group_size=g, sym=False, zero_convention="v2", act_dtype=act,
                         bias=True),
                    Case("w4a16", "awq", M, N, K, group_size=g, sym=False, act_dtype=act),
                    Case("w4a16", "ct-pack-quantized", M, N, K, group_size=g, sym=True, act_dtype=act,
                         scale_dtype="bfloat16"),
                    Case("w4a16", "ct-pack-quantized", M, N, K, group_size=g, sym=False, act_dtype=act),
                    Case("w4a8", "ct-pack-quantized", M, N, K, group_size=g, sym=True, act_dtype=act),
                    Case("w4a8", "gptq", M, N, K, group_size=g, sym=True, zero_convention="v1", act_dtype=act),
                ]
            out += [
                Case("w4a16", "gptq", M, N, K, group_size=32, sym=False, zero_convention="v1", act_order=True,
                     act_dtype=act),
                Case("w4a16", "ct-pack-quantized", M, N, K, group_size=-1, sym=True, act_dtype=act),
                Case("w8a8", "ct-int-quantized", M, N, K, group_size=-1, act_dtype=act, scale_dtype="bfloat16"),
                Case("w8a8", "ct-int-quantized", M, N, K, group_size=-1, act_dtype=act, bias=True,
                     scale_dtype="float32"),
                Case("w4a16-mxfp4", "ct-mxfp4", M, N, K, group_size=32, act_dtype=act),
                Case("w4a4-mxfp4", "ct-mxfp4", M, N, K, group_size=32, act_dtype=act),
                Case("w4a16-moe", "gptq", M, min(N, 64), K, group_size=32, sym=True, act_dtype=act, E=4, top_k=2),
                Case("w8a16", "ct-int-quantized", M, N, K, group_size=-1, act_dtype=act, scale_dtype="bfloat16"),
            ]
        out.append(Case("w4a16", "gptq", M, N, K, group_size=32, sym=True, zero_convention="v1", act_dtype="float32"))
        if K % 128 == 0:
            out.append(Case("w8a16", "gptq", M, N, K, group_size=128, sym=True, zero_convention="v1", bits=8))
    # K equal to the group size
    out.append(Case("w4a16", "gptq", 2, 40, 128, group_size=128, sym=False, zero_convention="v2"))
    # square scale matrices (K / G == N, and K / 32 == N for MXFP4): a kernel that reads the scales
    # transposed passes every shape check here and only here
    out += [
        Case("w4a16", "gptq", 3, 16, 512, group_size=32, sym=True, zero_convention="v1"),
        Case("w4a16", "awq", 3, 16, 512, group_size=32, sym=False),
        Case("w4a16", "ct-pack-quantized", 3, 16, 512, group_size=32, sym=False),
        Case("w4a16-mxfp4", "ct-mxfp4", 3, 16, 512, group_size=32),
    ]
    # K not a multiple of 16 (vectorised kernels without a K tail), bf16 activations
    out.append(Case("w8a16", "ct-int-quantized", 4, 64, 40, group_size=-1, scale_dtype="bfloat16"))
    # channel-wise MoE experts with I != K (w13 and w2 have different group sizes)
    out.append(Case("w4a16-moe", "gptq", 5, 64, 128, group_size=-1, sym=True, E=4, top_k=2))
    return out + quantize_grid(shapes)


def quantize_grid(shapes) -> list[Case]:
    """The quantize-only cases (docs/conformance.md#quantize-only-cases): activations [M, K] alone (N = 0)."""
    out: list[Case] = []
    for (M, _N, K) in shapes:
        out += [
            Case("q-int8-token", "none", M, 0, K, group_size=-1, sym=True, act_dtype="bfloat16"),
            Case("q-int8-token", "none", M, 0, K, group_size=-1, sym=False, act_dtype="bfloat16"),
            Case("q-int8-token", "none", M, 0, K, group_size=-1, sym=True, act_dtype="float16"),
            Case("q-int8-token", "none", M, 0, K, group_size=-1, sym=False, act_dtype="float32"),
            Case("q-uint8-tensor", "none", M, 0, K, group_size=-1, sym=False, act_dtype="float32"),
            Case("q-mxfp4", "none", M, 0, K, group_size=32, act_dtype="bfloat16"),
            Case("q-mxfp4", "none", M, 0, K, group_size=32, act_dtype="float32"),
        ]
    return out


def family_cases(families: list[dict], shapes) -> list[Case]:
    """Cases of the ``families`` profile: each family (a Case's fields but M, N, K; optionally ``K_max``, the
    largest K a checkpoint's layers of the family have) at each (M, N, K) of ``shapes`` and, with ``K_max``,
    at (1, 64, K_max) and (5, 64, K_max); K widened to at least two groups of the family and a multiple of
    its group (and of 32, the MX block and every packing), N to 64 for MoE blocks."""
    out: list[Case] = []
    for fam in families:
        if not isinstance(fam, dict) or {"M", "N", "K"} & set(fam):
            raise ValueError(f"a case family is a Case's fields without M, N and K, got {fam!r}")
        fam = dict(fam)
        k_max = fam.pop("K_max", None)
        g = int(fam.get("group_size") or -1)
        extra = [] if not k_max else [(1, 64, int(k_max)), (5, 64, int(k_max))]
        for (M, N, K) in list(shapes) + [s for s in extra if s not in shapes]:
            unit = max(32, g if g > 0 else 32)
            k = max(K, 2 * g if g > 0 else K)
            k = -(-k // unit) * unit
            n = min(N, 64) if fam.get("E") else N
            try:
                out.append(Case(**{**fam, "M": M, "N": n, "K": k}))
            except (TypeError, ValueError) as e:
                raise ValueError(f"case family {fam!r} is not a valid case: {e}") from None
    return out


def case_list(schemes=None, tiers=TIERS, profile: str = "ci", formats=None,
              base_seed: "int | None" = None, families: "list[dict] | None" = None) -> list[CaseSpec]:
    """The ordered, de-duplicated case list for a profile.

    An unknown scheme, tier, weight format or profile raises ValueError (docs/conformance.md#usage-errors):
    a typo must not select fewer cases. A profile with ``fresh_seeds`` (nightly) draws its seeds from
    ``base_seed`` (default: the current time); give the recorded one to re-derive a list (certification
    bundles record it). The ``families`` profile takes ``families`` (Case fields without the shape; e.g.
    from ``qconform certify --for-model``); every other profile refuses them.
    """
    from conformance.cases.selection import check_selection

    check_selection(schemes=schemes, tiers=tiers, profile=profile, formats=formats)
    prof = PROFILES[profile]
    if (prof.get("cases") == "families") != (families is not None):
        raise ValueError("profile 'families' takes the case families of a checkpoint (qconform certify --for-model "
                         "CKPT)" if families is None else f"case families given with profile {profile!r}: they "
                         "belong to profile 'families'")
    if families is not None and not families:
        raise ValueError("profile 'families': no case family given")
    if not prof["fresh_seeds"]:
        base_seed = 0
    elif base_seed is None:
        base_seed = int(time.time())
    specs: list[CaseSpec] = []
    seen = set()
    for case, gens in _profile_cases(prof, [t for t in tiers if t != "golden"], families):
        if schemes and case.scheme not in schemes:
            continue
        if formats and case.weight_format not in formats:
            continue
        for gen in gens:
            tier = GENERATORS[gen][0]
            n_seeds = prof["seeds"] if tier == "random" else 1
            for s in range(n_seeds):
                seed = _seed(case, gen, base_seed + s)
                spec = CaseSpec(case, tier, gen, seed)
                if spec.case_id not in seen:
                    seen.add(spec.case_id)
                    specs.append(spec)
    if "edge" in tiers and prof.get("coverage"):  # the covering design over the feature tables
        from conformance.cases.coverage import TABLES, design_specs

        for scheme in TABLES:
            if schemes and scheme not in schemes:
                continue
            for _row, case, gen, d in design_specs(scheme, tuple(prof["coverage"])):
                if formats and case.weight_format not in formats:
                    continue
                spec = CaseSpec(case, "edge", gen, _seed(case, gen, base_seed + d))
                if spec.case_id not in seen:
                    seen.add(spec.case_id)
                    specs.append(spec)
    if "golden" in tiers and prof.get("golden", True):
        from conformance.cases.golden import golden_specs

        for spec in golden_specs():
            if (not schemes or spec.case.scheme in schemes) and (not formats or spec.case.weight_format in formats):
                specs.append(spec)
    return specs


def _profile_cases(prof: dict, tiers, families=None):
    """(case, generator names) of a profile: the scheme grid at its shapes with every generator of the
    tiers, or the model profile's own cases with its one generator (conformance/cases/model_profile.py)."""
    if prof.get("cases") == "model":
        from conformance.cases.model_profile import MODEL_GENERATOR, model_cases

        gens = [MODEL_GENERATOR] if GENERATORS[MODEL_GENERATOR][0] in tiers else []
        return [(case, gens) for case in model_cases()]
    if prof.get("cases") == "families":
        return [(case, generators_for(case, tiers)) for case in family_cases(families, prof["shapes"])]
    return [(case, generators_for(case, tiers)) for case in scheme_grid(prof["shapes"])]


def _seed(case: Case, gen: str, s: int) -> int:
    h = hashlib.sha256(json.dumps([case.to_json(), gen, s], sort_keys=True).encode()).digest()
    return int.from_bytes(h[:4], "little")


def parse_shard(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    try:
        i, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard expects i/n (e.g. 1/4), got {text!r}") from None
    if not (n >= 1 and 1 <= i <= n):
        raise ValueError(f"--shard {text}: need 1 <= i <= n")
    return i, n


def shard(specs: list[CaseSpec], i: int, n: int) -> list[CaseSpec]:
    """Shard i of n (1-based): a stable partition by case id hash, so shards stay balanced and disjoint."""
    out = []
    for s in specs:
        h = int.from_bytes(hashlib.sha256(s.case_id.encode()).digest()[:8], "little")
        if h % n == i - 1:
            out.append(s)
    return out


def list_hash(specs: list[CaseSpec]) -> str:
    h = hashlib.sha256()
    for s in specs:
        h.update(s.case_id.encode() + b"\n")
    return h.hexdigest()
