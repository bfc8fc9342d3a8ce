"""Play a scenario in virtual time through the real collectors, engine and derived layer.

``play(scenario)`` renders the scenario's trees into a temporary directory, builds the daemon's collectors
(``exporter.daemon.build_collectors``) pointed at them with a :class:`FakeNvml` in ``ctx.shared["nvml"]``,
appends the derived layer's ``exporter.analysis.Analyzer`` when it exists, and steps an
:class:`~exporter.engine.Engine` on a :class:`~exporter.engine.VirtualClock` from one sampler due time to
the next. Before each step it rewrites only the files the due samplers read (:data:`SAMPLER_GROUPS`), so a
2-minute, 8-GPU scenario plays in seconds. At each phase end it records the derived state; with
``timeline`` it also records every evaluation.

The interface with the classifier (agreed with the derived layer): ``Analyzer(ctx)`` is a collector with one
non-blocking sampler ``derived``; it reads the engine from ``ctx.shared["engine"]``; its samples are
:class:`exporter.samples.derived.DerivedState`, read here as ``engine.snapshot.value("derived")``. Without
``exporter.analysis`` the result says ``"classifier": "unavailable"`` and every cause is ``None``.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter import log
from exporter.collectors import load_all
from exporter.collectors.base import Collector, CollectorContext, TargetPids
from exporter.config import resolve
from exporter.daemon import build_collectors
from exporter.engine import Engine, VirtualClock
from exporter.samples.derived import DerivedState
from exporter.sim.fakenvml import FakeNvml
from exporter.sim.model import Model
from exporter.sim.render import GROUPS, Renderer, nvml_state
from exporter.sim.scenario import Scenario

_log = log.get_logger(component="sim")

# Which rendered files each sampler reads; "nvml" is the fake NVML's state. An unknown sampler gets all.
SAMPLER_GROUPS: Mapping[str, frozenset[str]] = {
    "cpu": frozenset({"stat"}),
    "proc": frozenset({"procs"}),
    "proc_threads": frozenset({"procs", "threads"}),
    "cpufreq": frozenset({"cpufreq"}),
    "memory": frozenset({"memory"}),
    "disk": frozenset({"disk"}),
    "nfs": frozenset({"nfs"}),
    "pressure": frozenset({"pressure"}),
    "pcie": frozenset({"pcie"}),
    "numa": frozenset({"procs"}),
    "gpu": frozenset({"nvml"}),
    "gpu_samples": frozenset({"nvml", "nvml_samples"}),
    "gpu_slow": frozenset({"nvml"}),
    "derived": frozenset(),
}
_ALL = frozenset({*GROUPS, "nvml", "nvml_samples"})
_EPS = 1e-9


@dataclass
class PhaseResult:
    """The derived state at the end of one phase."""

    name: str
    end_s: float
    state: DerivedState | None


@dataclass
class PlayResult:
    """Everything a diagnose report needs."""

    scenario: Scenario
    classifier: bool
    phases: list[PhaseResult]
    timeline: list[tuple[float, DerivedState]] = field(default_factory=list)
    collectors: list[str] = field(default_factory=list)
    sampler_runs: dict[str, int] = field(default_factory=dict)
    sampler_errors: dict[str, str] = field(default_factory=dict)


def fast_tmpdir() -> Path | None:
    """/dev/shm when it is a writable directory (tmpfs: file churn costs 4-5x less than on disk), else None."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK) else None


def _analyzer_class() -> type[Collector] | None:
    """``exporter.analysis.Analyzer``, or None while the derived layer has not landed."""
    try:
        mod = importlib.import_module("exporter.analysis")
    except ImportError as e:
        if e.name != "exporter.analysis":
            raise
        return None
    cls: type[Collector] = mod.Analyzer
    return cls


def play(
    sc: Scenario,
    *,
    timeline: bool = False,
    flags: Mapping[str, Any] | None = None,
    workdir: Path | None = None,
) -> PlayResult:
    """Run the whole scenario once in virtual time; ``flags`` are extra settings (``collector.x.interval``...)."""
    with tempfile.TemporaryDirectory(prefix="gpufeed-sim-", dir=workdir or fast_tmpdir()) as tmp:
        root = Path(tmp)
        model = Model(sc)
        renderer = Renderer(model, root, atomic=False)  # nothing reads while we write: one thread
        renderer.setup()
        renderer.render(0.0)
        counter_bits = 32
        fake = FakeNvml(nvml_state(model, 0.0, counter_bits=counter_bits))
        registry = load_all()
        settings = resolve(registry, {}, {"path.procfs": str(root / "proc"), "path.sysfs": str(root / "sys"),
                                          **(flags or {})})
        shared: dict[str, Any] = {"nvml": fake}
        targets = TargetPids()
        collectors = build_collectors(settings, registry, targets=targets, shared=shared)
        analyzer_cls = _analyzer_class()
        if analyzer_cls is not None and not any(c.name == analyzer_cls.name for c in collectors):
            ctx = CollectorContext(procfs=settings.procfs, sysfs=settings.sysfs,
                                   options=settings.collector.get(analyzer_cls.name, {}), targets=targets,
                                   shared=shared)
            collectors.append(analyzer_cls(ctx))
        clock = VirtualClock(0.0)
        engine = Engine(collectors, clock, inline=True, history_seconds=float(settings["engine.history"]))
        shared["engine"] = engine
        result = PlayResult(scenario=sc, classifier=analyzer_cls is not None, phases=[],
                            collectors=[c.name for c in collectors])
        derived_runs = 0
        last_samples: dict[str, Any] | None = None
        engine.run_until(0.0)
        for ph in sc.phases:
            end = ph.end_s
            while True:
                due = min((s.next_due for s in engine.samplers.values()), default=end + 1)
                if due > end + _EPS:
                    break
                names = [n for n, s in engine.samplers.items() if s.next_due <= due + _EPS]
                groups: set[str] = set()
                for n in names:
                    groups |= SAMPLER_GROUPS.get(n, _ALL)
                renderer.render(due, groups & set(GROUPS))
                if "nvml" in groups:
                    buffered = engine.samplers.get("gpu_samples")
                    state = nvml_state(model, due, counter_bits=counter_bits,
                                       samples=("nvml_samples" in groups) or last_samples is None,
                                       buffer_s=max(2.0, 2.0 * (buffered.interval if buffered else 1.0)))
                    if "nvml_samples" in groups or last_samples is None:
                        last_samples = {d["uuid"]: (d["util_samples"], d["mem_util_samples"])
                                        for d in state["devices"]}
                    else:
                        # Only the buffered sampler reads the whole buffer; the others may read the newest.
                        for d in state["devices"]:
                            util, mem = last_samples[d["uuid"]]
                            d["util_samples"], d["mem_util_samples"] = util[-1:], mem[-1:]
                    fake.set_state(state)
                engine.run_until(due + _EPS)
                if timeline and "derived" in engine.samplers:
                    runs = engine.samplers["derived"].runs
                    if runs != derived_runs:
                        derived_runs = runs
                        value = engine.snapshot.value("derived")
                        if isinstance(value, DerivedState):
                            result.timeline.append((due, value))
            engine.run_until(end)
            value = engine.snapshot.value("derived")
            result.phases.append(PhaseResult(ph.name, end, value if isinstance(value, DerivedState) else None))
        for n, s in engine.samplers.items():
            result.sampler_runs[n] = s.runs
            if s.last_error and s.available:
                result.sampler_errors[n] = s.last_error
        for c in collectors:
            try:
                c.close()
            except Exception as e:
                _log.warning("collector_close_failed", collector=c.name, error=repr(e))
        return result
