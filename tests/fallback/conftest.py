"""Fixtures shared by the fallback tests."""

import pytest

from emulator.synthetic import SCHEMES, write_checkpoint


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """One synthetic checkpoint folder per scheme of emulator/synthetic.py (with bias where the scheme has one)."""
    root = tmp_path_factory.mktemp("synthetic")
    for s in SCHEMES:
        write_checkpoint(root / s, s, bias=s != "gptoss-mxfp4")
    return root
