"""Verdict latency: how long after a phase's onset each expected verdict settles, in every shared scenario.

Adaptive sampling (DESIGN.md "Sampling that pays only for what it learns") must not slow detection: the budget
is a verdict within 15 s of a condition's onset. Each scenario of ``tests/scenarios`` (the repository's copy of
``shared/scenarios``, with its version-2 workload scenarios) plays in virtual time through the real collectors,
engine and derived layer at default settings (``exporter.sim.player.play``, what ``gpufeed diagnose --scenario``
runs), recording every evaluation. For each ``expect`` entry and GPU (or MIG instance, ``expect[].mig``), the
latency is the time from the phase's
start to the first evaluation from which the expected verdict (any of a list) holds at every evaluation to the
phase's end. A verdict that never settles, or one that is gone again by the phase's end, has no latency: that
is a miss. Virtual time, so the figures do not depend on the machine.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from bench.common import Context, Options
from bench.report import Section

BUDGET_S = 15.0  # DESIGN.md "Budgets": a verdict within 15 s of a condition's onset
REPO_SCENARIOS = Path(__file__).resolve().parent.parent / "tests" / "scenarios"
SHARED_SCENARIOS = Path(__file__).resolve().parent.parent.parent / "shared" / "scenarios"
# A smoke run plays only these (the shortest shared scenarios): it checks the harness, not the budget.
SMOKE = ("launch_bound.yaml",)


@dataclass(frozen=True)
class Latency:
    """One expected verdict of one phase: seconds from the phase's onset to the verdict that holds to its end."""

    scenario: str
    phase: str
    gpu: int
    want: tuple[str, ...]
    seconds: float  # math.inf when it never settled
    mig: int | None = None  # the MIG instance (GPU instance id) of an ``expect[].mig`` verdict

    def raw(self) -> dict[str, object]:
        """As JSON can hold it: a verdict that never settled has no latency (null, not Infinity)."""
        return {**self.__dict__, "seconds": None if math.isinf(self.seconds) else self.seconds}

    def who(self) -> str:
        return f"GPU {self.gpu}" if self.mig is None else f"GPU {self.gpu} MIG {self.mig}"


def scenario_files(smoke: bool = False) -> list[Path]:
    """The shared scenarios: the repository's copy (tests/scenarios, recursively), else ../shared/scenarios."""
    base = REPO_SCENARIOS if any(REPO_SCENARIOS.glob("*.yaml")) else SHARED_SCENARIOS
    files = sorted(base.rglob("*.yaml"))
    return [p for p in files if p.name in SMOKE] if smoke else files


def settle_time(evaluations: Sequence[tuple[float, str | None]], want: Iterable[str]) -> float | None:
    """The time of the first evaluation from which every evaluation's cause is one of ``want``; None when the
    last one is not (or there is none)."""
    wanted = set(want)
    first: float | None = None
    for t, cause in evaluations:
        if cause in wanted:
            if first is None:
                first = t
        else:
            first = None
    return first


def latencies(path: Path) -> list[Latency]:
    """Every expected verdict of the scenario at ``path``, played at default settings."""
    from exporter.samples.gpu import GpuKey
    from exporter.sim.player import play
    from exporter.sim.scenario import load

    sc = load(path)
    res = play(sc, timeline=True)
    starts = {ph.name: (ph.start_s, ph.end_s) for ph in sc.phases}
    out: list[Latency] = []
    for exp in sc.expect:
        start, end = starts[exp.phase]
        during = [(t, s) for t, s in res.timeline if start < t <= end + 1e-9]
        for gpu, want in sorted(exp.gpus.items()):
            evals = [(t, s.gpus[gpu].cause if gpu in s.gpus else None) for t, s in during]
            t0 = settle_time(evals, want)
            out.append(Latency(path.stem, exp.phase, gpu, tuple(want), math.inf if t0 is None else t0 - start))
        for (gpu, gi), cause in sorted(exp.mig.items()):
            key = GpuKey(gpu, gi)
            evals = [(t, s.mig[key].cause if key in s.mig else None) for t, s in during]
            t0 = settle_time(evals, (cause,))
            out.append(Latency(path.stem, exp.phase, gpu, (cause,), math.inf if t0 is None else t0 - start, gi))
    return out


def run(ctx: Context, opts: Options) -> Section:
    sec = Section("verdicts", "Verdict latency (every shared scenario, virtual time, default settings)")
    found: list[Latency] = []
    with _quiet_logs():  # each play's verdict_changed events are what is measured, not output
        for path in scenario_files(opts.smoke):
            found.extend(latencies(path))
    if not found:
        sec.error = "no scenario with an expected verdict was found"
        return sec
    per: dict[str, list[Latency]] = {}
    for x in found:
        per.setdefault(x.scenario, []).append(x)
    worst = max(found, key=lambda x: x.seconds)
    budget = f"<= {BUDGET_S:g} s"
    sec.add("worst verdict latency, every scenario",
            f"{_fmt(worst.seconds)} ({worst.scenario}, phase {worst.phase}, {worst.who()}: "
            f"{'/'.join(worst.want)}; {len(found)} expected verdicts in {len(per)} scenarios)",
            budget, worst.seconds <= BUDGET_S)
    for name, xs in sorted(per.items()):
        w = max(xs, key=lambda x: x.seconds)
        sec.add(f"{name}: worst of {len(xs)}", f"{_fmt(w.seconds)} (phase {w.phase}, {w.who()}: {'/'.join(w.want)})",
                budget, w.seconds <= BUDGET_S)
    sec.raw = {"latencies": [x.raw() for x in found]}
    sec.note("Latency: from the phase's start to the first evaluation from which the expected verdict holds at every "
             "evaluation to the phase's end (the analyzer evaluates every second; a phase that continues the previous "
             "phase's verdict settles at its first evaluation). A phase shorter than its verdict's latency shows as "
             "never settled.")
    return sec


@contextlib.contextmanager
def _quiet_logs() -> Iterator[None]:
    """structlog at warning level for the duration, the process's configuration as it was afterwards."""
    before = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    try:
        yield
    finally:
        structlog.configure(**before)


def _fmt(seconds: float) -> str:
    return "never settled" if math.isinf(seconds) else f"{seconds:.0f} s"
