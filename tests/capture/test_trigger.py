"""When a waiting GPU is captured: after --capture.after on one cause, once per workload per --capture.interval."""

from __future__ import annotations

from exporter.capture.trigger import HISTORY_CHANGES, Due, Trigger
from exporter.samples.derived import GpuVerdict


def v(gpu: int, cause: str) -> GpuVerdict:
    return GpuVerdict(index=gpu, uuid=f"GPU-{gpu}", cause=cause, confidence=0.8, waiting_ratio=0.6,
                      evidence=(f"{cause} evidence",))


def test_gpu_waiting_on_one_cause_for_two_minutes_is_due_once() -> None:
    trig = Trigger(after=120.0, interval=3600.0)
    w = {0: ("pod=train",)}
    assert trig.observe(0.0, {0: v(0, "input_bound")}, w) == []
    assert trig.observe(119.0, {0: v(0, "input_bound")}, w) == []
    due = trig.observe(120.0, {0: v(0, "input_bound")}, w)
    assert due == [Due(0, "input_bound", 0.0, ("pod=train",))]
    trig.captured(due[0].workload, 120.0)
    assert trig.observe(121.0, {0: v(0, "input_bound")}, w) == []
    assert trig.observe(3719.0, {0: v(0, "input_bound")}, w) == []
    assert trig.observe(3720.0, {0: v(0, "input_bound")}, w) == [Due(0, "input_bound", 0.0, ("pod=train",))]


def test_a_change_of_cause_restarts_the_wait() -> None:
    trig = Trigger(after=120.0, interval=3600.0)
    trig.observe(0.0, {0: v(0, "input_bound")}, {})
    trig.observe(100.0, {0: v(0, "launch_bound")}, {})
    assert trig.observe(200.0, {0: v(0, "launch_bound")}, {}) == []
    assert trig.observe(220.0, {0: v(0, "launch_bound")}, {}) == [Due(0, "launch_bound", 100.0, ("gpu=0",))]
    assert [h.cause for h in trig.history(0)] == ["input_bound", "launch_bound"]


def test_working_or_idle_gpus_are_never_due() -> None:
    trig = Trigger(after=1.0, interval=10.0)
    for t in range(0, 100, 10):
        assert trig.observe(float(t), {0: v(0, "healthy"), 1: v(1, "idle"), 2: v(2, "gpu_throttled")}, {}) == []


def test_one_job_waiting_on_several_gpus_is_captured_once_per_interval() -> None:
    trig = Trigger(after=10.0, interval=100.0)
    job = ("job=42",)
    verdicts = {0: v(0, "input_bound"), 1: v(1, "input_bound"), 2: v(2, "input_bound")}
    workloads = {0: job, 1: job, 2: ("pid=9",)}
    trig.observe(0.0, verdicts, workloads)
    due = trig.observe(10.0, verdicts, workloads)
    assert [(d.gpu, d.workload) for d in due] == [(0, job), (2, ("pid=9",))]
    for d in due:
        trig.captured(d.workload, 10.0)
    assert trig.observe(50.0, verdicts, workloads) == []


def test_not_captured_means_due_again_at_the_next_look() -> None:
    trig = Trigger(after=10.0, interval=100.0)
    trig.observe(0.0, {0: v(0, "io_bound")}, {})
    assert trig.observe(10.0, {0: v(0, "io_bound")}, {})
    assert trig.observe(11.0, {0: v(0, "io_bound")}, {}), "a capture that could not start is still due"


def test_history_is_bounded_and_forgets_gpus_that_are_gone() -> None:
    trig = Trigger(after=10.0, interval=100.0)
    for t in range(100):
        trig.observe(float(t), {0: v(0, "input_bound" if t % 2 else "healthy")}, {})
    assert len(trig.history(0)) == HISTORY_CHANGES
    trig.observe(200.0, {}, {})
    assert trig.history(0) == ()
