"""Golden tensors: the committed files verify, regenerate byte for byte, and catch a flipped byte."""

import shutil

import numpy as np
import pytest

from conformance import golden


def test_committed_golden_files_verify():
    assert golden.verify() == []
    specs = golden.golden_specs()
    assert len(specs) >= 40
    schemes = {s.case.scheme for s in specs}
    assert schemes == {"w4a16", "w8a8", "w4a8", "w4a16-mxfp4", "w4a4-mxfp4", "w4a16-moe"}


def test_regenerate_reproduces_every_byte(tmp_path):
    golden.regenerate(tmp_path)
    committed = sorted(p.name for p in golden.GOLDEN_DIR.iterdir())
    fresh = sorted(p.name for p in tmp_path.iterdir())
    assert committed == fresh
    for name in committed:
        assert (tmp_path / name).read_bytes() == (golden.GOLDEN_DIR / name).read_bytes(), name


def test_flipped_byte_is_named(tmp_path):
    dst = tmp_path / "g"
    shutil.copytree(golden.GOLDEN_DIR, dst)
    victim = sorted(dst.glob("*.safetensors"))[3]
    data = bytearray(victim.read_bytes())
    data[-5] ^= 0x01
    victim.write_bytes(bytes(data))
    problems = golden.verify(dst)
    assert len(problems) == 1 and problems[0].startswith(victim.name)
    (dst / sorted(p.name for p in dst.glob("*.safetensors"))[0]).unlink()
    assert any("missing" in p for p in golden.verify(dst))
    (dst / "extra.safetensors").write_bytes(b"x")
    assert any(p.startswith("extra.safetensors: not in the manifest") for p in golden.verify(dst))


def test_cli_golden_verify_fails_naming_the_file(tmp_path, capsys):
    from conformance.cli import main

    dst = tmp_path / "g"
    shutil.copytree(golden.GOLDEN_DIR, dst)
    victim = sorted(dst.glob("*.safetensors"))[0]
    data = bytearray(victim.read_bytes())
    data[100] ^= 0xFF
    victim.write_bytes(bytes(data))
    assert main(["golden", "verify", "--dir", str(dst)]) == 1
    assert victim.name in capsys.readouterr().out
    assert main(["golden", "verify"]) == 0


def test_emulator_reproduces_golden_outputs():
    """The stored references equal what the emulator computes now (a regression gate on the emulator)."""
    from backends.base import Declared
    from conformance.acceptance import declared_interval

    for spec in golden.golden_specs():
        inp = golden.golden_inputs(spec)
        exp = golden.golden_expected(spec)
        iv = declared_interval(inp, Declared(variants={}, accumulate="exact", output=spec.case.output_dtype))
        np.testing.assert_array_equal(iv.y_ref, exp["y_ref"], err_msg=spec.generator)
