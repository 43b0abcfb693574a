"""The bounded, seeded search of a certification: the property tier (conformance/run/property_search.py) run by
``qconform certify`` with a recorded seed and example budget per family, and what a bundle says about it.

Semantics: docs/certification.md#coverage-and-search. The search runs after the case list, in its own
runner folder ``search/`` inside the bundle (its ``results.jsonl``, the Hypothesis example database, replay
bundles of shrunk failures, worker logs), so the case list's records stay exactly backends x cases.
``search_record`` derives bundle.json's ``search`` from ``search/results.jsonl`` alone; verify-bundle
derives it again and requires the same record, every (backend, family) line at the recorded seed and budget,
and every failure's replay bundle; ``--rerun`` replays the search and requires the same outcome.
``certificate_text`` is ``certificate.md``: what the certification covers (the coverage table of the
profile, the search budget) and what it concluded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path

from conformance.judge.verdict import BAD, Verdict

__all__ = ["SEARCH_DIR", "SearchSpec", "search_profile", "run_search", "search_record", "search_ok", "check_search",
           "replay_search", "certificate_text", "CERTIFICATE"]

SEARCH_DIR = "search"
CERTIFICATE = "certificate.md"


def search_profile(profile: str) -> str:
    """The property profile of a case profile (the model and families profiles search like certification)."""
    from conformance.cases.property import PROPERTY_PROFILES

    return profile if profile in PROPERTY_PROFILES else "certification"


def search_schemes(schemes, families) -> "list | None":
    """The schemes searched: the certified ones (a checkpoint's families: theirs)."""
    if families:
        return sorted({f["scheme"] for f in families if isinstance(f, dict) and f.get("scheme")})
    return list(schemes) if schemes else None


@dataclasses.dataclass(frozen=True)
class SearchSpec:
    """One bounded search: the case profile it is drawn for (``search_profile``), the schemes (None: all), the
    seed and the examples per family (None: the profile's budget); bundle.json ``search`` records them."""

    profile: str
    schemes: "list | None" = None
    seed: int = 0
    examples: "int | None" = None


def run_search(work: Path, backends: list, search: SearchSpec, *, timeout: float = 120.0, waivers=None,
               log=print) -> None:
    """Run the property search of every backend into ``work/search`` (replaced if a resumed certify left one)."""
    from conformance.cases.property import families
    from conformance.run.property_search import run_property
    from conformance.run.runner import Runner

    profile, schemes, seed, examples = search.profile, search.schemes, search.seed, search.examples
    folder = Path(work) / SEARCH_DIR
    shutil.rmtree(folder, ignore_errors=True)
    prof = search_profile(profile)
    runner = Runner(folder, timeout=timeout, waivers=waivers, progress=False)
    try:
        header = {"suite": "qconform", "profile": prof, "tiers": ["property"], "backends": list(backends),
                  "schemes": list(schemes) if schemes else "all", "case_count": 0, "property_seed": seed,
                  "property_examples": examples, "certify_search": True}
        log(f"qconform certify: property search, {len(families(schemes))} famil(ies) x {len(backends)} backend(s), "
            f"seed {seed}, profile {prof}")
        runner.run(list(backends), [], header=header)
        run_property(runner, list(backends), profile=prof, seed=seed, schemes=schemes, max_examples=examples)
    finally:
        runner.close()
    _relative_bundles(folder)


def _relative_bundles(folder: Path) -> None:
    """Replay bundle paths in search/results.jsonl as the bundle names them (``search/bundles/<file>``)."""
    p = folder / "results.jsonl"
    if not p.exists():
        return
    out = []
    for line in p.read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        if rec.get("bundle"):
            rec["bundle"] = f"{SEARCH_DIR}/bundles/{Path(rec['bundle']).name}"
        out.append(json.dumps(rec, sort_keys=True))
    p.write_text("".join(x + "\n" for x in out), encoding="utf-8")
    shutil.rmtree(folder / ".work", ignore_errors=True)
    from conformance.run.outlock import LOCK_NAME

    (folder / LOCK_NAME).unlink(missing_ok=True)


def _lines(raw: bytes) -> list[dict]:
    return [json.loads(x) for x in raw.decode("utf-8").splitlines() if x.strip()]


def search_record(raw: bytes, *, profile: str, schemes=None, seed: int = 0, examples: "int | None" = None,
                  backends: "list | None" = None) -> dict:
    """bundle.json's ``search``, derived from the bytes of search/results.jsonl alone."""
    from conformance.cases.property import PROPERTY_PROFILES, families

    prof = search_profile(profile)
    budget = int(examples) if examples is not None else PROPERTY_PROFILES[prof]["examples"]
    fams: dict = {}
    counts: Counter = Counter()
    for rec in _lines(raw):
        if rec.get("kind") != "result":
            continue
        p = rec.get("property") or {}
        fam = p.get("family") or f"{rec.get('scheme')}/{rec.get('weight_format')}"
        entry = {"verdict": rec["verdict"], "case_id": rec["case_id"], "seed": p.get("seed"),
                 "max_examples": p.get("max_examples"), "calls": p.get("calls", 0), "judged": p.get("judged", 0)}
        if rec.get("bundle"):
            entry["replay"] = rec["bundle"]
        if p.get("minimal"):
            entry["minimal"] = (p["minimal"] or {}).get("case")
        fams.setdefault(rec["backend"], {}).setdefault(fam, []).append(entry)
        counts[rec["verdict"]] += 1
    n_bad = sum(counts[v] for v in BAD)
    return {"tier": "property", "profile": prof, "seed": seed, "examples_per_family": budget,
            "limits": {k: v for k, v in PROPERTY_PROFILES[prof].items() if k != "examples"},
            "families_searched": [f"{s}/{f}" for s, f in families(schemes)],
            "results": f"{SEARCH_DIR}/results.jsonl", "results_sha256": hashlib.sha256(raw).hexdigest(),
            "backends": fams, "verdicts": dict(sorted(counts.items())), "n_bad": n_bad,
            "examples_judged": sum(e["judged"] or 0 for b in fams.values() for es in b.values() for e in es),
            "ok": n_bad == 0}


def search_ok(files, meta: dict) -> bool:
    """Whether the recorded search passed, recomputed from the search's results (not from ``meta``'s claim);
    True where the bundle records no search (its certificate says so)."""
    rec = meta.get("search")
    if not isinstance(rec, dict):
        return True
    raw = files.get(rec.get("results") or f"{SEARCH_DIR}/results.jsonl", "search results")
    if raw is None:
        return False
    return not any(r.get("kind") == "result" and r.get("verdict") in BAD for r in _lines(raw))


def check_search(files, meta: dict, problems: list, notes: list, *, deep: bool = False) -> None:
    """verify-bundle: the search record, its results, its budget and completeness; the coverage record;
    certificate.md."""
    from conformance.cases.property import families

    rec = meta.get("search")
    if rec is None:
        notes.append("no property search recorded (certify --no-search): the certificate covers the case list only")
    elif not isinstance(rec, dict):
        problems.append("bundle.json: search is not a record")
    else:
        rel = rec.get("results") or f"{SEARCH_DIR}/results.jsonl"
        raw = files.get(rel, "bundle.json search results")
        if raw is not None:
            want = search_record(raw, profile=meta.get("profile", ""), schemes=_search_schemes(meta),
                                 seed=rec.get("seed", 0), examples=rec.get("examples_per_family"))
            if rec.get("examples_per_family") != want["examples_per_family"] or rec != want:
                diff = sorted(k for k in set(rec) | set(want) if rec.get(k) != want.get(k))
                problems.append(f"bundle.json: search record differs from {rel} ({', '.join(diff)})")
            fams = {f"{s}/{f}" for s, f in families(_search_schemes(meta))}
            for b in (meta.get("backends") or {}):
                got = set((want["backends"].get(b) or {}))
                if got != fams:
                    problems.append(f"{rel}: backend {b!r} searched {len(got)} of {len(fams)} families "
                                    f"(missing: {sorted(fams - got)[:3]})")
            for b, by in want["backends"].items():
                for fam, entries in by.items():
                    for e in entries:
                        if e["seed"] != rec.get("seed") or e["max_examples"] not in (None, rec.get("examples_per_family")):
                            problems.append(f"{rel}: {b} {fam} searched at seed {e['seed']}, {e['max_examples']} "
                                            f"examples; the record says seed {rec.get('seed')}, "
                                            f"{rec.get('examples_per_family')}")
                        if e["verdict"] in BAD and (not e.get("replay") or files.path(e["replay"], "replay") is None):
                            problems.append(f"{rel}: {b} {fam}: a {e['verdict']} without its replay bundle")
                        if deep and e["verdict"] not in BAD | {Verdict.UNSUPPORTED} and not e["judged"]:
                            problems.append(f"{rel}: {b} {fam}: verdict {e['verdict']} with no judged example")
                        if deep and (e["judged"] or 0) > (e["calls"] or 0):
                            problems.append(f"{rel}: {b} {fam}: {e['judged']} judged of {e['calls']} drawn")
    cert = files.get(CERTIFICATE, CERTIFICATE) if "search" in meta or "coverage" in meta else None
    if cert is not None and cert != certificate_text(meta).encode("utf-8"):
        problems.append(f"{CERTIFICATE}: differs from what bundle.json gives (edited after the run?)")
    if deep:
        _deep_coverage(meta, problems)


def _schemes(meta: dict):
    s = meta.get("schemes")
    return None if s in (None, "all") else list(s)


def _search_schemes(meta: dict):
    return search_schemes(_schemes(meta), meta.get("families"))


def _deep_coverage(meta: dict, problems: list) -> None:
    """--deep: the coverage record is what this suite's tables and design give for the profile, and every
    class of every table is covered."""
    from conformance.report.coverage import coverage_record
    from conformance.cases.specs import PROFILES

    profile = meta.get("profile")
    if profile not in PROFILES or not PROFILES[profile].get("coverage"):
        if meta.get("coverage") is not None:
            problems.append(f"bundle.json: a coverage record for profile {profile!r}, which draws no design")
        return
    want = json.loads(json.dumps(coverage_record(profile, _schemes(meta))))
    if meta.get("coverage") != want:
        problems.append("bundle.json: coverage record differs from this suite's tables and design "
                        f"(tables sha256 {str((meta.get('coverage') or {}).get('table_sha256'))[:12]} vs "
                        f"{want['table_sha256'][:12]})")
    for s, c in want["schemes"].items():
        if c["classes_covered"] != c["classes"] or c["pairs_covered"] != c["pairs_feasible"]:
            problems.append(f"coverage: {s}: {c['classes_covered']}/{c['classes']} classes, "
                            f"{c['pairs_covered']}/{c['pairs_feasible']} feasible pairs")


def replay_search(folder: Path, meta: dict, problems: list, notes: list, timeout: float = 120.0) -> int:
    """verify-bundle --rerun: run the recorded search again (same seed, budget, families, empty example
    database) on every backend available here; each family must end as recorded (failing or not), and a
    deterministic backend must judge the same number of examples. Returns the families replayed."""
    import tempfile

    rec = meta.get("search")
    if not isinstance(rec, dict):
        return 0
    backends = {b: (info or {}).get("spec") for b, info in (meta.get("backends") or {}).items()}
    with tempfile.TemporaryDirectory(prefix="qconform-search-replay-") as tmp:
        from conformance.run.runner import Runner

        probe = Runner(Path(tmp) / "probe", timeout=timeout, progress=False)
        run = []
        for b, spec in backends.items():
            hello = probe.hello(spec) if spec else {}
            if hello.get("ok") and hello.get("available"):
                run.append((b, spec, hello.get("deterministic", True)))
            else:
                notes.append(f"search replay: {b} is not available here; its search was not replayed")
        probe.close()
        if not run:
            return 0
        run_search(Path(tmp), [s for _, s, _ in run],
                   SearchSpec(profile=meta.get("profile", ""), schemes=_search_schemes(meta), seed=rec.get("seed", 0),
                              examples=rec.get("examples_per_family")),
                   timeout=timeout, log=lambda *_: None)
        raw = (Path(tmp) / SEARCH_DIR / "results.jsonl").read_bytes()
        again = search_record(raw, profile=meta.get("profile", ""), schemes=_search_schemes(meta),
                              seed=rec.get("seed", 0), examples=rec.get("examples_per_family"))
    n = 0
    for b, _spec, deterministic in run:
        was, now = (rec.get("backends") or {}).get(b, {}), again["backends"].get(b, {})
        for fam in sorted(set(was) | set(now)):
            n += 1
            w = sorted(e["verdict"] in BAD for e in was.get(fam, []))
            g = sorted(e["verdict"] in BAD for e in now.get(fam, []))
            if any(w) != any(g):
                problems.append(f"search replay: {b} {fam}: recorded {'failing' if any(w) else 'passing'}, "
                                f"replayed {'failing' if any(g) else 'passing'}")
            elif deterministic and not any(w):
                jw = sum(e["judged"] for e in was.get(fam, []))
                jg = sum(e["judged"] for e in now.get(fam, []))
                if jw != jg:
                    problems.append(f"search replay: {b} {fam}: recorded {jw} judged examples, replayed {jg}")
    return n


def certificate_text(meta: dict) -> str:
    """certificate.md: what the certification covers and what it concluded, from bundle.json alone."""
    ok = meta.get("ok")
    lines = [f"# qconform certificate: {'PASS' if ok else 'FAIL'}", "",
             f"Profile `{meta.get('profile')}`, schemes {meta.get('schemes')}, tiers {', '.join(meta.get('tiers') or [])}; "
             f"{meta.get('case_count')} case(s) x {len(meta.get('backends') or {})} backend(s) "
             f"({', '.join(meta.get('backends') or {})}); {meta.get('n_bad')} failing of {meta.get('n_results')}; "
             f"case list sha256 `{meta.get('case_list_sha256')}`.", ""]
    cov = meta.get("coverage")
    lines += ["## Coverage (docs/conformance.md#coverage)", ""]
    if isinstance(cov, dict):
        lines += [f"Covering design seeds {cov.get('design_seeds')} over the feature tables (sha256 "
                  f"`{cov.get('table_sha256')}`):", "",
                  "| scheme | coverage cases | classes covered | feasible pairs covered | infeasible pairs |",
                  "| --- | --- | --- | --- | --- |"]
        for s, c in (cov.get("schemes") or {}).items():
            lines.append(f"| `{s}` | {c.get('cases')} | {c.get('classes_covered')}/{c.get('classes')} | "
                         f"{c.get('pairs_covered')}/{c.get('pairs_feasible')} | {c.get('pairs_infeasible')} |")
    else:
        lines.append("This profile draws no covering design: only its grid cases were run.")
    lines += ["", "## Search (docs/conformance.md#property-tier)", ""]
    rec = meta.get("search")
    if isinstance(rec, dict):
        lines.append(f"Hypothesis search, seed {rec.get('seed')}, at most {rec.get('examples_per_family')} examples "
                     f"per family (shapes up to M, N, K = {rec.get('limits', {}).get('max_m')}, "
                     f"{rec.get('limits', {}).get('max_n')}, {rec.get('limits', {}).get('max_k')}), "
                     f"{len(rec.get('families_searched') or [])} families per backend; "
                     f"{rec.get('examples_judged')} examples judged; verdicts {rec.get('verdicts')}; "
                     f"{'no failure found' if rec.get('ok') else str(rec.get('n_bad')) + ' failing famil(ies)'}.")
    else:
        lines.append("No search was run (certify --no-search).")
    lines += ["", "Not covered: what lies outside these classes, shapes and the search budget; a pass is a "
              "statement about these inputs.", ""]
    return "\n".join(lines)
