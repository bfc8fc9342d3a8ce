"""The version-2 workload parts of a scenario as functions of time: per-thread run delay and context switches,
storage reads, cgroup counters, the process tree and who is alive when.

Built by :class:`exporter.sim.model.Model` (``model.workloads``). Counters are exact integrals of the
scenario's rates, as everywhere in the simulator; a process that is not in /proc (SPEC v2 ``start_s`` /
``exit_s``) contributes nothing, and its children are re-parented to pid 1, as the kernel does.
"""

from __future__ import annotations

from typing import Protocol

from exporter.sim import signal
from exporter.sim.signal import At, Piecewise, Track
from exporter.sim.spec import CGROUP_PSI_KEYS, FRACTION, MEMORY_EVENT_KEYS, NONNEG, Phase, Process, Scenario, Value


class Model(Protocol):
    """What the workload tracks need of :class:`exporter.sim.model.Model` (which builds them)."""

    sc: Scenario

    def _track(self, get: object, key: str, rng: tuple[float, float]) -> Track: ...

    def _piece(self, ph: Phase, v: Value, key: str, rng: tuple[float, float]) -> Piecewise: ...

    def alive_piece(self, p: Process, ph: Phase) -> Piecewise | None: ...

    def alive(self, p: Process, t: float) -> bool: ...

    def at(self, t: float) -> At: ...

    def thread_seconds(self, pid: int, at: At) -> list[tuple[float, float]]: ...

THREAD_KEYS = ("run_delay", "voluntary_switches_per_s", "nonvoluntary_switches_per_s")
CGROUP_KEYS = ("nr_throttled_per_s", "throttled_fraction", "memory_current_bytes")


class WorkloadTracks:
    """Time functions of the version-2 workload keys of one scenario."""

    def __init__(self, model: Model) -> None:
        self.model = model
        sc = model.sc
        self.by_pid = {p.pid: p for p in sc.processes}
        self.storage: dict[int, Track] = {
            p.pid: model._track(lambda ph, q=p.pid: ph.processes[q].storage_read_bytes_per_s,
                                f"processes.{p.pid}.storage_read_bytes_per_s", NONNEG)
            for p in sc.processes
        }
        # CPU of children the process reaped (short-lived workers): its cutime, and its cgroup's usage.
        self.reaped: dict[int, Track] = {
            p.pid: model._track(lambda ph, q=p.pid: ph.processes[q].children_cpu, f"processes.{p.pid}.children_cpu",
                                NONNEG)
            for p in sc.processes
        }
        # Per thread of each process: (run_delay, voluntary, nonvoluntary) tracks. Built only for processes
        # whose phases give any of them (the benchmark host has 8 x 150 threads that never do).
        self.threads: dict[int, list[tuple[Track, Track, Track]]] = {}
        for p in sc.processes:
            if any(self._has_thread_keys(ph, p) for ph in sc.phases):
                self.threads[p.pid] = self._thread_tracks(p)
        self.cgroups: dict[str, dict[str, Track]] = {}
        for name in sc.host.cgroups:
            tr = {k: model._track(lambda ph, n=name, k=k: getattr(ph.host.cgroups[n], k), f"host.cgroups.{name}.{k}",
                                  FRACTION if k == "throttled_fraction" else NONNEG) for k in CGROUP_KEYS}
            for e in MEMORY_EVENT_KEYS:
                tr[f"events.{e}"] = model._track(lambda ph, n=name, e=e: ph.host.cgroups[n].memory_events[e],
                                                 f"host.cgroups.{name}.memory_events.{e}", NONNEG)
            for k in CGROUP_PSI_KEYS:
                tr[f"psi.{k}"] = model._track(lambda ph, n=name, k=k: ph.host.cgroups[n].psi[k],
                                              f"host.cgroups.{name}.psi.{k}", FRACTION)
            self.cgroups[name] = tr

    @staticmethod
    def _has_thread_keys(ph: Phase, p: Process) -> bool:
        return any(g.run_delay != 0.0 or g.voluntary_switches_per_s != 0.0 or g.nonvoluntary_switches_per_s != 0.0
                   for g in ph.processes[p.pid].threads_cpu)

    def _thread_tracks(self, p: Process) -> list[tuple[Track, Track, Track]]:
        m = self.model
        per_thread: list[list[list[Piecewise]]] = [[[], [], []] for _ in range(p.threads)]
        for ph in m.sc.phases:
            d = ph.duration_s
            zero = Piecewise.const(0.0, d)
            alive = m.alive_piece(p, ph)
            cache: dict[tuple[int, str], Piecewise] = {}
            groups = [(gi, g) for gi, g in enumerate(ph.processes[p.pid].threads_cpu) for _ in range(g.count)]
            for ti in range(p.threads):
                for k, key in enumerate(THREAD_KEYS):
                    if ti >= len(groups):
                        per_thread[ti][k].append(zero)
                        continue
                    gi, grp = groups[ti]
                    if (gi, key) not in cache:
                        v: Value = getattr(grp, key)
                        piece = m._piece(ph, v, f"processes.{p.pid}.threads_cpu.{gi}.{key}",
                                         FRACTION if key == "run_delay" else NONNEG)
                        if alive is not None:
                            piece = signal.combine(lambda x, a: x * a, [piece, alive], d)
                        cache[(gi, key)] = piece
                    per_thread[ti][k].append(cache[(gi, key)])
        starts = [ph.start_s for ph in m.sc.phases]
        return [(Track(a, starts), Track(b, starts), Track(c, starts)) for a, b, c in per_thread]

    # ---- queries ---------------------------------------------------------------------------------------------

    def alive(self, t: float) -> list[Process]:
        """The processes in /proc at ``t``."""
        return [p for p in self.model.sc.processes if self.model.alive(p, t)]

    def ppid(self, p: Process, t: float) -> int:
        """``p``'s parent at ``t``: the scenario's ``ppid``, or 1 once a listed parent has exited."""
        parent = self.by_pid.get(p.ppid)
        if parent is not None and not self.model.alive(parent, t):
            return 1
        return p.ppid

    def children(self, pid: int, t: float) -> list[int]:
        """Pids of the live processes whose parent is ``pid`` at ``t`` (the parent's task/<pid>/children)."""
        return sorted(q.pid for q in self.alive(t) if q.pid != pid and self.ppid(q, t) == pid)

    def members(self, cgroup: str, t: float) -> list[Process]:
        """The live processes of cgroup ``cgroup`` at ``t``."""
        return [p for p in self.alive(t) if p.cgroup == cgroup]

    def thread_counters(self, pid: int, ti: int, t: float) -> tuple[float, float, float]:
        """(run delay seconds, voluntary, nonvoluntary switches) of thread ``ti`` of ``pid`` up to ``t``."""
        tracks = self.threads.get(pid)
        if tracks is None:
            return 0.0, 0.0, 0.0
        a, b, c = tracks[ti]
        return a.integral(t), b.integral(t), c.integral(t)

    def cgroup_cpu_seconds(self, cgroup: str, t: float) -> tuple[float, float]:
        """(user, system) CPU seconds of the cgroup's processes up to ``t`` (of those alive now)."""
        at = self.model.at(t)
        user = system = 0.0
        for p in self.members(cgroup, t):
            for u, s in self.model.thread_seconds(p.pid, at):
                user += u
                system += s
            user += self.reaped[p.pid].integral(t)
        return user, system
