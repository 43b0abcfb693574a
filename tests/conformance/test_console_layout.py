"""What a user reads (issue 22 item 14): the verdict table's titles are separate words and scheme names are never
cut; `qconform backends` aligns long names; a default run lists the unavailable backends on one line."""

import io
import json
import types

from conformance.cli import commands
from conformance.report.console import TABLE_VERDICTS, print_table
from conformance.report.write import load_source
from conformance.report.summary import summarize_sources


def _summary(tmp_path):
    lines = [{"kind": "run", "suite": "qconform", "backends": ["compressed-tensors", "emulator"]}]
    for b in ("compressed-tensors", "emulator"):
        lines.append({"kind": "backend", "backend": b, "available": True, "version": "1"})
        for scheme in ("q-uint8-tensor", "w4a16"):
            lines.append({"kind": "result", "backend": b, "case_id": f"{scheme}-0", "scheme": scheme,
                          "verdict": "pass" if b == "emulator" else "unsupported", "reason": ""})
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return summarize_sources([load_source(tmp_path)])


def test_table_titles_are_words_and_columns_line_up(tmp_path):
    buf = io.StringIO()
    print_table(_summary(tmp_path), buf)
    head, *rows = buf.getvalue().splitlines()
    # the columns with a case (pass, unsupported) and the ones always shown; separate words, not "unsupwaived"
    titles = [t for v, t in TABLE_VERDICTS if v in ("pass", "fail", "crash", "unsupported")]
    assert head.split() == ["backend", "scheme", *titles]
    assert max(len(l) for l in buf.getvalue().splitlines()) <= 100
    ends = [head.index(" " + t) + len(t) + 1 for t in titles]
    assert len(rows) == 4 and "…" not in buf.getvalue()
    for row in rows:
        parts = row.split()
        assert len(parts) == 2 + len(titles)
        assert parts[0] in ("compressed-tensors", "emulator") and parts[1] in ("q-uint8-tensor", "w4a16")
        for end, value in zip(ends, parts[2:]):  # each count ends under its title
            assert row[end - len(value):end] == value, (row, head)


def test_backends_listing_aligns_long_names(capsys):
    assert commands.cmd_backends(types.SimpleNamespace(json=False)) == 0
    rows = [l for l in capsys.readouterr().out.splitlines() if not l.lstrip().startswith("reason:")]
    cols = {l.index(" available") if " available" in l else l.index(" unavailable") for l in rows}
    assert len(rows) > 3 and len(cols) == 1, rows


def test_unavailable_backends_are_one_line(monkeypatch, capsys):
    def fake(skipped):
        skipped.extend((f"b{i}", f"reason {i}") for i in range(11))
        return ["emulator"]

    monkeypatch.setattr(commands, "available_backends", fake)
    args = types.SimpleNamespace(tier=["exact"], scheme=["w4a16"], profile="smoke", seed=None, backend=None,
                                 shard=None)
    backends, _, specs = commands.run_selection(args)
    out = capsys.readouterr().out.splitlines()
    assert backends == ["emulator"] and specs
    assert out == ["not run (unavailable here): " + ", ".join(f"b{i}" for i in range(11))
                   + " (`qconform backends` says why)"]


def test_every_subcommand_is_in_the_readme():
    """A command a user can type is documented (issue 22 item 14: `selfcheck` was not)."""
    import argparse
    import re
    from pathlib import Path

    from conformance.cli.main import build_parser

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    subs = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = [n for n in subs.choices if not re.search(rf"qconform {re.escape(n)}\b", readme)]
    assert not missing, missing


def test_every_verdict_with_a_case_gets_its_own_column(tmp_path):
    s = _summary(tmp_path)
    s["cells"][0]["counts"].update({"waived": 3, "unsupported": 2, "mistrusted": 1})
    buf = io.StringIO()
    print_table(s, buf)
    head = buf.getvalue().splitlines()[0]
    assert "unsup waived" in head and "mistr" in head and max(len(l) for l in buf.getvalue().splitlines()) <= 100
