"""The Analyzer's glue: counters exact at any evaluation interval, gaps counted once, adaptive depth, exposition."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from itertools import pairwise
from types import MappingProxyType
from typing import Any

import pytest

from exporter.derived.analyzer import Analyzer
from exporter.samples.derived import DerivedState
from exporter.samples.gpu import GpuSlow
from exporter.sampling import Targets
from exporter.snapshot import Snapshot, Stamped
from tests.support.builders import GpuSpec, ThreadSpec, const, cpu_window, gpu_windows, proc_window, square
from tests.support.engine import FakeEngine, analyzer


def make(gpu: GpuSpec, threads: Sequence[ThreadSpec], t1: float) -> tuple[Analyzer, FakeEngine]:
    fast, buf, slow = gpu_windows([gpu], 0.0, t1)
    procs = proc_window(gpu.pids[0], threads, 0.0, t1, cpus_allowed=frozenset(range(16)), total_threads=8)
    eng = FakeEngine({"gpu": fast, "gpu_samples": buf, "gpu_slow": slow, "proc": procs, "proc_threads": procs,
                      "cpu": cpu_window(16, {0: (0.56, 0.43)}, 0.0, t1)})
    return analyzer(eng), eng


def run(an: Analyzer, eng: FakeEngine, times: Sequence[float]) -> DerivedState:
    out = None
    for t in times:
        eng.t = t
        got = an.update()
        if isinstance(got, DerivedState):  # UNCHANGED: the previous state stands
            out = got
    out = out or an.state
    assert out is not None
    return out


def test_state_seconds_add_up_to_elapsed_time_at_irregular_evaluation_intervals() -> None:
    an, eng = make(GpuSpec(util=const(0.42), sm=const(0.11)), [ThreadSpec(1, 0.56, 0.43, "R")], 45.0)
    # The last time is a stable interval after the GPU's verdict settled: an evaluation, whatever the default.
    times = [1.0, 2.5, 3.0, 7.25, 9.0, 9.1, 15.0, 22.7, 30.0, 45.0]
    st = run(an, eng, times)
    a = st.activity[0]
    total = sum(a.state_seconds.values())
    assert total == pytest.approx(times[-1] - times[0], abs=1e-9)
    assert a.state_seconds["working"] == pytest.approx(0.42 * total, rel=0.03)
    assert sum(a.waiting_seconds.values()) == pytest.approx(a.state_seconds["waiting"], abs=1e-9)
    assert a.waiting_seconds["launch_bound"] > 0.5 * a.state_seconds["waiting"]
    assert st.gpus[0].cause == "launch_bound"


def test_idle_gpu_time_is_idle_not_waiting() -> None:
    an, eng = make(GpuSpec(util=const(0.0)), [ThreadSpec(1, 0.01, 0.0)], 20.0)
    a = run(an, eng, [float(t) for t in range(1, 21)]).activity[0]
    # Every second accounted is idle; the counters stand at the last evaluation, within a stable interval of now.
    assert a.state_seconds["idle"] == pytest.approx(sum(a.state_seconds.values()))
    assert 19.0 - an.stable_s - 1e-6 <= a.state_seconds["idle"] <= 19.0 + 1e-6
    assert a.state_seconds["waiting"] == 0.0


def test_each_idle_gap_is_counted_once_across_overlapping_windows() -> None:
    # 3 s period, busy 18%: an idle gap of 2.46 s per period; 30 s -> 10 periods, 9 gaps bounded both sides.
    an, eng = make(GpuSpec(util=square(0.95, 0.0, 3.0, 0.18), sm=square(0.8, 0.0, 3.0, 0.18)),
                   [ThreadSpec(8, 0.05, 0.06, "D")], 30.0)
    a = run(an, eng, [float(t) for t in range(1, 31)]).activity[0]
    assert sum(a.gap_buckets) == 9
    assert a.gap_buckets[2] == 9  # all in the (1 s, 2.5 s] bucket
    assert a.gap_seconds_sum == pytest.approx(9 * 2.46, abs=9 * 0.1)  # one 100 ms sample of quantisation per gap
    assert a.periodic_gaps


def test_waiting_gpu_speeds_up_per_thread_sampling_and_a_working_one_restores_it() -> None:
    an, eng = make(GpuSpec(util=lambda t: 0.95 if t < 20 else 0.4, sm=const(0.7)),
                   [ThreadSpec(1, 0.56, 0.43, "R")], 50.0)
    run(an, eng, [float(t) for t in range(1, 20)])
    assert eng.changes == [("proc_threads", 120.0)]  # working: the quiet pace (--collector.derived.quiet-host)
    run(an, eng, [float(t) for t in range(20, 30)])
    assert eng.changes[-1] == ("proc_threads", 0.5)


def test_exposition_is_one_hot_with_cumulative_gap_buckets() -> None:
    an, eng = make(GpuSpec(util=square(0.95, 0.0, 3.0, 0.18), sm=square(0.8, 0.0, 3.0, 0.18)),
                   [ThreadSpec(1, 0.1, 0.02)], 30.0)
    st = run(an, eng, [float(t) for t in range(1, 31)])
    snap = Snapshot(version=1, t=30.0, latest=MappingProxyType({"derived": Stamped(30.0, st)}))
    fams = {m.name: m for m in an.metrics(snap)}
    # Only the current verdict is exported (value 1): `== 1` and `count by (cause)` read it as before.
    verdict = [s for s in fams["gpufeed_gpu_bottleneck"].samples if s.labels["gpu"] == "0"]
    assert [(s.labels["cause"], s.value) for s in verdict] == [(st.gpus[0].cause, 1.0)]
    buckets = [s for s in fams["gpufeed_gpu_idle_gap_seconds"].samples if s.name.endswith("_bucket")]
    assert [s.labels["le"] for s in buckets] == ["0.25", "1.0", "2.5", "10.0", "+Inf"]
    assert [s.value for s in buckets] == sorted(s.value for s in buckets) and buckets[-1].value == 9
    states = {s.labels["state"]: s.value for s in fams["gpufeed_gpu_state_seconds"].samples}
    assert sum(states.values()) == pytest.approx(29.0)


def test_without_the_engine_wired_the_analyzer_reports_no_data() -> None:
    from exporter.sampling import NoDataError

    an = Analyzer({}, Targets())
    with pytest.raises(NoDataError):
        an.update()


def test_a_stable_gpu_waits_its_stable_interval_while_host_findings_keep_their_own_pace(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from exporter.derived import evaluate
    from exporter.derived.analyzer import HOST_FINDINGS_S

    gpu_at: list[float] = []
    host_at: list[float] = []
    real_gpu, real_host = evaluate.evaluate_gpu, evaluate.host_findings

    def gpu(*args: Any, **kwargs: Any) -> Any:
        gpu_at.append(eng.t)
        return real_gpu(*args, **kwargs)

    def host(*args: Any, **kwargs: Any) -> Any:
        host_at.append(eng.t)
        return real_host(*args, **kwargs)

    monkeypatch.setattr("exporter.derived.analyzer.evaluate_gpu", gpu)  # the names the analyzer calls
    monkeypatch.setattr("exporter.derived.analyzer.host_findings", host)
    an, eng = make(GpuSpec(util=const(0.95), sm=const(0.7)), [ThreadSpec(1, 0.3, 0.02)], 90.0)
    run(an, eng, [float(t) for t in range(1, 91)])
    assert an.stable_s == 15.0 and an.stable_s > HOST_FINDINGS_S
    settled = [t for t in gpu_at if t >= 40.0]  # the verdict has held for the whole window by then
    assert settled and all(b - a == pytest.approx(an.stable_s) for a, b in pairwise(settled))
    late = [t for t in host_at if t >= 40.0]
    assert all(b - a <= HOST_FINDINGS_S + 1e-9 for a, b in pairwise(late))
    assert len(late) > len(settled)


def _evaluations_around(monkeypatch: pytest.MonkeyPatch, change: Callable[[GpuSlow], GpuSlow],
                        at: float) -> tuple[list[float], list[float], float, float]:
    """A GPU busy and stable all along whose slow samples are ``change``d from ``at`` on: the times of its stable
    evaluations before the first changed sample, of its evaluations from it on, that sample's time, and the
    stable interval."""
    import dataclasses

    from exporter.derived import evaluate

    gpu_at: list[float] = []
    real_gpu = evaluate.evaluate_gpu

    def gpu(*args: Any, **kwargs: Any) -> Any:
        gpu_at.append(eng.t)
        return real_gpu(*args, **kwargs)

    monkeypatch.setattr("exporter.derived.analyzer.evaluate_gpu", gpu)
    an, eng = make(GpuSpec(util=const(0.95), sm=const(0.7)), [ThreadSpec(1, 0.3, 0.02)], 90.0)
    slow = eng.streams["gpu_slow"]
    for i, s in enumerate(slow):
        g = s.value.gpus[0]
        if s.t >= at and isinstance(g, GpuSlow):
            slow[i] = Stamped(s.t, dataclasses.replace(s.value, gpus={**s.value.gpus, 0: change(g)}))
    run(an, eng, [float(t) for t in range(1, 91)])
    first_seen = min(s.t for s in slow if s.t >= at)
    stable = [t for t in gpu_at if 40.0 <= t < first_seen]
    assert stable and all(b - a == pytest.approx(an.stable_s) for a, b in pairwise(stable))  # stable before
    return stable, [t for t in gpu_at if t >= first_seen], first_seen, an.stable_s


def test_a_change_of_the_gpus_processes_evaluates_a_stable_gpu_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # A job ends and the next starts with the GPU as busy as before (a restart looks like that): its
    # activity does not move, but its verdict must not keep naming the process that left.
    # The first slow sample after 61.5 s (65 s) falls between two stable evaluations (60, 75).
    stable, after, first_seen, stable_s = _evaluations_around(
        monkeypatch, lambda g: replace(g, processes=tuple(replace(p, pid=p.pid + 1) for p in g.processes)), 61.5)
    assert after and after[0] - first_seen <= 1.0 and after[0] - stable[-1] < stable_s


def test_a_new_xid_on_a_stable_gpu_evaluates_it_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # An Xid (or an uncorrected ECC error, a row remap) on a GPU whose verdict holds: its finding must not wait
    # for the next stable evaluation, up to --stable-interval later.
    stable, after, first_seen, stable_s = _evaluations_around(
        monkeypatch, lambda g: replace(g, xid_errors={48: 1}), 61.5)
    assert after and after[0] - first_seen <= 1.0 and after[0] - stable[-1] < stable_s
    assert len([t for t in after if t < first_seen + stable_s]) == 1, "then stable again: the count holds"
