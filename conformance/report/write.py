"""Reports of a conformance run: ``summary.json``, ``report.md`` and a self-contained ``report.html``.

Semantics: docs/certification.md#reports.

    qconform report OUT [--html] [--md] [--out DIR]     # OUT: a run folder (results.jsonl, results-*.jsonl)
    qconform report merge BUNDLE... --out DIR [--no-verify]   # one matrix over several hosts' bundles

Input is the run's JSONL: ``kind: run`` header lines (profile, case-list hash, environment,
waivers), ``kind: backend`` lines (version, device) and ``kind: result`` lines (one per
backend x case; a later line for the same pair replaces an earlier one, as a resumed run
writes them). pytest-xdist workers write ``results-<worker>.jsonl``: every such file in
the folder is read.

The matrix has one row per scheme and one column per backend (per host + backend when
bundles from several hosts are merged). Each cell is coloured by its worst verdict and
shows the verdict counts, the worst error/bound ratio, the largest ULP distance, the lowest
SQNR, the tie flips, and an inline SVG histogram of the per-case error/bound ratios
(drawn here, no script, no network: the file opens from disk).

Split along its seams: conformance/report/summary.py (the summary: statuses, failure groups),
report_html.py and report_md.py (rendering); this module reads runs, writes files, merges
bundles and holds the ``qconform report`` command.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["load_source", "summarize_sources", "write_reports", "render_html", "render_markdown", "report_run",
           "merge_bundles", "register", "VERDICT_ORDER", "RATIO_BINS"]

from conformance.report.html import COLOURS, TINTS, ratio_histogram_svg, render_html  # noqa: F401
from conformance.report.markdown import MAX_LISTED, render_markdown  # noqa: F401
from conformance.report.summary import BAD, RATIO_BINS, SCHEME_ORDER, VERDICT_ORDER, json_safe, summarize_sources  # noqa: F401



# -- reading -----------------------------------------------------------------------------------------
def _read_jsonl(path: Path) -> list[dict]:
    from conformance.run.runner import read_results

    return read_results(path)


def result_files(path: "str | Path") -> list[Path]:
    """The JSONL files of a run: a file as given, or a folder's results.jsonl and results-*.jsonl."""
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise FileNotFoundError(f"{p}: no such file or folder")
    files = ([p / "results.jsonl"] if (p / "results.jsonl").is_file() else []) + sorted(p.glob("results-*.jsonl"))
    if not files:
        raise FileNotFoundError(f"{p}: no results.jsonl or results-*.jsonl (not a qconform run folder)")
    return files


def load_source(path: "str | Path", *, host: str | None = None) -> dict:
    """One run (folder or JSONL file): headers, backend lines, the latest result per (backend, case)."""
    p = Path(path)
    headers, backends, latest = [], {}, {}
    for f in result_files(p):
        for rec in _read_jsonl(f):
            kind = rec.get("kind")
            if kind == "run":
                headers.append(rec)
            elif kind == "backend":
                backends[rec.get("backend")] = rec
            elif kind == "result" and "backend" in rec and "case_id" in rec:
                latest[(rec["backend"], rec["case_id"])] = rec
    folder = p if p.is_dir() else p.parent
    bundle = None
    if (folder / "bundle.json").is_file():
        try:
            bundle = json.loads((folder / "bundle.json").read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            bundle = None
    env = next((h.get("environment") for h in reversed(headers) if h.get("environment")), None) or {}
    if host is None:
        host = (bundle or {}).get("host_label") or env.get("host")
    return {"path": str(p), "folder": str(folder), "headers": headers, "backends": backends,
            "results": list(latest.values()), "bundle": bundle, "environment": env, "host": host}



# -- writing -----------------------------------------------------------------------------------------
def write_reports(out_dir: "str | Path", summary: dict, *, html_report: bool = True, md_report: bool = True,
                  title: str = "qconform conformance report") -> list[Path]:
    """Write summary.json (always), report.html and report.md into ``out_dir``; returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    p = out / "summary.json"
    p.write_text(json.dumps(json_safe(summary), indent=1, sort_keys=False, allow_nan=False) + "\n", encoding="utf-8")
    written.append(p)
    if html_report:
        p = out / "report.html"
        p.write_text(render_html(summary, title=title), encoding="utf-8")
        written.append(p)
    if md_report:
        p = out / "report.md"
        p.write_text(render_markdown(summary, title=title), encoding="utf-8")
        written.append(p)
    return written


def report_run(run: "str | Path", out_dir: "str | Path | None" = None, *, html_report: bool = True,
               md_report: bool = True) -> list[Path]:
    """The reports of one run folder (or JSONL file), written next to it unless ``out_dir`` is given."""
    src = load_source(run)
    if out_dir is None and (Path(src["folder"]) / "MANIFEST.json").is_file():
        from emulator.errors import QconformError

        raise QconformError(f"{src['folder']} is a sealed certification bundle: its reports are part of it "
                            "(rewriting them would break its hashes); give --out DIR")
    target = out_dir or src["folder"]
    summary = summarize_sources([src], base=target)
    return write_reports(target, summary, html_report=html_report, md_report=md_report)


def merge_bundles(bundles: list["str | Path"], out_dir: "str | Path", *, verify_bundle=None) -> tuple[dict, list]:
    """One matrix over several certification bundles (or run folders): a column per host + backend.

    Each bundle is verified first by ``verify_bundle`` (the CLI passes ``conformance.certify.verify_bundle``:
    the report room sits below certify and never imports it); a bundle that fails is refused. With
    ``verify_bundle=None`` (``--no-verify``) bundles are read unverified and their columns say so.
    Returns (summary, paths written).
    """
    from emulator.errors import QconformError

    sources = []
    for b in bundles:
        folder = Path(b)
        is_bundle = (folder / "MANIFEST.json").is_file()
        verified = None
        if is_bundle and verify_bundle is not None:
            res = verify_bundle(folder)
            if not res.ok:
                raise QconformError(f"{folder}: bundle does not verify ({len(res.problems)} problem(s)); first: "
                                    f"{res.problems[0]}")
            verified = True
        elif not is_bundle:
            verified = False
        src = load_source(folder)
        src["verified"] = verified
        sources.append(src)
    hosts = [s["host"] or Path(s["folder"]).name for s in sources]
    for s, h in zip(sources, hosts):
        s["host"] = h
    summary = summarize_sources(sources, by_host=True, base=out_dir)
    summary["merged_from"] = [s["folder"] for s in sources]
    missing, notes = shard_shortfall(sources)
    if missing or notes:  # a shard set short of a shard (or with one twice) is never CONFORMANT
        from conformance.run.completeness import enforce

        summary.setdefault("notes", [])[:0] = notes
        enforce(summary, missing=missing or {"(a shard given twice)": 1})
    paths = write_reports(out_dir, summary, title="qconform conformance report (merged)")
    return summary, paths


def _shard_group(header: dict) -> tuple:
    """What shards of one sharded run share: the case list's recipe, its backends, the shard count."""
    n = str(header.get("shard")).split("/")[-1]
    return (header.get("profile"), tuple(header.get("tiers") or ()), json.dumps(header.get("schemes"), sort_keys=True),
            tuple(header.get("backends") or ()), header.get("base_seed"), n)


def shard_shortfall(sources: list[dict]) -> "tuple[dict, list[str]]":
    """({what is missing: result count}, notes) for sharded sources (``--shard i/n``) merged without every shard
    1..n of their run, or with one shard twice; ({}, []) when every shard set is whole (or nothing is sharded)."""
    groups: dict = {}
    for src in sources:
        h = (src.get("headers") or [{}])[-1]
        if not h.get("shard"):
            continue
        try:
            i, n = (int(t) for t in str(h["shard"]).split("/"))
        except ValueError:
            return {f"{src['folder']}: unreadable shard {h['shard']!r}": 1}, []
        groups.setdefault(_shard_group(h), {"n": n, "seen": [], "header": h})["seen"].append(i)
    missing, notes = {}, []
    for g in groups.values():
        n, seen, h = g["n"], g["seen"], g["header"]
        absent = [i for i in range(1, n + 1) if i not in seen]
        twice = sorted({i for i in seen if seen.count(i) > 1})
        what = f"profile {h.get('profile')}, backends {', '.join(h.get('backends') or [])}"
        if absent:
            count = _shard_cases(h, absent) * max(1, len(h.get("backends") or []))
            missing[f"shard(s) {', '.join(f'{i}/{n}' for i in absent)} of {what}"] = count
        if twice:
            notes.append(f"shard(s) {', '.join(f'{i}/{n}' for i in twice)} of {what} merged twice: its results "
                         "are counted once per copy")
    return missing, notes


def _shard_cases(header: dict, absent: list[int]) -> int:
    """Cases in the absent shards (re-derived from the header's recipe), at least one per shard."""
    try:
        from conformance.cases.suite import case_list, shard

        schemes = header.get("schemes")
        specs = case_list(schemes=None if schemes in (None, "all") else schemes, tiers=header.get("tiers"),
                          profile=header.get("profile") or "ci", base_seed=header.get("base_seed"))
        n = int(str(header["shard"]).split("/")[1])
        return sum(max(1, len(shard(specs, i, n))) for i in absent)
    except Exception:  # noqa: BLE001 - a recipe this checkout cannot re-derive still counts as missing
        return len(absent)


# -- command line ------------------------------------------------------------------------------------
def cmd_report(args) -> int:
    paths = list(args.paths)
    if paths and paths[0] == "merge":
        if len(paths) < 2:
            raise ValueError("report merge: give one or more bundle folders")
        if not args.out:
            raise ValueError("report merge: --out DIR is required")
        summary, written = merge_bundles(paths[1:], args.out,
                                          verify_bundle=None if args.no_verify else args.verify_bundle)
        print(f"merged {len(paths) - 1} source(s): {len(summary['columns'])} column(s) x "
              f"{len(summary['schemes'])} scheme(s), {summary['n_bad']} failing")
        for note in summary.get("notes") or []:
            if note.startswith(("incomplete", "shard")):
                print(f"note: {note}")
        for p in written:
            print(f"wrote {p}")
        # the merged verdict as the exit status: 1 failing, 4 a shard set short of a shard, else 0
        return 1 if summary["n_bad"] else (4 if summary.get("n_missing") else 0)
    if len(paths) != 1:
        raise ValueError("report: give one run folder or results JSONL file (or 'merge BUNDLE... --out DIR')")
    want_html, want_md = args.html, args.md
    if not want_html and not want_md:
        want_html = want_md = True
    written = report_run(paths[0], args.out, html_report=want_html, md_report=want_md)
    for p in written:
        print(f"wrote {p}")
    return 0


def register(sub, services) -> None:
    """``qconform report``; ``services.verify_bundle`` checks each bundle ``report merge`` reads (certify's
    verifier: this room sits below certify)."""
    s = sub.add_parser("report", help="summary.json, report.md and report.html of a run; 'report merge BUNDLE... "
                                      "--out DIR' combines bundles from several hosts")
    s.add_argument("paths", nargs="+", metavar="OUT", help="a run folder (or results JSONL); or: merge BUNDLE...")
    s.add_argument("--html", action="store_true", help="write report.html (default: html and md)")
    s.add_argument("--md", action="store_true", help="write report.md (default: html and md)")
    s.add_argument("--out", help="folder for the reports (default: the run folder); required for merge")
    s.add_argument("--no-verify", action="store_true", help="merge: skip verifying the bundles")
    s.set_defaults(fn=cmd_report, verify_bundle=services.verify_bundle)
