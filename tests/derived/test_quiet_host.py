"""Host samplers slow while no GPU waits, back at their configured pace as soon as one does."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter import names
from exporter.derived.cadence import QUIET_INTERVALS
from tests.derived.test_analyzer import run
from tests.derived.test_deep_focus import _two_gpus
from tests.derived.test_scenarios import CONTRACT, assert_settled_within
from tests.support.engine import analyzer

CONFIGURED = {names.CPU: 0.25, names.PRESSURE: 0.25, names.PROC: 1.0, names.PROC_THREADS: 5.0, names.CPUFREQ: 5.0,
              names.PCIE: 5.0, names.NUMA: 5.0, names.MEMORY: 1.0, names.DISK: 1.0, names.NFS: 1.0}


def test_while_every_gpu_works_host_sources_are_read_at_their_quiet_pace() -> None:
    an, eng, _ = _two_gpus(waiting_from=1e9, t1=60.0)
    eng.intervals.update(CONFIGURED)
    run(an, eng, [float(t) for t in range(1, 12)])
    assert {n: eng.intervals[n] for n in QUIET_INTERVALS} == QUIET_INTERVALS
    assert eng.intervals[names.PCIE] == 5.0  # pcie_link_downgraded reads its hops over the 15 s window


def test_a_waiting_gpu_brings_every_host_source_back_to_its_configured_pace_and_recovery_slows_them_again() -> None:
    an, eng, _ = _two_gpus(waiting_from=10.0, t1=60.0)
    eng.intervals.update(CONFIGURED)
    run(an, eng, [float(t) for t in range(1, 10)])
    assert eng.intervals[names.CPU] == QUIET_INTERVALS[names.CPU] == 5.0  # the quiet pace while nothing waits
    st = run(an, eng, [float(t) for t in range(10, 25)])
    assert st.gpus[1].cause == "launch_bound"
    assert {n: eng.intervals[n] for n in QUIET_INTERVALS if n != names.PROC_THREADS} == {
        n: CONFIGURED[n] for n in QUIET_INTERVALS if n != names.PROC_THREADS}
    assert eng.intervals[names.PROC_THREADS] == 0.5  # deep sampling: --collector.derived.deep-interval
    eng.streams.update(_two_gpus(waiting_from=1e9, t1=60.0)[1].streams)
    run(an, eng, [float(t) for t in range(25, 50)])
    assert {n: eng.intervals[n] for n in QUIET_INTERVALS} == QUIET_INTERVALS


def test_once_the_waiting_verdict_has_held_for_the_window_deep_and_cpu_sampling_slow_down() -> None:
    an, eng, _ = _two_gpus(waiting_from=10.0, t1=90.0)
    eng.intervals.update(CONFIGURED)
    st = run(an, eng, [float(t) for t in range(1, 25)])
    assert st.gpus[1].cause == "launch_bound"
    assert eng.intervals[names.PROC_THREADS] == 0.5 and eng.intervals[names.CPU] == 0.25  # detecting
    (spec,) = an.samplers()
    assert spec.pace is not None and spec.pace() == 1.0  # the analyzer every --collector.derived.interval
    st = run(an, eng, [float(t) for t in range(25, 50)])
    assert st.gpus[1].cause == "launch_bound"  # held since ~13 s: settled for the 15 s window
    assert spec.pace() == 2.0  # --collector.derived.steady-interval: the tripwire still checks every run
    assert eng.intervals[names.PROC_THREADS] == 5.0  # --collector.derived.deep-settled-interval
    assert eng.intervals[names.CPU] == 5.0 and eng.intervals[names.PRESSURE] == 5.0  # back to the quiet pace
    assert {n: eng.intervals[n] for n in QUIET_INTERVALS if n != names.PROC_THREADS} == {
        n: v for n, v in QUIET_INTERVALS.items() if n != names.PROC_THREADS}  # every host source quiet again
    eng.streams.update(_two_gpus(waiting_from=1e9, t1=90.0)[1].streams)  # the GPU recovers
    run(an, eng, [50.0, 52.0])
    assert spec.pace() == 1.0  # its activity moved: evaluated, the verdict unsettled, every second again
    run(an, eng, [float(t) for t in range(53, 70)])
    assert {n: eng.intervals[n] for n in QUIET_INTERVALS} == QUIET_INTERVALS


def test_a_configured_interval_slower_than_the_quiet_one_is_kept() -> None:
    an, eng, _ = _two_gpus(waiting_from=1e9, t1=30.0)
    eng.intervals.update(CONFIGURED | {names.CPUFREQ: 60.0, names.CPU: 10.0})
    run(an, eng, [float(t) for t in range(1, 12)])
    assert eng.intervals[names.CPUFREQ] == 60.0 and eng.intervals[names.CPU] == 10.0


def test_quiet_host_off_keeps_every_configured_interval() -> None:
    _, eng, targets = _two_gpus(waiting_from=1e9, t1=30.0)
    an = analyzer(eng, targets=targets, options={"quiet-host": False})  # --no-collector.derived.quiet-host
    eng.intervals.update(CONFIGURED)
    run(an, eng, [float(t) for t in range(1, 12)])
    assert {n: eng.intervals[n] for n in CONFIGURED} == CONFIGURED


@pytest.mark.parametrize("path", CONTRACT, ids=[p.stem for p in CONTRACT])
def test_quiet_host_pace_keeps_every_contract_verdict_within_15_s_of_its_phase_onset(path: Path) -> None:
    # DESIGN.md "Budgets": a verdict within 15 s of a condition's onset -- with the host sources slowed while
    # nothing waits, the onset of waiting is when they must speed up again in time.
    assert_settled_within(path)
