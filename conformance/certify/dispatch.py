"""Certified dispatch: the fallback op's ``auto`` restricted to kernels certified on this host, the fastest.

Semantics: docs/fallback.md#certified-dispatch.

``CertificationStore`` is the *certifier* qconform_torch's op takes (``op.use_certifications``: an object
with ``labels()`` and ``why_not(label, version, case)``); it lives here because reading and verifying
bundles is the suite's business, and qconform_torch sits below the suite (docs/fallback.md#layers).

A certification bundle (``qconform certify --backend B``, docs/certification.md) records, per backend
and case, the verdict of the conformance suite on the host that wrote it. Given bundles
(``op.use_certifications(CertificationStore([...]))``; ``qconform model --certified DIR`` or
``QCONFORM_CERTIFIED``), a backend may take
a layer's Case only if all of this holds:

1. the bundle verifies (``verify_bundle``: files, records, every verdict recomputed from its stored
   outputs by the suite running now) and is a whole certification (no shard, the exact, edge and
   random tiers); a bundle that is not is an error, never skipped quietly;
2. it was written on this host: the same CPU model, machine, CPU count and the CPU flags the suite
   records (AVX*, AMX*, FMA, F16C, SSE4) as ``conformance.run.provenance.environment()`` reads here now;
3. the backend spec and its library version are the ones installed now; a dispatcher (``auto``) or the
   emulator is never a candidate, whatever a bundle says of it;
4. the Case's *family* (every Case field but M, N and K: scheme, format, code width where the format has
   a choice, group size, symmetry, act order, zero convention, activation, output and scale dtypes, bias,
   experts) has at least one
   judged case in the bundles, every judged case of the family in every given bundle passed (``pass``,
   ``pass-with-tie-flips``, ``quality-warning``; ``pass-sqnr`` only for opaque arithmetic where allowed;
   a fail, crash, timeout or waiver in any bundle withholds it), and the Case's K is at most the largest
   K that passed (accumulation length is where sums overflow or lose precision: no extrapolation);
5. the dispatcher's own rules still hold for this Case (``backends.registry.refusal``: no semantic
   deviation, no known kernel defect, a declaration).

The store is the certifier of the dispatcher's ``CertifiedFastest`` policy (backends/dispatch.py), handed
to it from above (``op.use_certifications``): backends never import the suite. Among the backends that pass,
the op's dispatcher times each, with the emulator backend's fast path, on the layer's first call at each
shape class (one warm-up and the best of three runs on the real input) and keeps the fastest. None passes:
the fast path.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from conformance.judge.verdict import Verdict

__all__ = ["CertificationError", "CertificationStore", "family_key", "PASSING", "host_identity",
           "checkpoint_families"]

#: verdicts that certify a judged case (quality-warning: inside the contract, at its edge): ``Verdict.passing``
PASSING = frozenset(v.value for v in Verdict if v.passing)
#: verdicts that neither certify nor withhold (not judged, or agreement that proves nothing): ``Verdict.neutral``
NEUTRAL = frozenset(v.value for v in Verdict if v.neutral)
#: Case fields a family leaves out: the shape
SHAPE_FIELDS = ("M", "N", "K")


class CertificationError(ValueError):
    """A certification bundle that cannot be used (one line: which bundle, what is wrong)."""


#: formats whose code width is a choice (4 or 8 bits); the others fix it (int8, E2M1), and their Cases'
#: ``bits`` field carries no meaning (the suite leaves its default, a checkpoint layer says 8)
_WIDTH_FORMATS = frozenset({"gptq", "awq", "ct-pack-quantized"})


def family_key(case_json: dict) -> str:
    """The family of a Case given as its ``to_json()`` dict: every field but the shape (and ``bits`` where
    the format fixes the width), canonical JSON."""
    drop = set(SHAPE_FIELDS) | {"K_max"} | (set() if case_json.get("weight_format") in _WIDTH_FORMATS else {"bits"})
    return json.dumps({k: v for k, v in case_json.items() if k not in drop}, sort_keys=True)


def host_identity(env: dict) -> dict:
    """What must match between the certifying host and this one (the CPU count too: kernels split work by
    thread, and a float kernel's summation order may follow)."""
    return {"cpu": env.get("cpu"), "machine": env.get("machine"), "cpu_count": env.get("cpu_count"),
            "cpu_flags": sorted(env.get("cpu_flags") or [])}


#: backends that are never dispatch candidates: the dispatcher itself and the reference fallback
NOT_CANDIDATES = frozenset({"auto", "emulator"})
#: the tiers a whole certification runs (golden is a profile's option)
WHOLE_TIERS = frozenset({"exact", "edge", "random"})


@dataclasses.dataclass
class _Family:
    passed: int = 0
    withheld: list = dataclasses.field(default_factory=list)  # (case id, verdict) of the non-passing
    opaque_passed: int = 0
    max_k: int = 0  # the largest K among the passing cases


@dataclasses.dataclass
class _BackendCert:
    bundle: str
    label: str
    version: str | None
    families: dict  # family key -> _Family


class CertificationStore:
    """The certifications of this host, read from bundles; ``why_not(backend, case)`` is None where the
    backend is certified for the case (points 2-4 of the module docstring), else the reason."""

    def __init__(self, bundles, *, here: dict | None = None):
        from conformance.run.provenance import environment
        from conformance.certify.verify import verify_bundle

        self.paths = [str(p) for p in bundles]
        if not self.paths:
            raise CertificationError("no certification bundle given")
        here_env = environment() if here is None else here
        self.here = host_identity(here_env)
        self.certs: dict[str, list[_BackendCert]] = {}
        self.other_host: dict[str, str] = {}  # bundle -> why it certifies nothing here
        for p in self.paths:
            folder = Path(p)
            if not folder.is_dir():
                raise CertificationError(f"certification bundle {p}: not a folder")
            v = verify_bundle(folder)
            if not v.ok:
                raise CertificationError(f"certification bundle {p} does not verify: {v.problems[0]}")
            meta = json.loads((folder / "bundle.json").read_text(encoding="utf-8"))
            if meta.get("shard") or not WHOLE_TIERS <= set(meta.get("tiers") or ()):
                raise CertificationError(f"certification bundle {p} is a partial certification (shard "
                                         f"{meta.get('shard')}, tiers {meta.get('tiers')}): certified dispatch "
                                         "needs a whole one (no --shard; the exact, edge and random tiers)")
            try:
                env = json.loads((folder / "environment.json").read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise CertificationError(f"certification bundle {p}: environment.json unreadable ({e})") from None
            theirs = host_identity(env)
            if theirs != self.here:
                diff = [k for k in self.here if self.here[k] != theirs[k]]
                self.other_host[p] = (f"written on another host ({', '.join(diff)} differ: "
                                      f"{theirs.get('cpu')!r} vs this {self.here.get('cpu')!r})")
                continue
            versions = {b.get("spec") or b.get("backend"): b.get("version") for b in env.get("backends", [])}
            by_label: dict[str, _BackendCert] = {}
            with open(folder / "results.jsonl", encoding="utf-8") as f:
                for line in f:
                    rec = json.loads(line)
                    if rec.get("kind") != "result":
                        continue
                    label = rec["backend"]
                    if label.split(":", 1)[0] in NOT_CANDIDATES:
                        continue
                    cert = by_label.setdefault(label, _BackendCert(p, label, versions.get(label), {}))
                    fam = cert.families.setdefault(family_key(rec["spec"]["case"]), _Family())
                    verdict = rec.get("verdict")
                    if verdict in PASSING:
                        fam.passed += 1
                        fam.max_k = max(fam.max_k, int(rec["spec"]["case"]["K"]))
                    elif verdict == "pass-sqnr":
                        fam.opaque_passed += 1
                    elif verdict not in NEUTRAL:
                        fam.withheld.append((rec.get("case_id"), verdict))
            for label, cert in by_label.items():
                self.certs.setdefault(label, []).append(cert)

    def labels(self) -> list[str]:
        """Backend specs certified on this host by some bundle (in the order first seen; never ``auto`` or the
        emulator)."""
        return list(self.certs)

    def why_not(self, label: str, version: str | None, case, *, allow_opaque: bool = False) -> str | None:
        certs = self.certs.get(label)
        if not certs:
            elsewhere = "; ".join(f"{p}: {why}" for p, why in self.other_host.items())
            return "no certification on this host" + (f" ({elsewhere})" if elsewhere else "")
        key = family_key(case.to_json())
        reasons, evidence = [], []
        for cert in certs:
            if cert.version != version:
                reasons.append(f"{cert.bundle} certified version {cert.version}, installed {version}")
                continue
            fam = cert.families.get(key)
            if fam is None:
                reasons.append(f"{cert.bundle} has no case of this family{_nearest(key, cert.families)}")
                continue
            if fam.withheld:  # one failing bundle withholds the family, whatever the others say
                cid, verdict = fam.withheld[0]
                return (f"not certified for this family: {cert.bundle}: {len(fam.withheld)} case(s) of this family "
                        f"did not pass (e.g. {verdict}: {cid})")
            evidence.append((cert, fam))
        passing = [(c, f) for c, f in evidence if f.passed or (allow_opaque and f.opaque_passed)]
        if not passing:
            reasons += [f"{c.bundle}: no case of this family passed" +
                        (" (pass-sqnr only: opaque arithmetic)" if f.opaque_passed else "") for c, f in evidence]
            return "not certified for this family: " + "; ".join(reasons)
        max_k = max(f.max_k for _, f in passing)
        if case.K > max_k:
            return (f"certified for this family up to K = {max_k} only, this layer has K = {case.K} (certify "
                    "--for-model certifies the checkpoint's own K)")
        return None


def _nearest(key: str, families: dict) -> str:
    """'' or ' (nearest certified: act_dtype float32, not bfloat16)': the fields that differ from the bundle's
    closest family of the same scheme and format, so a user sees e.g. a --dtype mismatch at once."""
    want = json.loads(key)
    best = None
    for other in families:
        have = json.loads(other)
        if (have.get("scheme"), have.get("weight_format")) != (want.get("scheme"), want.get("weight_format")):
            continue
        diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
        if best is None or len(diff) < len(best[0]):
            best = (diff, have)
    if best is None:
        return f" (none of {want.get('scheme')}/{want.get('weight_format')})"
    diff, have = best
    return " (nearest certified: " + ", ".join(f"{k} {have.get(k)}, not {want.get(k)}" for k in diff) + ")"


def checkpoint_families(folder, act_dtype: str = "float32") -> tuple[list[dict], list[str]]:
    """(the distinct case families of a checkpoint's layers at ``act_dtype`` activations, each with ``K_max``,
    the largest K of its layers; the layers no Case describes: they always run the reference). What
    ``qconform certify --for-model`` certifies."""
    from emulator.checkpoint import Checkpoint
    from emulator.errors import UnsupportedFormatError
    from emulator.layer_cases import layer_case
    from emulator.layers import declared_activation

    fams: dict[str, dict] = {}
    reference_only = []
    for info in Checkpoint(folder).layers():
        if len(info.shape) != 2:
            reference_only.append(info.name)
            continue
        try:
            case = layer_case(info, 1, act_dtype, declared_activation(info))
        except UnsupportedFormatError:
            reference_only.append(info.name)
            continue
        fam = {k: v for k, v in case.to_json().items() if k not in SHAPE_FIELDS}
        entry = fams.setdefault(json.dumps(fam, sort_keys=True), dict(fam, K_max=0))
        entry["K_max"] = max(entry["K_max"], int(info.shape[-1]))  # certified at the model's own K
    return [fams[k] for k in sorted(fams)], reference_only
