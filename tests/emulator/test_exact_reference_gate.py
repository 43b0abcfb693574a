"""Regression gate: the exact reference (emulator/linear.py) returns today's outputs bit for bit.

The stored outputs (tests/data/exact_reference_gate.safetensors) were computed by main's code at commit
c8c12d5, before the elements float64 leaves undecided were decided vectorised; the cases are listed in
tests/emulator/exact_reference_gate.py. This compares the code with an earlier version of itself (a
regression gate, not an oracle): the oracle tests of the decision are test_exact_decision.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import load_file

from exact_reference_gate import GOLDEN, cases

_STORED = load_file(str(GOLDEN))
_CASES = list(cases())


def test_the_gate_exercises_the_exact_decision():
    """The stored cases hold elements float64 could not decide (else the gate would not cover the decision)."""
    undecided = sum(int(v.sum()) for k, v in _STORED.items() if k.endswith("|ambiguous"))
    assert undecided >= 200
    assert len(_CASES) * 2 == len(_STORED)


@pytest.mark.parametrize("key,run", _CASES, ids=[k for k, _ in _CASES])
def test_exact_reference_is_unchanged(key, run):
    r = run()
    want = _STORED[key + "|y"]
    got = np.asarray(r.y, dtype=np.float64)
    assert np.array_equal(got, want.astype(np.float64), equal_nan=True), (
        f"{key}: {int(np.sum(got != want))} elements differ from the stored exact reference")
    assert np.array_equal(r.y_ambiguous, _STORED[key + "|ambiguous"].astype(bool)), key


_W16 = [(k, run) for k, run in cases(fast=True) if "|e0|" in k or "|w16" in k]


@pytest.mark.parametrize("key,run", _W16, ids=[k for k, _ in _W16])
def test_the_fast_a16_reference_gives_the_same_outputs(key, run):
    """``linear_w16_fast`` (emulator/fast_linear_w16.py: the bound from the rows' 2-norms, what the fallback's exact
    reference runs) returns the stored outputs bit for bit, zeros' signs included (regression gate)."""
    r = run()
    want = _STORED[key + "|y"].astype(np.float64)
    got = np.asarray(r.y, np.float64)
    assert np.array_equal(got, want, equal_nan=True), key
    assert np.array_equal(np.signbit(got), np.signbit(want)), key
