"""Energy spent waiting (gpufeed_gpu_waiting_joules_total): the GPU's energy counter apportioned over the same
evaluations as its waiting seconds, exact against scenarios of known power, absent without an energy counter."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.derived.analyzer import Analyzer, _GpuState
from exporter.derived.families import derived_families
from exporter.derived.series import Point
from exporter.samples.derived import DerivedState
from exporter.sim import scenario
from tests.support.plays import play

SCENARIO = """
version: 1
name: waiting-energy
description: A GPU trains at full power, then its launch thread starves it at a lower power.
seed: 3
host:
  cpus: 32
  numa_nodes: [{{cpus: "0-15"}}, {{cpus: "16-31"}}]
gpus:
  - {{index: 0, pci_bus_id: "0000:81:00.0", numa_node: 0}}
processes:
  - {{pid: 4242, comm: python, gpus: [0], cpus_allowed: "0-15", mems_allowed: "0", threads: 12}}
phases:
  - name: training
    duration_s: 60
    gpus:
      0: {{gpu_util: 0.9, sm_active: 0.7, sm_occupancy: 0.4, power_w: {train_w}}}
    processes:
      4242:
        threads_cpu: [{{count: 1, user: 0.6, system: 0.1, state: R}}]
  - name: starved
    duration_s: 90
    gpus:
      0:
        gpu_util: {{noise: {{mean: 0.42, sd: 0.05}}}}
        sm_active: {{noise: {{mean: 0.11, sd: 0.02}}}}
        sm_occupancy: 0.08
        power_w: {starved_w}
    processes:
      4242:
        threads_cpu:
          - {{count: 1, user: 0.56, system: 0.43, state: R}}
          - {{count: 11, user: 0.01, system: 0.0, state: S}}
"""


def _timeline(tmp_path: Path, train_w: float, starved_w: float) -> list[tuple[float, DerivedState]]:
    path = tmp_path / "energy.yaml"
    path.write_text(SCENARIO.format(train_w=train_w, starved_w=starved_w))
    return play(scenario.load(path)).timeline


def test_waiting_joules_are_power_times_waiting_seconds_at_constant_power(tmp_path: Path) -> None:
    final = _timeline(tmp_path, 300.0, 300.0)[-1][1].activity[0]
    assert final.waiting_seconds["launch_bound"] > 30.0
    for cause, secs in final.waiting_seconds.items():
        if secs > 1.0:
            assert final.waiting_joules[cause] == pytest.approx(300.0 * secs, rel=0.01), cause
    assert set(final.waiting_joules) <= {c for c, s in final.waiting_seconds.items() if s > 0}


def test_waiting_joules_follow_the_power_of_the_phase_the_gpu_waited_in(tmp_path: Path) -> None:
    # 400 W while training at 90% utilisation (its 10% not working counts as waiting: 6 s over the 60 s phase),
    # 150 W while starved (the rest of the waiting seconds): each phase's waiting seconds at its own power,
    # within 1%.
    timeline = _timeline(tmp_path, 400.0, 150.0)
    first_t, first = next((t, s.activity[0]) for t, s in timeline if 0 in s.activity)
    # Accounted from t = 0 (by cause once the verdict has held a window: the joules are held back with them).
    assert first.state_seconds["waiting"] == pytest.approx(0.1 * first_t)
    final = timeline[-1][1].activity[0]
    before = 0.1 * 60.0
    after = sum(final.waiting_seconds.values()) - before
    assert after > 30.0
    truth = 400.0 * before + 150.0 * after
    assert sum(final.waiting_joules.values()) == pytest.approx(truth, rel=0.01)
    assert final.waiting_joules["launch_bound"] > 0.9 * 150.0 * after


def _fed(readings: list[tuple[float, float]], util: float, cause: str | None = "launch_bound") -> _GpuState:
    st = _GpuState()
    pts = [Point(t / 10, 0.1, util) for t in range(0, 400)]
    for now in (10.0, 20.0, 30.0, 40.0):
        joules = Analyzer._waiting_energy(st, [r for r in readings if now - 10.0 < r[0] <= now], pts, dt=10.0,
                                          now=now)
        if cause is not None and joules:  # booked as the analyzer books them once the verdict has held
            Analyzer._book_joules(st, cause, joules)
    return st


def test_counter_restart_loses_only_its_own_interval() -> None:
    # 200 W, 25% working: 150 J of waiting per second; the counter restarts at t = 25 s (driver reload).
    steady = [(t / 10, 200.0 * t / 10) for t in range(1, 401)]
    restarted = [(t, e if t < 25.0 else 200.0 * (t - 25.0)) for t, e in steady]
    assert _fed(steady, 0.25).waiting_joules["launch_bound"] == pytest.approx(150.0 * 39.9, rel=1e-6)
    # From the first reading on; one 100 ms interval (the one across the restart) is unknown.
    assert _fed(restarted, 0.25).waiting_joules["launch_bound"] == pytest.approx(150.0 * 39.8, rel=1e-6)


def test_energy_read_past_the_newest_utilisation_point_waits_for_the_evaluation_that_has_its_share() -> None:
    # A steady GPU: 100 W, 92% working, energy read every second, its GPM pair (the utilisation points) every
    # 2 s -- an evaluation can end a second past the newest pair. That second is booked by the next evaluation,
    # at its own share, not as if the GPU had waited all of it.
    st = _GpuState()
    readings = [(float(t), 100.0 * t) for t in range(0, 31)]
    total = 0.0
    for now in range(1, 31):
        pts = [Point(float(t), 2.0, 0.92) for t in range(0, now - 1, 2)]  # pairs at even seconds, up to now
        if not pts:
            continue
        total += Analyzer._waiting_energy(st, [r for r in readings if r[0] <= now], pts, dt=1.0,
                                          now=float(now)) or 0.0
    covered = st.energy[0] if st.energy is not None else 0.0
    assert covered >= 28.0
    # From t = 1 s: the first evaluation (now = 2 s, dt = 1 s) starts at the newest reading before its interval.
    assert total == pytest.approx(0.08 * 100.0 * (covered - 1.0), rel=1e-6)


def test_gpu_without_an_energy_counter_has_no_waiting_joules_series() -> None:
    st = _fed([], 0.25)
    assert st.waiting_joules == {} and st.energy is None
    assert _fed([(t / 10, 50.0 * t) for t in range(1, 401)], 0.0, cause=None).waiting_joules == {}


def test_waiting_joules_series_appear_per_cause_seen() -> None:
    timeline = play(scenario.load(Path(__file__).resolve().parents[1] / "scenarios" / "launch_bound.yaml")).timeline
    names = {(s.name, s.labels.get("cause")) for m in derived_families(timeline[-1][1]) for s in m.samples
             if s.name == "gpufeed_gpu_waiting_joules_total"}
    assert ("gpufeed_gpu_waiting_joules_total", "launch_bound") in names
    assert len(names) <= 5


def test_mig_instances_have_no_waiting_joules_the_counter_is_the_whole_gpus() -> None:
    path = Path(__file__).resolve().parent / "scenarios" / "mig_instances.yaml"
    final = play(scenario.load(path)).timeline[-1][1]
    assert final.mig_activity and any(sum(a.waiting_seconds.values()) > 0 for a in final.mig_activity.values())
    assert all(not a.waiting_joules for a in final.mig_activity.values())
    names = {s.labels.get("mig") for m in derived_families(final) for s in m.samples
             if s.name == "gpufeed_gpu_waiting_joules_total"}
    assert all(n is None for n in names)  # never a series labelled with a MIG instance
