"""Hand-built sample windows for the derived layer's table tests: plain data, no collectors, no clock."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from exporter.samples.gpu import GpuBuffered, GpuFast, GpuIdentity, GpuProcess, GpuSample, GpuSlow, UtilPoint
from exporter.samples.host import (
    CpuSample,
    CpuTimes,
    NfsSample,
    PressureSample,
    PressureTotals,
    ProcessSample,
    ProcSample,
    ThreadStat,
)
from exporter.samples.rows import Rows
from exporter.samples.topology import PcieDevice, PcieLink, PcieSample
from exporter.snapshot import Stamped

Fn = Callable[[float], float]
GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0}


def const(v: float) -> Fn:
    return lambda _t: v


def square(high: float, low: float, period: float, duty: float) -> Fn:
    return lambda t: high if (t % period) < duty * period else low


@dataclass
class GpuSpec:
    """What one GPU does over time (functions of t) plus its static identity."""

    index: int = 0
    bdf: str = "0000:81:00.0"
    gpm: bool = True
    util: Fn = field(default_factory=lambda: const(0.0))
    sm: Fn | None = None
    rx: Fn = field(default_factory=lambda: const(0.0))
    tx: Fn = field(default_factory=lambda: const(0.0))
    clock_ratio: Fn = field(default_factory=lambda: const(1.0))
    reasons: frozenset[str] = frozenset()
    link: tuple[int, int] = (5, 16)
    max_link: tuple[int, int] = (5, 16)
    pids: tuple[int, ...] = (4242,)
    max_clock_hz: float = 1.98e9
    tensor: Fn | None = None  # GPM tensor-pipe and DRAM-bandwidth activity (None: not sampled)
    dram: Fn | None = None


def identity(g: GpuSpec) -> GpuIdentity:
    return GpuIdentity(g.index, f"GPU-{g.index}", "NVIDIA H100", g.bdf, g.gpm)


def gpu_windows(
    gpus: Sequence[GpuSpec], t0: float, t1: float, *, dt: float = 0.1, slow_dt: float = 5.0, buf_dt: float = 1.0,
) -> tuple[list[Stamped[GpuSample]], list[Stamped[GpuSample]], list[Stamped[GpuSample]]]:
    """(fast, buffered, slow) windows integrating each GPU's functions like the collector's counters.

    GPUs without GPM get no busy/SM integrals on the fast path (as with real NVML) but driver samples
    every ``dt`` delivered in batches every ``buf_dt`` with their integral.
    """
    ids = MappingProxyType({g.index: identity(g) for g in gpus})
    fast: list[Stamped[GpuSample]] = []
    slow: list[Stamped[GpuSample]] = []
    buffered: list[Stamped[GpuSample]] = []
    pending: dict[int, list[UtilPoint]] = {g.index: [] for g in gpus}
    busy = {g.index: 0.0 for g in gpus}
    smsec = {g.index: 0.0 for g in gpus}
    rxt = {g.index: 0.0 for g in gpus}
    txt = {g.index: 0.0 for g in gpus}
    n = round((t1 - t0) / dt)
    for i in range(n + 1):
        t = t0 + i * dt
        per: dict[int, object] = {}
        for g in gpus:
            if i:
                busy[g.index] += g.util(t - dt) * dt
                smsec[g.index] += (g.sm or g.util)(t - dt) * dt
                rxt[g.index] += g.rx(t - dt) * dt
                txt[g.index] += g.tx(t - dt) * dt
            # GPM metrics average the interval that ends at the sample, like the collector's pairs.
            sm = g.sm(max(t0, t - dt)) if (g.sm and g.gpm) else None
            per[g.index] = GpuFast(
                sm_active=sm, sm_occupancy=None,
                tensor_active=g.tensor(max(t0, t - dt)) if (g.tensor and g.gpm) else None,
                dram_active=g.dram(max(t0, t - dt)) if (g.dram and g.gpm) else None,
                pcie_tx_bytes_per_s=g.tx(t), pcie_rx_bytes_per_s=g.rx(t),
                fields=MappingProxyType({"pcie_tx_bytes": float(int(txt[g.index])),
                                         "pcie_rx_bytes": float(int(rxt[g.index])), "pcie_replays": 0.0}),
                sm_clock_hz=g.clock_ratio(t) * g.max_clock_hz,
                sm_active_seconds=smsec[g.index] if g.gpm else None,
                busy_seconds=busy[g.index] if g.gpm else None,
            )
            if i:
                pending[g.index].append(UtilPoint(t, g.util(t - dt)))
        fast.append(Stamped(t, GpuSample(ids, MappingProxyType(per), frozenset())))
        if i and (i * dt) % buf_dt < dt / 2:
            per3: dict[int, object] = {
                g.index: GpuBuffered(tuple(pending[g.index]), busy[g.index]) for g in gpus}
            buffered.append(Stamped(t, GpuSample(ids, MappingProxyType(per3), frozenset())))
            pending = {g.index: [] for g in gpus}
    t = t0
    while t <= t1 + 1e-9:
        per2: dict[int, object] = {}
        for g in gpus:
            reasons = set(g.reasons)
            if g.util(t) == 0:
                reasons.add("gpu_idle")
            per2[g.index] = GpuSlow(
                link_gen=g.link[0], link_width=g.link[1], max_link_gen=g.max_link[0], max_link_width=g.max_link[1],
                gpu_max_link_gen=g.max_link[0],
                clock_event_reasons=frozenset(reasons), temperature_c=None, memory_used_bytes=None,
                memory_total_bytes=None, power_limit_w=None, max_sm_clock_hz=g.max_clock_hz,
                processes=tuple(GpuProcess(p, None, None) for p in g.pids), numa_node=0,
            )
        slow.append(Stamped(t, GpuSample(ids, MappingProxyType(per2), frozenset())))
        t += slow_dt
    return fast, buffered, slow


@dataclass
class ThreadSpec:
    count: int
    user: float
    system: float
    state: str = "S"


def proc_window(
    pid: int, threads: Sequence[ThreadSpec], t0: float, t1: float, dt: float = 1.0, *,
    total_threads: int = 0, cpus_allowed: frozenset[int] = frozenset(range(32)),
    read_bytes_per_s: float = 0.0, read_calls_per_s: float = 0.0, comm: str = "python",
) -> list[Stamped[ProcSample]]:
    """Deep ProcSamples of one process whose threads run at constant core fractions."""
    loads: list[ThreadSpec] = []
    for spec in threads:
        loads += [ThreadSpec(1, spec.user, spec.system, spec.state)] * spec.count
    n_threads = max(total_threads, len(loads))
    out = []
    t = t0
    while t <= t1 + 1e-9:
        el = t - t0
        ths = []
        for k in range(n_threads):
            ld = loads[k] if k < len(loads) else ThreadSpec(1, 0.0, 0.0, "S")
            ths.append(ThreadStat(pid + k, comm, ld.state, ld.user * el, ld.system * el, k))
        ut = sum(x.utime for x in ths)
        st = sum(x.stime for x in ths)
        p = ProcessSample(pid, comm, "R", ut, st, n_threads, cpus_allowed, frozenset({0}), Rows(ThreadStat, ths),
                          int(read_bytes_per_s * el), int(read_calls_per_s * el))
        out.append(Stamped(t, ProcSample(MappingProxyType({pid: p}), True)))
        t += dt
    return out


def cpu_window(
    n: int, busy: Mapping[int, tuple[float, float]], t0: float, t1: float, dt: float = 1.0,
    *, background: tuple[float, float] = (0.02, 0.01), iowait: float = 0.0,
) -> list[Stamped[CpuSample]]:
    """Per-core /proc/stat-like samples: ``busy`` maps cpu -> (user, system) fractions."""
    out = []
    t = t0
    while t <= t1 + 1e-9:
        el = t - t0
        cpus = {}
        for c in range(n):
            u, s = busy.get(c, background)
            idle = max(0.0, 1.0 - u - s - iowait)
            cpus[c] = CpuTimes(u * el, 0.0, s * el, idle * el, iowait * el, 0.0, 0.0, 0.0)
        out.append(Stamped(t, CpuSample(MappingProxyType(cpus), MappingProxyType({}))))
        t += dt
    return out


def pressure_window(rates: Mapping[str, tuple[float, float]], t0: float, t1: float,
                    dt: float = 1.0) -> list[Stamped[PressureSample]]:
    out = []
    t = t0
    while t <= t1 + 1e-9:
        el = t - t0
        res = {r: PressureTotals(some * el, full * el) for r, (some, full) in rates.items()}
        out.append(Stamped(t, PressureSample(MappingProxyType(res))))
        t += dt
    return out


def nfs_window(ops: Mapping[str, float], retrans: float, t0: float, t1: float,
               dt: float = 1.0) -> list[Stamped[NfsSample]]:
    out = []
    t = t0
    while t <= t1 + 1e-9:
        el = t - t0
        calls = int(sum(ops.values()) * el)
        out.append(Stamped(t, NfsSample(calls, int(retrans * el), MappingProxyType(
            {k: int(v * el) for k, v in ops.items()}))))
        t += dt
    return out


def pcie_window(
    gpu_bdf: str, hops: Sequence[tuple[str, Callable[[float], tuple[int, int]], tuple[int, int]]],
    t0: float, t1: float, dt: float = 1.0,
) -> list[Stamped[PcieSample]]:
    """PCIe chain samples: ``hops`` root first, each (bdf, current(t) -> (gen, width), (max_gen, max_width))."""
    out = []
    t = t0
    chain = tuple(h[0] for h in hops)
    while t <= t1 + 1e-9:
        devs = {}
        for i, (bdf, cur, mx) in enumerate(hops):
            g, w = cur(t)
            link = PcieLink(GTS[g], w, GTS[mx[0]], mx[1])
            role = "gpu" if bdf == gpu_bdf else "bridge"
            devs[bdf] = PcieDevice(bdf, role, "10de", "2330", "0302", "nvidia", 0, frozenset(), link, None,
                                   gpu_bdf if role == "bridge" else None, chain[:i])
        out.append(Stamped(t, PcieSample(MappingProxyType(devs), MappingProxyType({gpu_bdf: chain}))))
        t += dt
    return out
