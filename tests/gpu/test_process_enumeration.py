"""Process enumeration takes the driver's global lock for milliseconds (MangoHud #2104): the backend lists a
GPU's processes at most once per 5 s whatever the slow path's interval, except on the first slow cycle after the
GPU's activity started or stopped, so a new workload is still found at once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.support.gpurig import Rig, device

MakeRig = Callable[..., Rig]
LIST = "nvmlDeviceGetComputeRunningProcesses_v3"
UTIL = "nvmlDeviceGetProcessUtilization"
# The slow path every second; the fast path (which plays no part here) as rarely as the rig allows, for speed.
FAST_OFF = {"slow-interval": 1.0, "interval": 5.0}


def _busy(_t: float) -> dict[str, Any]:
    return {"gpu_util": 1.0, "sm_active": 0.9}


def test_processes_are_enumerated_at_most_every_five_seconds_with_a_one_second_slow_path(rig: MakeRig) -> None:
    r = rig([device(0, processes=[{"pid": 100, "used_memory_bytes": 1 << 30}])],
            options=FAST_OFF, procs={100: "train"})
    r.rates(0, _busy)
    r.run_until(2.5)  # activity seen by the first buffered reads: the enumeration of t=0 may be repeated once
    before = r.fake.calls[LIST]
    r.run_until(22.5)
    slow_cycles = 20
    listed = r.fake.calls[LIST] - before
    assert listed == slow_cycles // 5, f"{listed} enumerations in {slow_cycles} slow cycles of a steady GPU"
    assert r.fake.calls[UTIL] <= r.fake.calls[LIST]
    # Between enumerations the slow path shows the newest list: the process never disappears.
    assert all(v.gpus[0].processes and v.gpus[0].processes[0].pid == 100 for _, v in r.history("gpu_slow")[1:])
    assert r.targets.by_gpu() == {"0": frozenset({100})}


def test_a_workload_that_starts_is_enumerated_on_the_next_slow_cycle(rig: MakeRig) -> None:
    r = rig([device(0)], options=FAST_OFF, procs={200: "train"})
    r.rates(0, lambda t: _busy(t) if t >= 20.0 else {})

    def start(st: dict[str, Any]) -> None:
        st["devices"][0]["processes"] = [{"pid": 200, "used_memory_bytes": 1 << 30}]

    r.at(20.0, start)
    r.run_until(19.5)
    r.fake.calls.clear()
    r.run_until(22.5)
    # Enumerated at t=20 (due: 5 s after 15) and at t=21 or 22, once the driver's samples show the work began.
    assert r.fake.calls[LIST] == 2
    found = [t for t, v in r.history("gpu_slow") if v.gpus[0].processes]
    assert found and found[0] <= 22.0, "a new workload is found within a second of its activity starting"
