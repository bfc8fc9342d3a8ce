"""gpufeed_nvml_call_duration_seconds: every NVML call the backend makes is timed, by kind of call, in a
histogram small enough for the host-level series budget."""

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
    # Cumulative buckets end at +Inf == count; the sum is a positive duration.
    for k, total in counted.items():
        les = [m[(NAME + "_bucket", (("call", k), ("le", f"{le:g}")))] for le in calls.BUCKETS]
        inf = m[(NAME + "_bucket", (("call", k), ("le", "+Inf")))]
        assert les == sorted(les) and inf == total
        assert m[(NAME + "_sum", (("call", k),))] > 0


def test_the_call_histogram_stays_within_forty_host_level_series(rig: MakeRig) -> None:
    r = rig([device(0), device(1)], options={"interval": 0.5})
    r.run_until(6.0)
    series = [k for k in r.metrics() if k[0].startswith(NAME)]
    assert len(series) <= len(calls.KINDS) * (len(calls.BUCKETS) + 3) <= 40
    assert not any(dict(labels).get("gpu") for _, labels in series), "host-level: no gpu label"


def test_a_bucket_bound_is_inclusive_like_prometheus_le() -> None:
    t = calls.CallTimes()
    t.observe("nvmlDeviceGetFieldValues", calls.BUCKETS[0])
    t.observe("nvmlDeviceGetFieldValues", 1.0)
    h = t.snapshot()["reads"]
    assert h.counts[0] == 1 and h.counts[-1] == 2 and h.sum_s == pytest.approx(1.0 + calls.BUCKETS[0])
