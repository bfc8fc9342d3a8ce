"""The sampling cadence as a channel: what each evaluation asks of collection, planned and sent as one value.

The plan is pure (:meth:`CadencePolicy.plan`: configured intervals and whether a GPU waits in, a
:class:`Cadence` out); the :class:`Pacer` sends only what changed. Through the analyzer, the cadence it sent
is the one the engine and Targets now hold.
"""

from __future__ import annotations

from types import MappingProxyType

from exporter import names
from exporter.derived.cadence import QUIET_INTERVALS, Cadence, CadencePolicy, Pacer
from exporter.log import get_logger
from exporter.sampling import Targets
from tests.derived.test_analyzer import run
from tests.derived.test_deep_focus import WAITING_PID, _two_gpus
from tests.derived.test_quiet_host import CONFIGURED
from tests.support.engine import FakeEngine

STEERED_CONFIGURED = {n: CONFIGURED[n] for n in QUIET_INTERVALS}


def test_a_waiting_gpu_plans_fast_per_thread_sampling_focused_on_its_pids_and_host_samplers_as_configured() -> None:
    c = CadencePolicy().plan(STEERED_CONFIGURED, waiting=True, settled=False, pids=frozenset({WAITING_PID}))
    assert c.focus == frozenset({WAITING_PID})
    assert c.intervals == {**STEERED_CONFIGURED, names.PROC_THREADS: 0.5}  # --collector.derived.deep-interval


def test_no_gpu_waiting_plans_every_process_at_the_quiet_pace() -> None:
    c = CadencePolicy().plan(STEERED_CONFIGURED, waiting=False, settled=False, pids=frozenset({WAITING_PID}))
    assert c.focus is None
    assert c.intervals == QUIET_INTERVALS


def test_a_settled_waiting_verdict_plans_the_settled_deep_pace_and_every_host_source_quiet() -> None:
    c = CadencePolicy().plan(STEERED_CONFIGURED, waiting=True, settled=True, pids=frozenset({WAITING_PID}))
    assert c.focus == frozenset({WAITING_PID})
    assert c.intervals == {**QUIET_INTERVALS, names.PROC_THREADS: 5.0}  # --collector.derived.deep-settled-interval


def test_a_sampler_that_is_off_is_not_planned_and_deep_never_runs_slower_than_configured() -> None:
    configured = {names.PROC_THREADS: 0.25, names.CPU: 1.0}  # the other steered collectors are off
    c = CadencePolicy(deep_fast=0.5).plan(configured, waiting=True, settled=False, pids=frozenset())
    assert c.intervals == {names.PROC_THREADS: 0.25, names.CPU: 1.0}


def test_quiet_host_off_plans_the_configured_intervals_while_nothing_waits() -> None:
    c = CadencePolicy(quiet_host=False).plan(STEERED_CONFIGURED, waiting=False, settled=False, pids=frozenset())
    assert c.intervals == STEERED_CONFIGURED and c.focus is None


def test_the_pacer_sends_only_what_changed_and_plans_from_the_configured_intervals() -> None:
    eng = FakeEngine({}, intervals=dict(CONFIGURED))
    targets = Targets()
    pacer = Pacer(CadencePolicy(), targets, get_logger(collector="test"))
    pacer.steer(eng, 1.0, waiting=False, settled=False, pids=frozenset())
    assert {n: eng.intervals[n] for n in QUIET_INTERVALS} == QUIET_INTERVALS
    assert eng.intervals[names.PCIE] == CONFIGURED[names.PCIE]  # not steered
    sent = len(eng.changes)
    pacer.steer(eng, 2.0, waiting=False, settled=False, pids=frozenset())
    assert len(eng.changes) == sent  # the same cadence again: nothing sent
    # A GPU waits: back to what was configured, not to the quiet intervals the pacer itself set.
    cadence = pacer.steer(eng, 3.0, waiting=True, settled=False, pids=frozenset({WAITING_PID}))
    assert targets.focus() == frozenset({WAITING_PID}) and pacer.sent == cadence
    assert {n: eng.intervals[n] for n in QUIET_INTERVALS} == {**STEERED_CONFIGURED, names.PROC_THREADS: 0.5}


def test_through_the_analyzer_a_waiting_gpu_sends_fast_deep_sampling_focused_on_its_pids_and_recovery_sends_it_back(
) -> None:
    an, eng, targets = _two_gpus(waiting_from=10.0, t1=60.0)
    eng.intervals.update(CONFIGURED)
    run(an, eng, [float(t) for t in range(1, 10)])
    assert an.pacer.sent == Cadence(MappingProxyType(QUIET_INTERVALS), None)
    st = run(an, eng, [float(t) for t in range(10, 25)])
    assert st.gpus[1].cause == "launch_bound" and st.gpus[0].cause == "healthy"
    assert an.pacer.sent.focus == frozenset({WAITING_PID}) == targets.focus()  # GPU 1's process only
    assert an.pacer.sent.intervals[names.PROC_THREADS] == 0.5 == eng.intervals[names.PROC_THREADS]
    eng.streams.update(_two_gpus(waiting_from=1e9, t1=60.0)[1].streams)  # GPU 1 recovers
    run(an, eng, [float(t) for t in range(25, 50)])
    assert an.pacer.sent.focus is None and targets.focus() is None
    assert dict(an.pacer.sent.intervals) == QUIET_INTERVALS == {n: eng.intervals[n] for n in QUIET_INTERVALS}
