"""GPU health from NVML: Xid errors from NVML events (exporter/gpu/events.py), ECC and row-remapping counters
from the slow field batch. Under the rig's inline engine the slow sampler drains the event set; the daemon's
waiter thread is tested on the backend directly."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pynvml
from structlog.testing import capture_logs

from exporter.gpu.backend import NvmlBackend
from exporter.gpu.events import MAX_CODES
from exporter.sim.fakenvml import FakeNvml
from tests.support.gpurig import Rig, device

MakeRig = Callable[..., Rig]


def _xids(*events: tuple[float, int]) -> list[dict[str, Any]]:
    return [{"t": t, "xid": x} for t, x in events]


def test_xid_errors_are_counted_per_gpu_and_code_from_nvml_events(rig: MakeRig) -> None:
    r = rig([device(0, xid_events=_xids((2.0, 79), (3.0, 48), (3.5, 48))), device(1)])
    with capture_logs() as logs:
        r.run_until(11.0)
    assert r.value("gpufeed_gpu_xid_errors_total", gpu="0", xid="48") == 2.0
    assert r.value("gpufeed_gpu_xid_errors_total", gpu="0", xid="79") == 1.0
    assert not [k for k in r.metrics() if k[0] == "gpufeed_gpu_xid_errors_total" and ("gpu", "1") in k[1]]
    assert [(e["gpu"], e["xid"]) for e in logs if e["event"] == "gpu_xid_error"] == [(0, 79), (0, 48), (0, 48)]
    slow = r.history("gpu_slow")[-1][1].gpus[0]
    assert slow.xid_errors == {48: 2, 79: 1}
    assert 3.5 <= slow.xid_last_seen[48] <= 11.0, "stamped when the slow path took it, on the engine's clock"
    # One event set for the host, both GPUs registered once; the fake delivered each event once.
    assert r.fake.calls["nvmlEventSetCreate"] == 1 and r.fake.calls["nvmlDeviceRegisterEvents"] == 2


def test_an_event_not_yet_due_is_not_counted_early(rig: MakeRig) -> None:
    r = rig([device(0, xid_events=_xids((30.0, 94)))])
    r.run_until(20.0)
    assert r.value("gpufeed_gpu_xid_errors_total", gpu="0", xid="94") is None
    r.run_until(36.0)
    assert r.value("gpufeed_gpu_xid_errors_total", gpu="0", xid="94") == 1.0


def test_distinct_xid_codes_per_gpu_are_bounded(rig: MakeRig) -> None:
    r = rig([device(0, xid_events=_xids(*((1.0 + 0.01 * i, 200 + i) for i in range(MAX_CODES + 8))))])
    r.run_until(6.0)
    series = {dict(k[1])["xid"]: v for k, v in r.metrics().items() if k[0] == "gpufeed_gpu_xid_errors_total"}
    assert len(series) == MAX_CODES + 1
    assert series["other"] == 8.0


def test_the_event_set_is_rearmed_after_a_lost_gpu_comes_back(rig: MakeRig) -> None:
    r = rig([device(0, xid_events=_xids((12.0, 13))), device(1, xid_events=_xids((40.0, 79)))])
    r.at(5.0, lambda st: st["devices"][1].update(lost=True))
    r.at(20.0, lambda st: st["devices"][1].update(lost=False))
    r.run_until(16.0)
    # While GPU 1 is lost the set is rebuilt without it: GPU 0 keeps reporting.
    assert r.value("gpufeed_gpu_xid_errors_total", gpu="0", xid="13") == 1.0
    r.run_until(60.0)
    assert r.value("gpufeed_gpu_lost", gpu="1") is None
    assert r.value("gpufeed_gpu_xid_errors_total", gpu="1", xid="79") == 1.0
    assert r.fake.event_sets == 1, "old sets are freed when a new one replaces them"


def test_a_gpu_without_xid_events_is_logged_once_and_the_others_still_report(rig: MakeRig) -> None:
    r = rig([device(0, unsupported=["nvmlDeviceRegisterEvents"]), device(1, xid_events=_xids((1.0, 31)))])
    with capture_logs() as logs:
        r.run_until(20.0)
    assert [e["gpu"] for e in logs if e["event"] == "gpu_events_unavailable"] == [0]
    assert r.value("gpufeed_gpu_xid_errors_total", gpu="1", xid="31") == 1.0
    assert r.failures() == {}


def test_the_event_thread_counts_without_the_slow_path_and_stops_promptly_at_close() -> None:
    fake = FakeNvml({"devices": [{"pci_bus_id": "0000:82:00.0"}]})
    clock = [0.0]
    backend = NvmlBackend(lambda: fake, clock=lambda: clock[0], event_thread=True)
    backend.fast()  # initialise: the watcher starts its thread and registers the GPU
    threads = [t for t in threading.enumerate() if t.name == "gpufeed-xid-events"]
    assert len(threads) == 1
    fake.set_state({"t": 5.0, "devices": [{"pci_bus_id": "0000:82:00.0", "xid_events": _xids((4.0, 119))}]})
    deadline = time.monotonic() + 10.0
    while backend.events.events == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert backend.events.counts(0)[0] == {119: 1}
    backend.close()
    assert not threads[0].is_alive(), "the waiter stops within its wait timeout"
    assert fake.event_sets == 0
    # The threaded watcher never drained on the slow path: the slow sample only copies its counts.
    assert fake.calls["nvmlEventSetWait_v2"] >= 1


def test_ecc_and_row_remapping_counters_are_exported_from_the_slow_path(rig: MakeRig) -> None:
    r = rig([device(0, ecc={"corrected_volatile": 12, "uncorrected_volatile": 1, "corrected_aggregate": 40,
                            "uncorrected_aggregate": 2},
                    remapped_rows={"correctable": 3, "uncorrectable": 1, "pending": 1, "failure": 0}),
             device(1, unsupported=["field:3", "field:4", "field:5", "field:6"]), device(2)])
    r.at(7.0, lambda st: st["devices"][0]["ecc"].update(uncorrected_volatile=4))
    r.run_until(12.0)
    ecc = "gpufeed_gpu_ecc_errors_total"
    assert r.value(ecc, gpu="0", error="uncorrected", counter="volatile") == 4.0
    assert r.value(ecc, gpu="0", error="corrected", counter="volatile") == 12.0
    assert r.value(ecc, gpu="0", error="corrected", counter="aggregate") == 40.0
    assert r.value(ecc, gpu="0", error="uncorrected", counter="aggregate") == 2.0
    assert r.value("gpufeed_gpu_remapped_rows", gpu="0", cause="correctable") == 3.0
    assert r.value("gpufeed_gpu_remapped_rows", gpu="0", cause="uncorrectable") == 1.0
    assert r.value("gpufeed_gpu_row_remap_pending", gpu="0") == 1.0
    assert r.value("gpufeed_gpu_row_remap_failure", gpu="0") is None  # a flag: 1 or absent
    # A GPU that never had an error: the volatile totals (the alerts' rates) are 0, the lifetime ones absent
    # until they count something (a level, exported once non-zero: the series budget).
    assert r.value(ecc, gpu="2", error="uncorrected", counter="volatile") == 0.0
    assert r.value(ecc, gpu="2", error="uncorrected", counter="aggregate") is None
    # A board without ECC: its series are absent (unknown), not zero; its remap counters still answer.
    assert r.value(ecc, gpu="1", error="uncorrected", counter="volatile") is None
    assert r.value("gpufeed_gpu_remapped_rows", gpu="1", cause="correctable") == 0.0
    # Read on the slow path only: ECC never costs the 100 ms tick anything.
    fast = r.history("gpu")[-1][1].gpus[0]
    assert not any(k.startswith("ecc_") for k in fast.fields)


def test_the_fake_delivers_each_xid_once_even_from_a_sliding_window_of_events() -> None:
    dev = {"pci_bus_id": "0000:82:00.0"}
    fake = FakeNvml({"t": 1.0, "devices": [{**dev, "xid_events": _xids((1.0, 13), (1.0, 31))}]})
    fake.nvmlInit()
    es = fake.nvmlEventSetCreate()
    fake.nvmlDeviceRegisterEvents(fake.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlEventTypeXidCriticalError, es)

    def drain() -> list[int]:
        got = []
        while True:
            try:
                got.append(int(fake.nvmlEventSetWait_v2(es, 0).eventData))
            except pynvml.NVMLError_Timeout:
                return got

    assert drain() == [13, 31], "two events at the same time: both, once"
    # The simulator keeps only recent events: the old ones fall out, a new one arrives.
    fake.set_state({"t": 9.0, "devices": [{**dev, "xid_events": _xids((1.0, 31), (8.0, 79), (12.0, 48))}]})
    assert drain() == [79], "delivered ones are not repeated; future ones wait"
    fake.set_state({"t": 12.0, "devices": [{**dev, "xid_events": _xids((12.0, 48))}]})
    assert drain() == [48]
