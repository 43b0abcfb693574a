"""The model bench's timing loop (benchmarks/model_bench.py ``timed_rounds``): the contenders' order rotates by one each
round, so no contender holds the same slot (nor follows the same contender) in every round, and every round's
time is kept. No speed is asserted: fake contenders record the order they ran in."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from benchmarks import model_bench  # noqa: E402


def test_timed_rotates_the_order_and_keeps_every_round():
    order: list[str] = []

    def contender(name):
        def f(tokens):
            order.append(name)
        return f

    fns = {k: contender(k) for k in ("fast", "auto", "dense")}
    rounds: dict = {}
    best = model_bench.timed_rounds(fns, [1, 2], 3, rounds)
    assert list(best) == ["fast", "auto", "dense"]
    timed = order[1::2]  # each contender runs once untimed, then timed
    assert order[0::2] == timed
    assert [timed[i:i + 3] for i in (0, 3, 6)] == [["fast", "auto", "dense"], ["auto", "dense", "fast"],
                                                   ["dense", "fast", "auto"]]
    assert {k: len(v) for k, v in rounds.items()} == {"fast": 3, "auto": 3, "dense": 3}
    assert all(best[k] == min(rounds[k]) for k in fns)
