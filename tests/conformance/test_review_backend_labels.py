"""Review: two --backend specs that name the same backend (the same parameters in another order) share one
label, so their result lines shared one (backend, case) key: the later line replaced the earlier one in the
summary, and a failure observed under one spec (a non-deterministic kernel) could vanish behind the other's
pass. Such a pair is a usage error (exit 2, one line), as the same spec twice is."""

from __future__ import annotations

from conformance.cli.main import main


def test_the_same_backend_under_two_spellings_is_refused(tmp_path, capsys):
    rc = main(["run", "--backend", "auto:only=emulator,opaque=allow", "--backend", "auto:opaque=allow,only=emulator",
               "--profile", "smoke", "--scheme", "w8a8", "--tier", "exact", "--out", str(tmp_path / "o"),
               "--no-progress"])
    text = capsys.readouterr()
    assert rc == 2, text.out + text.err
    assert "auto:only=emulator,opaque=allow" in text.err and "Traceback" not in text.err
    assert not (tmp_path / "o" / "results.jsonl").exists()
