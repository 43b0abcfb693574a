"""Certified dispatch: the fallback op's ``auto`` restricted to kernels certified on this host, the fastest.

Semantics: docs/fallback.md#certified-dispatch.

``CertificationStore`` is the *certifier* qconform_torch's op takes (``op.use_certifications``: an object
with ``labels()`` and ``why_not(label, version, case)``); it lives here because reading and verifying
bundles is the suite's business, and qconform_torch sits below the suite (docs/fallback.md#layers).

A certification bundle (``qconform certify --backend B``, docs/certification.md) records, per backend
and case, the verdict of the conformance suite on the host that wrote it. Given bundles
(``op.use_certifications(CertificationStore([...]))``; ``qconform model --certified DIR``;
``QCONFORM_CERTIFIED``), a backend may take
a layer's Case only if all of this holds:

1. the bundle verifies (``verify_bundle``: files, records, every verdict recomputed from its stored
   outputs by the suite running now); a bundle that does not is an error, never skipped quietly;
2. it was written on this host: the same CPU model, machine and the CPU flags the suite records
   (AVX*, AMX*, FMA, F16C, SSE4) as ``conformance.provenance.environment()`` reads here now;
3. the backend spec and its library version are the ones installed now;
4. the Case's *family* (every Case field but M, N and K: scheme, format, code width where the format has
   a choice, group size, symmetry, act order, zero convention, activation, output and scale dtypes, bias,
   experts) has at least one
   judged case in the bundle, and every judged case of the family passed (``pass``,
   ``pass-with-tie-flips``, ``quality-warning``; ``pass-sqnr`` only for opaque arithmetic where allowed).
   A fail, crash, timeout or waiver anywhere in the family withholds it;
5. the dispatcher's own rules still hold for this Case (``backends.registry.refusal``: no semantic
   deviation, no known kernel defect, a declaration).

Among the backends that pass, the op times each on the layer's first call at that M (one warm-up and
the best of three runs on the real input; qconform_torch/op.py) and keeps the fastest. None passes:
the emulator.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

__all__ = ["CertificationError", "CertificationStore", "family_key", "PASSING", "host_identity", "bundles_from_env",
           "checkpoint_families"]

#: verdicts that certify a judged case (quality-warning: inside the contract, at its edge)
PASSING = frozenset({"pass", "pass-with-tie-flips", "quality-warning"})
#: verdicts that neither certify nor withhold (not judged, or agreement that proves nothing)
NEUTRAL = frozenset({"unsupported", "mistrusted"})
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
    drop = set(SHAPE_FIELDS) | (set() if case_json.get("weight_format") in _WIDTH_FORMATS else {"bits"})
    return json.dumps({k: v for k, v in case_json.items() if k not in drop}, sort_keys=True)


def host_identity(env: dict) -> dict:
    """What must match between the certifying host and this one."""
    return {"cpu": env.get("cpu"), "machine": env.get("machine"), "cpu_flags": sorted(env.get("cpu_flags") or [])}


@dataclasses.dataclass
class _Family:
    passed: int = 0
    withheld: list = dataclasses.field(default_factory=list)  # (case id, verdict) of the non-passing
    opaque_passed: int = 0


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
        from ..provenance import environment
        from .verify import verify_bundle

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
                    cert = by_label.setdefault(label, _BackendCert(p, label, versions.get(label), {}))
                    fam = cert.families.setdefault(family_key(rec["spec"]["case"]), _Family())
                    verdict = rec.get("verdict")
                    if verdict in PASSING:
                        fam.passed += 1
                    elif verdict == "pass-sqnr":
                        fam.opaque_passed += 1
                    elif verdict not in NEUTRAL:
                        fam.withheld.append((rec.get("case_id"), verdict))
            for label, cert in by_label.items():
                self.certs.setdefault(label, []).append(cert)

    def labels(self) -> list[str]:
        """Backend specs certified on this host by some bundle (in the order first seen)."""
        return list(self.certs)

    def why_not(self, label: str, version: str | None, case, *, allow_opaque: bool = False) -> str | None:
        certs = self.certs.get(label)
        if not certs:
            elsewhere = "; ".join(f"{p}: {why}" for p, why in self.other_host.items())
            return "no certification on this host" + (f" ({elsewhere})" if elsewhere else "")
        key = family_key(case.to_json())
        reasons = []
        for cert in certs:
            if cert.version != version:
                reasons.append(f"{cert.bundle} certified version {cert.version}, installed {version}")
                continue
            fam = cert.families.get(key)
            if fam is None:
                reasons.append(f"{cert.bundle} has no case of this family")
                continue
            if fam.withheld:
                cid, verdict = fam.withheld[0]
                reasons.append(f"{cert.bundle}: {len(fam.withheld)} case(s) of this family did not pass "
                               f"(e.g. {verdict}: {cid})")
                continue
            if fam.passed or (allow_opaque and fam.opaque_passed):
                return None
            reasons.append(f"{cert.bundle}: no case of this family passed" +
                           (" (pass-sqnr only: opaque arithmetic)" if fam.opaque_passed else ""))
        return "not certified for this family: " + "; ".join(reasons)


def checkpoint_families(folder, act_dtype: str = "float32") -> tuple[list[dict], list[str]]:
    """(the distinct case families of a checkpoint's layers at ``act_dtype`` activations, the layers no Case
    describes: they always run the reference). What ``qconform certify --for-model`` certifies."""
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
        fams.setdefault(json.dumps(fam, sort_keys=True), fam)
    return [fams[k] for k in sorted(fams)], reference_only


def bundles_from_env() -> list[str]:
    """``QCONFORM_CERTIFIED``: bundle folders separated by os.pathsep (empty: none)."""
    raw = os.environ.get("QCONFORM_CERTIFIED", "")
    return [p for p in raw.split(os.pathsep) if p.strip()]
