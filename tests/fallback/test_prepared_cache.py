"""qconform_torch/prepared_cache.py: the op's scan-resistant cache of prepared layers (docs/fallback.md#the-cache).

Oracle: the hand-derived behaviour of a repeated scan (each forward requests every layer once, in order) and
of a plain LRU on the same requests (simulated here in a few lines), not the code under test.
"""

from __future__ import annotations

import collections

from qconform_torch.prepared_cache import PreparedCache

MiB = 1 << 20


def _forward(cache: PreparedCache, layers, size: int) -> int:
    """One forward pass: every layer requested once, in order, as qconform_torch/op.py asks (``admits``, then
    ``get`` and ``put``, or ``count_streamed``); returns the hits."""
    hits = 0
    for name in layers:
        if not cache.admits(name, size):
            cache.count_streamed(name)
        elif cache.get(name) is not None:
            hits += 1
        else:
            assert cache.put(name, object(), size)
        assert cache.used <= cache.budget
    return hits


def _lru_hits(layers, size: int, budget: int, passes: int) -> int:
    d: collections.OrderedDict = collections.OrderedDict()
    hits = 0
    for _ in range(passes):
        for name in layers:
            if name in d:
                d.move_to_end(name)
                hits += 1
                continue
            while d and (len(d) + 1) * size > budget:
                d.popitem(last=False)
            d[name] = 1
    return hits


def test_a_repeated_scan_keeps_a_stable_set_that_fills_the_budget():
    """56 layers of 8 MiB, a 100 MiB budget: from the second forward on, 12 layers (96 MiB) hit on every pass,
    always the same ones; a plain LRU on the same requests never hits."""
    layers = [f"layer{i}" for i in range(56)]
    c = PreparedCache(100 * MiB)
    assert _forward(c, layers, 8 * MiB) == 0
    kept = set(c._d)
    for _ in range(4):
        assert _forward(c, layers, 8 * MiB) == 12
        assert set(c._d) == kept
    assert c.used == 96 * MiB
    assert _lru_hits(layers, 8 * MiB, 100 * MiB, 5) == 0


def test_layers_no_longer_requested_are_replaced():
    """A second model's layers take over the cache from the first's (whose entries are no longer requested)."""
    c = PreparedCache(40 * MiB)
    a = [f"a{i}" for i in range(10)]
    b = [f"b{i}" for i in range(10)]
    for _ in range(3):
        _forward(c, a, 8 * MiB)
    assert all(k.startswith("a") for k in c._d)
    hits = [_forward(c, b, 8 * MiB) for _ in range(6)]
    assert hits[-1] == 5 and all(k.startswith("b") for k in c._d)


def test_an_entry_over_the_budget_is_never_cached_and_stats_count_it():
    c = PreparedCache(10 * MiB)
    assert not c.admits("big", 11 * MiB)
    assert not c.put("big", object(), 11 * MiB)
    c.count_streamed("big")
    assert c.stats()["uncached"] == 2 and c.stats()["misses"] == 1 and c.used == 0
    c.reset(0)
    assert not c.admits("x", 1) and c.stats()["budget_bytes"] == 0
