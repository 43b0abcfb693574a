"""Writing a certification bundle: run in ``<out>.partial``, derive, seal, rename into place.

Semantics and layout: docs/certification.md#certification-bundles.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

from emulator import __version__ as emulator_version
from emulator.errors import QconformError

from conformance.run.outlock import LOCK_NAME, OutLock
from conformance.certify.codec import StoredCase, case_key, encode_case, pack_outputs, safe_label
from conformance.certify.derive import (backend_lines, declared_table, environment_record, json_bytes, latest_results, report_title,
                     reports, run_headers, verdict_summary, waiver_record)
from conformance.certify.files import hash_file, scan
from conformance.certify.identity import BUNDLE_FORMAT, MANIFEST, suite_code_sha256

__all__ = ["CertifyOptions", "CertifyResult", "certify", "add_files", "seal", "STAGING", "search_by_default", "SHAPE_PROFILES"]

STAGING = ".staging"  # <parent>/.<out>.staging: each judged output, encoded, until the bundle is sealed
PARTIAL = ".partial"


class Stager:
    """Runner.on_output callback: encodes each judged output into DIR/.staging/<backend>/<case>.safetensors."""

    def __init__(self, folder: Path):
        self.folder = folder

    def __call__(self, label, spec, inp, declared, iv, y, rec, judgement) -> None:
        from emulator.tensorfile import save_tensors

        from conformance.judge.verdict import Verdict

        if spec.case.spec.quantize_only:  # y: the observed tensors, judgement: the expected ones
            self._quantized(label, spec, y, judgement)
            return
        # the intervals the verdict was decided on, as judge() formed them: never recomputed here
        loose, jiv = judgement.loose, judgement.judged
        # the intervals the verdict used beyond the declared one (as judged, before waivers)
        ev = judgement.evidence
        alt = ev.alt if judgement.verdict is Verdict.FAIL else None
        tie = ev.tie if judgement.verdict in (Verdict.FAIL, Verdict.PASS_WITH_TIE_FLIPS) else None
        tensors, meta = encode_case(StoredCase(y, loose.y_ref, loose.lo, loose.hi, loose.y_exact, loose.out_dtype,
                                               bound_positive=bool(jiv.bound.max(initial=0) > 0),
                                               judged=(jiv.lo, jiv.hi), tie=tie, alt=alt))
        d = self.folder / safe_label(label)
        d.mkdir(parents=True, exist_ok=True)
        save_tensors(d / f"{case_key(spec.case_id)}.safetensors", tensors,
                     metadata={"case_id": spec.case_id, "backend": label, "meta": json.dumps(meta)})


    def _quantized(self, label, spec, observed: dict, expected: dict) -> None:
        """A quantize-only case: the observed and expected tensors as they are (docs/certification.md)."""
        from emulator.tensorfile import save_tensors

        tensors = {f"obs.{k}": v for k, v in observed.items()}
        tensors.update({f"exp.{k}": v for k, v in expected.items()})
        d = self.folder / safe_label(label)
        d.mkdir(parents=True, exist_ok=True)
        meta = {"kind": "quantize", "observed": sorted(observed), "expected": list(expected)}
        save_tensors(d / f"{case_key(spec.case_id)}.safetensors", tensors,
                     metadata={"case_id": spec.case_id, "backend": label, "meta": json.dumps(meta)})


@dataclasses.dataclass
class CertifyResult:
    path: Path
    ok: bool  # certified: every backend available and judged on at least one case, no fail/crash/timeout
    n_results: int
    n_bad: int
    manifest_sha256: str  # the bundle's identity: sha256 of its MANIFEST.json
    counts: dict
    unavailable: dict = dataclasses.field(default_factory=dict)  # backend label -> why it could not run
    no_judged_case: list = dataclasses.field(default_factory=list)  # backends that refused every case


def seal(folder: Path) -> str:
    """Write MANIFEST.json (sha256 and size of every other file); returns its own sha256."""
    files, problems = scan(folder)
    if problems:
        raise QconformError(f"{folder}: cannot seal a bundle: {problems[0]}")
    entries = {}
    for rel in sorted(files):
        if rel == MANIFEST:
            continue
        sha, n, _ = hash_file(folder / rel)
        entries[rel] = {"sha256": sha, "bytes": n}
    (folder / MANIFEST).write_text(json.dumps({"format": BUNDLE_FORMAT, "files": entries}, indent=1, sort_keys=True)
                                   + "\n", encoding="utf-8")
    return hash_file(folder / MANIFEST)[0]


def _check_target(folder: Path) -> None:
    if (folder / MANIFEST).exists():
        raise QconformError(f"{folder}: already holds a sealed bundle (MANIFEST.json); choose another --out")
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise QconformError(f"{folder}: exists and is not empty (and is not a bundle); choose another --out")


#: profiles whose cases are given shapes (a checkpoint's layers, the model profile's Llama / Qwen / gpt-oss layers):
#: certify runs no property search for them by default, since the search draws every shape of a scheme
SHAPE_PROFILES = frozenset({"families", "model"})


def search_by_default(profile: str) -> bool:
    """Whether certify runs the seeded property search when neither --no-search nor search=True is given."""
    return profile not in SHAPE_PROFILES


@dataclasses.dataclass(frozen=True)
class CertifyOptions:
    """What ``certify`` runs and how: the case selection, the run's limits, the property search and where the
    cases run. ``qconform certify``'s options build one (conformance/certify/cli.py); a caller of ``certify``
    passes one, or its fields as keywords (docs/certification.md)."""

    profile: str = "certification"
    schemes: "list[str] | None" = None  # None: every scheme of the profile
    tiers: "list[str] | None" = None  # None: every tier
    shard: "str | None" = None  # "i/n"
    waivers: "str | Path | None" = None
    jobs: int = 1
    timeout: float = 120.0  # seconds a case may take
    host_label: "str | None" = None  # the host's name in the bundle (default: the environment's)
    memory_limit: object = None  # the runner's per-worker limit
    #: the case families to certify (profile ``families``), recorded in bundle.json (docs/certification.md#families)
    families: "list[dict] | None" = None
    #: the property tier's bounded search after the case list (None: ``search_by_default(profile)``), with seed
    #: ``search_seed`` and ``search_examples`` examples per family (None: the profile's budget); recorded in
    #: bundle.json ``search`` and under search/ (docs/certification.md#coverage-and-search)
    search: "bool | None" = None
    search_seed: int = 0
    search_examples: "int | None" = None
    placement: object = None  # devices and executor (conformance/run/placement.py), or None: this host


def certify(backends: list[str], out: "str | Path" = "qconform-certification", options: "CertifyOptions | None" = None,
            *, extra_files: dict | None = None, progress: bool = False, log=print, **fields) -> CertifyResult:
    """Run the suite on ``backends`` and write a certification bundle into ``out``.

    ``options`` (a CertifyOptions; its fields may also be given as keywords, which replace the options'):
    what runs and how. The run happens in ``<out>.partial`` (an interrupted certify of the same case list
    resumes there); the sealed bundle is renamed to ``out``, which must not exist or be an empty folder. The
    lock ``.<out>.qconform-lock`` (next to ``out``) keeps a second certify out while this one writes.
    ``extra_files`` ({name: bytes | str | Path}) are stored under extra/.
    """
    opts = _checked_options(backends, dataclasses.replace(options or CertifyOptions(), **fields))
    folder = Path(out)
    _check_target(folder)
    lock = OutLock.beside(folder).acquire()
    try:
        _check_target(folder)
        work, staging = _work_folder(folder), _staging_folder(folder)
        base_seed, specs = _selected_cases(work, opts)
        ids = [s.case_id for s in specs]
        _claim_work(work, ids)
        from conformance.run.runner import load_waivers

        wv = load_waivers(opts.waivers)
        header = _run_header(backends, opts, base_seed, specs, wv)
        host = header["host_label"]
        search_args = {"seed": int(opts.search_seed), "examples": opts.search_examples} if opts.search else None
        _run_cases(folder, backends, specs, header, wv, opts, progress, log)
        if search_args is not None:  # the bounded, seeded search, in its own runner folder search/
            from conformance.certify.coverage_search import SearchSpec, run_search, search_schemes

            spec = SearchSpec(profile=opts.profile, schemes=search_schemes(opts.schemes, opts.families),
                              seed=search_args["seed"], examples=opts.search_examples)
            run_search(work, list(backends), spec, timeout=opts.timeout, waivers=wv, log=log)
        return _seal_into(folder, work, staging, ids, dict(header, host_label=host, search=search_args), extra_files)
    finally:
        lock.release()


def _work_folder(folder: Path) -> Path:
    """Where the run happens until the sealed bundle is renamed to ``folder``."""
    return folder.with_name(folder.name + PARTIAL)


def _staging_folder(folder: Path) -> Path:
    """Where the encoded outputs wait outside the bundle until it is in place: an interruption anywhere before
    the rename leaves them for the resumed run (which skips the cases they belong to)."""
    return folder.with_name(f".{folder.name}{STAGING}")


def _checked_options(backends: list[str], opts: CertifyOptions) -> CertifyOptions:
    """The options with tiers and search resolved, or ValueError before any case runs or any file is written."""
    from conformance.cases.suite import PROFILES, TIERS

    if not backends:
        raise ValueError("certify: give at least one --backend")
    from conformance.cases.selection import check_backends

    check_backends(backends)  # an unknown name or parameter: exit 2 before any case runs or any file is written
    tiers = tuple(opts.tiers) if opts.tiers else TIERS
    for t in tiers:
        if t not in TIERS:
            raise ValueError(f"unknown tier {t!r}; known: {', '.join(TIERS)}")
    if opts.profile not in PROFILES:
        raise ValueError(f"unknown profile {opts.profile!r}; known: {', '.join(PROFILES)}")
    search = search_by_default(opts.profile) if opts.search is None else opts.search
    if search:  # the search needs Hypothesis: say so before any case runs
        try:
            import hypothesis  # noqa: F401
        except ModuleNotFoundError:
            raise ValueError("certify runs the property search, which needs Hypothesis: pip install hypothesis "
                             "(or --no-search: the certificate then says no search was run)") from None
        if opts.search_examples is not None and int(opts.search_examples) < 1:
            raise ValueError(f"--search-examples expects a number >= 1, got {opts.search_examples}")
    return dataclasses.replace(opts, tiers=tiers, search=search)


def _selected_cases(work: Path, opts: CertifyOptions) -> tuple:
    """(base seed, the case specs): the profile's case list (fresh-seed profiles keep a resumed run's seed), sharded."""
    from conformance.cases.suite import PROFILES, case_list, parse_shard
    from conformance.cases.suite import shard as do_shard

    base_seed = None
    if PROFILES[opts.profile].get("fresh_seeds"):
        base_seed = _recorded_seed(work)
        if base_seed is None:
            base_seed = int(time.time())
    specs = case_list(schemes=opts.schemes or None, tiers=opts.tiers, profile=opts.profile, base_seed=base_seed,
                      families=opts.families)
    sh = parse_shard(opts.shard)
    if sh:
        specs = do_shard(specs, *sh)
    if not specs:
        raise ValueError("certify: the selection has no cases")
    return base_seed, specs


def _claim_work(work: Path, ids: list) -> None:
    """Create the work folder with its cases.txt, refusing one that holds another case list's interrupted run."""
    work.mkdir(parents=True, exist_ok=True)
    cases_txt = "".join(i + "\n" for i in ids)
    if (work / "cases.txt").exists() and (work / "cases.txt").read_text(encoding="utf-8") != cases_txt:
        raise QconformError(f"{work}: holds an interrupted certification of another case list; remove it "
                            "or choose another --out")
    (work / "cases.txt").write_text(cases_txt, encoding="utf-8")


def _run_header(backends: list[str], opts: CertifyOptions, base_seed, specs, wv) -> dict:
    """The run's header record (results.jsonl), which bundle.json is derived from."""
    from conformance.cases.suite import list_hash
    from conformance.run.provenance import environment

    env = environment()
    host = opts.host_label or env.get("host") or "host"
    header = {"suite": "qconform", "emulator_version": emulator_version, "profile": opts.profile,
              "tiers": list(opts.tiers), "schemes": list(opts.schemes) if opts.schemes else "all",
              "backends": list(backends), "shard": opts.shard, "base_seed": base_seed, "case_count": len(specs),
              "case_list_sha256": list_hash(specs), "environment": env, "timeout": opts.timeout,
              "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "waivers": [w.__dict__ for w in wv],
              "certify": True, "host_label": host, "waiver_date": time.strftime("%Y-%m-%d")}
    if opts.families is not None:
        header["families"] = opts.families
    return header


def _run_cases(folder: Path, backends, specs, header: dict, wv, opts: CertifyOptions, progress: bool, log) -> None:
    """Run (or resume) the case list in ``folder``'s work folder, its outputs staged beside it; QconformError
    unless every (backend, case) has its result."""
    from conformance.run.runner import Runner

    work, staging = _work_folder(folder), _staging_folder(folder)

    placement = opts.placement
    runner = Runner(work, timeout=opts.timeout, jobs=opts.jobs, waivers=wv, progress=progress,
                    on_output=Stager(staging), memory_limit=opts.memory_limit, lock=True,
                    devices=placement.devices if placement else None,
                    executor=placement.executor if placement else None)
    log(f"qconform certify: {len(specs)} case(s) x {len(backends)} backend(s) [{', '.join(backends)}], "
        f"profile {opts.profile} -> {folder}")
    import warnings

    try:
        with warnings.catch_warnings():
            # NumPy's invalid-value warnings on the suite's deliberate NaN/Inf inputs are not findings
            warnings.simplefilter("ignore", RuntimeWarning)
            runner.run(list(backends), specs, resume=True, header=header)
    finally:
        runner.close()
    from conformance.run.completeness import missing_pairs
    from conformance.run.runner import read_results

    ids = [s.case_id for s in specs]
    missing = missing_pairs(read_results(work / "results.jsonl"), runner.labels, list(backends), ids)
    if missing:  # the invariant (conformance/run/completeness.py): nothing is sealed without every result
        raise QconformError(f"certify: {sum(missing.values())} result(s) missing after the run ("
                            + ", ".join(f"{k}: {v}" for k, v in sorted(missing.items()))
                            + f"); nothing sealed; rerun the same command to resume in {work}")


def _seal_into(folder: Path, work: Path, staging: Path, ids: list, header: dict, extra_files) -> CertifyResult:
    """Derive every file from the run, seal the manifest and rename the work folder to ``folder``."""
    (work / LOCK_NAME).unlink(missing_ok=True)
    shutil.rmtree(work / ".work", ignore_errors=True)  # the runner's scratch space, if a kill left it
    res = _assemble(work, staging, ids, header, extra_files)
    sha = seal(work)
    if folder.exists():
        folder.rmdir()  # empty (checked above, under the lock)
    os.rename(work, folder)
    shutil.rmtree(staging, ignore_errors=True)
    res.path, res.manifest_sha256 = folder, sha
    return res


def _recorded_seed(work: Path) -> "int | None":
    from conformance.run.runner import read_results

    for r in read_results(work / "results.jsonl"):
        if r.get("kind") == "run" and r.get("base_seed") is not None:
            return int(r["base_seed"])
    return None


def _assemble(folder: Path, staging: Path, ids: list, header: dict, extra_files) -> CertifyResult:
    """Pack the outputs and write every derived file and bundle.json (not the manifest)."""
    from conformance.cases.golden import GOLDEN_DIR
    from conformance.run.runner import read_results

    lines = read_results(folder / "results.jsonl")
    latest = latest_results(lines)
    blines = backend_lines(lines)
    headers = run_headers(lines)
    labels = list(dict.fromkeys(r["backend"] for r in latest.values()))
    index = {cid: n for n, cid in enumerate(ids)}
    backends_info = {}
    for label in labels:
        rel = f"outputs/{safe_label(label)}.safetensors"
        n = pack_outputs(staging, label, index, folder / rel)
        b = blines.get(label, {})
        backends_info[label] = {"outputs": rel, "outputs_cases": n, "spec": b.get("spec"),
                                "version": b.get("version"), "device": b.get("device"),
                                "available": b.get("available"), "reason": b.get("reason"),
                                "deterministic": b.get("deterministic", True)}
    (folder / "declared.json").write_bytes(json_bytes(declared_table(latest)))
    wrec = waiver_record(latest, headers)
    (folder / "waivers.json").write_bytes(json_bytes(wrec))
    (folder / "environment.json").write_bytes(json_bytes(environment_record(headers, blines)))
    gm = GOLDEN_DIR / "MANIFEST.json"
    golden_sha = None
    if gm.exists():
        shutil.copyfile(gm, folder / "golden_manifest.json")
        golden_sha = hash_file(folder / "golden_manifest.json")[0]
    for name, data in (extra_files or {}).items():
        _put_extra(folder, name, data)
    vs = verdict_summary(latest, labels, blines)
    env = header.get("environment") or {}
    bundle = {"format": BUNDLE_FORMAT, "suite_version": env.get("suite_version"),
              "emulator_version": emulator_version, "git_commit": env.get("git_commit"),
              "suite_code_sha256": suite_code_sha256(), "host_label": header["host_label"],
              "profile": header["profile"], "tiers": header["tiers"], "schemes": header["schemes"],
              "shard": header["shard"], "base_seed": header.get("base_seed"), "case_count": len(ids),
              "case_list_sha256": header["case_list_sha256"], "cases_file": "cases.txt",
              "golden_manifest": "golden_manifest.json" if golden_sha else None,
              "golden_manifest_sha256": golden_sha, "backends": backends_info, "waiver_dates": wrec["dates"],
              "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **vs}
    if header.get("families") is not None:
        bundle["families"] = header["families"]
    _coverage_and_search(folder, bundle, header)
    raw = json_bytes(bundle)
    (folder / "bundle.json").write_bytes(raw)
    meta = json.loads(raw)
    for name, data in reports(lines, meta, report_title(labels, header["host_label"])).items():
        (folder / name).write_bytes(data)
    from conformance.certify.coverage_search import CERTIFICATE, certificate_text

    (folder / CERTIFICATE).write_text(certificate_text(meta), encoding="utf-8")
    return CertifyResult(folder, bundle["ok"], vs["n_results"], vs["n_bad"], "", vs["verdicts"], vs["unavailable"],
                         vs["no_judged_case"])


def _coverage_and_search(folder: Path, bundle: dict, header: dict) -> None:
    """bundle.json's ``coverage`` (the profile's coverage table) and ``search`` (what the property search
    searched and found); a failing search makes the certification fail (docs/certification.md#coverage-and-search)."""
    from conformance.report.coverage import coverage_record
    from conformance.certify.coverage_search import SEARCH_DIR, search_record, search_schemes
    from conformance.cases.specs import PROFILES

    profile = header["profile"]
    schemes = header["schemes"] if header["schemes"] != "all" else None
    if PROFILES.get(profile, {}).get("coverage"):
        bundle["coverage"] = coverage_record(profile, schemes)
    s = header.get("search")
    if s is None:
        bundle["search"] = None
        return
    raw = (folder / SEARCH_DIR / "results.jsonl").read_bytes()
    bundle["search"] = search_record(raw, profile=profile, schemes=search_schemes(schemes, header.get("families")),
                                     seed=s["seed"], examples=s["examples"])
    bundle["ok"] = bool(bundle["ok"] and bundle["search"]["ok"])


def _put_extra(folder: Path, name: str, data) -> Path:
    if "/" in name or "\\" in name or name.startswith("."):
        raise ValueError(f"extra file name {name!r}: a plain file name is required")
    p = folder / "extra" / name
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, (bytes, bytearray)):
        p.write_bytes(bytes(data))
    elif isinstance(data, Path):
        shutil.copyfile(data, p)
    else:
        p.write_text(str(data), encoding="utf-8")
    return p


def add_files(bundle: "str | Path", files: dict) -> str:
    """Add files under extra/ of a bundle that verifies, then re-seal it; returns the new MANIFEST sha256."""
    from conformance.certify.verify import verify_bundle

    folder = Path(bundle)
    with OutLock.beside(folder):
        res = verify_bundle(folder)
        if not res.ok:
            raise QconformError(f"{folder}: will not add files to a bundle that does not verify: {res.problems[0]}")
        for name, data in files.items():
            _put_extra(folder, name, data)
        return seal(folder)

