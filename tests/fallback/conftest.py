"""Fixtures shared by the fallback tests."""

import atexit
import os
import shutil
import tempfile

import pytest

from emulator.synthetic import SCHEMES, write_checkpoint

# the measured dispatcher's per-host choices (backends/dispatch_cache.py) go to a folder of this test run,
# never the user's ~/.cache: a test must not depend on, nor leave, another run's timings
if "QCONFORM_DISPATCH_CACHE" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="qconform-dispatch-test-")
    os.environ["QCONFORM_DISPATCH_CACHE"] = _cache
    atexit.register(shutil.rmtree, _cache, True)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """One synthetic checkpoint folder per scheme of emulator/synthetic.py (with bias where the scheme has one)."""
    root = tmp_path_factory.mktemp("synthetic")
    for s in SCHEMES:
        write_checkpoint(root / s, s, bias=s != "gptoss-mxfp4")
    return root
