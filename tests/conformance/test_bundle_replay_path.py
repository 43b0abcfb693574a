"""A result's replay-bundle path must name a file in the bundle's bundles/ folder, not only share its basename
(issue 22 item 9: ``../../../../etc/<name>`` verified)."""

from pathlib import Path

from bundle_cache import copy_bundle
from conformance.certify import verify_bundle
from test_bundle_forgery import _forge, _lines, _write_lines


def test_bundle_path_outside_bundles_folder_fails(rich, tmp_path):
    b = copy_bundle(rich, tmp_path / "b")
    lines = _lines(b)
    victim = next(r for r in lines if r.get("kind") == "result" and r.get("bundle"))
    name = Path(victim["bundle"]).name
    assert (b / "bundles" / name).is_file()  # the basename is a real file of the bundle
    victim["bundle"] = "../../../../etc/" + name
    _write_lines(b, lines)
    _forge(b)
    res = verify_bundle(b)
    assert not res.ok
    assert any(victim["case_id"] in p and "replay bundle" in p and "../../../../etc/" in p for p in res.problems), \
        res.problems
