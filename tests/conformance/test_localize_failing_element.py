"""The element a failure names is a failing element (issue 21 item 4; docs/conformance.md#verdicts): outside
the judged interval, NaN/Inf mismatches counted and named first, never an element inside its interval."""

import numpy as np

from conformance.judge.acceptance import Interval
from conformance.report.summary import describe_worst
from conformance.judge.verdict import decide, decide_opaque


def _iv(y_exact, lo, hi):
    y_exact = np.asarray(y_exact, np.float64)
    return Interval(y_ref=np.where(np.isfinite(y_exact), 1.0, y_exact), y_exact=y_exact, lo=np.asarray(lo, np.float64),
                    hi=np.asarray(hi, np.float64), bound=np.zeros_like(y_exact), out_dtype="float32")


def test_worst_element_is_outside_the_judged_interval():
    # element 0 uses 90% of the loose interval but is inside the judged one; element 1 barely leaves the judged one
    loose = _iv([[1.0, 1.0]], [[0.5, 0.5]], [[1.5, 1.5]])
    judged = _iv([[1.0, 1.0]], [[0.5, 1.0]], [[1.5, 1.0]])
    y = np.array([[1.45, 1.01]])
    rec = decide(y, loose, judged).record()
    assert rec["verdict"] == "fail"
    we = rec["worst_element"]
    assert we["index"] == [0, 1] and not (we["lo"] <= we["observed"] <= we["hi"])


def test_nan_reference_mismatch_is_named_first_and_counted():
    # the reference is NaN at [0, 0] and [0, 2] (observed 0: a failure); [0, 1] is far but inside loose only
    loose = _iv([[np.nan, 1.0, np.nan]], [[np.nan, 0.0, np.nan]], [[np.nan, 2.0, np.nan]])
    judged = _iv([[np.nan, 1.0, np.nan]], [[np.nan, 1.0, np.nan]], [[np.nan, 1.0, np.nan]])
    y = np.array([[0.0, 1.9, 0.0]])
    for rec in (decide(y, loose, judged).record(), decide_opaque(y, loose, judged, 30.0).record()):
        assert rec["verdict"] == "fail"
        we = rec["worst_element"]
        assert we["index"] == [0, 0] and np.isnan(we["expected"]) and we["observed"] == 0.0
        assert we["nonfinite_mismatches"] == 2
        assert "first of 2 NaN/Inf" in describe_worst(we)


def test_a_pass_keeps_its_worst_element():
    iv = _iv([[1.0, 1.0]], [[0.5, 0.5]], [[1.5, 1.5]])
    rec = decide(np.array([[1.2, 1.0]]), iv, iv).record()
    assert rec["verdict"] != "fail" and rec["worst_element"]["index"] == [0, 0]
