"""Scenario phases: each phase's partial state as written, merged key by key over the previous phase's (nested
mappings included: ``host.disks.sda.await_ms`` can change alone), then resolved against the spec's defaults."""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from exporter.sim import interconnect as ic
from exporter.sim import workload_spec as v2
from exporter.sim.reader import Reader, generation, governor, indexed, item, join, width
from exporter.sim.signal import NOISE_STEP
from exporter.sim.spec import (
    CLOCK_EVENT_REASONS,
    CPU_MODES,
    DISK_KEYS,
    FRACTION,
    GPU_HEALTH_NUMERIC,
    GPU_NUMERIC,
    MAX_PHASE_S,
    MAX_PIECES,
    MAX_TIMELINE_S,
    MIG_NUMERIC,
    NFS_OPS,
    NONNEG,
    PSI_KEYS,
    THREAD_STATES,
    CpuModes,
    DiskState,
    Gpu,
    GpuState,
    Host,
    HostState,
    Link,
    MemoryState,
    MigState,
    NfsState,
    Noise,
    Phase,
    Process,
    ProcessState,
    Square,
    ThreadGroup,
    Value,
    XidEvent,
)

# ---- phases: partial dicts, merged key by key -------------------------------------------------------------------

Partial = dict[str, Any]


def _merge(base: Partial, over: Mapping[str, Any]) -> Partial:
    """Deep merge: nested dicts merge key by key; any other value (numbers, patterns, lists) replaces."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


_GPU_STATE_KEYS = (*GPU_NUMERIC, "link", "clock_event_reasons", "lost")
# Project keys (docs/simulator.md): ECC, row remapping, Xid events, MIG instances.
_GPU_PROJECT_KEYS = (*GPU_HEALTH_NUMERIC, "row_remap_pending", "row_remap_failure", "xid_events", "mig", "nvlink")


def _gpu_partial(r: Reader, v: object, path: str, gpu: Gpu) -> Partial:
    m = r.mapping(v if v is not None else {}, path)
    r.keys(m, path, (*_GPU_STATE_KEYS, *_GPU_PROJECT_KEYS))
    out: Partial = {}
    for k, raw in m.items():
        kp = join(path, k)
        if k in _GPU_PROJECT_KEYS:
            out[k] = _gpu_project_value(r, k, raw, kp, gpu)
        elif k in MIG_NUMERIC and gpu.mig is not None:
            raise r.fail(kp, f"GPU {gpu.index} is in MIG mode: set {k} per instance under {join(path, 'mig')}.<gi>")
        elif k in GPU_NUMERIC:
            out[k] = r.value(raw, kp, GPU_NUMERIC[k])
        elif k == "link":
            lm = r.mapping(raw, kp)
            r.keys(lm, kp, ("gen", "width"))
            link: Partial = {}
            if "gen" in lm:
                link["gen"] = generation(r, lm["gen"], kp + ".gen")
                if link["gen"] > gpu.pcie.gpu_max_gen:
                    raise r.fail(kp + ".gen", f"Gen{link['gen']} is above the GPU's own max Gen{gpu.pcie.gpu_max_gen}")
            if "width" in lm:
                link["width"] = width(r, lm["width"], kp + ".width")
                if link["width"] > gpu.pcie.gpu_max_width:
                    raise r.fail(kp + ".width",
                                 f"x{link['width']} is above the GPU's own max x{gpu.pcie.gpu_max_width}")
            out[k] = link
        elif k == "clock_event_reasons":
            reasons: list[str] = []
            for j, x in enumerate(r.seq(raw, kp)):
                s = r.string(x, item(kp, j))
                if s not in CLOCK_EVENT_REASONS:
                    raise r.fail(item(kp, j),
                                 f"unknown clock event reason {s!r} (known: {', '.join(CLOCK_EVENT_REASONS)})")
                if s not in reasons:
                    reasons.append(s)
            out[k] = tuple(reasons)
        else:
            out[k] = r.boolean(raw, kp)
    return out


def _gpu_project_value(r: Reader, k: str, raw: object, kp: str, gpu: Gpu) -> Any:
    """One project key of a GPU's phase state (docs/simulator.md)."""
    if k in GPU_HEALTH_NUMERIC:
        return r.value(raw, kp, GPU_HEALTH_NUMERIC[k])
    if k in ("row_remap_pending", "row_remap_failure"):
        return r.boolean(raw, kp)
    if k == "nvlink":
        return ic.nvlink_partial(r, raw, kp, gpu)
    gis = {x.gi for x in gpu.mig or ()}
    if k == "xid_events":
        events: list[XidEvent] = []
        for j, e in enumerate(r.seq(raw, kp)):
            ep = item(kp, j)
            em = r.mapping(e, ep)
            r.keys(em, ep, ("at_s", "xid", "mig"), ("at_s", "xid"))
            mig = None
            if em.get("mig") is not None:
                mig = r.integer(em["mig"], ep + ".mig")
                if mig not in gis:
                    raise r.fail(ep + ".mig", f"GPU {gpu.index} has no GPU instance {mig}")
            events.append(XidEvent(r.number(em["at_s"], ep + ".at_s", 0.0), r.integer(em["xid"], ep + ".xid", 0, 2**32),
                                   mig))
        return tuple(sorted(events, key=lambda e: e.at_s))
    # mig: per-instance state, merged key by key like the GPU's own
    if gpu.mig is None:
        raise r.fail(kp, f"GPU {gpu.index} is not in MIG mode (gpus[].mig)")
    out: Partial = {}
    for gi, st in indexed(r, r.mapping(raw, kp), kp, gis, "GPU instance").items():
        ip = f"{kp}.{gi}"
        sm = r.mapping(st if st is not None else {}, ip)
        r.keys(sm, ip, tuple(MIG_NUMERIC))
        out[str(gi)] = {x: r.value(y, join(ip, x), MIG_NUMERIC[x]) for x, y in sm.items()}
    return out


def _proc_partial(r: Reader, v: object, path: str, proc: Process, host: Host) -> Partial:
    m = r.mapping(v if v is not None else {}, path)
    v2.gate(r, m, path, r.version, v2.V2_PROCESS_STATE)
    r.keys(m, path, ("threads_cpu", "read_bytes_per_s", "read_syscalls_per_s", "cpus_allowed", "mems_allowed",
                     *v2.V2_PROCESS_STATE))
    out: Partial = {}
    for k, raw in m.items():
        kp = join(path, k)
        if k == "threads_cpu":
            groups: list[ThreadGroup] = []
            total = 0
            for j, tg in enumerate(r.seq(raw, kp)):
                gp = item(kp, j)
                gm = r.mapping(tg, gp)
                v2.gate(r, gm, gp, r.version, v2.V2_THREAD_GROUP)
                r.keys(gm, gp, ("count", "user", "system", "state", *v2.V2_THREAD_GROUP), ("count",))
                count = r.integer(gm["count"], gp + ".count", 1)
                state = r.string(gm.get("state", "S"), gp + ".state")
                if state not in THREAD_STATES:
                    raise r.fail(gp + ".state", f"thread state must be R, S or D, not {state!r}")
                total += count
                if total > proc.threads:
                    raise r.fail(gp + ".count", f"{total} threads described but process {proc.pid} has "
                                 f"{proc.threads} (processes[].threads)")
                groups.append(ThreadGroup(count, r.value(gm.get("user", 0.0), gp + ".user", FRACTION),
                                          r.value(gm.get("system", 0.0), gp + ".system", FRACTION), state,
                                          **v2.thread_group_v2(r, gm, gp)))
            out[k] = tuple(groups)
        elif k in ("read_bytes_per_s", "read_syscalls_per_s", "storage_read_bytes_per_s", "children_cpu"):
            out[k] = r.value(raw, kp, NONNEG)
        elif k == "cpus_allowed":
            out[k] = r.cpulist(raw, kp, host.cpus)
        else:
            out[k] = r.cpulist(raw, kp, len(host.numa_nodes), "node")
    return out


def _modes_partial(r: Reader, v: object, path: str) -> Partial:
    m = r.mapping(v, path)
    r.keys(m, path, CPU_MODES)
    return {k: r.value(x, join(path, k), FRACTION) for k, x in m.items()}


def _host_partial(r: Reader, v: object, path: str, host: Host) -> Partial:
    m = r.mapping(v if v is not None else {}, path)
    v2.gate(r, m, path, r.version, v2.V2_HOST_STATE)
    r.keys(m, path, ("cpu_background", "cpu_cores", "disks", "nfs", "psi", "memory", "oom_kills_per_s", "governor",
                     "nics", *v2.V2_HOST_STATE))
    out: Partial = {}
    for k, raw in m.items():
        kp = join(path, k)
        if k == "cpu_background":
            out[k] = _modes_partial(r, raw, kp)
        elif k == "cpu_cores":
            cm = r.mapping(raw, kp)
            cores: Partial = {}
            for cl, modes in cm.items():
                key = str(cl)
                cpus = r.cpulist(key, join(kp, key), host.cpus)
                cores[key] = {"_cpus": cpus, **_modes_partial(r, modes, join(kp, key))}
            out[k] = cores
        elif k == "disks":
            dm = r.mapping(raw, kp)
            disks: Partial = {}
            for dev, st in dm.items():
                dp = join(kp, dev)
                if dev not in host.disks:
                    raise r.fail(dp, f"unknown disk {dev!r} (host.disks: {', '.join(host.disks) or 'none'})")
                sm = r.mapping(st, dp)
                r.keys(sm, dp, DISK_KEYS)
                disks[str(dev)] = {x: r.value(y, join(dp, x), NONNEG) for x, y in sm.items()}
            out[k] = disks
        elif k == "nfs":
            if not host.nfs:
                raise r.fail(kp, "NFS state needs host.nfs: true")
            nm = r.mapping(raw, kp)
            r.keys(nm, kp, ("ops_per_s", "retrans_per_s"))
            nfs: Partial = {}
            if "ops_per_s" in nm:
                om = r.mapping(nm["ops_per_s"], kp + ".ops_per_s")
                r.keys(om, kp + ".ops_per_s", NFS_OPS)
                nfs["ops_per_s"] = {x: r.value(y, join(kp + ".ops_per_s", x), NONNEG) for x, y in om.items()}
            if "retrans_per_s" in nm:
                nfs["retrans_per_s"] = r.value(nm["retrans_per_s"], kp + ".retrans_per_s", NONNEG)
            out[k] = nfs
        elif k == "psi":
            pm = r.mapping(raw, kp)
            r.keys(pm, kp, PSI_KEYS)
            out[k] = {x: r.value(y, join(kp, x), FRACTION) for x, y in pm.items()}
        elif k == "memory":
            mm = r.mapping(raw, kp)
            r.keys(mm, kp, ("available_ratio", "dirty_bytes", "writeback_bytes"))
            out[k] = {x: r.value(y, join(kp, x), FRACTION if x == "available_ratio" else NONNEG)
                      for x, y in mm.items()}
        elif k == "oom_kills_per_s":
            out[k] = r.value(raw, kp, NONNEG)
        elif k == "cgroups":
            out[k] = v2.cgroup_state_partial(r, raw, kp, host.cgroups)
        elif k == "nics":
            out[k] = ic.nics_partial(r, raw, kp, host.nics)
        else:
            out[k] = governor(r, raw, kp)
    return out


def phases_of(r: Reader, v: object, host: Host, gpus: tuple[Gpu, ...], procs: tuple[Process, ...]) -> tuple[Phase, ...]:
    lst = r.seq(v, "phases")
    if not lst:
        raise r.fail("phases", "at least one phase is required")
    gpu_by = {g.index: g for g in gpus}
    proc_by = {p.pid: p for p in procs}
    gstate: dict[int, Partial] = {g.index: {} for g in gpus}
    pstate: dict[int, Partial] = {p.pid: {} for p in procs}
    hstate: Partial = {}
    names: set[str] = set()
    out: list[Phase] = []
    start = 0.0
    pieces = 0
    for i, ph in enumerate(lst):
        p = item("phases", i)
        m = r.mapping(ph, p)
        r.keys(m, p, ("name", "duration_s", "gpus", "processes", "host"), ("name", "duration_s"))
        name = r.string(m["name"], p + ".name")
        if not name:
            raise r.fail(p + ".name", "must not be empty")
        if name in names:
            raise r.fail(p + ".name", f"phase name {name!r} used twice")
        names.add(name)
        duration = r._positive(m["duration_s"], p + ".duration_s", hi=MAX_PHASE_S)
        if start + duration > MAX_TIMELINE_S:
            raise r.fail(p + ".duration_s", f"the phases would last {start + duration:g} s, more than "
                         f"{MAX_TIMELINE_S:g} s (a week) in all")
        gpus_m = r.mapping(m.get("gpus") or {}, p + ".gpus")
        for idx, gv in indexed(r, gpus_m, p + ".gpus", set(gpu_by), "GPU").items():
            gstate[idx] = _merge(gstate[idx], _gpu_partial(r, gv, f"{p}.gpus.{idx}", gpu_by[idx]))
            late = [e.at_s for e in gstate[idx].get("xid_events", ()) if e.at_s >= duration]
            if late:
                raise r.fail(f"{p}.gpus.{idx}.xid_events", f"an event at {late[0]:g} s is past the phase's "
                             f"duration_s {duration:g}")
        procs_m = r.mapping(m.get("processes") or {}, p + ".processes")
        for pid, pv in indexed(r, procs_m, p + ".processes", set(proc_by), "pid").items():
            pstate[pid] = _merge(pstate[pid], _proc_partial(r, pv, f"{p}.processes.{pid}", proc_by[pid], host))
        hstate = _merge(hstate, _host_partial(r, m.get("host") or {}, p + ".host", host))
        resolved = {g: _gpu_state(gstate[g], gpu_by[g]) for g in sorted(gstate)}
        for partial in gstate.values():
            partial.pop("xid_events", None)  # an event happens in its phase only: never carried over
        phase = Phase(
            name=name, duration_s=duration, start_s=start, index=i,
            gpus=MappingProxyType(resolved),
            processes=MappingProxyType({q: _proc_state(pstate[q], proc_by[q]) for q in sorted(pstate)}),
            host=_host_state(hstate, host),
        )
        pieces += _pieces(phase, host)
        if pieces > MAX_PIECES:
            raise r.fail(p, f"the square/noise patterns in force up to this phase make {pieces} constant pieces "
                         f"(at most {MAX_PIECES}, weighted by the cores each lands on): use longer period_s, "
                         "fewer noisy values or shorter phases")
        out.append(phase)
        start += duration
    return tuple(out)


def pattern_pieces(v: Value, duration: float) -> int:
    """Constant pieces the simulator builds for ``v`` over a phase of ``duration`` seconds (exporter.sim.signal)."""
    if isinstance(v, Square):
        if 0.0 < v.duty < 1.0 and v.high != v.low:
            return 2 * math.ceil(duration / v.period_s)
        return 1
    if isinstance(v, Noise):
        return math.ceil(duration / NOISE_STEP) if v.sd > 0 else 1
    return 1


def _pieces(ph: Phase, host: Host) -> int:
    """Weighted pieces of one phase: a pattern is rebuilt in every phase it is in force, and a CPU pattern is
    combined into the time series of each core it lands on (the background: every core)."""
    d = ph.duration_s
    n = 0
    for g in ph.gpus.values():
        n += sum(pattern_pieces(getattr(g, k), d) for k in GPU_NUMERIC)
    for st in ph.processes.values():
        n += pattern_pieces(st.read_bytes_per_s, d) + pattern_pieces(st.read_syscalls_per_s, d)
        for tg in st.threads_cpu:
            n += (pattern_pieces(tg.user, d) + pattern_pieces(tg.system, d)) * min(tg.count, host.cpus)
    hs = ph.host
    n += sum(pattern_pieces(hs.cpu_background.get(m), d) for m in CPU_MODES) * host.cpus
    for cpus, modes in hs.cpu_cores:
        n += sum(pattern_pieces(modes.get(m), d) for m in CPU_MODES) * len(cpus)
    for disk in hs.disks.values():
        n += sum(pattern_pieces(getattr(disk, k), d) for k in DISK_KEYS)
    n += sum(pattern_pieces(v, d) for v in (*hs.nfs.ops_per_s.values(), hs.nfs.retrans_per_s, *hs.psi.values(),
                                           hs.memory.available_ratio, hs.memory.dirty_bytes,
                                           hs.memory.writeback_bytes, hs.oom_kills_per_s))
    return n


def _gpu_state(s: Partial, gpu: Gpu) -> GpuState:
    link = s.get("link", {})
    return GpuState(
        gpu_util=s.get("gpu_util", 0.0), sm_active=s.get("sm_active", 0.0), sm_occupancy=s.get("sm_occupancy", 0.0),
        tensor_active=s.get("tensor_active", 0.0), dram_active=s.get("dram_active", 0.0),
        pcie_tx_bytes_per_s=s.get("pcie_tx_bytes_per_s", 0.0), pcie_rx_bytes_per_s=s.get("pcie_rx_bytes_per_s", 0.0),
        link=Link(link.get("gen", gpu.pcie.max_gen), link.get("width", gpu.pcie.max_width)),
        sm_clock_mhz=s.get("sm_clock_mhz"), power_w=s.get("power_w"), temperature_c=s.get("temperature_c", 40.0),
        clock_event_reasons=s.get("clock_event_reasons"), memory_used_bytes=s.get("memory_used_bytes", 0.0),
        pcie_replays_per_s=s.get("pcie_replays_per_s", 0.0), aer_correctable_per_s=s.get("aer_correctable_per_s", 0.0),
        lost=bool(s.get("lost", False)),
        **_gpu_project_state(s, gpu),
    )


def _gpu_project_state(s: Partial, gpu: Gpu) -> dict[str, Any]:
    """The project keys of a resolved GPU state (docs/simulator.md); every MIG instance gets a state."""
    mig = s.get("mig", {})
    return {
        **{k: s.get(k, 0.0) for k in GPU_HEALTH_NUMERIC},
        "row_remap_pending": bool(s.get("row_remap_pending", False)),
        "row_remap_failure": bool(s.get("row_remap_failure", False)),
        "xid_events": s.get("xid_events", ()),
        "nvlink": ic.nvlink_state(s.get("nvlink", {})),
        "mig": MappingProxyType({
            x.gi: MigState(**{k: mig.get(str(x.gi), {}).get(k, 0.0) for k in MIG_NUMERIC}) for x in gpu.mig or ()}),
    }


def _proc_state(s: Partial, proc: Process) -> ProcessState:
    return ProcessState(
        threads_cpu=s.get("threads_cpu", ()), read_bytes_per_s=s.get("read_bytes_per_s", 0.0),
        read_syscalls_per_s=s.get("read_syscalls_per_s", 0.0),
        cpus_allowed=s.get("cpus_allowed", proc.cpus_allowed), mems_allowed=s.get("mems_allowed", proc.mems_allowed),
        storage_read_bytes_per_s=s.get("storage_read_bytes_per_s", 0.0), children_cpu=s.get("children_cpu", 0.0),
    )


def _modes(s: Mapping[str, Any], base: Mapping[str, Value]) -> CpuModes:
    return CpuModes(**{k: s.get(k, base.get(k, 0.0)) for k in CPU_MODES})


_BACKGROUND: Mapping[str, Value] = MappingProxyType({"user": 0.02, "system": 0.01})


def _host_state(s: Partial, host: Host) -> HostState:
    bg = _modes(s.get("cpu_background", {}), _BACKGROUND)
    bg_map = {k: bg.get(k) for k in CPU_MODES}
    cores = tuple((c["_cpus"], _modes(c, bg_map)) for c in s.get("cpu_cores", {}).values())
    disks = {d: DiskState(**{k: s.get("disks", {}).get(d, {}).get(k, 0.0) for k in DISK_KEYS}) for d in host.disks}
    nfs = s.get("nfs", {})
    mem = s.get("memory", {})
    return HostState(
        cpu_background=bg, cpu_cores=cores, disks=MappingProxyType(disks),
        nfs=NfsState(MappingProxyType({o: nfs.get("ops_per_s", {}).get(o, 0.0) for o in NFS_OPS}),
                     nfs.get("retrans_per_s", 0.0)),
        psi=MappingProxyType({k: s.get("psi", {}).get(k, 0.0) for k in PSI_KEYS}),
        memory=MemoryState(mem.get("available_ratio", 0.8), mem.get("dirty_bytes", 0.0),
                           mem.get("writeback_bytes", 0.0)),
        oom_kills_per_s=s.get("oom_kills_per_s", 0.0), governor=s.get("governor", host.governor),
        cgroups=v2.cgroup_states(s.get("cgroups", {}), host.cgroups),
        nics=ic.nic_states(s.get("nics", {}), host.nics),
    )


