"""Verifying a certification bundle offline: files, records, derived files, evidence, every verdict.

Semantics and threat model: docs/certification.md#verification.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np

from conformance.judge.verdict import BAD, JUDGED, Verdict
from conformance.certify.codec import decode_case, decode_quantized, load_outputs
from conformance.certify.derive import (backend_lines, declared_table, environment_record, json_bytes, latest_results,
                     report_title, reports, run_headers, verdict_summary, waiver_record)
from conformance.certify.files import MAX_FILE_BYTES, MAX_PARSED_BYTES, BundleFileError, bad_relpath, hash_file, scan, tail
from conformance.certify.identity import BUNDLE_FORMAT, MANIFEST, suite_identity, version_mismatch

__all__ = ["VerifyResult", "verify_bundle", "offline_verdict"]

from conformance.certify.offline import offline_verdict  # noqa: E402 - the verdict rule on stored arrays (shared with audit.py)

_PARSED = (".json", ".jsonl", ".txt", ".md", ".html", ".log")
RESULTS = "results.jsonl"  # read as a stream, at most as many lines as the case list allows (``results_bound``)
#: run and backend lines a results.jsonl may hold besides its results: one run line and a line per backend
#: for each invocation of an interrupted and resumed certify, up to this many invocations
MAX_RUNS = 256
MAX_LINE = 16 << 20  # bytes of one results.jsonl line (a result line is a few KiB)
LOG_TAIL = 600  # = conformance.run.workerproc.LOG_TAIL: the log excerpt a crash/timeout record carries


@dataclasses.dataclass
class VerifyResult:
    path: Path
    problems: list
    notes: list
    checked: dict
    manifest_sha256: str | None
    version_mismatch: "str | None" = None  # set when another suite version wrote the bundle
    rerun_seed: "int | None" = None  # the seed that chose the audited cases (verify_bundle(rerun=N))

    @property
    def ok(self) -> bool:
        return not self.problems


class _Files:
    """The bundle's files that MANIFEST.json lists and that hashed as listed; small ones kept in memory."""

    def __init__(self, folder: Path, problems: list):
        self.folder = folder
        self.problems = problems
        self.ok: dict[str, "bytes | None"] = {}

    def get(self, rel, what: str) -> "bytes | None":
        why = bad_relpath(rel)
        if why:
            self.problems.append(f"{what}: {rel!r} is {why}: not a file of the bundle")
            return None
        if rel not in self.ok:
            self.problems.append(f"{what}: {rel} is not a verified file of the bundle")
            return None
        data = self.ok[rel]
        if data is None:
            self.problems.append(f"{what}: {rel} is too large to read")
        return data

    def path(self, rel, what: str) -> "Path | None":
        why = bad_relpath(rel)
        if why:
            self.problems.append(f"{what}: {rel!r} is {why}: not a file of the bundle")
            return None
        if rel not in self.ok:
            self.problems.append(f"{what}: {rel} is not a verified file of the bundle")
            return None
        return self.folder / rel


def _check_files(folder: Path, res: VerifyResult) -> "tuple[_Files, dict] | None":
    """Step 1: MANIFEST.json; every listed file present, regular, inside the bundle, same bytes; nothing else."""
    problems = res.problems
    try:
        sha, _, raw = hash_file(folder / MANIFEST, 64 << 20, keep=True)
    except FileNotFoundError:
        raw = None
    except BundleFileError as e:
        problems.append(f"{MANIFEST}: {e}")
        return None
    except OSError:
        raw = None
    if raw is None:
        problems.append(f"{MANIFEST}: missing (not a sealed certification bundle)")
        return None
    res.manifest_sha256 = sha
    try:
        man = json.loads(raw)
        listed = man["files"]
        if not isinstance(listed, dict) or not all(isinstance(e, dict) for e in listed.values()):
            raise TypeError("'files' is not an object of objects")
        if man.get("format") != BUNDLE_FORMAT:
            problems.append(f"{MANIFEST}: format {man.get('format')!r}, expected {BUNDLE_FORMAT!r}")
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        problems.append(f"{MANIFEST}: malformed ({type(e).__name__}: {e})")
        return None
    on_disk, scan_problems = scan(folder)
    problems.extend(scan_problems)
    files = _Files(folder, problems)
    for rel, entry in sorted(listed.items()):
        why = bad_relpath(rel)
        if why:
            problems.append(f"{rel!r}: {why}: a bundle's files stay inside it")
            continue
        if rel == MANIFEST:
            problems.append(f"{MANIFEST}: lists itself")
            continue
        if rel not in on_disk:
            problems.append(f"{rel}: missing (or not a regular file)")
            continue
        keep = rel.endswith(_PARSED) and on_disk[rel] <= MAX_PARSED_BYTES and rel != RESULTS
        try:
            got, n, data = hash_file(folder / rel, MAX_FILE_BYTES, keep=keep)
        except (BundleFileError, OSError) as e:
            problems.append(f"{rel}: {e}")
            continue
        res.checked["files"] += 1
        if got != entry.get("sha256"):
            problems.append(f"{rel}: sha256 {got[:16]}... does not match MANIFEST.json's "
                            f"{str(entry.get('sha256'))[:16]}...")
        elif n != entry.get("bytes"):
            problems.append(f"{rel}: {n} bytes, MANIFEST.json says {entry.get('bytes')}")
        else:
            files.ok[rel] = data
    for rel in sorted(on_disk):
        if rel != MANIFEST and rel not in listed:
            problems.append(f"{rel}: not listed in MANIFEST.json")
    return files, listed


def _json(files: _Files, rel: str, what: str):
    data = files.get(rel, what)
    if data is None:
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:
        files.problems.append(f"{rel}: not JSON ({type(e).__name__}: {e})")
        return None


def _jsonl(data: bytes, rel: str, problems: list, *, first: int = 1) -> list[dict]:
    out = []
    for i, line in enumerate(data.decode("utf-8", "replace").splitlines(), first):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            if not isinstance(r, dict):
                raise ValueError("not an object")
            out.append(r)
        except (ValueError, RecursionError) as e:
            problems.append(f"{rel}: line {i} is not a JSON object ({type(e).__name__}: {e})")
    return out


def results_bound(n_cases: int, n_backends: int) -> int:
    """The most lines a sealed results.jsonl of ``n_cases`` cases and ``n_backends`` backends can hold: a
    result per (backend, case), and a run line and backend lines per invocation (``MAX_RUNS`` of them)."""
    b = max(1, n_backends)
    return n_cases * b + MAX_RUNS * (1 + b)


def _read_results(files: _Files, listed: dict, bound: int, problems: list) -> "list[dict] | None":
    """results.jsonl's records, read line by line and hashed again as read (it was verified unread), or None
    (with the problem) as soon as it holds more than ``bound`` lines: a padded file costs no more than a
    full one (issue 22: 40 M ``{}`` lines, resealed)."""
    path = files.path(RESULTS, "results")
    if path is None:
        return None
    h = hashlib.sha256()
    out, n = [], 0
    try:
        with open(path, "rb") as f:
            while True:
                raw = f.readline(MAX_LINE + 1)
                if not raw:
                    break
                h.update(raw)
                n += 1
                if n > bound:
                    problems.append(f"{RESULTS}: more than {bound} lines, the most its case list allows (a result "
                                    f"per backend and case, and the run lines of at most {MAX_RUNS} runs): refused, "
                                    "not read further (padded?)")
                    return None
                if len(raw) > MAX_LINE:
                    problems.append(f"{RESULTS}: line {n} is longer than {MAX_LINE} bytes: refused, not read further")
                    return None
                out.extend(_jsonl(raw, RESULTS, problems, first=n))
    except OSError as e:
        problems.append(f"{RESULTS}: {e}")
        return None
    if h.hexdigest() != (listed.get(RESULTS) or {}).get("sha256"):
        problems.append(f"{RESULTS}: changed while it was verified (sha256 differs from MANIFEST.json's)")
        return None
    return out


def verify_bundle(bundle: "str | Path", *, deep: bool = False, any_version: bool = False, rerun: int = 0,
                  rerun_seed: "int | None" = None) -> VerifyResult:
    """Re-check a bundle offline: files, records, derived files, evidence, every verdict from stored outputs.

    Verdicts and metrics are recomputed only when the running suite is the one that wrote the
    bundle (same package and emulator version and ``suite_code_sha256``); otherwise the result
    has one problem naming both versions (``version_mismatch``) and the files and records are
    still checked. ``any_version=True`` recomputes anyway and keeps that line as a note.
    ``rerun=N`` also re-executes N randomly chosen cases on their backend where it is available
    (``conformance.certify.audit``); ``rerun_seed`` fixes the choice (recorded in ``rerun_seed``).
    """
    folder = Path(bundle)
    res = VerifyResult(folder, [], [], Counter(), None)
    problems, notes, checked = res.problems, res.notes, res.checked
    if not folder.is_dir():
        problems.append(f"{folder}: not a folder")
        return res
    got = _check_files(folder, res)
    if got is None:
        return res
    files, listed = got
    # 2. the bundle's own records agree with each other
    meta = _json(files, "bundle.json", "bundle.json")
    if not isinstance(meta, dict):
        problems.append("bundle.json: unreadable")
        return res
    res.version_mismatch = version_mismatch(meta, suite_identity())
    recompute = res.version_mismatch is None or any_version
    if res.version_mismatch:
        (notes if any_version else problems).append(res.version_mismatch)
    ids = _check_case_list(files, meta, problems)
    if ids is None:
        return res
    _check_golden(files, meta, deep, problems, notes)
    backends = meta.get("backends") if isinstance(meta.get("backends"), dict) else {}
    lines = _read_results(files, listed, results_bound(len(ids), len(backends)), problems)
    if lines is None:
        return res
    headers, latest, blines, labels = _check_records(meta, ids, backends, lines, problems)
    if recompute:  # (the derived files come from the judging and report code of the suite that wrote them)
        _check_derived(files, meta, lines, latest, blines, headers, labels, problems)
        from conformance.certify.coverage_search import check_search

        check_search(files, meta, problems, notes, deep=deep)  # the search, coverage and certificate records
    waivers, dates = _bundle_waivers(files, problems)
    # 3. evidence of every verdict that has no output; every other verdict recomputed from its output
    timeout = next((h.get("timeout") for h in headers if h.get("timeout") is not None), None)
    _check_support(latest, problems)
    if not recompute:
        checked["results"] = sum(1 for (b, _) in latest if b in backends)
        return res
    ctx = _Recheck(files, blines, timeout, waivers, dates, deep, problems, checked)
    stored_all = _check_outputs(backends, latest, ctx)
    if deep:
        _deep_case_list(meta, ids, problems, notes)
    if rerun:
        from conformance.certify.audit import rerun_cases

        res.rerun_seed = rerun_cases(folder, meta, latest, stored_all, rerun, rerun_seed, timeout, res)
        from conformance.certify.coverage_search import replay_search

        checked["search_replayed"] = replay_search(folder, meta, problems, notes, timeout or 120.0)
    return res


def _check_case_list(files: _Files, meta: dict, problems: list) -> "list | None":
    """The case ids of the bundle's case list, checked against bundle.json's hash and count; None: unreadable."""
    cases_rel = meta.get("cases_file", "cases.txt")
    cases_raw = files.get(cases_rel, "bundle.json cases_file")
    if cases_raw is None:
        return None
    ids = cases_raw.decode("utf-8", "replace").splitlines()
    case_hash = hashlib.sha256(cases_raw).hexdigest()
    if case_hash != meta.get("case_list_sha256"):
        problems.append(f"{cases_rel}: sha256 {case_hash[:16]}... is not bundle.json's case_list_sha256")
    if len(ids) != meta.get("case_count"):
        problems.append(f"{cases_rel}: {len(ids)} case(s), bundle.json says {meta.get('case_count')}")
    return ids


def _check_records(meta: dict, ids: list, backends: dict, lines: list, problems: list) -> tuple:
    """(run headers, latest result per (backend, case), backend lines, labels), each checked against bundle.json and
    the case list: the run headers' case list and seed, the backends they ask for, a result for every pair."""
    headers = run_headers(lines)
    if not headers:
        problems.append("results.jsonl: no run header")
    for h in headers:
        if h.get("case_list_sha256") != meta.get("case_list_sha256"):
            problems.append("results.jsonl: a run header's case_list_sha256 is not the bundle's")
        if h.get("base_seed") != meta.get("base_seed"):
            problems.append("results.jsonl: a run header's base_seed is not the bundle's")
    latest = latest_results(lines)
    blines = backend_lines(lines)
    requested = {str(x) for h in headers for x in (h.get("backends") or [])}
    ran = {str(x.get("spec")) for x in blines.values()}
    if requested != ran:
        problems.append(f"results.jsonl: the run headers ask for backends {sorted(requested)}, the backend lines "
                        f"are of {sorted(ran)}")
    labels = list(dict.fromkeys(r["backend"] for r in latest.values()))
    idset = set(ids)
    for (b, cid) in latest:
        if b not in backends:
            problems.append(f"results.jsonl: a result for backend {b!r} that bundle.json does not list")
        if cid not in idset:
            problems.append(f"results.jsonl: a result for case {cid} that is not in cases.txt")
    for b in backends:
        missing = [cid for cid in ids if (b, cid) not in latest]
        if missing:
            problems.append(f"{b}: {len(missing)} case(s) of cases.txt have no result (first: {missing[0]})")
    return headers, latest, blines, labels


def _bundle_waivers(files: _Files, problems: list) -> tuple:
    """(the waivers the run was given, the dates they were judged at) from waivers.json."""
    wj = _json(files, "waivers.json", "waivers") or {}
    from conformance.run.runner import Waiver

    try:
        waivers = [Waiver(**{k: str(w[k]) for k in ("backend", "scheme", "case", "reason", "issue", "expires")},
                          variant=str(w.get("variant", "")))
                   for w in wj.get("given", [])]
        dates = list(wj.get("dates") or [])
    except (KeyError, TypeError, AttributeError) as e:
        problems.append(f"waivers.json: malformed ({e})")
        waivers, dates = [], []
    return waivers, dates


@dataclasses.dataclass(frozen=True)
class _Recheck:
    """What the re-check of every result reads (the bundle's files, its backend lines, the run's timeout, the
    waivers and their dates, --deep) and where it reports (the result's problems and checked counts)."""

    files: _Files
    blines: dict
    timeout: "float | None"
    waivers: list
    dates: list
    deep: bool
    problems: list
    checked: Counter


def _check_outputs(backends: dict, latest: dict, ctx: _Recheck) -> dict:
    """Each backend's stored outputs ({backend: {case: entry}}), checked against bundle.json and the result lines;
    every result re-checked (``_check_one``)."""
    files, problems, checked = ctx.files, ctx.problems, ctx.checked
    stored_all = {}
    for b, info in backends.items():
        stored: dict = {}
        rel = info.get("outputs") if isinstance(info, dict) else None
        p = files.path(rel, f"{b} outputs") if rel else None
        if p is not None and p.stat().st_size > MAX_PARSED_BYTES:
            problems.append(f"{rel}: larger than the {MAX_PARSED_BYTES}-byte limit for a file read into memory")
            p = None
        if p is not None:
            try:
                label, stored = load_outputs(p)
                if label != b:
                    problems.append(f"{rel}: holds backend {label!r}, bundle.json says {b!r}")
                if info.get("outputs_cases") != len(stored):
                    problems.append(f"{rel}: {len(stored)} case(s), bundle.json says {info.get('outputs_cases')}")
            except Exception as e:  # noqa: BLE001 - a malformed file is a finding, not a crash
                problems.append(f"{rel}: unreadable ({type(e).__name__}: {e})")
                stored = {}
        stored_all[b] = stored
        for cid in stored:
            if (b, cid) not in latest:
                problems.append(f"{b} {cid}: an output without a result line")
        for (rb, cid), rec in latest.items():
            if rb != b:
                continue
            checked["results"] += 1
            _check_one(rec, stored.get(cid), ctx)
    return stored_all


def _check_golden(files: _Files, meta: dict, deep: bool, problems: list, notes: list) -> None:
    if not meta.get("golden_manifest"):
        return
    data = files.get(meta["golden_manifest"], "bundle.json golden_manifest")
    if data is None:
        return
    g = hashlib.sha256(data).hexdigest()
    if g != meta.get("golden_manifest_sha256"):
        problems.append(f"{meta['golden_manifest']}: sha256 {g[:16]}... is not bundle.json's golden_manifest_sha256")
    from conformance.cases.golden import GOLDEN_DIR

    local = GOLDEN_DIR / "MANIFEST.json"
    if local.is_file() and hash_file(local)[0] != g:
        msg = "the golden manifest differs from this checkout's golden/MANIFEST.json"
        (problems if deep else notes).append(msg + (" (deep: golden cases cannot be re-derived)" if deep
                                                    else " (another suite version?)"))


def _check_derived(files, meta, lines, latest, blines, headers, labels, problems) -> None:
    """bundle.json's counts and ``ok``, and every file derived from the results, recomputed and compared."""
    vs = json.loads(json_bytes(verdict_summary(latest, labels, blines)))
    from conformance.certify.coverage_search import search_ok

    vs["ok"] = vs["ok"] and search_ok(files, meta)  # a failing property search fails the certification
    for k, v in vs.items():
        if meta.get(k) != v:
            problems.append(f"bundle.json: {k} is {meta.get(k)!r}, the results give {v!r}")
    if set(meta.get("backends") or {}) != set(labels) and labels:
        problems.append(f"bundle.json: backends {sorted(meta.get('backends') or {})}, the results have {labels}")
    for b, info in (meta.get("backends") or {}).items():
        line = blines.get(b)
        if not isinstance(info, dict) or line is None:
            problems.append(f"bundle.json: backend {b!r} has no backend line in results.jsonl")
            continue
        for k in ("spec", "version", "device", "available", "reason"):
            if info.get(k) != line.get(k):
                problems.append(f"bundle.json: backend {b!r} {k} is {info.get(k)!r}, its backend line says "
                                f"{line.get(k)!r}")
    wrec = waiver_record(latest, headers)
    if meta.get("waiver_dates") != wrec["dates"]:
        problems.append("bundle.json: waiver_dates are not the run headers' dates")
    derived = {"declared.json": json_bytes(declared_table(latest)), "waivers.json": json_bytes(wrec),
               "environment.json": json_bytes(environment_record(headers, blines))}
    try:
        derived.update(reports(lines, meta, report_title(labels, meta.get("host_label"))))
    except Exception as e:  # noqa: BLE001
        problems.append(f"reports: cannot be regenerated from the results ({type(e).__name__}: {e})")
    for name, want in derived.items():
        have = files.get(name, name)
        if have is not None and have != want:
            problems.append(f"{name}: differs from what the bundle's results give (edited after the run?)")


def _check_support(latest: dict, problems: list) -> None:
    """A backend's support is a function of the case (``can_implement(case)``): the same case of another
    seed or generator cannot be refused once and run once, nor refused for two different reasons."""
    by: dict = {}
    for (b, cid), r in latest.items():
        spec = r.get("spec") or {}
        key = (b, json.dumps(spec.get("case"), sort_keys=True))
        raw = r.get("waived_verdict") or r.get("verdict")
        ev = r.get("evidence") or {}
        if raw == Verdict.UNSUPPORTED and "unavailable" in ev:
            continue
        refused = raw == Verdict.UNSUPPORTED
        by.setdefault(key, []).append((cid, refused, r.get("reason") if refused else None))
    for (b, _), rows in by.items():
        refused = [x for x in rows if x[1]]
        if refused and len(refused) != len(rows):
            ran = next(x for x in rows if not x[1])
            problems.append(f"{b} {refused[0][0]}: unsupported, but the same case ran as {ran[0]}: a backend's "
                            "support depends on the case alone")
        if len({x[2] for x in refused}) > 1:
            problems.append(f"{b} {refused[0][0]}: the same case was refused for different reasons")


def _check_evidence(rec: dict, raw: str, files: _Files, blines: dict, timeout, problems: list) -> bool:
    """A verdict without an output must carry its evidence; False when it does not."""
    who = f"{rec['backend']} {rec['case_id']}"
    ev = rec.get("evidence")
    if not isinstance(ev, dict) or not ev:
        problems.append(f"{who}: {raw} without evidence (the worker's exit, the backend's refusal or the fault)")
        return False
    reason = str(rec.get("reason") or "")
    if raw == Verdict.UNSUPPORTED:
        if "unavailable" in ev:
            line = blines.get(rec["backend"], {})
            if line.get("available") is not False:
                problems.append(f"{who}: unsupported as unavailable, but its backend line says it was available")
                return False
            return True
        refusal = ev.get("refusal")
        if not isinstance(refusal, str) or not refusal.strip() or refusal != reason:
            problems.append(f"{who}: unsupported without the backend's refusal reason as evidence")
            return False
        for k in ("declared", "metrics", "bundle"):
            if rec.get(k):
                problems.append(f"{who}: unsupported, but it records {k} (a refused case is never planned or run)")
                return False
        return True
    if raw == Verdict.FAIL:
        if not ev.get("malformed") or not reason.startswith("malformed output"):
            problems.append(f"{who}: fail without a stored output or a malformed-output reason")
            return False
        return True
    kind = ev.get("worker")
    if kind in ("crash", "timeout"):
        if kind != raw:
            problems.append(f"{who}: {raw}, but its evidence is the worker's {kind}")
            return False
        if kind == "timeout" and timeout is not None and ev.get("timeout_s") != timeout:
            problems.append(f"{who}: timeout after {ev.get('timeout_s')} s, the run's timeout was {timeout} s")
            return False
        if kind == "crash" and ev.get("signal") and str(ev["signal"]) not in reason:
            problems.append(f"{who}: crash by {ev['signal']}, which its reason does not name")
            return False
        if ev.get("log"):
            p = files.path(ev["log"], f"{who} worker log")
            if p is None:
                return False
            t = tail(p, LOG_TAIL).decode("utf-8", "replace").strip()
            if t != ev.get("log_tail"):
                problems.append(f"{who}: the log excerpt in its evidence is not the end of {ev['log']}")
                return False
        return True
    if kind == "raised":
        exc = str(ev.get("exception") or "")
        if raw != Verdict.CRASH or not exc or exc not in reason:
            problems.append(f"{who}: {raw}, but the exception in its evidence is not its reason")
            return False
        return True
    if raw == Verdict.CRASH and ev.get("runner"):
        return True
    problems.append(f"{who}: {raw} with evidence of unknown kind {sorted(ev)}")
    return False


def _expected_verdict(raw: str, rec: dict, waivers: list, dates: list) -> set:
    """The final verdicts ``raw`` can turn into under the bundle's waivers (a set: one per run date)."""
    from conformance.cases.suite import CaseSpec

    spec = CaseSpec.from_json(rec["spec"])
    # a waiver naming a variant accepts a semantic deviation only: it never changes a verdict
    match = next((w for w in waivers if not w.variant and w.matches(rec["backend"], spec)), None)
    if match is None:
        return {raw}
    out = set()
    for day in dates or [time.strftime("%Y-%m-%d")]:
        if match.expired(day):
            out.add(raw if raw in BAD else Verdict.FAIL.value)
        else:
            out.add(Verdict.WAIVED.value if raw in BAD else raw)
    return out


def _num_equal(a, b) -> bool:
    if a is None or b is None:
        return a is b
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return list(a) == list(b)
    fa, fb = float(a), float(b)
    return fa == fb or (np.isnan(fa) and np.isnan(fb))


def _check_one(rec: dict, entry, ctx: _Recheck) -> None:
    """One result against its stored output (recomputed) or, without one, its evidence."""
    files, blines, timeout, waivers, dates = ctx.files, ctx.blines, ctx.timeout, ctx.waivers, ctx.dates
    problems, checked, deep = ctx.problems, ctx.checked, ctx.deep
    who = f"{rec['backend']} {rec['case_id']}"
    v = rec.get("verdict")
    raw_recorded = rec.get("waived_verdict") or v
    bp = rec.get("bundle")
    # the run writes OUT/bundles/<name>: a path whose folder is not bundles/ (../../etc/x) names no file of the bundle
    if bp and (not isinstance(bp, str) or Path(bp).parent.name != "bundles"
               or ("bundles/" + Path(bp).name) not in files.ok):
        problems.append(f"{who}: {raw_recorded}: its replay bundle {str(bp)[:120]!r} is not a file in bundles/")
    if entry is None:
        if raw_recorded in JUDGED and not (raw_recorded == Verdict.FAIL
                                           and (rec.get("evidence") or {}).get("malformed")):
            problems.append(f"{who}: verdict {v} but no stored output to recompute it from")
            return
        if _check_evidence(rec, raw_recorded, files, blines, timeout, problems):
            checked["evidence"] += 1
        checked["not_recomputable"] += 1
        return
    if raw_recorded in (Verdict.UNSUPPORTED, Verdict.CRASH, Verdict.TIMEOUT):
        problems.append(f"{who}: verdict {v} but an output is stored")
        return
    meta = entry["meta"]
    if meta.get("kind") == "quantize":
        _check_quantized(rec, entry, bp, waivers, dates, problems, checked, deep)
        return
    try:
        d = decode_case(entry["tensors"], meta)
        got = offline_verdict(d, meta, rec.get("declared")).record()
    except Exception as e:  # noqa: BLE001
        problems.append(f"{who}: stored output/interval unreadable ({type(e).__name__}: {e})")
        return
    if not _verdict_and_reason_agree(who, rec, got, bp, waivers, dates, problems, "the stored output and interval"):
        return
    m = rec.get("metrics") or {}
    for k in ("max_ratio", "max_ulp", "n_outside", "exact_match", "worst"):
        if k not in m:
            problems.append(f"{who}: metric {k} missing")
        elif not _num_equal(m[k], got[k]):
            problems.append(f"{who}: metric {k} recorded {m[k]!r}, recomputed {got[k]!r}")
    if m.get("tie_flips") != got["tie_flips"]:
        problems.append(f"{who}: tie_flips recorded {m.get('tie_flips')}, recomputed {got['tie_flips']}")
    we = m.get("worst_element")
    if got["worst"] and np.shape(d["y"]) == np.shape(d["jlo"]):
        idx = tuple(got["worst"])
        for k, arr in (("observed", d["y"]), ("lo", d["jlo"]), ("hi", d["jhi"])):
            if not isinstance(we, dict) or not _num_equal(we.get(k), float(arr[idx])):
                problems.append(f"{who}: worst_element.{k} recorded {(we or {}).get(k)!r}, stored {float(arr[idx])!r}")
    checked["recomputed"] += 1
    if deep:
        _deep_check(rec, d, problems, checked)


def _verdict_and_reason_agree(who: str, rec: dict, got: dict, bp, waivers, dates, problems: list, source: str) -> bool:
    """The recorded verdict and reason against those recomputed from ``source`` (a non-pass needs its replay
    bundle); False when the verdict disagrees (the metrics are then not compared)."""
    if got["verdict"] in BAD and not bp:
        problems.append(f"{who}: {got['verdict']} without a replay bundle")
    expected = _expected_verdict(got["verdict"], rec, waivers, dates)
    v = rec.get("verdict")
    if v not in expected:
        problems.append(f"{who}: recorded verdict {v}, {source} give {' or '.join(sorted(expected))}")
        return False
    rr = str(rec.get("reason") or "")
    if rr != got["reason"] and not (rec.get("waiver_expired") and rr.startswith(got["reason"] + " (waiver ")):
        problems.append(f"{who}: reason {rec.get('reason')!r}, recomputed {got['reason']!r}")
    return True


def _check_quantized(rec: dict, entry, bp, waivers, dates, problems: list, checked: Counter, deep: bool) -> None:
    """A quantize-only case (docs/conformance.md#quantize-only-cases): the verdict, reason and metrics
    recomputed from the stored observed and expected tensors; ``deep``: the expected tensors recomputed
    from the case id and the declaration."""
    from conformance.judge.quantized import decide_quantized

    who = f"{rec['backend']} {rec['case_id']}"
    try:
        obs, exp = decode_quantized(entry)
        if not exp:
            raise ValueError("no expected tensors stored")
        got = decide_quantized(obs, exp)
    except Exception as e:  # noqa: BLE001
        problems.append(f"{who}: stored quantized outputs unreadable ({type(e).__name__}: {e})")
        return
    if not _verdict_and_reason_agree(who, rec, got, bp, waivers, dates, problems, "the stored tensors"):
        return
    m = rec.get("metrics") or {}
    for k in ("exact_match", "n_outside", "mismatch", "first_mismatch"):
        if k not in m:
            problems.append(f"{who}: metric {k} missing")
        elif json.dumps(m[k], sort_keys=True) != json.dumps(got[k], sort_keys=True):
            problems.append(f"{who}: metric {k} recorded {m[k]!r}, recomputed {got[k]!r}")
    checked["recomputed"] += 1
    if not deep:
        return
    from backends.base import Declared
    from emulator.quantize_only import quantize_reference

    from conformance.cases.suite import CaseSpec

    spec = CaseSpec.from_json(rec["spec"])
    if spec.case_id != rec["case_id"]:
        problems.append(f"{who}: the recorded spec gives case id {spec.case_id}")
        return
    try:
        inp = spec.inputs()
        with np.errstate(all="ignore"):
            again = quantize_reference(spec.case, np.asarray(inp.x, np.float32), Declared(**rec["declared"]))
    except Exception as e:  # noqa: BLE001
        problems.append(f"{who}: deep: cannot rebuild the case ({type(e).__name__}: {e})")
        return
    if list(again) != list(exp) or not Verdict.parse(decide_quantized(again, exp)["verdict"]).agrees:
        problems.append(f"{who}: deep: stored expected tensors differ from the reference recomputed here")
        return
    checked["deep"] += 1


def _deep_check(rec: dict, d: dict, problems: list, checked: Counter) -> None:
    """Rebuild the inputs from the case id and re-judge the stored output with ``judge`` itself: the intervals
    it judged on must be the stored ones, and its verdict and metrics the recorded ones."""
    from backends.base import Declared

    from conformance.cases.suite import CaseSpec
    from conformance.judge.verdict import judge, judged_against
    from conformance.certify.codec import same_values

    who = f"{rec['backend']} {rec['case_id']}"
    spec = CaseSpec.from_json(rec["spec"])
    if spec.case_id != rec["case_id"]:
        problems.append(f"{who}: the recorded spec gives case id {spec.case_id}")
        return
    try:
        inp = spec.inputs()
        declared = Declared(**rec["declared"])
        with np.errstate(all="ignore"):
            iv = judged_against(inp, declared)
    except Exception as e:  # noqa: BLE001
        problems.append(f"{who}: deep: cannot rebuild the case ({type(e).__name__}: {e})")
        return
    with np.errstate(all="ignore"):
        j = judge(inp, iv, d["y"], declared)
    for k, arr in (("y_ref", j.loose.y_ref), ("lo", j.loose.lo), ("hi", j.loose.hi), ("jlo", j.judged.lo),
                   ("jhi", j.judged.hi)):
        if not same_values(d[k], arr):
            problems.append(f"{who}: deep: stored {k} differs from the interval recomputed here")
            return
    m = rec.get("metrics") or {}
    raw = rec.get("waived_verdict") or rec.get("verdict")
    if rec.get("waiver_expired") and raw == Verdict.FAIL and j.verdict is not Verdict.FAIL:
        raw = j.verdict  # an expired waiver turned a non-failure into fail
    if j.verdict != raw:
        problems.append(f"{who}: deep: re-judged {j.verdict}, recorded {raw}")
    for k in ("sqnr_db", "tie_flips", "max_ratio", "max_ulp"):
        if k in m and not _num_equal(m[k], j.metrics.get(k)):
            problems.append(f"{who}: deep: metric {k} recorded {m[k]!r}, recomputed {j.metrics.get(k)!r}")
    checked["deep"] += 1


def _deep_case_list(meta: dict, ids: list, problems: list, notes: list) -> None:
    from conformance.cases.suite import PROFILES, TIERS, case_list, parse_shard, shard

    prof = meta.get("profile")
    if prof not in PROFILES:
        problems.append(f"deep: unknown profile {prof!r}")
        return
    seed = meta.get("base_seed")
    if PROFILES[prof].get("fresh_seeds") and not isinstance(seed, int):
        problems.append(f"deep: profile {prof} draws fresh seeds and bundle.json records no base_seed: its case "
                        "list cannot be re-derived")
        return
    schemes = None if meta.get("schemes") in (None, "all") else meta["schemes"]
    try:
        specs = case_list(schemes=schemes, tiers=tuple(meta.get("tiers") or TIERS), profile=prof, base_seed=seed,
                          families=meta.get("families"))
        sh = parse_shard(meta.get("shard"))
    except (ValueError, TypeError) as e:
        problems.append(f"deep: the bundle's selection is not valid ({e})")
        return
    if sh:
        specs = shard(specs, *sh)
    if [s.case_id for s in specs] != ids:
        problems.append("deep: cases.txt is not the case list this checkout derives for the bundle's profile, "
                        "schemes, tiers, shard and seed")
