"""Shared fixtures: certification bundles built once per module (tests/conformance/bundle_cache.py)."""

import pytest

from bundle_cache import basic_bundle, rich_bundle


@pytest.fixture(scope="module")
def basic(tmp_path_factory):
    return basic_bundle(tmp_path_factory)


@pytest.fixture(scope="module")
def rich(tmp_path_factory):
    return rich_bundle(tmp_path_factory)
