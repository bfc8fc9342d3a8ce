"""The sampling cadence: what the derived layer asks of collection, the one feedback from ``derived/`` upstream.

Every evaluation ends in a :class:`Cadence` -- the interval each steered sampler should run at and the
processes deep (per-thread) sampling is narrowed to -- computed by :meth:`CadencePolicy.plan` from whether a
GPU waits, whether the waiting verdicts have settled, and the samplers' configured intervals (pure). The
:class:`Pacer` sends it: intervals to the engine (:class:`SamplerPace`), the focus to the proc collector
through :class:`~exporter.sampling.Targets`, and it alone remembers what it sent. docs/architecture.md draws
this channel next to Targets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from exporter import names
from exporter.sampling import Targets

# Host samplers slowed while no GPU waits (DESIGN.md "Sampling that pays only for what it learns"), and their
# slow interval; back to the configured one as soon as an evaluation sees a GPU waiting. A configured interval
# slower than this is kept. Counters and rate() stay exact: /proc/stat jiffies and PSI's total stall time are
# cumulative, so a longer interval loses resolution, never time. What the verdict of a waiting GPU needs --
# the CPU shape and PSI over the classifier's window -- comes at the configured rates again from the first
# evaluation that sees a GPU waiting (the engine wakes a sampler at once when its interval shortens). Quiet is
# 5 s: the shape compares the ends of its <= 12 s window, which samples 5 s apart give (at least two in it), and
# a /proc/stat pass on a 192-CPU host costs ~1.5 ms of CPU -- at 2 s that was 0.08% of a core of the benchmark
# host's 1% while every GPU worked, with nothing learnt from the extra passes; the 30 s passes
# (cpufreq governors, NUMA placement) feed findings of a working GPU from their newest sample, and are read at
# their configured rate as soon as the GPU waits. Per-thread reads serve waiting GPUs (DESIGN.md: deep
# evidence on demand): while none waits a pass every 120 s keeps the pair a GPU's first evaluation after its
# onset starts from and the process-thread series (a pass over 8 x 150 threads costs ~30-50 ms of CPU: 0.08%
# of the benchmark host's 1% at 60 s); the onset brings --collector.derived.deep-interval within the next run,
# so the old end of that pair serves one evaluation, before any verdict can have settled. The PCIe chain
# (5 s) is not slowed: pcie_link_downgraded judges the hops upstream of a GPU over the classifier's window
# (15 s), which a 30 s pass would leave empty half of the time -- the series of those hops would come and go.
# The GPU processes' own counters (proc, 1 s) go to 5 s: CPU time and I/O are cumulative, the CPU shape takes
# the ends of its 10 s window, and NUMA placement and the process series read the newest sample.
# /proc/diskstats, /proc/meminfo and the NFS client counters (1 s) go to 5 s with /proc/stat and PSI: cumulative
# counters again, and what reads a level (memory pressure, the I/O evidence of a waiting GPU) reads the newest
# sample or a window's ends.
QUIET_INTERVALS = {
    names.CPU: 5.0, names.PRESSURE: 5.0, names.DISK: 5.0, names.MEMORY: 5.0, names.NFS: 5.0, names.PROC: 5.0,
    names.PROC_THREADS: 120.0, names.CPUFREQ: 30.0, names.NUMA: 30.0,
}
# Of those, the ones back at their quiet pace while GPUs wait once their verdicts have settled: all but the deep
# sampler (--collector.derived.deep-settled-interval). The onset read them at their configured rates and found
# the cause and its findings (a powersave governor, a process on the wrong node); what follows only has to show
# the cause still holds, and any move of a waiting GPU's activity unsettles it and brings those rates back.
SETTLED_QUIET = frozenset(QUIET_INTERVALS) - {names.PROC_THREADS}
# The order a cadence is sent in: the deep sampler first, then the host samplers.
STEERED = (names.PROC_THREADS, *(n for n in QUIET_INTERVALS if n != names.PROC_THREADS))


@dataclass(frozen=True, slots=True)
class Cadence:
    """What one evaluation asks of collection.

    ``intervals`` maps each steered sampler that is on to the interval it should run at (the deep sampler
    first); ``focus`` is the set of pids deep sampling is narrowed to -- the waiting GPUs' processes -- or None
    for every target.
    """

    intervals: Mapping[str, float]
    focus: frozenset[int] | None


@dataclass(frozen=True, slots=True)
class CadencePolicy:
    """The analyzer's cadence options: --collector.derived.deep-interval, deep-settled-interval, quiet-host."""

    deep_fast: float = 0.5
    deep_settled: float = 5.0
    quiet_host: bool = True

    def quiet(self, name: str, configured: float) -> float:
        """Sampler ``name``'s interval while no GPU waits."""
        return max(configured, QUIET_INTERVALS[name]) if self.quiet_host else configured

    def plan(self, configured: Mapping[str, float], *, waiting: bool, settled: bool,
             pids: frozenset[int]) -> Cadence:
        """The cadence for ``configured`` (each steered sampler that is on -> its configured interval).

        Per-thread sampling fast while a GPU waits, and only of the waiting GPUs' processes ``pids``; back to
        every process at its quiet pace otherwise. Once every waiting GPU's verdict has held for the window
        (``settled``), at --collector.derived.deep-settled-interval: the evidence that found the cause is in,
        what follows only has to show it still holds (or moves, which unsettles it again). Host samplers at
        their quiet intervals while no GPU waits, configured again once one does, and quiet again once the
        waiting verdicts have settled: the CPU shape compares a window's ends, the finer pace is what detection
        needs, at the onset."""
        intervals: dict[str, float] = {}
        for name in STEERED:
            if name not in configured:
                continue  # that collector is off
            conf = configured[name]
            if name == names.PROC_THREADS:
                if not waiting:
                    want = self.quiet(name, conf)
                else:
                    want = min(max(self.deep_fast, self.deep_settled) if settled else self.deep_fast, conf)
            else:
                quiet = not waiting or (settled and name in SETTLED_QUIET)
                want = self.quiet(name, conf) if quiet else conf
            intervals[name] = want
        return Cadence(MappingProxyType(intervals), pids if waiting else None)


class SamplerPace(Protocol):
    """The engine's side of the channel: a sampler's current interval, and setting it."""

    def interval(self, name: str) -> float | None: ...

    def set_interval(self, name: str, interval: float) -> None: ...


class Pacer:
    """Sends each evaluation's :class:`Cadence`: intervals to the engine, the deep focus to ``targets``.

    It learns each steered sampler's configured interval the first time it sees it, so the plan always starts
    from what the operator set. While the focus is narrowed, one full deep pass is still requested as often as
    passes run while no GPU waits, so the other GPUs keep the per-thread evidence (a launch-bound GPU's hot
    thread) they had before any GPU waited.
    """

    def __init__(self, policy: CadencePolicy, targets: Targets, log: Any) -> None:
        self.policy = policy
        self.targets = targets
        self.log = log
        self._configured: dict[str, float] = {}  # steered sampler -> its configured interval, learnt at first sight
        self.sent = Cadence(MappingProxyType({}), None)  # the newest cadence planned and sent
        self._full_t: float | None = None  # when the last full deep pass was requested while focused

    def steer(self, engine: SamplerPace, now: float, *, waiting: bool, settled: bool, pids: frozenset[int]) -> Cadence:
        """Plan the cadence for this evaluation and send what changed; returns it."""
        current = {n: i for n in STEERED if (i := engine.interval(n)) is not None}  # the samplers that are on
        for name, interval in current.items():
            self._configured.setdefault(name, interval)
        cadence = self.policy.plan({n: self._configured[n] for n in current}, waiting=waiting, settled=settled,
                                   pids=pids)
        if cadence.focus != self.sent.focus:
            self.targets.set_focus(cadence.focus)
            if self.sent.focus is None:
                self._full_t = now  # the passes up to now were full
            # At info: when deep sampling starts and stops is what the daemon's CPU follows (a GPU judged waiting,
            # or inside the waiting band's hysteresis without a verdict change), and it is rare.
            self.log.info("deep_focus_changed", sampler=names.PROC_THREADS,
                           pids=",".join(map(str, sorted(cadence.focus))) if cadence.focus is not None else "all")
        self.sent = cadence
        self.request_full(now)
        for name, want in cadence.intervals.items():
            if current[name] != want:
                engine.set_interval(name, want)
                event = "deep_sampling_changed" if name == names.PROC_THREADS else "host_sampling_changed"
                self.log.debug(event, sampler=name, interval=want, waiting=waiting)
        return cadence

    def request_full(self, now: float) -> None:
        """While deep sampling is focused, ask for a full pass as often as passes run while no GPU waits
        (also from a run whose evaluations all still stand): the working GPUs' per-thread evidence stays as
        fresh as it was, and no fresher -- every 5 s, a pass over all eight processes of an 8-GPU host was
        ~1% of a core while two GPUs waited."""
        deep = self._configured.get(names.PROC_THREADS)
        if self.sent.focus is not None and deep is not None and self._full_t is not None \
                and now - self._full_t >= self.policy.quiet(names.PROC_THREADS, deep):
            self.targets.request_full()
            self._full_t = now
