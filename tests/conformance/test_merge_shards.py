"""`qconform report merge` of a sharded run: every shard i/n must be there, once (a CI matrix that lost a job
must not merge into CONFORMANT)."""

import json

from conformance.cli.main import main


def _shard(tmp_path, i, n=3):
    out = tmp_path / f"s{i}"
    rc = main(["run", "--backend", "emulator", "--scheme", "w8a8", "--tier", "exact", "--shard", f"{i}/{n}",
               "--out", str(out)])
    assert rc == 0
    return str(out)


def test_a_merge_missing_a_shard_is_incomplete_naming_it(tmp_path, capsys):
    s1, s2, s3 = (_shard(tmp_path, i) for i in (1, 2, 3))
    capsys.readouterr()
    rc = main(["report", "merge", s1, s2, "--out", str(tmp_path / "m12")])
    out = capsys.readouterr().out
    assert rc == 4 and "shard(s) 3/3" in out
    summary = json.loads((tmp_path / "m12" / "summary.json").read_text())
    assert summary["status"] == "incomplete" and not summary["ok"] and summary["n_missing"] > 0
    rc = main(["report", "merge", s1, s2, s3, "--out", str(tmp_path / "m123")])
    summary = json.loads((tmp_path / "m123" / "summary.json").read_text())
    assert rc == 0 and summary["ok"] and summary["status"] != "incomplete"


def test_a_shard_merged_twice_is_not_conformant(tmp_path):
    s1, s2, s3 = (_shard(tmp_path, i) for i in (1, 2, 3))
    rc = main(["report", "merge", s1, s2, s3, s1, "--out", str(tmp_path / "m")])
    summary = json.loads((tmp_path / "m" / "summary.json").read_text())
    assert rc == 4 and not summary["ok"] and any("merged twice" in n for n in summary["notes"])
