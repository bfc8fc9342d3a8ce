"""The GPU path as real drivers behave (issue 38; ../shared/reference/reviews/gpu_readiness.md): per-GPU handle
errors, counters the driver refreshes in steps, PCIe counters missing before R555 or wrapping at 2^32 in a
64-bit slot, non-finite GPM values, garbage pids, a missing NVML library on a host with NVIDIA GPUs. Each test
makes the strict fake behave as the driver does and checks what gpufeed exports."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import pytest
from structlog.testing import capture_logs

from tests.support.gpurig import Rig, device

MakeRig = Callable[..., Rig]


@pytest.mark.parametrize("error", ["no_permission", "insufficient_power", "irq_issue"])
def test_one_gpu_refusing_its_handle_is_unavailable_and_the_others_keep_sampling(rig: MakeRig, error: str) -> None:
    r = rig([device(0), device(1, errors={"nvmlDeviceGetHandleByIndex": error}), device(2)])
    for i in (0, 2):
        r.rates(i, {"gpu_util": 1.0, "sm_active": 0.5})
    with capture_logs() as logs:
        r.run_until(6.0)
    assert r.failures() == {}
    assert r.value("gpufeed_collector_available", collector="gpu") is None
    assert r.value("gpufeed_gpu_unavailable", gpu="1", reason=error) == 1.0
    assert r.value("gpufeed_gpu_lost", gpu="1") is None, "unavailable is not lost"
    assert set(r.history("gpu")[-1][1].gpus) == {0, 2}
    assert (r.value("gpufeed_gpu_sm_active_seconds_total", gpu="2") or 0.0) > 2.0
    assert [(e["gpu"], e["reason"]) for e in logs if e["event"] == "gpu_unavailable"] == [(1, error)]


def test_an_unavailable_gpu_is_sampled_once_its_handle_is_granted(rig: MakeRig) -> None:
    r = rig([device(0), device(1, errors={"nvmlDeviceGetUUID": "no_permission"})])
    r.at(8.0, lambda st: st["devices"][1].update(errors={}))
    r.run_until(6.0)
    assert r.value("gpufeed_gpu_unavailable", gpu="1", reason="no_permission") == 1.0
    r.run_until(40.0)
    assert r.value("gpufeed_gpu_unavailable", gpu="1", reason="no_permission") is None
    assert set(r.history("gpu")[-1][1].gpus) == {0, 1}
    info = [dict(k[1]) for k in r.metrics() if k[0] == "gpufeed_gpu_info"]
    assert [(i["gpu"], i["uuid"]) for i in info] == [("0", "GPU-test-0"), ("1", "GPU-test-1")]


@pytest.mark.parametrize("refresh", [0.1, 1.0, [0.3, 1.7, 0.9, 0.45]], ids=["100ms", "1s", "irregular"])
def test_throttle_time_the_driver_refreshes_in_steps_is_exported_whole(rig: MakeRig, refresh: object) -> None:
    # 10 s of power-cap throttling read every 100 ms, the counter refreshed every `refresh` seconds: each step
    # is the throttle time since the previous refresh, which the value's own timestamp explains.
    r = rig([device(0, field_refresh_s={"74": refresh})], options={"steady-interval": 0.1})
    r.rates(0, lambda t: {"gpu_util": 1.0, "throttle": {"sw_power_cap": 1.0 if 2.0 <= t < 12.0 else 0.0}})
    r.run_until(16.0)
    throttled = r.value("gpufeed_gpu_throttle_seconds_total", gpu="0", reason="sw_power_cap")
    assert throttled is not None and 9.9 <= throttled <= 10.1


def test_pcie_counters_a_driver_before_r555_lacks_are_logged_as_not_available(rig: MakeRig) -> None:
    r = rig([device(0)], driver_version="550.54.15", driver_fields="invalid_argument")
    r.rates(0, {"gpu_util": 1.0, "pcie_rx_bytes_per_s": 1e9})
    with capture_logs() as logs:
        r.run_until(6.0)
    off = {e["field"]: e for e in logs if e["event"] == "gpu_field_disabled"}
    assert sorted(off) == [197, 198, 269, 270, 271]
    assert off[198]["reason"] == "invalid_argument" and off[198]["needs_driver"] == "R555+"
    assert "GPM" in off[198]["instead"]
    assert r.value("gpufeed_gpu_pcie_rx_bytes_total", gpu="0") is None
    assert r.value("gpufeed_gpu_pcie_replays_total", gpu="0") == 0.0, "the fields the driver has are read"
    assert r.failures() == {}


def test_a_pcie_counter_typed_64_bit_that_wraps_at_32_bits_is_unwrapped(rig: MakeRig) -> None:
    # 20 GB/s for 10 s: a 2**32 wrap every 0.21 s. Each wrap of a 64-bit-typed counter read as a reset lost
    # 45 of 200 GB.
    r = rig([device(0, pcie_counter_bits=32, pcie_counter_value_type="ull")], options={"steady-interval": 0.1})
    r.rates(0, lambda t: {"gpu_util": 1.0, "pcie_rx_bytes_per_s": 20e9 if 1.0 <= t < 11.0 else 0.0})
    r.run_until(0.5)
    start = r.value("gpufeed_gpu_pcie_rx_bytes_total", gpu="0")
    r.run_until(12.0)
    end = r.value("gpufeed_gpu_pcie_rx_bytes_total", gpu="0")
    assert start is not None and end is not None
    assert end - start == pytest.approx(200e9, rel=1e-3)


def test_a_nan_from_gpm_is_dropped_and_counted_and_the_counters_stay_finite(rig: MakeRig) -> None:
    r = rig([device(0)], options={"steady-interval": 0.1})
    r.rates(0, {"gpu_util": 1.0, "graphics_active": 1.0, "sm_active": 0.5})
    r.at(3.0, lambda st: st["devices"][0].update(gpm_nan=[1, 2]))  # graphics and SM utilisation
    r.at(3.25, lambda st: st["devices"][0].update(gpm_nan=[]))
    with capture_logs() as logs:
        r.run_until(10.0)
    sm = r.value("gpufeed_gpu_sm_active_seconds_total", gpu="0")
    assert sm is not None and sm == pytest.approx(0.5 * 10.0, abs=0.2), "the pairs without NaN still count"
    dropped = r.value("gpufeed_nvml_values_dropped_total", reason="gpm_not_finite")
    assert dropped is not None and dropped >= 2
    assert [e["gpu"] for e in logs if e["event"] == "nvml_value_dropped"] == [0]


def test_pids_no_process_can_have_are_dropped_and_counted(rig: MakeRig) -> None:
    procs = [{"pid": 4242, "used_memory_bytes": 1 << 30}, {"pid": 0, "used_memory_bytes": 5},
             {"pid": (1 << 32) - 1, "used_memory_bytes": 1}, {"pid": 4194305, "used_memory_bytes": 1}]
    r = rig([device(0, processes=procs)], procs={4242: "python3"})
    r.at(9.5, lambda st: st["devices"][0].update(process_util=[
        {"pid": 4242, "ts_us": 9_400_000, "sm_pct": 63, "mem_pct": 10},
        {"pid": 0, "ts_us": 9_450_000, "sm_pct": 99, "mem_pct": 0}]))
    r.run_until(11.0)
    assert r.targets.by_gpu() == {"0": frozenset({4242})}
    lists = r.fake.calls["nvmlDeviceGetComputeRunningProcesses_v3"]
    assert r.value("gpufeed_nvml_values_dropped_total", reason="invalid_pid") == 3 * lists + 1


def test_no_nvml_library_on_a_host_with_nvidia_gpus_is_a_failure_with_a_hint(rig: MakeRig) -> None:
    # A pod the container toolkit gave no libnvidia-ml.so.1 (hardened clusters) on a node whose sysfs shows an
    # NVIDIA 3D controller: not "no GPU here".
    r = rig([device(0)], init_error="library_not_found")
    dev = r.sysfs / "bus" / "pci" / "devices" / "0000:82:00.0"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x10de\n")
    (dev / "class").write_text("0x030200\n")
    with capture_logs() as logs:
        r.run_until(2.0)
    assert "CDI" in (r.failures().get("gpu") or "")
    failed = [e for e in logs if e["event"] == "nvml_init_failed"]
    assert len(failed) == 1 and "privileged" in failed[0]["error"]


def test_temperature_comes_from_the_current_call_and_falls_back_on_drivers_without_it(rig: MakeRig) -> None:
    r = rig([device(0, temperature_c=61), device(1, temperature_c=47, errors={
        "nvmlDeviceGetTemperatureV": "function_not_found"})])
    r.run_until(11.0)
    assert r.value("gpufeed_gpu_temperature_celsius", gpu="0") == 61.0
    assert r.value("gpufeed_gpu_temperature_celsius", gpu="1") == 47.0
    assert r.fake.calls["nvmlDeviceGetTemperature"] == r.fake.calls["nvmlDeviceGetTemperatureV"] - 1, (
        "the deprecated call only for the GPU whose driver lacks the current one")


def _busy_with_a_process(**kw: object) -> dict[str, object]:
    return device(0, processes=[{"pid": 4242, "used_memory_bytes": 1 << 30}], **kw)


def test_no_per_process_sample_on_a_busy_gpu_is_unknown_not_zero(rig: MakeRig) -> None:
    # Blackwell's nvmlDeviceGetProcessUtilization is reported to answer nothing useful (HAMi #2015); the newer
    # call is unsupported here too: the process's share is unknown, not "idle".
    r = rig([_busy_with_a_process(errors={"nvmlDeviceGetProcessUtilization": "not_found"},
                                  unsupported=["nvmlDeviceGetProcessesUtilizationInfo"])], procs={4242: "train"})
    r.rates(0, {"gpu_util": 1.0, "sm_active": 0.9})
    r.run_until(11.0)
    assert r.value("gpufeed_gpu_process_memory_bytes", gpu="0", pid="4242", comm="train") == float(1 << 30)
    assert r.value("gpufeed_gpu_process_sm_ratio", gpu="0", pid="4242", comm="train") is None


def test_per_process_utilisation_falls_back_to_the_r550_call(rig: MakeRig) -> None:
    r = rig([_busy_with_a_process(errors={"nvmlDeviceGetProcessUtilization": "not_found"})], procs={4242: "train"})
    r.rates(0, {"gpu_util": 1.0, "sm_active": 0.9})
    r.at(9.5, lambda st: st["devices"][0].update(process_util=[
        {"pid": 4242, "ts_us": 9_400_000, "sm_pct": 71, "mem_pct": 10}]))
    r.run_until(11.0)
    assert r.value("gpufeed_gpu_process_sm_ratio", gpu="0", pid="4242", comm="train") == pytest.approx(0.71)
    assert r.fake.calls["nvmlDeviceGetProcessesUtilizationInfo"] >= 1


def test_a_binding_whose_process_struct_is_not_the_drivers_lists_no_processes(rig: MakeRig) -> None:
    # nvidia-ml-py 12.535.77 lays nvmlProcessInfo_t out in 32 bytes, the driver in 24: read at the wrong stride,
    # every pid after the first is garbage that may name an unrelated process.
    class Wider(ctypes.Structure):
        _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                    ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint),
                    ("usedGpuCcProtectedMemory", ctypes.c_ulonglong)]

    r = rig([device(0, processes=[{"pid": 4242, "used_memory_bytes": 1 << 30}])], procs={4242: "train"})
    r.fake.__dict__["c_nvmlProcessInfo_v3_t"] = Wider  # the older binding's struct, as the backend finds it
    with capture_logs() as logs:
        r.run_until(11.0)
    assert r.targets.by_gpu() == {"0": frozenset()}
    assert r.fake.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 0
    assert len([e for e in logs if e["event"] == "gpu_process_struct_mismatch"]) == 1
