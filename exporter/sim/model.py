"""A scenario turned into functions of time: every rate, counter and placement the renderer writes.

Built once per scenario (all per-phase pieces precomputed), then asked for any time ``t`` in any order.
Counters are exact integrals of the rates (see :mod:`exporter.sim.signal`); integer counters are the
floor of the integral, so they never go backwards.

Thread placement (SPEC "Process state"): per phase, every thread of every process, pids ascending and
tids ascending, goes on the least-loaded core of its process's ``cpus_allowed`` (lowest number on a tie),
load measured by the phase means (background plus threads already placed). Where the threads on a core
would take it past one full core, their contribution is scaled down to fit (and so are their own
utime/stime): a thread cannot run more than the core it is on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from exporter import linkmath
from exporter.sim import signal
from exporter.sim.interconnect import InterconnectTracks
from exporter.sim.signal import At, Piecewise, Track
from exporter.sim.spec import (
    CLOCK_EVENT_REASONS,
    CPU_MODES,
    DISK_KEYS,
    FRACTION,
    GPU_HEALTH_NUMERIC,
    GPU_NUMERIC,
    MIG_NUMERIC,
    NFS_OPS,
    NONNEG,
    PSI_KEYS,
    CpuModes,
    Gpu,
    Link,
    Phase,
    Process,
    Scenario,
    Value,
)
from exporter.sim.workload_model import WorkloadTracks

IDLE_SM_CLOCK_MHZ = 345.0  # SPEC: sm_clock_mhz default when gpu_util is 0
FRACTION_KEYS = frozenset(k for k, rng in MIG_NUMERIC.items() if rng == FRACTION)


@dataclass(frozen=True, slots=True)
class ThreadPlan:
    """Where one thread sits in one phase, and (version 2) its name and group in ``threads_cpu``."""

    processor: int
    state: str
    comm: str | None = None  # None: the process's comm
    group: int | None = None  # index in the phase's threads_cpu, None for a thread no group covers


class Model:
    """Time functions of one scenario."""

    def __init__(self, sc: Scenario) -> None:
        self.sc = sc
        self.length = sc.duration_s
        self._starts = [p.start_s for p in sc.phases]
        self._ends = [p.end_s for p in sc.phases]
        self.gpu_tracks: dict[int, dict[str, Track]] = {}
        self.reason_tracks: dict[int, dict[str, Track]] = {}
        self.mig_tracks: dict[int, dict[int, dict[str, Track]]] = {}  # GPU -> GPU instance -> key -> track
        for g in sc.gpus:
            self._build_gpu(g)
        self.core_tracks: list[dict[str, Track]] = []
        self.thread_tracks: dict[int, list[tuple[Track, Track]]] = {}
        self.thread_plans: dict[int, list[list[ThreadPlan]]] = {}  # pid -> per phase -> per thread
        self._build_cpu()
        self.proc_io: dict[int, dict[str, Track]] = {
            p.pid: {k: self._track(lambda ph, q=p.pid, k=k: getattr(ph.processes[q], k), f"processes.{p.pid}.{k}",
                                   NONNEG) for k in ("read_bytes_per_s", "read_syscalls_per_s")}
            for p in sc.processes
        }
        self.psi = {k: self._track(lambda ph, k=k: ph.host.psi[k], f"host.psi.{k}", FRACTION) for k in PSI_KEYS}
        self.disks: dict[str, dict[str, Track]] = {}
        for d in sc.host.disks:
            tr = {k: self._track(lambda ph, d=d, k=k: getattr(ph.host.disks[d], k), f"host.disks.{d}.{k}", NONNEG)
                  for k in DISK_KEYS}
            # Derived: time spent per completed I/O (ms/s) and the share of time with I/O in flight.
            tr["read_ms"] = self._combined(lambda r, a: r * a, (tr["reads_per_s"], tr["await_ms"]))
            tr["write_ms"] = self._combined(lambda w, a: w * a, (tr["writes_per_s"], tr["await_ms"]))
            tr["busy"] = self._combined(lambda r, w, a: min(1.0, (r + w) * a / 1000.0),
                                        (tr["reads_per_s"], tr["writes_per_s"], tr["await_ms"]))
            self.disks[d] = tr
        self.nfs_ops = {o: self._track(lambda ph, o=o: ph.host.nfs.ops_per_s[o], f"host.nfs.ops_per_s.{o}", NONNEG)
                        for o in NFS_OPS}
        self.nfs_retrans = self._track(lambda ph: ph.host.nfs.retrans_per_s, "host.nfs.retrans_per_s", NONNEG)
        self.memory = {
            "available_ratio": self._track(lambda ph: ph.host.memory.available_ratio, "host.memory.available_ratio",
                                           FRACTION),
            "dirty_bytes": self._track(lambda ph: ph.host.memory.dirty_bytes, "host.memory.dirty_bytes", NONNEG),
            "writeback_bytes": self._track(lambda ph: ph.host.memory.writeback_bytes, "host.memory.writeback_bytes",
                                           NONNEG),
        }
        self.oom = self._track(lambda ph: ph.host.oom_kills_per_s, "host.oom_kills_per_s", NONNEG)
        self.workloads = WorkloadTracks(self)
        self.interconnect = InterconnectTracks(self)

    # ---- construction helpers ----------------------------------------------------------------------------

    def _piece(self, ph: Phase, v: Value, key: str, rng: tuple[float, float]) -> Piecewise:
        return signal.build(v, ph.duration_s, seed=self.sc.seed, key=f"{ph.index}/{key}", lo=rng[0], hi=rng[1])

    def _track(self, get: object, key: str, rng: tuple[float, float]) -> Track:
        fn = get  # Callable[[Phase], Value]
        return Track([self._piece(ph, fn(ph), key, rng) for ph in self.sc.phases], self._starts)  # type: ignore[operator]

    def _carried(self, asked: Track, g: Gpu) -> Track:
        """What a GPU's own link carries of the traffic a phase asks for: no more than the achievable capacity of
        the link it runs at in that phase (a scenario asking a Gen3 x8 link for 7.2 GB/s gets its 6.5)."""
        pieces = []
        for i, ph in enumerate(self.sc.phases):
            link = ph.gpus[g.index].link
            cap = linkmath.capacity_bytes_per_second(link.gen, link.width)
            pieces.append(signal.combine(lambda x, cap=cap: min(x, cap), [asked.phases[i]], ph.duration_s))
        return Track(pieces, self._starts)

    def _combined(self, fn: object, tracks: tuple[Track, ...]) -> Track:
        pieces = [signal.combine(fn, [t.phases[i] for t in tracks], ph.duration_s)  # type: ignore[arg-type]
                  for i, ph in enumerate(self.sc.phases)]
        return Track(pieces, self._starts)

    def _build_gpu(self, g: Gpu) -> None:
        tracks: dict[str, Track] = {}
        for k, rng in GPU_NUMERIC.items():
            if k in ("sm_clock_mhz", "power_w"):
                continue
            tracks[k] = self._track(lambda ph, k=k: getattr(ph.gpus[g.index], k), f"gpus.{g.index}.{k}", rng)
        for k, rng in GPU_HEALTH_NUMERIC.items():
            tracks[k] = self._track(lambda ph, k=k: getattr(ph.gpus[g.index], k), f"gpus.{g.index}.{k}", rng)
        for k in ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s"):
            tracks[k] = self._carried(tracks[k], g)
        for k in ("row_remap_pending", "row_remap_failure"):
            tracks[k] = Track([Piecewise.const(1.0 if getattr(ph.gpus[g.index], k) else 0.0, ph.duration_s)
                               for ph in self.sc.phases], self._starts)
        if g.mig is not None:
            self._build_mig(g, tracks)
        util = tracks["gpu_util"]
        clock: list[Piecewise] = []
        power: list[Piecewise] = []
        reasons: dict[str, list[Piecewise]] = {r: [] for r in CLOCK_EVENT_REASONS}
        for i, ph in enumerate(self.sc.phases):
            st = ph.gpus[g.index]
            u = util.phases[i]
            if st.sm_clock_mhz is None:
                clock.append(signal.combine(lambda x: g.max_sm_clock_mhz if x > 0 else IDLE_SM_CLOCK_MHZ, [u],
                                            ph.duration_s))
            else:
                clock.append(self._piece(ph, st.sm_clock_mhz, f"gpus.{g.index}.sm_clock_mhz", NONNEG))
            if st.power_w is None:
                power.append(signal.combine(lambda x: g.power_limit_w * (0.1 + 0.8 * x), [u], ph.duration_s))
            else:
                power.append(self._piece(ph, st.power_w, f"gpus.{g.index}.power_w", NONNEG))
            for r in CLOCK_EVENT_REASONS:
                if st.clock_event_reasons is None:
                    if r == "gpu_idle":
                        reasons[r].append(signal.combine(lambda x: 1.0 if x <= 0 else 0.0, [u], ph.duration_s))
                    else:
                        reasons[r].append(Piecewise.const(0.0, ph.duration_s))
                else:
                    reasons[r].append(Piecewise.const(1.0 if r in st.clock_event_reasons else 0.0, ph.duration_s))
        tracks["sm_clock_mhz"] = Track(clock, self._starts)
        tracks["power_w"] = Track(power, self._starts)
        self.gpu_tracks[g.index] = tracks
        self.reason_tracks[g.index] = {r: Track(v, self._starts) for r, v in reasons.items()}

    def _build_mig(self, g: Gpu, tracks: dict[str, Track]) -> None:
        """A GPU in MIG mode: each instance's activity tracks; the GPU's own are derived from them -- its
        utilisation (for the clock, power and gpu_idle defaults) is its busiest instance's, its PCIe traffic
        and memory the instances' sum (one link, one memory)."""
        inst: dict[int, dict[str, Track]] = {}
        for x in g.mig or ():
            inst[x.gi] = {k: self._track(lambda ph, k=k, gi=x.gi: getattr(ph.gpus[g.index].mig[gi], k),
                                         f"gpus.{g.index}.mig.{x.gi}.{k}", rng) for k, rng in MIG_NUMERIC.items()}
        self.mig_tracks[g.index] = inst
        for k in MIG_NUMERIC:
            parts = tuple(t[k] for t in inst.values())
            if not parts:
                continue  # MIG mode with no instance: nothing runs, the GPU keeps its zero tracks
            how = (lambda *xs: max(xs)) if k in FRACTION_KEYS else (lambda *xs: sum(xs))
            tracks[k] = self._combined(how, parts)

    def xid_events(self, index: int, t: float, window_s: float) -> list[tuple[float, int, int | None]]:
        """The GPU's Xid events at scenario times in (t - window_s, t], oldest first, as (time, xid, instance);
        a looping timeline repeats them every pass."""
        out: list[tuple[float, int, int | None]] = []
        lo = t - window_s
        first, last = max(0, math.floor(lo / self.length)), self.loops(t)
        for loop in range(first, last + 1):
            for ph in self.sc.phases:
                for e in ph.gpus[index].xid_events:
                    at = loop * self.length + ph.start_s + e.at_s
                    if lo < at <= t:
                        out.append((at, e.xid, e.mig))
        return sorted(out, key=lambda e: e[0])

    def _build_cpu(self) -> None:
        sc = self.sc
        ncpu = sc.host.cpus
        core_pieces: list[dict[str, list[Piecewise]]] = [{m: [] for m in CPU_MODES} for _ in range(ncpu)]
        thread_pieces: dict[int, list[tuple[list[Piecewise], list[Piecewise]]]] = {
            p.pid: [([], []) for _ in range(p.threads)] for p in sc.processes
        }
        for p in sc.processes:
            self.thread_plans[p.pid] = []
        for ph in sc.phases:
            d = ph.duration_s
            modes_of: list[tuple[str, CpuModes]] = [("host.cpu_background", ph.host.cpu_background)] * ncpu
            for j, (cpus, modes) in enumerate(ph.host.cpu_cores):
                for c in cpus:
                    modes_of[c] = (f"host.cpu_cores[{j}]", modes)
            base_pieces: dict[tuple[str, str], Piecewise] = {}

            def base(c: int, m: str, ph: Phase = ph, modes_of: list[tuple[str, CpuModes]] = modes_of,
                     cache: dict[tuple[str, str], Piecewise] = base_pieces) -> Piecewise:
                src, modes = modes_of[c]
                if (src, m) not in cache:
                    cache[(src, m)] = self._piece(ph, modes.get(m), f"{src}.{m}", FRACTION)
                return cache[(src, m)]

            load = [sum(base(c, m).mean() for m in CPU_MODES) for c in range(ncpu)]
            placed: list[list[tuple[int, int, Piecewise, Piecewise]]] = [[] for _ in range(ncpu)]
            group_cache: dict[tuple[int, int, str], Piecewise] = {}
            for p in sc.processes:
                st = ph.processes[p.pid]
                allowed = sorted(st.cpus_allowed)
                plans: list[ThreadPlan] = []
                groups = [(gi, g) for gi, g in enumerate(st.threads_cpu) for _ in range(g.count)]
                alive = self.alive_piece(p, ph)
                for ti in range(p.threads):
                    comm: str | None = None
                    group: int | None = None
                    if ti < len(groups):
                        gi, grp = groups[ti]
                        for m, v in (("user", grp.user), ("system", grp.system)):
                            if (p.pid, gi, m) not in group_cache:
                                piece = self._piece(ph, v, f"processes.{p.pid}.threads_cpu.{gi}.{m}", FRACTION)
                                if alive is not None:  # SPEC v2 start_s/exit_s: no load while not in /proc
                                    piece = signal.combine(lambda x, a: x * a, [piece, alive], d)
                                group_cache[(p.pid, gi, m)] = piece
                        u, s, state = group_cache[(p.pid, gi, "user")], group_cache[(p.pid, gi, "system")], grp.state
                        comm, group = grp.comm, gi
                    else:
                        u = s = Piecewise.const(0.0, d)
                        state = "S"
                    core = min(allowed, key=lambda c: (load[c], c))
                    load[core] += u.mean() + s.mean()
                    placed[core].append((p.pid, ti, u, s))
                    plans.append(ThreadPlan(core, state, comm, group))
                self.thread_plans[p.pid].append(plans)
            for c in range(ncpu):
                base_busy = sum(base(c, m).mean() for m in CPU_MODES)
                threads_busy = sum(u.mean() + s.mean() for _, _, u, s in placed[c])
                scale = 1.0
                if threads_busy > 0 and base_busy + threads_busy > 1.0:
                    scale = max(0.0, 1.0 - base_busy) / threads_busy
                users: list[Piecewise] = []
                systems: list[Piecewise] = []
                for pid, ti, u, s in placed[c]:
                    su = u if scale == 1.0 else signal.total([u], d, scale)
                    ss = s if scale == 1.0 else signal.total([s], d, scale)
                    thread_pieces[pid][ti][0].append(su)
                    thread_pieces[pid][ti][1].append(ss)
                    users.append(su)
                    systems.append(ss)
                for m in CPU_MODES:
                    extra = users if m == "user" else systems if m == "system" else []
                    core_pieces[c][m].append(signal.total([base(c, m), *extra], d) if extra else base(c, m))
        self.core_tracks = [{m: Track(v, self._starts) for m, v in cp.items()} for cp in core_pieces]
        self.thread_tracks = {
            pid: [(Track(u, self._starts), Track(s, self._starts)) for u, s in lst]
            for pid, lst in thread_pieces.items()
        }

    def alive_piece(self, p: Process, ph: Phase) -> Piecewise | None:
        """1 while ``p`` is in /proc during phase ``ph``, else 0 (SPEC v2 ``start_s``/``exit_s``); None when it
        is there for the whole phase."""
        lo = 0.0 if p.start_s is None else p.start_s - ph.start_s
        hi = ph.duration_s if p.exit_s is None else p.exit_s - ph.start_s
        if lo <= 0.0 and hi >= ph.duration_s:
            return None
        lo, hi = max(0.0, lo), min(ph.duration_s, hi)
        if hi <= lo:
            return Piecewise.const(0.0, ph.duration_s)
        xs, vs = [0.0], [0.0 if lo > 0 else 1.0]
        if lo > 0:
            xs.append(lo)
            vs.append(1.0)
        if hi < ph.duration_s:
            xs.append(hi)
            vs.append(0.0)
        return Piecewise(xs, vs, ph.duration_s)

    def alive(self, p: Process, t: float) -> bool:
        """Whether ``p`` is in /proc and NVML at ``t`` (looping)."""
        return p.alive(self.local(t))

    # ---- queries -----------------------------------------------------------------------------------------

    def at(self, t: float) -> At:
        """``t`` located on the timeline, for the batch ``*_seconds`` queries."""
        return At(t, self._ends)

    def core_seconds(self, at: At) -> list[list[float]]:
        """Per CPU, seconds spent in each of CPU_MODES up to ``at``."""
        return [[tr[m].integral_at(at) for m in CPU_MODES] for tr in self.core_tracks]

    def thread_seconds(self, pid: int, at: At) -> list[tuple[float, float]]:
        """Per thread of ``pid``, (user, system) seconds up to ``at``."""
        return [(u.integral_at(at), s.integral_at(at)) for u, s in self.thread_tracks[pid]]

    def local(self, t: float) -> float:
        """Scenario time within the current loop of the timeline."""
        return t - math.floor(t / self.length) * self.length if t >= self.length else max(t, 0.0)

    def phase(self, t: float) -> Phase:
        """The phase playing at ``t`` (looping)."""
        return self.sc.phase_at(self.local(t))

    def loops(self, t: float) -> int:
        """How many full passes of the timeline lie before ``t``."""
        return math.floor(t / self.length) if t >= self.length else 0

    def link(self, index: int, t: float) -> Link:
        """The GPU's current link at ``t``."""
        return self.phase(t).gpus[index].link

    def lost_since(self, index: int, t: float) -> bool:
        """Whether the GPU is lost at ``t`` (SPEC: from the phase that says so on; a new loop starts fresh)."""
        return self.phase(t).gpus[index].lost

    def thread_plan(self, proc: Process, t: float) -> list[ThreadPlan]:
        """Processor and state of each thread of ``proc`` at ``t``."""
        return self.thread_plans[proc.pid][self.phase(t).index]

    def governor(self, t: float) -> str:
        """scaling_governor at ``t``."""
        return self.phase(t).host.governor

    def cpus_allowed(self, pid: int, t: float) -> frozenset[int]:
        """Cpus_allowed_list at ``t``."""
        return self.phase(t).processes[pid].cpus_allowed

    def mems_allowed(self, pid: int, t: float) -> frozenset[int]:
        """Mems_allowed_list at ``t``."""
        return self.phase(t).processes[pid].mems_allowed

    def core_busy_now(self, c: int, t: float) -> float:
        """Instantaneous busy fraction of CPU ``c`` (everything but idle and iowait)."""
        return min(1.0, sum(self.core_tracks[c][m].at(t) for m in CPU_MODES if m != "iowait"))

    def reasons_at(self, index: int, t: float) -> tuple[str, ...]:
        """Clock-event reasons active at ``t``."""
        return tuple(r for r, tr in self.reason_tracks[index].items() if tr.at(t) > 0.5)


def gpus_of(sc: Scenario) -> Mapping[int, Gpu]:
    """GPUs by NVML index."""
    return {g.index: g for g in sc.gpus}
