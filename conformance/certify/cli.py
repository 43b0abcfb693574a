"""The `certify` and `verify-bundle` commands (wired into conformance/cli/main.py through ``register``).

Semantics: docs/certification.md.
"""

from __future__ import annotations

import json
import sys

from conformance.run.placement import add_options as add_placement_options
from conformance.run.placement import open_placement
from conformance.certify.verify import verify_bundle
from conformance.certify.write import CertifyOptions, certify

__all__ = ["cmd_certify", "cmd_verify_bundle", "register"]


def cmd_certify(args) -> int:
    profile, families = args.profile or "certification", None
    from conformance.cases.selection import check_backends

    check_backends(args.backend)  # a typo: one line, exit 2, before anything else is printed
    if args.search and args.no_search:
        raise ValueError("--search and --no-search contradict each other: give one")
    if args.for_model:
        from conformance.certify.dispatch import checkpoint_families

        if args.profile not in (None, "families"):
            raise ValueError(f"--for-model certifies the checkpoint's own case families (profile 'families'), "
                             f"not profile {args.profile!r}")
        profile = "families"
        families, reference_only = checkpoint_families(args.for_model, args.dtype)
        if not families:
            raise ValueError(f"{args.for_model}: no layer a kernel could take (every layer runs the reference)")
        print(f"--for-model {args.for_model}: {len(families)} case famil{'y' if len(families) == 1 else 'ies'} "
              f"at {args.dtype} activations" + (f"; {len(reference_only)} layer(s) always run the reference"
                                                 if reference_only else ""))
    elif args.dtype != "float32":
        raise ValueError("--dtype goes with --for-model (the activation dtype the model will run at)")
    options = CertifyOptions(profile=profile, schemes=args.scheme, tiers=args.tier, shard=args.shard,
                             waivers=args.waivers, jobs=args.jobs, timeout=args.timeout, host_label=args.host_label,
                             memory_limit=args.memory_limit, families=families,
                             search=False if args.no_search else (True if args.search else None),
                             search_seed=args.search_seed, search_examples=args.search_examples,
                             placement=open_placement(args))
    res = certify(args.backend, args.out, options, progress=not args.no_progress and sys.stderr.isatty())
    counts = ", ".join(f"{n} {v}" for v, n in sorted(res.counts.items()))
    print(f"bundle: {res.path} ({counts})")
    for label, verdicts in _per_backend(res.path).items():  # which backend failed, not only how many cases
        print(f"  {label}: " + ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items())))
    _print_coverage_and_search(res.path)
    print(f"bundle sha256 (of MANIFEST.json): {res.manifest_sha256}")
    print(f"report: {res.path / 'report.html'}")
    print(f"verify: qconform verify-bundle {res.path}")
    for label, why in res.unavailable.items():
        print(f"unavailable: {label}: {why}")
    for label in res.no_judged_case:
        if label not in res.unavailable:
            print(f"no judged case: {label}: every case was refused (unsupported) or crashed; nothing was compared")
    if res.unavailable:
        print(f"certification: NOT CERTIFIED ({len(res.unavailable)} backend(s) could not run here; "
              f"{res.n_bad} failing of {res.n_results})")
    elif res.no_judged_case:
        print(f"certification: NOT CERTIFIED (no judged case for {', '.join(res.no_judged_case)}; "
              f"{res.n_bad} failing of {res.n_results})")
    else:
        from conformance.report.summary import headline as run_headline

        summary = _bundle_summary(res.path)
        head = run_headline(summary) if summary else "?"
        searched = search_failures(res.path)
        why = f"; property search: {searched} failing example(s)" if searched else ""
        print(f"certification: {'PASS' if res.ok else 'FAIL'} (case list: {res.n_bad} failing of {res.n_results}, "
              f"{head}, level {summary.get('level') if summary else '?'}{why})")
    return 0 if res.ok else 1


def search_failures(folder) -> int:
    """Failing examples of the bundle's property search (0: none, or no search): a FAIL that the case list alone
    does not explain names it."""
    try:
        rec = json.loads((folder / "bundle.json").read_text(encoding="utf-8")).get("search")
    except (OSError, ValueError):
        return 0
    return int(rec.get("n_bad") or 0) if isinstance(rec, dict) and not rec.get("ok", True) else 0


def _print_coverage_and_search(folder) -> None:
    """What the certificate covers (certificate.md): the coverage table's totals and the search."""
    try:
        meta = json.loads((folder / "bundle.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    cov = meta.get("coverage")
    if isinstance(cov, dict):
        per = cov.get("schemes") or {}
        print(f"coverage: {sum(c['classes_covered'] for c in per.values())}/{sum(c['classes'] for c in per.values())} "
              f"classes, {sum(c['pairs_covered'] for c in per.values())}/"
              f"{sum(c['pairs_feasible'] for c in per.values())} feasible class pairs of {len(per)} scheme(s) "
              f"(design seeds {cov.get('design_seeds')})")
    rec = meta.get("search")
    if isinstance(rec, dict):
        print(f"search: seed {rec['seed']}, {rec['examples_per_family']} examples per family, "
              f"{len(rec.get('families_searched') or [])} families x {len(rec.get('backends') or {})} backend(s), "
              f"{rec['examples_judged']} examples judged: "
              + ("no failure" if rec["ok"] else f"{rec['n_bad']} failing (see {rec['results']})"))
    else:
        print("search: not run (--no-search, or a profile of given shapes: families, model; --search runs it)")
    print(f"certificate: {folder / 'certificate.md'}")


def _per_backend(folder) -> dict:
    """{backend label: {verdict: count}} from a bundle's results.jsonl (empty where it cannot be read)."""
    from collections import Counter
    from pathlib import Path

    out: dict = {}
    try:
        with open(Path(folder) / "results.jsonl", encoding="utf-8") as f:
            for line in f:
                rec = json.loads(line)
                if rec.get("kind") == "result":
                    out.setdefault(rec["backend"], Counter())[rec.get("verdict")] += 1
    except (OSError, ValueError):
        return {}
    return out


def _bundle_summary(folder) -> dict | None:
    """The bundle's summary.json (its headline and level), None where it cannot be read."""
    import json

    try:
        return json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def cmd_verify_bundle(args) -> int:
    if args.rerun < 0:
        raise ValueError(f"--rerun expects a number of cases >= 0, got {args.rerun}")
    res = verify_bundle(args.bundle, deep=args.deep, any_version=args.any_version, rerun=args.rerun,
                        rerun_seed=args.rerun_seed)
    if args.json:
        print(json.dumps({"ok": res.ok, "problems": res.problems, "notes": res.notes, "checked": dict(res.checked),
                          "manifest_sha256": res.manifest_sha256, "version_mismatch": res.version_mismatch,
                          "rerun_seed": res.rerun_seed},
                         indent=1))
        return 0 if res.ok else 1
    for p in res.problems[:200]:
        print(f"verify-bundle: {p}")
    if len(res.problems) > 200:
        print(f"verify-bundle: ... {len(res.problems) - 200} more problem(s)")
    for n in res.notes:
        print(f"note: {n}")
    c = res.checked
    print(f"{res.path}: {c.get('files', 0)} file(s) hashed, {c.get('results', 0)} result(s), "
          f"{c.get('recomputed', 0)} verdict(s) recomputed from stored outputs"
          + (f", {c.get('deep', 0)} re-derived from the emulator" if args.deep else "")
          + f", {c.get('not_recomputable', 0)} without output (crash/timeout/unsupported: "
            f"{c.get('evidence', 0)} with their evidence checked)"
          + (f", {c.get('rerun', 0)} re-executed ({c.get('rerun_skipped', 0)} skipped: backend unavailable; "
             f"seed {res.rerun_seed}), {c.get('search_replayed', 0)} search famil(ies) replayed" if args.rerun else ""))
    print(f"bundle sha256 (of MANIFEST.json): {res.manifest_sha256}")
    if res.ok:
        print("bundle OK (its files, records and verdicts check out)")
        print(f"certification recorded in it: {_recorded_verdict(args.bundle)}")
    elif res.version_mismatch and not args.any_version and len(res.problems) == 1:
        print("bundle NOT VERIFIED: written by another suite version (its hashes and records check out; "
              "its verdicts were not recomputed)")
    else:
        print(f"bundle FAILS verification: {len(res.problems)} problem(s)")
    return 0 if res.ok else 1


def _recorded_verdict(folder) -> str:
    """What a verified bundle says of its backends: PASS, FAIL or NOT CERTIFIED (bundle.json's ``ok`` and
    counts). A bundle can verify (a true record) and record a failed certification."""
    from pathlib import Path

    try:
        meta = json.loads((Path(folder) / "bundle.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return f"? (bundle.json unreadable: {e})"
    n_bad, n = meta.get("n_bad"), meta.get("n_results")
    if meta.get("unavailable") or meta.get("no_judged_case"):
        why = ", ".join(list(meta.get("unavailable") or {}) + list(meta.get("no_judged_case") or []))
        return f"NOT CERTIFIED (no judged case or unavailable: {why}; {n_bad} failing of {n})"
    return f"{'PASS' if meta.get('ok') else 'FAIL'} ({n_bad} failing of {n}; bundle.json ok: {str(meta.get('ok')).lower()})"


def register(sub, services) -> None:
    from conformance.cases.suite import PROFILES, TIERS

    s = sub.add_parser("certify", help="run the certification profile on backends and write a verifiable bundle")
    s.add_argument("--backend", action="append", required=True, help="backend spec; repeatable")
    s.add_argument("--out", default="qconform-certification", help="bundle folder (must not exist or be empty; the run happens in OUT.partial)")
    s.add_argument("--profile", default=None, choices=sorted(PROFILES),
                   help="case list (default: certification; --for-model: families)")
    s.add_argument("--for-model", metavar="CKPT",
                   help="certify the case families this checkpoint's layers need (profile 'families'), for "
                        "`qconform model CKPT --certified` (docs/certification.md#families)")
    s.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="with --for-model: the activation dtype the model will run at (qconform model --dtype)")
    s.add_argument("--scheme", action="append", help="restrict to a scheme; repeatable")
    s.add_argument("--tier", action="append", help=f"restrict to a tier ({', '.join(TIERS)}); repeatable")
    s.add_argument("--shard", help="i/n: certify shard i of n of the case list")
    s.add_argument("--waivers", help="waivers TOML file")
    s.add_argument("-j", "--jobs", type=int, default=1, help="worker processes per backend")
    s.add_argument("--timeout", type=float, default=120.0, help="seconds per case before the worker is killed")
    s.add_argument("--host-label", help="name of this host in merged reports (default: the host name)")
    s.add_argument("--memory-limit", default=None,
                   help="memory cap per worker, e.g. 8G or 512M; 0: none (default: half the host's memory)")
    s.add_argument("--no-progress", action="store_true")
    s.add_argument("--search-seed", type=int, default=0,
                   help="seed of the property search certify runs after the case list (recorded in the bundle)")
    s.add_argument("--search-examples", type=int, default=None, metavar="N",
                   help="examples per family of the search (default: the profile's budget, "
                        "docs/conformance.md#property-tier)")
    s.add_argument("--search", action="store_true",
                   help="run the property search also for a profile of given shapes (model, families), which "
                        "skips it by default")
    s.add_argument("--no-search", action="store_true",
                   help="skip the property search (the certificate then says no search was run; --for-model "
                        "runs none: its families are certified at the checkpoint's shapes)")
    add_placement_options(s)  # --devices, --executor, --address (docs/scaling.md)
    s.set_defaults(fn=cmd_certify)

    s = sub.add_parser("verify-bundle", help="re-check a certification bundle offline (hashes, every verdict)")
    s.add_argument("bundle")
    s.add_argument("--deep", action="store_true", help="also rebuild every case from its id and recompute the "
                                                       "intervals with this checkout's emulator")
    s.add_argument("--any-version", action="store_true",
                   help="recompute verdicts even when another suite version wrote the bundle (expect spurious "
                        "problems where the judging code changed)")
    s.add_argument("--rerun", type=int, default=0, metavar="N",
                   help="audit: re-execute N randomly chosen cases on their backend where it is available and "
                        "require the stored outputs (docs/certification.md#audit)")
    s.add_argument("--rerun-seed", type=int, default=None, help="seed of the --rerun choice (default: random, "
                                                                 "printed)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_verify_bundle)
