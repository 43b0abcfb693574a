"""``python -m benchmarks.exact_decision``: the elements of a float32 A16 layer that float64 leaves undecided,
decided one at a time (``round_exact_products`` per element: the path before issue 25) and vectorised
(``emulator.linear.decide_exactly``: docs/formats/activations.md#deciding-the-undecided-elements), timed
alternately on the same result, best of 3; both must agree bit for bit."""

from __future__ import annotations

import copy
import time

import numpy as np

from emulator import linear as lin
from emulator.numerics.exact_sum import round_exact_products


def main() -> None:
    rng = np.random.default_rng(0)
    for M, N, K in ((136, 2048, 2048), (136, 5632, 2048), (136, 2048, 5632)):
        x = rng.standard_normal((M, K)).astype(np.float32)
        w = (rng.standard_normal((N, K)) * 0.02).astype(np.float32)
        x64, w64 = x.astype(np.float64), w.astype(np.float64)
        base = lin.linear_w16(x, w, None, out_dtype="float32")
        at = np.argwhere(base.y_ambiguous)

        def one_at_a_time():
            return [round_exact_products([(x64[m], w64[n])], "float32") for m, n in at]

        def vectorised():
            r = copy.copy(base)
            r.y = base.y.copy()
            return lin.decide_exactly(r, lambda ms, ns: [(x64[ms], w64[ns])])

        best = [float("inf"), float("inf")]
        for _ in range(3):
            t0 = time.perf_counter()
            a = one_at_a_time()
            t1 = time.perf_counter()
            r = vectorised()
            t2 = time.perf_counter()
            best = [min(best[0], t1 - t0), min(best[1], t2 - t1)]
        assert np.array_equal(np.array(a), r.y[at[:, 0], at[:, 1]]), "the two paths disagree"
        print(f"{M}x{N}x{K}: {len(at)} undecided; one at a time {best[0] * 1e3:.0f} ms, vectorised "
              f"{best[1] * 1e3:.0f} ms: {best[0] / best[1]:.1f}x faster")


if __name__ == "__main__":
    main()
