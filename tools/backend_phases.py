"""Where a backend's certification time goes: per-phase times over the ci cases it supports, in one process.

Usage: ``python tools/backend_phases.py BACKEND N`` (e.g. ``gemlite 80`` on a CUDA host): availability (import and
device start-up), the number of distinct (M, N, K, dtype) among the supported cases, input/prepare/run seconds
over the first N, the mean run time of a case whose shape is new to the process against a repeated shape, and
the top of a cProfile. Numbers: docs/scaling.md#measured-2026-11-28.
"""
import cProfile, collections, io, json, pstats, sys, time
t0 = time.perf_counter()
from backends.registry import create
from conformance.cases.suite import case_list
name, n = sys.argv[1], int(sys.argv[2])
b = create(name); av = b.availability(); t_av = time.perf_counter() - t0
print("availability", av.available, av.reason, f"{t_av:.2f}s", flush=True)
specs = case_list(profile="ci")
sel = [s for s in specs if b.can_implement(s.case).ok]
print("supported", len(sel), "of", len(specs), flush=True)
shapes = collections.Counter((s.case.M, s.case.N, s.case.K, s.case.act_dtype) for s in sel)
print("distinct (M,N,K,dtype):", len(shapes), flush=True)
ph = collections.defaultdict(float)
pr = cProfile.Profile()
seen = set(); first = []; again = []
for s in sel[:n]:
    a = time.perf_counter(); inp = s.inputs(); b1 = time.perf_counter()
    pr.enable(); p = b.prepare(inp.case, inp.tensors); c = time.perf_counter()
    y = b.run(p, inp.x, bias=inp.bias, router_logits=inp.router_logits); d = time.perf_counter(); pr.disable()
    ph["inputs"] += b1 - a; ph["prepare"] += c - b1; ph["run"] += d - c
    key = (s.case.M, s.case.N, s.case.K, s.case.act_dtype)
    (again if key in seen else first).append(d - c); seen.add(key)
tot = sum(ph.values())
print(json.dumps({k: round(v, 2) for k, v in ph.items()}), f"total {tot:.1f}s for {min(n, len(sel))} cases",
      f"-> {min(n, len(sel)) / tot:.2f} cases/s", flush=True)
import statistics as st
print("run first-seen shape: n=%d mean %.3fs; repeat shape: n=%d mean %.3fs" % (
    len(first), st.mean(first) if first else 0, len(again), st.mean(again) if again else 0))
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(25); print(s.getvalue()[:6000])
