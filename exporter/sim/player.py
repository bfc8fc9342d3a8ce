"""Play a scenario in virtual time through the real collectors, engine and derived layer.

``play(scenario)`` renders the scenario's trees into a temporary directory, builds the daemon's pipeline
(:func:`exporter.pipeline.build`) pointed at them with a :class:`FakeNvml` as the NVML module, and steps its
:class:`~exporter.engine.Engine` on a :class:`~exporter.engine.VirtualClock` from one sampler due time to the
next. Before each step it rewrites only the files the due samplers read (:data:`SAMPLER_GROUPS`), so a
2-minute, 8-GPU scenario plays in seconds. At each phase end it records the derived state (the analyzer's
sample, :class:`exporter.samples.derived.DerivedState`); with ``timeline`` it also records every evaluation.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter import log, names, pipeline
from exporter.config import resolve
from exporter.engine import VirtualClock
from exporter.samples.derived import DerivedState
from exporter.sampling import Stage
from exporter.sim.fakenvml import FakeNvml
from exporter.sim.kubelet import Kubelet
from exporter.sim.model import Model
from exporter.sim.render import GROUPS, Renderer, nvml_state
from exporter.sim.spec import Scenario

_log = log.get_logger(component="sim")

# Which rendered files each sampler reads; "nvml" is the fake NVML's state. Every sampler the stages register
# (exporter.sampling.Stage.sampler_names) needs a row here: sampler_groups() refuses a registry with one missing.
READS: Mapping[str, frozenset[str]] = {
    names.CPU: frozenset({"stat"}),
    names.PROC: frozenset({"procs"}),
    names.PROC_THREADS: frozenset({"procs", "threads"}),
    names.CPUFREQ: frozenset({"cpufreq"}),
    names.MEMORY: frozenset({"memory"}),
    names.DISK: frozenset({"disk"}),
    names.NFS: frozenset({"nfs"}),
    names.PRESSURE: frozenset({"pressure"}),
    names.PCIE: frozenset({"pcie"}),
    names.NIC: frozenset({"nic"}),
    names.NUMA: frozenset({"procs"}),
    names.GPU_FAST: frozenset({"nvml"}),
    names.GPU_SAMPLES: frozenset({"nvml", "nvml_samples"}),
    names.GPU_SLOW: frozenset({"nvml"}),
    names.DERIVED: frozenset(),
    names.WORKLOAD: frozenset({"procs", "cgroups"}),
    names.KUBERNETES: frozenset(),  # the scenario's kubelet answers on its socket (sim/kubelet.py)
    names.SELF: frozenset(),  # the daemon's own /proc/self in the real procfs, never the rendered tree
}


def sampler_groups(registry: Mapping[str, type[Stage]]) -> dict[str, frozenset[str]]:
    """The file groups each sampler of ``registry``'s stages reads (:data:`READS`); LookupError naming the
    samplers :data:`READS` lacks, so a new collector's sampler gets its row rather than a guess."""
    samplers = [s for cls in registry.values() for s in cls.sampler_names()]
    missing = sorted(set(samplers) - set(READS))
    if missing:
        raise LookupError(f"exporter/sim/player.py READS lists no file groups for sampler(s) {missing}")
    return {s: READS[s] for s in samplers}


# Which rendered files each registered sampler reads: the table the player and the live simulator redraw by.
SAMPLER_GROUPS: Mapping[str, frozenset[str]] = sampler_groups(pipeline.registry())
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
    phases: list[PhaseResult]
    timeline: list[tuple[float, DerivedState]] = field(default_factory=list)
    collectors: list[str] = field(default_factory=list)
    sampler_runs: dict[str, int] = field(default_factory=dict)
    sampler_errors: dict[str, str] = field(default_factory=dict)


SHM = Path("/dev/shm")


class NoScratchError(OSError):
    """No writable directory for a simulated host's tree (a read-only filesystem); the message names them."""


def fast_tmpdir() -> Path | None:
    """/dev/shm when it is a writable directory (tmpfs: file churn costs 4-5x less than on disk), else None."""
    return SHM if SHM.is_dir() and os.access(SHM, os.W_OK | os.X_OK) else None


def scratch_dir() -> Path:
    """Where a simulated host's /proc and /sys tree goes: /dev/shm when writable, else the temporary directory
    (TMPDIR, /tmp, /var/tmp, /usr/tmp, the working directory); NoScratchError naming them when none is."""
    fast = fast_tmpdir()
    if fast is not None:
        return fast
    try:
        return Path(tempfile.gettempdir())
    except FileNotFoundError as e:  # "No usable temporary directory found in [...]"
        tried = str(e.strerror).rpartition(" in ")[2]
        raise NoScratchError(f"no writable directory for the simulated host's /proc and /sys: {SHM} and {tried} "
                             "are not writable (a read-only filesystem?); set TMPDIR to a writable directory"
                             ) from None


def play(
    sc: Scenario,
    *,
    timeline: bool = False,
    flags: Mapping[str, Any] | None = None,
    workdir: Path | None = None,
) -> PlayResult:
    """Run the whole scenario once in virtual time; ``flags`` are extra settings (``collector.x.interval``...)."""
    # Expectations over a phase's evaluations (SPEC v2 within_s, no_findings_anytime) need the timeline.
    timeline = timeline or any(e.within_s is not None or e.no_findings_anytime for e in sc.expect)
    with tempfile.TemporaryDirectory(prefix="gpufeed-sim-", dir=workdir or scratch_dir()) as tmp:
        root = Path(tmp)
        model = Model(sc)
        renderer = Renderer(model, root, atomic=False)  # nothing reads while we write: one thread
        renderer.setup()
        renderer.render(0.0)
        counter_bits = 32
        fake = FakeNvml(nvml_state(model, 0.0, counter_bits=counter_bits))
        # The scenario's kubelet (SPEC v2 host.kubernetes) answers on a socket in the simulated root; without
        # one the socket is absent there -- never the real host's kubelet.
        sock = kubelet_socket(root)
        kubelet = Kubelet(sc, sock) if sc.host.kubernetes is not None else None
        settings = resolve(pipeline.registry(), {}, {
            "path.procfs": str(root / "proc"), "path.sysfs": str(root / "sys"),
            "collector.kubernetes.socket": str(sock), **(flags or {})})
        pipe = pipeline.build(settings, clock=VirtualClock(0.0), nvml=fake, inline=True)
        engine = pipe.engine
        result = PlayResult(scenario=sc, phases=[], collectors=[c.name for c in pipe.stages])
        derived_runs = 0
        last_samples: dict[str, Any] | None = None
        engine.run_until(0.0)
        for ph in sc.phases:
            end = ph.end_s
            while True:
                due = min((s.next_due for s in engine.samplers.values()), default=end + 1)
                if due > end + _EPS:
                    break
                due_now = [n for n, s in engine.samplers.items() if s.next_due <= due + _EPS]
                groups: set[str] = set()
                for n in due_now:
                    groups |= SAMPLER_GROUPS[n]
                renderer.render(due, groups & set(GROUPS))
                if "nvml" in groups:
                    buffered = engine.samplers.get(names.GPU_SAMPLES)
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
                if timeline and names.DERIVED in engine.samplers:
                    runs = engine.samplers[names.DERIVED].runs
                    if runs != derived_runs:
                        derived_runs = runs
                        value = engine.snapshot.value(names.DERIVED)
                        if isinstance(value, DerivedState):
                            result.timeline.append((due, value))
            engine.run_until(end)
            value = engine.snapshot.value(names.DERIVED)
            result.phases.append(PhaseResult(ph.name, end, value if isinstance(value, DerivedState) else None))
        for n, s in engine.samplers.items():
            result.sampler_runs[n] = s.runs
            if s.last_error and s.available:
                result.sampler_errors[n] = s.last_error
        pipe.close()
        if kubelet is not None:
            kubelet.stop()
        return result


def kubelet_socket(root: Path) -> Path:
    """Where a simulated host's kubelet listens (the real path, below the simulated root)."""
    return root / "var" / "lib" / "kubelet" / "pod-resources" / "kubelet.sock"
