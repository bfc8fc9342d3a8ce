"""A GPU in MIG mode: enumerated with its MIG devices, sampled per instance (GPM per instance, memory,
processes through the MIG handles), and followed through reconfiguration."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from structlog.testing import capture_logs

from exporter.samples.gpu import GpuSample, HeldFast
from tests.support.gpurig import Rig, device

MakeRig = Callable[..., Rig]


def _mig(*gis: int, **per: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"gi": gi, **per.get(f"i{gi}", {})} for gi in gis]


def _two_instances(**kw: Any) -> dict[str, Any]:
    kw.setdefault("name", "NVIDIA H100 80GB HBM3")
    return device(0, mig=_mig(
        1, 2, i1={"processes": [{"pid": 100, "used_memory_bytes": 5 << 30}], "memory_used_bytes": 6 << 30},
        i2={"processes": [{"pid": 200, "used_memory_bytes": 1 << 30}]}), **kw)


def test_a_mig_gpu_is_enumerated_with_its_instances_and_described_per_instance(rig: MakeRig) -> None:
    r = rig([_two_instances(), device(1)], procs={100: "trainer", 200: "server"})
    r.rates(0, {"sm_active": 0.4, "mig": {1: {"graphics_active": 0.95, "sm_active": 0.8}, 2: {}}})
    r.run_until(10.0)
    assert r.failures() == {}
    assert r.value("gpufeed_gpu_mig_mode", gpu="0") == 1.0 and r.value("gpufeed_gpu_mig_mode", gpu="1") is None
    assert r.value("gpufeed_gpu_mig_info", gpu="0", mig="1", compute_instance="0",
                   uuid="MIG-test-0-1", name="NVIDIA H100 80GB HBM3 MIG 1") == 1.0
    active = r.value("gpufeed_gpu_sm_active_seconds_total", gpu="0", mig="1")
    assert active is not None and abs(active - 0.8 * 10.0) < 0.15
    assert r.value("gpufeed_gpu_sm_active_seconds_total", gpu="0", mig="2") == 0.0
    # The whole GPU's own GPM as well (nvml.h: nvmlGpmSampleGet supports the device handle in MIG mode).
    whole = r.value("gpufeed_gpu_sm_active_seconds_total", gpu="0")
    assert whole is not None and abs(whole - 0.4 * 10.0) < 0.15
    assert r.value("gpufeed_gpu_sm_active_seconds_total", gpu="1") is not None
    assert r.value("gpufeed_gpu_memory_used_bytes", gpu="0", mig="1") == float(6 << 30)
    assert r.value("gpufeed_gpu_process_memory_bytes", gpu="0", mig="1", pid="100", comm="trainer") == float(5 << 30)
    assert r.value("gpufeed_gpu_process_memory_bytes", gpu="0", mig="2", pid="200", comm="server") == float(1 << 30)
    # Every process of every instance feeds the host collectors under its GPU.
    assert set(r.targets.by_gpu()["0"]) == {100, 200}
    assert r.fake.calls["nvmlGpmMigSampleGet"] > 0
    assert r.fake.gpm_short_pairs == 0


def test_whole_gpu_utilisation_calls_are_unsupported_in_mig_mode_and_stop_being_asked(rig: MakeRig) -> None:
    r = rig([_two_instances()])
    r.run_until(30.0)
    for fn in ("nvmlDeviceGetSamples", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetProcessUtilization"):
        assert r.fake.calls[fn] <= 2, fn
    assert r.value("gpufeed_gpu_busy_seconds_total", gpu="0") is None
    assert r.value("gpufeed_gpu_process_sm_ratio", gpu="0", mig="1", pid="100", comm="") is None


def test_a_destroyed_instance_is_dropped_and_the_others_keep_their_counters(rig: MakeRig) -> None:
    r = rig([_two_instances()])
    r.rates(0, lambda t: {"mig": {1: {"sm_active": 0.5}} if t >= 12.0 else {1: {"sm_active": 0.5}, 2: {}}})
    r.at(12.0, lambda st: st["devices"][0].update(mig=[m for m in st["devices"][0]["mig"] if m["gi"] == 1]))
    with capture_logs() as logs:
        r.run_until(30.0)
    assert r.failures() == {}
    assert [e["instances"] for e in logs if e["event"] == "gpu_mig_enumerated"] == ["1,2", "1"]
    assert r.value("gpufeed_gpu_mig_info", gpu="0", mig="2", compute_instance="0", uuid="MIG-test-0-2",
                   name="NVIDIA H100 80GB HBM3 MIG 2") is None
    active = r.value("gpufeed_gpu_sm_active_seconds_total", gpu="0", mig="1")
    # A steadily idle or busy GPU is read at the steady rate: the counter is exact as of its newest read.
    newest = r.engine.snapshot.value("gpu").gpus[0]
    read = (newest.value if isinstance(newest, HeldFast) else newest).mig[1].counter_t
    assert read is not None and read > 28.5
    assert active is not None and abs(active - 0.5 * read) < 0.2, "no jump, no loss across re-enumeration"


def test_mig_mode_switched_off_returns_to_whole_gpu_sampling(rig: MakeRig) -> None:
    r = rig([_two_instances()])
    r.rates(0, lambda t: {"sm_active": 0.7} if t >= 10.0 else {})
    r.at(10.0, lambda st: st["devices"][0].update(mig=None))
    r.run_until(25.0)
    assert r.value("gpufeed_gpu_mig_mode", gpu="0") is None
    sample = r.engine.snapshot.value("gpu_slow")
    assert isinstance(sample, GpuSample) and sample.identities[0].mig == ()
    active = r.value("gpufeed_gpu_sm_active_seconds_total", gpu="0")
    assert active is not None and 0.7 * 9.0 < active <= 0.7 * 15.0 + 0.1


def test_mig_on_a_gpu_without_gpm_has_instances_but_no_activity_series(rig: MakeRig) -> None:
    r = rig([_two_instances(gpm=False, name="NVIDIA A100-SXM4-80GB")])
    r.run_until(10.0)
    assert r.failures() == {}
    assert r.fake.calls["nvmlGpmMigSampleGet"] == 0 and r.fake.calls["nvmlGpmSampleAlloc"] == 0
    assert r.value("gpufeed_gpu_mig_info", gpu="0", mig="2", compute_instance="0", uuid="MIG-test-0-2",
                   name="NVIDIA A100-SXM4-80GB MIG 2") == 1.0
    assert not [k for k in r.metrics() if k[0] == "gpufeed_gpu_sm_active_seconds_total"]


def test_several_compute_instances_of_one_gpu_instance_each_report_their_processes(rig: MakeRig) -> None:
    # GPU instance 1 split into compute instances 0 and 1: two MIG devices with the same gi. Keyed by gi, the
    # second replaced the first and process 100 was never enumerated.
    r = rig([device(0, mig=[{"gi": 1, "ci": 0, "processes": [{"pid": 100, "used_memory_bytes": 1 << 30}]},
                            {"gi": 1, "ci": 1, "processes": [{"pid": 101, "used_memory_bytes": 2 << 30}]},
                            {"gi": 2, "processes": [{"pid": 200, "used_memory_bytes": 3 << 30}]}])],
            procs={100: "a", 101: "b", 200: "c"})
    r.rates(0, {"mig": {1: {"sm_active": 0.5}}})
    r.run_until(10.0)
    assert r.failures() == {}
    assert set(r.targets.by_gpu()["0"]) == {100, 101, 200}
    assert r.value("gpufeed_gpu_process_memory_bytes", gpu="0", mig="1", pid="100", comm="a") == float(1 << 30)
    assert r.value("gpufeed_gpu_process_memory_bytes", gpu="0", mig="1", pid="101", comm="b") == float(2 << 30)
    active = r.value("gpufeed_gpu_sm_active_seconds_total", gpu="0", mig="1")
    assert active is not None and abs(active - 0.5 * 10.0) < 0.15, "GPM is the GPU instance's, counted once"
    assert [k for k in r.metrics() if k[0] == "gpufeed_gpu_mig_info"] == [
        ("gpufeed_gpu_mig_info", (("compute_instance", "0"), ("gpu", "0"), ("mig", "1"),
                                  ("name", "NVIDIA H100 80GB HBM3 MIG 1"), ("uuid", "MIG-test-0-1"))),
        ("gpufeed_gpu_mig_info", (("compute_instance", "0"), ("gpu", "0"), ("mig", "2"),
                                  ("name", "NVIDIA H100 80GB HBM3 MIG 2"), ("uuid", "MIG-test-0-2")))]


def test_a_mig_device_recreated_behind_a_reused_handle_is_enumerated_again(rig: MakeRig) -> None:
    # Instance 1 destroyed and created again with another profile: NVML hands out the same handle (nvml.h: MIG
    # handles may be reused), every call on it succeeds, and only its UUID tells. On a GPU without GPM (A100)
    # no failing GPM call would have noticed either.
    r = rig([device(0, gpm=False, mig=[{"gi": 1, "uuid": "MIG-old", "name": "1g.10gb",
                                         "processes": [{"pid": 100, "used_memory_bytes": 1}]}])])
    r.at(7.0, lambda st: st["devices"][0].update(mig=[{"gi": 1, "uuid": "MIG-new", "name": "2g.20gb",
                                                       "memory_total_bytes": 20 << 30}]))
    r.run_until(16.0)
    assert r.failures() == {}
    info = [dict(k[1]) for k in r.metrics() if k[0] == "gpufeed_gpu_mig_info"]
    assert [(i["uuid"], i["name"]) for i in info] == [("MIG-new", "2g.20gb")]
    assert r.value("gpufeed_gpu_memory_total_bytes", gpu="0", mig="1") == float(20 << 30)


def test_a_driver_refusing_whole_gpu_gpm_in_mig_mode_keeps_the_instances_gpm(rig: MakeRig) -> None:
    r = rig([_two_instances(unsupported=["nvmlGpmSampleGet"])])
    r.rates(0, {"mig": {1: {"sm_active": 0.8}}})
    r.run_until(10.0)
    assert r.failures() == {}
    assert r.value("gpufeed_gpu_sm_active_seconds_total", gpu="0") is None
    active = r.value("gpufeed_gpu_sm_active_seconds_total", gpu="0", mig="1")
    assert active is not None and abs(active - 0.8 * 10.0) < 0.15
    assert r.fake.calls["nvmlGpmSampleGet"] == 1, "asked once, then disabled"


def test_mig_devices_hidden_from_an_unprivileged_container_say_what_to_set(rig: MakeRig) -> None:
    r = rig([_two_instances(errors={"nvmlDeviceGetMigDeviceHandleByIndex": "no_permission"})])
    with capture_logs() as logs:
        r.run_until(11.0)
    assert r.failures() == {}
    warned = [e for e in logs if e["event"] == "gpu_mig_no_permission"]
    assert len(warned) == 1 and "NVIDIA_MIG_MONITOR_DEVICES" in warned[0]["hint"]
    assert r.value("gpufeed_gpu_mig_mode", gpu="0") == 1.0
    assert not [k for k in r.metrics() if k[0] == "gpufeed_gpu_mig_info"]
