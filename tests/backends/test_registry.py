"""Registry, parameters, entry points and the dispatcher."""

import logging
import sys
import types

import pytest

from backends import registry
from backends.base import Availability, Backend, Case, Declared, Prepared, no, yes
from backends.registry import create, parse_spec, registered, select


def test_parse_spec():
    assert parse_spec("emulator") == ("emulator", {})
    assert parse_spec("emulator:act_rounding=rhaz, path=exact") == ("emulator", {"act_rounding": "rhaz", "path": "exact"})
    with pytest.raises(ValueError, match="not key=value"):
        parse_spec("emulator:oops")
    with pytest.raises(ValueError, match="empty backend name"):
        parse_spec(":a=b")


def test_unknown_backend_names_the_registered_ones():
    with pytest.raises(ValueError, match="unknown backend 'nope'.*emulator"):
        create("nope")


def test_unknown_emulator_parameter_is_an_error():
    with pytest.raises(ValueError, match="unknown parameter"):
        create("emulator:rounding_mode=rne")


def test_every_builtin_answers_availability_with_a_reason():
    for name in registry.BUILTIN:
        av = create(name).availability()
        assert isinstance(av, Availability)
        assert av.reason, name  # available or not, it says why


def _mk(name, prio, available=True, supports=True, why="nope"):
    class B(Backend):
        covers = "test"

        def availability(self):
            return Availability(available, "ok" if available else f"{name} library missing")

        def can_implement(self, case):
            return yes() if supports else no(why)

        def declared(self, case):
            return Declared(variants={})

        def prepare(self, case, tensors):
            return Prepared(case, {})

        def run(self, prepared, x, **inputs):
            return x

    B.name = name
    B.priority = prio
    return B


@pytest.fixture
def fake_backends(monkeypatch):
    mod = types.ModuleType("qconform_fake_backends")
    mod.High = _mk("high", 90, available=False)
    mod.Mid = _mk("mid", 50, supports=False, why="no act order")
    mod.Low = _mk("low", 10)
    monkeypatch.setitem(sys.modules, "qconform_fake_backends", mod)
    monkeypatch.setenv("QCONFORM_EXTRA_BACKENDS",
                       "high=qconform_fake_backends:High,mid=qconform_fake_backends:Mid,low=qconform_fake_backends:Low")
    return mod


CASE = Case("w4a16", "gptq", 1, 64, 128, group_size=32)


def test_dispatcher_priority_and_skip_reasons(fake_backends, caplog):
    caplog.set_level(logging.INFO, logger="qconform.dispatch")
    sel = select(CASE, ["emulator", "low", "mid", "high"])
    assert sel.backend.name == "low"
    skipped = dict(sel.skipped)
    assert skipped["high"] == "unavailable: high library missing"
    assert skipped["mid"].startswith("cannot implement") and "no act order" in skipped["mid"]
    assert "skipped high" in caplog.text and "selected low" in caplog.text


def test_dispatcher_falls_back_to_the_emulator(fake_backends):
    sel = select(CASE, ["high", "mid", "emulator"])
    assert sel.backend.name == "emulator"
    assert {n for n, _ in sel.skipped} == {"high", "mid"}
    sel2 = select(CASE, ["high", "mid"])  # even when not listed, the emulator is the fallback
    assert sel2.backend.name == "emulator"


def test_adapter_import_error_is_reported_not_raised(monkeypatch):
    monkeypatch.setitem(registry.BUILTIN, "broken", "backends.does_not_exist:Nope")
    b = create("broken")
    av = b.availability()
    assert not av.available and "ModuleNotFoundError" in av.reason


def test_entry_point_backends_are_discovered(monkeypatch, fake_backends):
    class EP:
        name = "vendor"
        value = "qconform_fake_backends:Low"

        def load(self):
            return fake_backends.Low

    monkeypatch.setattr(registry, "_entry_points", lambda: {"vendor": EP()})
    assert registered()["vendor"] == "entry point qconform_fake_backends:Low"
    assert create("vendor").availability().available


def test_cli_backends_lists_everything(capsys):
    import json

    from conformance.cli.main import main

    assert main(["backends", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    names = {b["name"] for b in data["backends"]}
    assert {"emulator", "torch-cpu", "ark", "zentorch", "vllm-cpu", "cuda", "xpu"} <= names
    emu = next(b for b in data["backends"] if b["name"] == "emulator")
    assert emu["available"] and "w4a4-mxfp4" in emu["schemes"]
    for b in data["backends"]:
        if not b["available"]:
            assert b["reason"]


def test_dispatcher_skips_backends_that_misread_weights(fake_backends, monkeypatch):
    class Misreader(fake_backends.Low):
        def declared(self, case):
            return Declared(variants={"zero_read": "v1_literal"})

    Misreader.name = "misreader"
    Misreader.priority = 95
    fake_backends.Misreader = Misreader
    monkeypatch.setenv("QCONFORM_EXTRA_BACKENDS", "misreader=qconform_fake_backends:Misreader,"
                                                  "low=qconform_fake_backends:Low")
    sel = select(Case("w4a16", "gptq", 1, 64, 128, group_size=32, sym=False, zero_convention="v1"),
                 ["misreader", "low"])
    assert sel.backend.name == "low"
    assert "zero_read=v1_literal" in dict(sel.skipped)["misreader"]
