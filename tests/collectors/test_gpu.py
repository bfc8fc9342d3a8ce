"""The real GPU collector and NVML backend, driven by the strict fake NVML in virtual time.

Each test names the device kind or fault and what gpufeed must then report.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
from structlog.testing import capture_logs

from exporter.collectors.gpu import identity_hostname
from exporter.samples.gpu import GpuBuffered, GpuFast, GpuSample, GpuSlow
from tests.support.gctrack import tracked_inside
from tests.support.gpurig import Rig, device

MakeRig = Callable[..., Rig]


def square(high: float, low: float, period: float, duty: float) -> Callable[[float], float]:
    return lambda t: high if (t % period) < duty * period - 1e-9 else low


def info_labels(uuid: str, name: str, bdf: str, *, gpu: str = "0", numa: str = "0", host: str = "") -> dict[str, str]:
    """gpufeed_gpu_info's labels for a GPU: gpufeed's own, and dcgm-exporter's (NVML bus id form)."""
    nvml_bus = "0000" + bdf.upper()
    return {"gpu": gpu, "uuid": uuid, "name": name, "pci_bus_id": nvml_bus, "gpu_bdf": bdf, "numa_node": numa,
            "UUID": uuid, "Hostname": host or identity_hostname(""),
            "hostname": host or identity_hostname("")}


def fast_at(r: Rig, index: int) -> list[tuple[float, GpuFast]]:
    return [(t, v.gpus[index]) for t, v in r.history("gpu") if isinstance(v.gpus.get(index), GpuFast)]


def total_at(points: list[tuple[float, GpuFast]], t: float, field: str) -> float:
    """The counter's value in the fast sample taken at time ``t``."""
    for ts, g in points:
        if abs(ts - t) < 1e-6:
            v = getattr(g, field)
            assert v is not None
            return float(v)
    raise AssertionError(f"no fast sample at t={t}")


# ---- identity ------------------------------------------------------------------------------------------------


def test_info_series_carries_dcgm_exporter_identity_labels_beside_gpufeeds_own(rig: MakeRig) -> None:
    r = rig([device(0, name="NVIDIA H100 80GB HBM3", pci_bus_id="0000:8a:00.0")],
            options={"hostname": "gpu-node-01"})
    r.run_until(6.0)
    # dcgm-exporter's join keys: UUID, NVML's 8-digit upper-case bus id, Hostname; gpufeed's: uuid, gpu_bdf.
    want = info_labels("GPU-test-0", "NVIDIA H100 80GB HBM3", "0000:8a:00.0", host="gpu-node-01")
    assert want["pci_bus_id"] == "00000000:8A:00.0"
    assert r.value("gpufeed_gpu_info", **want) == 1.0


def test_hostname_label_is_the_flag_else_the_kubernetes_node_name_else_the_host_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-node-07")
    assert identity_hostname("configured") == "configured"
    assert identity_hostname("") == "gpu-node-07"
    monkeypatch.delenv("NODE_NAME")
    monkeypatch.setattr("socket.gethostname", lambda: "dgx-a")
    assert identity_hostname("") == "dgx-a"


# ---- device kinds ------------------------------------------------------------------------------------------


def test_hopper_with_gpm_sm_active_counter_rate_equals_average_over_any_range(rig: MakeRig) -> None:
    r = rig([device(0, name="NVIDIA H100 80GB HBM3")], procs={4242: "python"})
    sm = square(0.9, 0.1, period=2.0, duty=0.25)  # mean 0.3
    r.rates(0, lambda t: {"gpu_util": 1.0 if sm(t) > 0.5 else 0.2, "sm_active": sm(t), "sm_occupancy": 0.4,
                          "tensor_active": 0.6, "dram_active": 0.3})
    r.run_until(20.0)
    assert r.failures() == {}
    pts = fast_at(r, 0)
    for a, b in ((2.0, 10.0), (4.0, 18.0), (1.0, 3.0), (6.5, 6.9)):
        got = (total_at(pts, b, "sm_active_seconds") - total_at(pts, a, "sm_active_seconds")) / (b - a)
        true = sum(sm(a + 0.01 * i) for i in range(round((b - a) / 0.01))) * 0.01 / (b - a)
        assert got == pytest.approx(true, abs=1e-6), (a, b)
    last = pts[-1][1]
    assert last.sm_occupancy == pytest.approx(0.4)
    assert last.tensor_active == pytest.approx(0.6)
    assert last.dram_active == pytest.approx(0.3)
    assert r.fake.gpm_short_pairs == 0
    assert r.value("gpufeed_gpu_sm_active_seconds_total", gpu="0") == pytest.approx(last.sm_active_seconds)
    assert r.value("gpufeed_gpu_info", **info_labels("GPU-test-0", "NVIDIA H100 80GB HBM3", "0000:82:00.0")) == 1.0
    assert r.value("gpufeed_gpu_lost", gpu="0") is None


def test_busy_seconds_from_driver_samples_rate_equals_average_utilisation(rig: MakeRig) -> None:
    r = rig([device(0, gpm=False, name="NVIDIA A100-SXM4-80GB")])
    util = square(0.8, 0.0, period=3.0, duty=0.5)  # mean 0.4, in whole-percent steps
    r.rates(0, lambda t: {"gpu_util": util(t), "mem_util": 0.25})
    r.run_until(40.0)
    assert r.failures() == {}
    hist = [(t, v.gpus[0]) for t, v in r.history("gpu_samples") if isinstance(v.gpus.get(0), GpuBuffered)]
    by_t = {round(t, 6): g.busy_seconds for t, g in hist}
    # Samples are integrated in driver time up to the newest sample (at most one period behind).
    for a, b in ((6.0, 36.0), (3.0, 33.0)):
        got = (by_t[b] - by_t[a]) / (b - a)
        assert got == pytest.approx(0.4, abs=0.01), (a, b)
    pts = [p for _, g in hist for p in g.gpu_util]
    assert pts and all(0.0 <= p.value <= 1.0 for p in pts)
    assert len({p.t for p in pts}) == len(pts), "every driver sample is delivered once (lastSeenTimeStamp)"
    assert r.value("gpufeed_gpu_busy_seconds_total", gpu="0") == pytest.approx(hist[-1][1].busy_seconds)


def test_ampere_without_gpm_reports_no_sm_activity_and_never_calls_gpm(rig: MakeRig) -> None:
    r = rig([device(0, gpm=False, name="NVIDIA A100-SXM4-80GB")])
    r.rates(0, {"gpu_util": 0.5, "sm_active": 0.5, "pcie_rx_bytes_per_s": 1e9})
    r.run_until(5.0)
    assert r.failures() == {}
    g = fast_at(r, 0)[-1][1]
    assert g.sm_active is None and g.sm_active_seconds is None and g.sm_occupancy is None
    assert g.pcie_rx_bytes_total is not None
    assert r.fake.calls["nvmlGpmSampleGet"] == 0 and r.fake.calls["nvmlGpmSampleAlloc"] == 0
    names = {k[0] for k in r.metrics()}
    assert "gpufeed_gpu_sm_active_seconds_total" not in names
    assert "gpufeed_gpu_pcie_rx_bytes_total" in names
    assert r.value("gpufeed_gpu_info", **info_labels("GPU-test-0", "NVIDIA A100-SXM4-80GB", "0000:82:00.0")) == 1.0


CONSUMER_UNSUPPORTED = [
    "nvmlDeviceGetSamples", "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetProcessUtilization", "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetGpuMaxPcieLinkGeneration", "nvmlDeviceGetMigMode", "nvmlDeviceGetCpuAffinity",
    "nvmlDeviceGetMemoryAffinity",
    "field:94", "field:186", "field:74", "field:76", "field:269", "field:270", "field:271",
]


def test_consumer_card_with_most_calls_not_supported_keeps_what_works_and_stops_asking(rig: MakeRig) -> None:
    r = rig([device(0, gpm=False, name="NVIDIA GeForce RTX 3060", unsupported=CONSUMER_UNSUPPORTED,
                    cpu_affinity=None, memory_affinity=None)])
    r.rates(0, {"gpu_util": 0.7, "pcie_tx_bytes_per_s": 2e8})
    with capture_logs() as logs:
        r.run_until(30.0)
    assert r.failures() == {}
    # Each unsupported call was tried once, then disabled for this GPU.
    for fn in ("nvmlDeviceGetSamples", "nvmlDeviceGetComputeRunningProcesses_v3",
               "nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetCurrentClocksEventReasons",
               "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetMigMode"):
        assert r.fake.calls[fn] <= 2, fn  # GetSamples: one try per sample type
    disabled = [e for e in logs if e["event"] == "gpu_call_disabled"]
    assert len(disabled) == len({(e["gpu"], e["call"]) for e in disabled}), "logged once per call"
    assert not [e for e in logs if e["log_level"] in ("error", "warning")]
    # What works is exported: power falls back to nvmlDeviceGetPowerUsage, utilisation to GetUtilizationRates.
    assert r.value("gpufeed_gpu_power_watts", gpu="0") is not None
    assert r.value("gpufeed_gpu_pcie_tx_bytes_total", gpu="0") is not None
    assert r.value("gpufeed_gpu_busy_seconds_total", gpu="0") == pytest.approx(0.7 * 29.0, rel=0.05)
    names = {k[0] for k in r.metrics()}
    assert "gpufeed_gpu_clock_event_reason" not in names  # unknown, not "no reason"
    assert "gpufeed_gpu_pcie_replays_total" not in names
    assert "gpufeed_gpu_power_limit_watts" not in names
    assert r.value("gpufeed_gpu_pcie_link_generation", gpu="0", kind="current") == 5.0
    # The GPU's own maximum generation is unsupported here: its label is empty, never guessed.
    info = [dict(k[1]) for k in r.metrics() if k[0] == "gpufeed_gpu_pcie_link_info"]
    assert [i["gpu_max_generation"] for i in info if i["gpu"] == "0"] in ([], [""])


def test_empty_sample_buffer_on_idle_gpu_is_normal_and_busy_stays_flat(rig: MakeRig) -> None:
    r = rig([device(0, gpm=False)])
    # Busy until t=10, then idle with the driver's buffer run dry (NOT_FOUND) until t=40, then busy again.
    r.rates(0, lambda t: {"gpu_util": 0.0 if 10.0 <= t < 40.0 else 1.0})

    def dry(st: dict[str, Any]) -> None:
        st["devices"][0].update(util_samples=[], mem_util_samples=[], util_acc=None)

    for k in range(30):
        r.at(10.05 + k, dry)
    r.run_until(10.0)
    busy_10 = r.value("gpufeed_gpu_busy_seconds_total", gpu="0")
    assert busy_10 == pytest.approx(9.0, abs=0.01)  # the first read (t=1) is the baseline
    with capture_logs() as logs:
        r.run_until(39.5)
    assert r.failures() == {}
    assert r.value("gpufeed_gpu_busy_seconds_total", gpu="0") == pytest.approx(busy_10, abs=0.2)
    assert not [e for e in logs if e["log_level"] in ("error", "warning")]
    r.run_until(50.0)
    # Samples resume at 100%: the 30 s dry gap before the first new sample is not counted as busy time.
    busy_50 = r.value("gpufeed_gpu_busy_seconds_total", gpu="0")
    assert busy_50 is not None and busy_50 - (busy_10 or 0.0) == pytest.approx(10.0, abs=0.5)


def test_empty_buffer_from_start_exports_zero_busy_not_nothing(rig: MakeRig) -> None:
    r = rig([device(0, gpm=False)])
    r.run_until(3.0)
    assert r.failures() == {}
    assert r.value("gpufeed_gpu_busy_seconds_total", gpu="0") == 0.0


# ---- counters ------------------------------------------------------------------------------------------------


def test_pcie_counter_wrap_at_32_bits_gives_exact_byte_totals(rig: MakeRig) -> None:
    rate = 25e9  # 2.5 GB per 100 ms tick, wraps the 32-bit counter every ~0.17 s
    r = rig([device(0, pcie_counter_bits=32, pcie_tx_bytes=(1 << 32) - 10_000)])
    r.rates(0, {"pcie_tx_bytes_per_s": rate, "pcie_rx_bytes_per_s": rate / 5, "gpu_util": 1.0})
    r.run_until(10.0)
    assert r.failures() == {}
    pts = fast_at(r, 0)
    tx = [g.pcie_tx_bytes_total for _, g in pts]
    assert all(b is not None and a is not None and b >= a for a, b in itertools.pairwise(tx))
    moved = total_at(pts, 9.0, "pcie_tx_bytes_total") - total_at(pts, 1.0, "pcie_tx_bytes_total")
    assert moved == pytest.approx(rate * 8.0, rel=1e-9)
    true_total = r.fake.state["devices"][0]["pcie_tx_bytes"]
    assert r.value("gpufeed_gpu_pcie_tx_bytes_total", gpu="0") == pytest.approx(true_total, rel=1e-9)


def test_throttle_time_counters_rate_is_the_throttled_share(rig: MakeRig) -> None:
    r = rig([device(0, clock_event_reasons=["sw_power_cap", "hw_thermal"])])
    r.rates(0, {"gpu_util": 1.0, "throttle": {"sw_power_cap": 0.25, "hw_thermal": 1.0}})
    r.run_until(20.0)
    pts = fast_at(r, 0)
    a = pts[10][1].throttle_seconds
    b = pts[-1][1].throttle_seconds
    dt = pts[-1][0] - pts[10][0]
    assert (b["sw_power_cap"] - a["sw_power_cap"]) / dt == pytest.approx(0.25, rel=1e-6)
    assert (b["hw_thermal"] - a["hw_thermal"]) / dt == pytest.approx(1.0, rel=1e-6)
    # A reason the GPU never spent time in has no series; one it did is a counter from then on.
    assert r.value("gpufeed_gpu_throttle_seconds_total", gpu="0", reason="sync_boost") is None
    assert r.value("gpufeed_gpu_throttle_seconds_total", gpu="0", reason="hw_thermal") == pytest.approx(
        b["hw_thermal"], rel=1e-6)
    assert r.value("gpufeed_gpu_clock_event_reason", gpu="0", reason="hw_thermal") == 1.0
    assert r.value("gpufeed_gpu_clock_event_reason", gpu="0", reason="gpu_idle") is None  # inactive: absent


# ---- faults --------------------------------------------------------------------------------------------------


def test_gpu_lost_mid_run_is_reported_others_keep_sampling_and_it_recovers(rig: MakeRig) -> None:
    r = rig([device(0), device(1, lost_error="unknown")])
    for i in (0, 1):
        r.rates(i, {"gpu_util": 0.5, "sm_active": 0.5, "pcie_rx_bytes_per_s": 1e9})
    r.at(5.0, lambda st: st["devices"][1].update(lost=True))
    r.at(30.0, lambda st: st["devices"][1].update(lost=False, pcie_rx_bytes=7))  # reset after recovery
    with capture_logs() as logs:
        r.run_until(20.0)
    assert r.failures() == {}
    assert r.value("gpufeed_gpu_lost", gpu="1") == 1.0
    assert r.value("gpufeed_gpu_lost", gpu="0") is None
    assert r.value("gpufeed_gpu_sm_active_seconds_total", gpu="1") is None  # no made-up values
    assert r.value("gpufeed_gpu_sm_active_seconds_total", gpu="0") == pytest.approx(0.5 * 19.9, abs=0.1)
    assert len([e for e in logs if e["event"] == "gpu_lost"]) == 1
    rx_before = max(g.pcie_rx_bytes_total or 0 for _, g in fast_at(r, 1))
    with capture_logs() as logs:
        r.run_until(80.0)
    assert r.value("gpufeed_gpu_lost", gpu="1") is None
    assert [e for e in logs if e["event"] == "gpu_recovered"]
    pts = fast_at(r, 1)
    after = [g.pcie_rx_bytes_total for t, g in pts if t > 30.0 and g.pcie_rx_bytes_total is not None]
    assert after[0] >= rx_before, "counter continues monotonic across the loss"
    assert after[-1] - after[0] == pytest.approx(1e9 * (pts[-1][0] - next(t for t, _ in pts if t > 30.0)), rel=0.05)
    assert r.value("gpufeed_gpu_sm_active_seconds_total", gpu="0") == pytest.approx(0.5 * 79.9, abs=0.1)


def test_no_driver_library_is_not_available_quietly(rig: MakeRig) -> None:
    r = rig([device(0)], init_error="library_not_found")
    with capture_logs() as logs:
        r.run_until(2.0)
    assert r.failures() == {}
    assert all(not s.available for s in r.engine.snapshot.status.values())
    assert "not available" in (r.engine.samplers["gpu"].last_error or "")
    assert r.metrics() == {}
    assert not [e for e in logs if e["log_level"] in ("error", "warning")]
    assert r.fake.calls["nvmlInit"] == 1, "retried only after retry_unavailable_s, not every tick"


def test_zero_gpus_is_not_available(rig: MakeRig) -> None:
    r = rig([])
    r.run_until(1.0)
    assert r.failures() == {}
    assert "no GPU" in (r.engine.samplers["gpu_slow"].last_error or "")
    assert r.fake.calls["nvmlShutdown"] == r.fake.calls["nvmlInit"]


def test_garbage_pids_from_version_skew_are_dropped_and_real_ones_published(rig: MakeRig) -> None:
    procs = [{"pid": 4242, "used_memory_bytes": 1 << 30}, {"pid": 0, "used_memory_bytes": 5},
             {"pid": -1, "used_memory_bytes": None}, {"pid": (1 << 32) - 1, "used_memory_bytes": 1},
             {"pid": 4194305, "used_memory_bytes": 1}, {"pid": 77, "used_memory_bytes": (1 << 64) - 1}]
    r = rig([device(0, processes=procs)], procs={4242: "python3", 77: "worker"})
    # The driver's per-process samples since the previous slow read: 4242 busy, a garbage pid, 77 idle.
    r.at(9.5, lambda st: st["devices"][0].update(process_util=[
        {"pid": 4242, "ts_us": 9_400_000, "sm_pct": 63, "mem_pct": 10},
        {"pid": 999999999, "ts_us": 9_450_000, "sm_pct": 99, "mem_pct": 0}]))
    with capture_logs() as logs:
        r.run_until(11.0)
    assert r.failures() == {}
    assert r.targets.by_gpu() == {"0": frozenset({4242, 77})}
    assert dict(r.targets.bus_ids()) == {"0": "0000:82:00.0"}
    assert r.value("gpufeed_gpu_process_memory_bytes", gpu="0", pid="4242", comm="python3") == float(1 << 30)
    assert r.value("gpufeed_gpu_process_sm_ratio", gpu="0", pid="4242", comm="python3") == pytest.approx(0.63)
    assert r.value("gpufeed_gpu_process_sm_ratio", gpu="0", pid="77", comm="worker") == 0.0
    assert r.value("gpufeed_gpu_process_memory_bytes", gpu="0", pid="77", comm="worker") is None
    series = [k for k in r.metrics() if k[0] == "gpufeed_gpu_process_memory_bytes"]
    assert len(series) == 1, "per-process series bounded by the real processes"
    assert len([e for e in logs if e["event"] == "gpu_process_pids_invalid"]) == 1


def test_mig_gpu_without_process_utilisation_exports_memory_only(rig: MakeRig) -> None:
    r = rig([device(0, processes=[{"pid": 4242, "used_memory_bytes": 100}],
                    unsupported=["nvmlDeviceGetProcessUtilization", "nvmlDeviceGetProcessesUtilizationInfo"])],
            procs={4242: "python"})
    r.run_until(11.0)
    assert r.failures() == {}
    slow = [v.gpus[0] for _, v in r.history("gpu_slow")]
    assert all(isinstance(g, GpuSlow) and g.processes[0].sm_ratio is None for g in slow)
    assert r.fake.calls["nvmlDeviceGetProcessUtilization"] == 1
    assert r.value("gpufeed_gpu_process_memory_bytes", gpu="0", pid="4242", comm="python") == 100.0
    assert not [k for k in r.metrics() if k[0] == "gpufeed_gpu_process_sm_ratio"]


def test_samplers_run_at_their_configured_rates(rig: MakeRig) -> None:
    # The adaptive fast rate off (steady-interval = interval): every GPU read on every fast tick
    # (tests/gpu/test_pace.py covers the steady rate).
    r = rig([device(0)], options={"interval": 0.2, "steady-interval": 0.2, "samples-interval": 2.0,
                                  "slow-interval": 10.0})
    r.run_until(20.0)
    assert len(r.history("gpu")) == 101
    assert len(r.history("gpu_samples")) == 11
    assert len(r.history("gpu_slow")) == 3
    assert r.fake.calls["nvmlDeviceGetFieldValues"] == 101 + 3, "one field-values call per GPU per fast/slow tick"
    assert r.fake.calls["nvmlDeviceGetPcieThroughput"] == 0


def test_the_sm_clock_is_read_once_a_second_at_the_fast_rate_and_carried_in_between(rig: MakeRig) -> None:
    # A GPU read every 100 ms (a waiting GPU, the steady rate off) has its SM clock read once a second: the
    # reads in between carry the newest value, so the gauge and the window's mean clock never miss it.
    r = rig([device(0)], options={"interval": 0.1, "steady-interval": 0.1})
    r.run_until(10.0)
    fast = [v.gpus[0] for _, v in r.history("gpu")]
    assert len(fast) == 101
    assert 10 <= r.fake.calls["nvmlDeviceGetClockInfo"] <= 12, r.fake.calls["nvmlDeviceGetClockInfo"]
    assert all(isinstance(g, GpuFast) and g.sm_clock_hz is not None and g.sm_clock_hz > 0 for g in fast)
    assert r.value("gpufeed_gpu_sm_clock_hertz", gpu="0") is not None


def test_link_state_as_nvml_sees_it(rig: MakeRig) -> None:
    r = rig([device(0, link={"gen": 1, "width": 16, "max_gen": 4, "max_width": 16, "gpu_max_gen": 5},
                    temperature_c=71, memory_used_bytes=123, clock_event_reasons=["gpu_idle"])])
    r.run_until(1.0)
    assert r.value("gpufeed_gpu_pcie_link_generation", gpu="0", kind="current") == 1
    assert r.value("gpufeed_gpu_pcie_link_width", gpu="0", kind="current") == 16
    # The static maxima are labels of one info series, not gauges. NVML has no call for the GPU's own maximum
    # width (nvidia-ml-py defines no GetGpuMaxPcieLinkWidth): there is no gpu_max_width label.
    assert r.value("gpufeed_gpu_pcie_link_info", gpu="0", max_generation="4", gpu_max_generation="5",
                   max_width="16") == 1.0
    assert r.value("gpufeed_gpu_pcie_link_generation", gpu="0", kind="max") is None
    assert r.value("gpufeed_gpu_temperature_celsius", gpu="0") == 71.0
    assert r.value("gpufeed_gpu_memory_used_bytes", gpu="0") == 123.0
    assert r.value("gpufeed_gpu_sm_clock_max_hertz", gpu="0") == 1980e6
    assert r.value("gpufeed_gpu_power_limit_watts", gpu="0") == 700.0
    assert r.value("gpufeed_gpu_clock_event_reason", gpu="0", reason="gpu_idle") == 1.0
    sample = r.engine.snapshot.value("gpu_slow")
    assert isinstance(sample, GpuSample) and sample.identities[0].cpu_affinity == frozenset({0, 1, 2, 3})


def test_gpu_answering_unknown_repeatedly_is_treated_as_lost(rig: MakeRig) -> None:
    unknown = {fn: "unknown" for fn in ("nvmlDeviceGetFieldValues", "nvmlDeviceGetClockInfo", "nvmlGpmSampleGet")}
    r = rig([device(0), device(1, errors=unknown)])
    with capture_logs() as logs:
        r.run_until(1.0)
    assert r.failures() == {}
    assert r.value("gpufeed_gpu_lost", gpu="1") == 1.0
    assert r.value("gpufeed_gpu_lost", gpu="0") is None
    assert [e["gpu"] for e in logs if e["event"] == "gpu_lost"] == [1]


def test_gpm_sampling_refused_in_a_vm_falls_back_without_sm_activity(rig: MakeRig) -> None:
    r = rig([device(0, unsupported=["nvmlGpmSampleGet"])])
    r.rates(0, {"gpu_util": 0.5, "sm_active": 0.5})
    r.run_until(3.0)
    assert r.failures() == {}
    assert r.fake.calls["nvmlGpmSampleGet"] == 1
    g = fast_at(r, 0)[-1][1]
    assert g.sm_active is None and g.sm_active_seconds is None
    assert not r.engine.snapshot.value("gpu").identities[0].gpm
    assert r.value("gpufeed_gpu_busy_seconds_total", gpu="0") == pytest.approx(1.0, abs=0.1)


def test_fast_tick_early_by_jitter_waits_instead_of_skipping_the_gpm_pair() -> None:
    from exporter.gpu.backend import NvmlBackend
    from exporter.sim.fakenvml import FakeNvml

    fake = FakeNvml({"devices": [device(0)]})
    now = [0.0]
    slept: list[float] = []

    def at(t: float) -> None:
        now[0] = t
        st = fake.state
        st["t"] = t
        fake.set_state(st)

    def sleep(s: float) -> None:
        slept.append(s)
        at(now[0] + s)

    b = NvmlBackend(lambda: fake, clock=lambda: now[0], sleep=sleep)
    for k in range(20):
        at(k * 0.1 + (0.003 if k % 2 else 0.0))  # odd ticks late by 3 ms: even ticks come 97 ms after
        b.fast()
    assert fake.calls["nvmlGpmMetricsGet"] == 19, "no pair skipped"
    assert fake.gpm_short_pairs == 0
    assert len(slept) == 9 and all(abs(s - 0.003) < 1e-9 for s in slept)


def test_a_gpu_sample_leaves_few_objects_for_the_cycle_collector_per_gpu(rig: MakeRig) -> None:
    # Issue 14: every object a sample keeps in the ring buffers is traversed by each full collection.
    r = rig([device(0), device(1)])
    r.rates(0, {"gpu_util": 0.8, "mem_util": 0.25})
    r.run_until(5.0)
    fast = [v for _, v in r.history("gpu")]
    assert len(fast) >= 2 and fast[-1].identities is fast[-2].identities, "identities shared while unchanged"
    g = fast[-1].gpus[0]
    assert isinstance(g, GpuFast) and g.fields and tracked_inside(g.fields) == []
    prev = fast[-2].gpus[0]
    assert isinstance(prev, GpuFast) and g.mig is prev.mig, "one empty MIG mapping for every sample"
    calls = fast[-1].calls
    assert calls["reads"].calls > 0 and tracked_inside(calls) == [calls]
    buffered = [v.gpus[0] for _, v in r.history("gpu_samples") if isinstance(v.gpus.get(0), GpuBuffered)]
    util = buffered[-1].gpu_util
    assert util and 0.0 <= util[0].value <= 1.0 and tracked_inside(util) == [util]
    slow = [v.gpus[0] for _, v in r.history("gpu_slow") if isinstance(v.gpus.get(0), GpuSlow)][-1]
    assert tracked_inside(slow.fields) == [] and slow.mig is slow.xid_errors is g.mig, "no Xid, no MIG: shared"


def test_the_boards_maxima_are_read_once_a_minute_and_the_current_link_every_slow_cycle(rig: MakeRig) -> None:
    r = rig([device(0), device(1)])
    r.run_until(64.0)  # slow cycles at 0, 5, ..., 60
    for fn in ("nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth",
               "nvmlDeviceGetGpuMaxPcieLinkGeneration", "nvmlDeviceGetMaxClockInfo"):
        assert r.fake.calls[fn] == 2 * 2, f"{fn}: at the first slow cycle and a minute later, per GPU"
    assert r.fake.calls["nvmlDeviceGetCurrPcieLinkGeneration"] == 13 * 2
    slow = r.history("gpu_slow")[-2][1].gpus[0]
    assert slow.max_link_gen and slow.max_link_width and slow.max_sm_clock_hz, "held between the reads"
