"""gpufeed_nvml_call_duration_seconds: every NVML call the backend makes is timed, by kind of call, in a summary
(count and sum) small enough for the host-level series budget."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from exporter.gpu import calls
from tests.support.gpurig import Rig, device

MakeRig = Callable[..., Rig]
NAME = "gpufeed_nvml_call_duration_seconds"


def test_every_nvml_call_is_counted_under_its_kind(rig: MakeRig) -> None:
    r = rig([device(0, processes=[{"pid": 7, "used_memory_bytes": 1 << 20}]), device(1)],
            options={"interval": 0.5}, procs={7: "train"})
    r.rates(0, {"gpu_util": 1.0, "sm_active": 0.8})
    r.run_until(10.0)
    m = r.metrics()
    counted = {k: m[(NAME + "_count", (("call", k),))] for k in calls.KINDS
               if (NAME + "_count", (("call", k),)) in m}
    made = r.fake.calls
    by_kind: dict[str, int] = {}
    for name, n in made.items():
        if name in ("nvmlEventSetWait_v2", "nvmlEventSetWait"):
            continue  # blocks by design until an event or its timeout: not a cost of the driver
        by_kind[calls.kind_of(name)] = by_kind.get(calls.kind_of(name), 0) + n
    assert counted == pytest.approx({k: float(v) for k, v in by_kind.items()})
    assert counted["reads"] > 0 and counted["processes"] > 0 and counted["device"] > 0
    # Every kind's sum is a positive duration; no buckets.
    for k in counted:
        assert m[(NAME + "_sum", (("call", k),))] > 0
    assert not [key for key in m if key[0] == NAME + "_bucket"]


def test_the_call_summary_is_two_host_level_series_a_kind(rig: MakeRig) -> None:
    r = rig([device(0), device(1)], options={"interval": 0.5})
    r.run_until(6.0)
    series = [k for k in r.metrics() if k[0].startswith(NAME)]
    assert len(series) == 2 * len(calls.KINDS) == 6
    assert not any(dict(labels).get("gpu") for _, labels in series), "host-level: no gpu label"


def test_calls_are_counted_and_summed_per_kind() -> None:
    t = calls.CallTimes()
    t.observe("nvmlDeviceGetFieldValues", 0.25)
    t.observe("nvmlGpmSampleGet", 1.0)
    t.observe("nvmlDeviceGetComputeRunningProcesses_v3", 0.5)
    snap = t.snapshot()
    assert snap["reads"].calls == 2 and snap["reads"].sum_s == pytest.approx(1.25)
    assert tuple(snap["processes"]) == (1, 0.5) and "device" not in snap
    assert t.snapshot() is snap, "the same mapping while no call came"
