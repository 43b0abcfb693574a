"""Reports (summary.json, report.md, report.html) and `qconform report merge`.

The HTML report is opened in a real headless browser (Debian's chromium): the DOM it builds
has the matrix and the plots, and its screenshot is not blank and shows the verdict colours.
"""

import json
import os
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from pathlib import Path

import pytest

from bundle_cache import copy_bundle
from conformance.cli.main import main


def _results(folder: Path) -> list[dict]:
    latest = {}
    for f in [folder / "results.jsonl", *sorted(folder.glob("results-*.jsonl"))]:
        if f.exists():
            for line in f.read_text().splitlines():
                r = json.loads(line)
                if r.get("kind") == "result":
                    latest[(r["backend"], r["case_id"])] = r
    return list(latest.values())


# -- summary and Markdown -----------------------------------------------------------------------------
def test_run_writes_reports_that_count_what_the_jsonl_holds(tmp_path):
    out = tmp_path / "run"
    assert main(["run", "--backend", "emulator", "--scheme", "w4a8", "--tier", "exact", "--profile", "smoke",
                 "--out", str(out), "--no-progress"]) == 0
    for name in ("summary.json", "report.md", "report.html"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    res = _results(out)
    cells = {(c["column"], c["scheme"]): c for c in summary["cells"]}
    assert set(cells) == {("emulator", "w4a8")}
    c = cells[("emulator", "w4a8")]
    assert c["n"] == len(res) and c["counts"] == dict(Counter(r["verdict"] for r in res))
    assert sum(c["ratio_hist"]) == sum(1 for r in res if r.get("metrics"))
    assert c["max_ulp"] == max(r["metrics"]["max_ulp"] for r in res if r.get("metrics"))
    assert summary["ok"] and summary["n_bad"] == 0
    # the environment of the run header, with the backend's version line
    env = next(iter(summary["environment"].values()))
    assert env["python"] and "cpu_flags" in env and env["backends"][0]["backend"] == "emulator"
    md = (out / "report.md").read_text()
    assert "| scheme | emulator |" in md and "CONFORMANT" in md


def test_report_reads_xdist_worker_files(basic, tmp_path):
    """results-gw0.jsonl + results-gw1.jsonl (pytest-xdist workers) read as one run."""
    lines = [l for l in (basic / "results.jsonl").read_text().splitlines() if json.loads(l).get("kind") == "result"]
    run = tmp_path / "xdist"
    run.mkdir()
    (run / "results-gw0.jsonl").write_text("\n".join(lines[0::2]) + "\n")
    (run / "results-gw1.jsonl").write_text("\n".join(lines[1::2]) + "\n{\"kind\": \"result\", \"cut")  # cut line
    assert main(["report", str(run), "--md"]) == 0
    assert (run / "report.md").is_file() and not (run / "report.html").exists()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["n_results"] == len(lines)
    assert any("no run header" in n for n in summary["notes"])


def test_failures_carry_replay_commands_and_waivers_are_listed(rich):
    summary = json.loads((rich / "summary.json").read_text())
    res = _results(rich)
    bad = [r for r in res if r["verdict"] in ("fail", "crash", "timeout")]
    assert len(summary["failures"]) == len(bad) > 0
    with_bundle = [f for f in summary["failures"] if f.get("replay")]
    assert with_bundle and all(f["replay"].startswith("qconform replay ") for f in with_bundle)
    # replay commands name bundles relative to the report's folder (no absolute paths: the folder moves)
    assert all(not Path(f["bundle"]).is_absolute() and (rich / f["bundle"]).exists() for f in with_bundle)
    assert all(f["replay"] == f"qconform replay {f['bundle']}" for f in with_bundle)
    # a certification bundle's reports name replay bundles inside it (bundles/<name>), wherever it lies
    assert all(f["bundle"].startswith("bundles/") and (rich / f["bundle"]).exists() for f in with_bundle)
    w = summary["waivers"]
    assert len(w["declared"]) == 2
    assert len(w["applied"]) == sum(1 for r in res if r["verdict"] == "waived") > 0
    assert len(w["expired"]) == sum(1 for r in res if r.get("waiver_expired")) > 0
    md = (rich / "report.md").read_text()
    assert "qconform replay" in md and "expired" in md


# -- merge --------------------------------------------------------------------------------------------
def test_merge_two_hosts_into_one_matrix(basic, rich, tmp_path, capsys):
    out = tmp_path / "merged"
    # the rich bundle holds failing backends: the merged matrix is written, and its exit says it fails
    assert main(["report", "merge", str(basic), str(rich), "--out", str(out)]) == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_bad"] > 0
    keys = [c["key"] for c in summary["columns"]]
    rich_backends = sorted({r["backend"] for r in _results(rich)})
    assert keys[0] == "host-a / emulator"
    assert sorted(keys[1:]) == sorted(f"host-b / {b}" for b in rich_backends)
    assert summary["schemes"] == ["w8a8"]
    cells = {c["column"]: c for c in summary["cells"]}
    assert cells["host-a / emulator"]["counts"] == dict(Counter(r["verdict"] for r in _results(basic)))
    nan = [r for r in _results(rich) if r["backend"] == "faulty-nan"]
    assert cells["host-b / faulty-nan"]["counts"] == dict(Counter(r["verdict"] for r in nan))
    html = (out / "report.html").read_text()
    assert "host host-a" in html and "host host-b" in html
    assert {"host-a", "host-b"} <= set(summary["environment"])


def test_merge_refuses_a_bundle_that_does_not_verify(basic, rich, tmp_path, capsys):
    bad = copy_bundle(basic, tmp_path / "bad")
    (bad / "report.md").write_text("edited")
    rc = main(["report", "merge", str(bad), str(rich), "--out", str(tmp_path / "m")])
    assert rc == 2 and "does not verify" in capsys.readouterr().err


# -- the HTML in a real browser ----------------------------------------------------------------------
def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        p = shutil.which(name)
        if p:
            return p
    return None


def _chromium_run(exe: str, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", f"--user-data-dir={tmp / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _png_pixels(path: Path) -> tuple[int, int, list[bytes], int]:
    """(width, height, rows of RGB(A) bytes, bytes per pixel): a minimal PNG decoder (8-bit RGB/RGBA,
    no interlace; the filters of the PNG specification, section 9)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h, depth, ctype, _, _, interlace = ihdr
    assert depth == 8 and ctype in (2, 6) and interlace == 0, ihdr
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(idat)
    stride = w * bpp
    rows, prev = [], bytearray(stride)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, rows, bpp


def _colours(rows, bpp, step=2) -> Counter:
    c = Counter()
    for r in rows[::step]:
        for i in range(0, len(r), bpp * step):
            c[r[i:i + 3]] += 1
    return c


def test_html_report_renders_in_headless_chromium(basic, rich, tmp_path):
    exe = _chromium()
    if exe is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium; .ci/run installs it)")
    out = tmp_path / "merged"
    assert main(["report", "merge", str(basic), str(rich), "--out", str(out)]) == 1  # (rich holds failures)
    url = (out / "report.html").resolve().as_uri()
    summary = json.loads((out / "summary.json").read_text())

    dom = _chromium_run(exe, tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert '<table id="matrix"' in html
    # one cell per column x scheme, carrying its worst verdict
    for ci, col in enumerate(summary["columns"]):
        cell = next(c for c in summary["cells"] if c["column"] == col["key"])
        assert f'id="cell-{ci}-w8a8"' in html
        assert f'id="cell-{ci}-w8a8" data-verdict="{cell["worst_verdict"]}"' in html
    # inline SVG plots with bars drawn (non-empty path data)
    import re

    svgs = re.findall(r'<svg class="ratio-plot".*?</svg>', html, flags=re.S)
    assert len(svgs) >= len(summary["columns"]) - 1  # the crashing column has no outputs to plot
    bars = re.findall(r'<path class="bars[^"]*"[^>]* d="([^"]+)"', "".join(svgs))
    assert bars and all(re.search(r"M[\d.]+ [\d.]+h[\d.]+v[\d.]+", d) for d in bars)

    png = tmp_path / "report.png"
    shot = _chromium_run(exe, tmp_path, f"--screenshot={png}", "--window-size=1400,1000", url)
    assert shot.returncode == 0 and png.is_file(), shot.stderr[-2000:]
    keep = os.environ.get("QCONFORM_KEEP_SCREENSHOT")
    if keep:
        shutil.copyfile(png, keep)
    w, h, rows, bpp = _png_pixels(png)
    assert (w, h) == (1400, 1000)
    colours = _colours(rows, bpp)
    assert len(colours) > 50  # text, tints, bars: not a blank page
    background = colours.most_common(1)[0][1]
    assert background < 0.9 * sum(colours.values())

    def near(rgb, hexcol, tol=40):
        want = bytes.fromhex(hexcol[1:])
        return all(abs(a - b) <= tol for a, b in zip(rgb, want))

    # the verdict colours are on screen: the fail badge red, the pass badge green, the crash badge dark red
    for hexcol in ("#dc2626", "#16a34a", "#7f1d1d"):
        assert sum(n for rgb, n in colours.items() if near(rgb, hexcol, 12)) > 30, hexcol


def test_report_does_not_rewrite_a_sealed_bundle(basic, tmp_path, capsys):
    from conformance.certify import verify_bundle

    assert main(["report", str(basic)]) == 2
    assert "sealed certification bundle" in capsys.readouterr().err
    assert main(["report", str(basic), "--out", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "report.html").is_file()
    assert verify_bundle(basic).ok


def test_html_failures_explain_themselves_in_headless_chromium(rich, tmp_path):
    """Each failing case's worst element, the declaration's notes and a relative replay command are in
    the DOM the browser builds, grouped by signature; the banner and the meaning of 'pass' too."""
    import re
    from html import unescape

    exe = _chromium()
    if exe is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium; .ci/run installs it)")
    summary = json.loads((rich / "summary.json").read_text())
    dom = _chromium_run(exe, tmp_path, "--dump-dom", (rich / "report.html").resolve().as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    text = unescape(re.sub(r"<[^>]+>", " ", dom.stdout))
    text = " ".join(text.split())
    assert "NOT CONFORMANT:" in text and "'pass' means every output element lies inside the interval" in text
    groups = summary["failure_groups"]
    assert len(re.findall(r'<details class="fgroup" id="fgroup-\d+"', dom.stdout)) == len(groups)
    for g in groups:
        ex = g["example"]
        assert f"{g['count']} case(s)" in text
        if ex["verdict"] == "fail":  # a crash has no output, hence no worst element
            we = ex["worst_element"]
            assert f"observed {float(we['observed']):.9g}, expected {float(we['expected']):.9g} (exact)" in text
            if we.get("ulp") is not None:  # None where the observed value is NaN or Inf
                assert f"{we['ulp']} ULP from the reference" in text
        assert f"declaration notes : {ex['notes'] or '(none)'}" in text
    shown = [f for f in summary["failures"] if f.get("replay")]
    assert shown
    for f in shown[:40]:
        assert not f["bundle"].startswith("/") and (rich / f["bundle"]).is_file()
        assert f["replay"] in text
    notes = {f["notes"] for f in summary["failures"]}
    assert "claims canonical semantics" in notes  # the declare=canonical kernels' own words reach the report


def test_failure_group_reason_masks_counts_not_names():
    """Failures group by their reason with the counts masked; the digits of a name (e2m1_rounding, float16,
    int8) are not counts: round 2 and 3's reports printed 'eNmN_rounding=rhaz'."""
    from conformance.report.summary import reason_pattern

    a = reason_pattern("48 output element(s) outside the declared interval; the output matches "
                       "e2m1_rounding=rhaz instead of the declared e2m1_rounding=rne")
    b = reason_pattern("51 output element(s) outside the declared interval; the output matches "
                       "e2m1_rounding=rhaz instead of the declared e2m1_rounding=rne")
    assert a == b
    assert a.startswith("N output element(s)") and "e2m1_rounding=rhaz" in a and "eNmN" not in a
    assert reason_pattern("scales in float16, 1.5 steps, int8 codes") == "scales in float16, N steps, int8 codes"


def test_worst_element_of_an_infinite_reference_names_no_interval():
    """An Inf reference has no interval (it must be matched exactly): round 3's report printed '[-inf, nan]'."""
    from conformance.report.summary import describe_worst

    text = describe_worst({"index": [0, 3], "observed": 65504.0, "expected": float("inf"), "lo": float("-inf"),
                           "hi": float("nan"), "reference": float("inf")})
    assert "nan]" not in text and "interval" not in text and "must be matched exactly" in text
    finite = describe_worst({"index": [0, 3], "observed": 1.5, "expected": 1.25, "lo": 1.0, "hi": 1.375})
    assert "interval [1, 1.375]" in finite
