"""Device placement (--devices) and work units: pure functions on fake device lists (CI has no GPU)."""

import pytest

from conformance.run.placement import (Device, DeviceError, intel_devices, parse_nvidia_smi, restrict_to_visible,
                                   select_devices, slots, unit_key, work_units)
from conformance.cases.suite import case_list

SMI_2 = ("0, NVIDIA H200, GPU-aaaa-1111, 00000000:18:00.0, 580.159.04\n"
         "1, NVIDIA H200, GPU-bbbb-2222, 00000000:2A:00.0, 580.159.04\n")
SMI_MIXED = SMI_2 + "2, NVIDIA L40S, GPU-cccc-3333, 00000000:3B:00.0, 580.159.04\n"


def test_nvidia_smi_rows_become_devices_named_by_uuid():
    d = parse_nvidia_smi(SMI_2)
    assert [x.index for x in d] == [0, 1] and d[1].model == "NVIDIA H200" and d[1].pci == "00000000:2A:00.0"
    # the worker sees its GPU by UUID: an index would follow CUDA's FASTEST_FIRST order, not nvidia-smi's
    assert d[1].env() == {"CUDA_VISIBLE_DEVICES": "GPU-bbbb-2222"}


def test_malformed_nvidia_smi_line_is_refused():
    with pytest.raises(DeviceError, match="5"):
        parse_nvidia_smi("0, NVIDIA H200\n")


def test_all_and_lists_select_devices_and_refuse_what_is_not_there():
    devs = parse_nvidia_smi(SMI_2)
    assert select_devices("all", devs) == devs
    assert select_devices("1", devs) == [devs[1]]
    assert select_devices(None, devs) == []
    for bad, msg in (("2", "no device 2"), ("0,0", "twice"), ("x", "expected 'all'"), ("", "expected 'all'")):
        with pytest.raises(DeviceError, match=msg):
            select_devices(bad, devs)
    with pytest.raises(DeviceError, match="lists no accelerator"):
        select_devices("all", [])


def test_devices_of_two_models_are_refused_with_the_per_model_commands():
    devs = parse_nvidia_smi(SMI_MIXED)
    with pytest.raises(DeviceError) as e:
        select_devices("all", devs)
    assert "NVIDIA H200: --devices 0,1" in str(e.value) and "NVIDIA L40S: --devices 2" in str(e.value)
    assert select_devices("0,1", devs) == devs[:2]


def test_a_schedulers_cuda_visible_devices_is_honoured():
    devs = parse_nvidia_smi(SMI_MIXED)
    assert [d.index for d in restrict_to_visible(devs, "2,0")] == [2, 0]
    assert [d.index for d in restrict_to_visible(devs, "GPU-bbbb")] == [1]
    assert restrict_to_visible(devs, "") == []
    assert [d.index for d in restrict_to_visible(devs, "0,7,1")] == [0]  # CUDA stops at the first unknown name


def test_slots_spread_workers_round_robin_and_give_each_device_one():
    devs = parse_nvidia_smi(SMI_2)
    s = slots(5, devs)
    assert [x.device.index for x in s] == [0, 1, 0, 1, 0]
    assert s[3].env() == {"CUDA_VISIBLE_DEVICES": "GPU-bbbb-2222"}
    assert [x.device.index for x in slots(1, devs)] == [0, 1]
    assert [x.env() for x in slots(2, [])] == [{}, {}]


def test_intel_render_nodes_are_found_by_vendor(tmp_path):
    for n, vendor in ((128, "0x8086"), (129, "0x10de"), (130, "0x8086")):
        d = tmp_path / f"renderD{n}" / "device"
        d.mkdir(parents=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "device").write_text("0x0bd5\n")
    found = intel_devices(tmp_path)
    assert [x.index for x in found] == [0, 1] and found[1].env() == {"ZE_AFFINITY_MASK": "1"}
    assert isinstance(found[0], Device) and found[0].model == "Intel GPU 0x0bd5"


def test_work_units_keep_every_case_once_and_group_one_kernel_configuration():
    specs = case_list(profile="ci", schemes=["w4a16"])
    units = work_units(specs, jobs=4)
    flat = [s.case_id for u in units for s in u]
    assert sorted(flat) == sorted(s.case_id for s in specs)  # nothing lost, nothing twice
    assert all(len({unit_key(s) for s in u}) == 1 for u in units)
    assert len(units) >= 4 * 4 or len(units) == len({unit_key(s) for s in specs})
    assert max(len(u) for u in units) <= -(-len(specs) // 16)


# -- the runner with fake devices: the environment each worker sees ---------------------------------------
def _double(monkeypatch):
    monkeypatch.setenv("QCONFORM_EXTRA_BACKENDS", "fake-device=conformance.selftest.doubles.devices:FakeDeviceBackend")


def _results(out):
    import json

    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()
            if line and json.loads(line).get("kind") == "result"]


def _run(tmp_path, name, bspec, devices, jobs):
    from conformance.run.runner import Runner

    specs = case_list(profile="ci", schemes=["w4a16"], tiers=["exact"])[:24]
    r = Runner(tmp_path / name, jobs=jobs, progress=False, timeout=60, devices=devices)
    try:
        r.run([bspec], specs)
    finally:
        r.close()
    return specs, _results(tmp_path / name)


def test_workers_see_their_device_and_every_case_is_judged_once_as_without_placement(tmp_path, monkeypatch):
    import json

    _double(monkeypatch)
    seen = tmp_path / "seen"
    seen.mkdir()
    devs = parse_nvidia_smi(SMI_2)
    specs, placed = _run(tmp_path, "placed", f"fake-device:dir={seen}", devs, jobs=3)
    _, plain = _run(tmp_path, "plain", f"fake-device:dir={seen}", [], jobs=2)
    assert sorted(r["case_id"] for r in placed) == sorted(s.case_id for s in specs)  # once each
    assert {r["case_id"]: r["verdict"] for r in placed} == {r["case_id"]: r["verdict"] for r in plain}
    assert all(r["device"]["uuid"] in ("GPU-aaaa-1111", "GPU-bbbb-2222") for r in placed)
    lines = [json.loads(x) for x in (seen / "seen.jsonl").read_text().splitlines()]
    assert {x["device"] for x in lines if x["device"]} == {"GPU-aaaa-1111", "GPU-bbbb-2222"}
    assert [x for x in lines if x["device"] is None]  # the unplaced run's workers saw no variable


def test_a_lost_device_is_retired_and_its_cases_run_on_the_other(tmp_path, monkeypatch):
    _double(monkeypatch)
    seen = tmp_path / "seen"
    seen.mkdir()
    devs = parse_nvidia_smi(SMI_2)
    specs, res = _run(tmp_path, "lose1", f"fake-device:dir={seen},lose=GPU-bbbb-2222", devs, jobs=2)
    assert sorted(r["case_id"] for r in res) == sorted(s.case_id for s in specs)  # nothing lost, nothing twice
    crashed = [r for r in res if r["verdict"] == "crash"]
    assert len(crashed) == 1 and crashed[0]["device"]["uuid"] == "GPU-bbbb-2222"
    ok = [r for r in res if r["verdict"] != "crash"]
    assert ok and all(r["device"]["uuid"] == "GPU-aaaa-1111" for r in ok)


def test_with_every_device_lost_the_rest_is_recorded_not_dropped(tmp_path, monkeypatch):
    _double(monkeypatch)
    seen = tmp_path / "seen"
    seen.mkdir()
    devs = parse_nvidia_smi(SMI_2)[1:]
    specs, res = _run(tmp_path, "lose-all", f"fake-device:dir={seen},lose=GPU-bbbb-2222", devs, jobs=1)
    assert sorted(r["case_id"] for r in res) == sorted(s.case_id for s in specs)
    assert {r["verdict"] for r in res} == {"crash"}
    assert sum("every device of this run was retired" in r["reason"] for r in res) == len(specs) - 1


def test_certify_places_its_workers_and_its_bundle_records_each_cases_device(tmp_path, monkeypatch):
    import json

    from conformance.certify import certify, verify_bundle
    from conformance.run.placement import Placement

    _double(monkeypatch)
    seen = tmp_path / "seen"
    seen.mkdir()
    res = certify([f"fake-device:dir={seen}"], tmp_path / "b", profile="smoke", schemes=["w8a16"], tiers=["exact"],
                  jobs=2, search=False, log=lambda *a: None, placement=Placement(parse_nvidia_smi(SMI_2)))
    rows = [json.loads(line) for line in (res.path / "results.jsonl").read_text().splitlines() if line]
    results = [r for r in rows if r.get("kind") == "result"]
    assert results and {r["device"]["uuid"] for r in results} == {"GPU-aaaa-1111", "GPU-bbbb-2222"}
    assert verify_bundle(res.path).ok
