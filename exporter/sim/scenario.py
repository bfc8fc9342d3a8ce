"""Scenario files, format versions 1 and 2 (``shared/scenarios/SPEC.md``): load and validate.

The format is a contract: a file written to the spec that the project has never seen must load. Every
problem is a :class:`ScenarioError` whose message names the file and the key path (``phases[1].gpus.0.
link.gen``) and says what is wrong. Unknown keys are errors. The parts: the model (:mod:`exporter.sim.spec`,
re-exported here), the validation primitives (:mod:`exporter.sim.reader`), the static sections (host, GPUs,
processes) and the expectations (this module), the phases (:mod:`exporter.sim.phases`), and the version-2
workload sections -- cgroups, the kubelet's answer, process trees, the stricter expectations
(:mod:`exporter.sim.workload_spec`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from exporter import pci, yamlsafe
from exporter.names import FINDINGS, VERDICTS
from exporter.sim import interconnect as ic
from exporter.sim import workload_spec as v2
from exporter.sim.phases import phases_of
from exporter.sim.reader import Reader, generation, governor, indexed, item, list_str, width
from exporter.sim.spec import (  # the model is part of this module's interface
    CLOCK_EVENT_REASONS,
    CPU_MODES,
    DISK_KEYS,
    FRACTION,
    GPU_NUMERIC,
    MAX_CPUS,
    MAX_MHZ,
    MAX_PROCESSES,
    MAX_THREADS,
    MAX_WATTS,
    NFS_OPS,
    NONNEG,
    PSI_KEYS,
    THREAD_STATES,
    Bridge,
    CpuModes,
    DiskState,
    Expectation,
    Gpu,
    GpuState,
    Host,
    HostState,
    Link,
    MemoryState,
    MigInstance,
    NfsState,
    Noise,
    PcieCaps,
    Phase,
    Process,
    ProcessState,
    Scenario,
    ScenarioError,
    Square,
    ThreadGroup,
)

DEVICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,31}$")  # a block device under /sys/block


# ---- loading ---------------------------------------------------------------------------------------------------


def load(path: str | Path) -> Scenario:
    """Read and validate a scenario file; ScenarioError (file and key named) on any problem.

    The file is refused before parsing when it is larger than :data:`exporter.yamlsafe.MAX_BYTES`.
    """
    p = Path(path)
    try:
        text = yamlsafe.read(p)
    except yamlsafe.YamlError as e:
        raise ScenarioError(f"{p}: {e}") from e
    return loads(text, str(p))


def loads(text: str, file: str = "<scenario>") -> Scenario:
    """Validate scenario YAML text; ``file`` names it in messages."""
    try:
        data = yamlsafe.loads(text)
    except yamlsafe.YamlError as e:
        raise ScenarioError(f"{file}: {e}") from e
    return from_dict(data, file)


def from_dict(data: object, file: str = "<scenario>") -> Scenario:
    """Validate an already-parsed document."""
    r = Reader(file)
    top = r.mapping(data, "")
    r.keys(top, "", ("version", "name", "description", "seed", "host", "gpus", "processes", "phases", "expect"),
           ("version", "name", "host", "gpus", "phases"))
    version = r.integer(top["version"], "version")
    if version not in (1, 2):
        raise r.fail("version", f"unsupported version {version} (this gpufeed reads versions 1 and 2)")
    r.version = version
    name = r.string(top["name"], "name")
    if not name.strip():
        raise r.fail("name", "must not be empty")
    description = r.string(top.get("description", ""), "description") if top.get("description") is not None else ""
    seed = r.integer(top.get("seed", 0), "seed", 0, 2**64 - 1)
    host = _host(r, top["host"])
    gpus = _gpus(r, top["gpus"], host)
    host = _host_kubernetes(r, top["host"], host, gpus)
    host = dataclasses.replace(host, nics=ic.nics(r, r.mapping(top["host"], "host").get("nics"), gpus))
    processes = _processes(r, top.get("processes", []), host, gpus)
    phases = phases_of(r, top["phases"], host, gpus, processes)
    expect = _expect(r, top.get("expect", []), phases, gpus)
    return Scenario(path=file, version=version, name=name, description=description.strip(), seed=seed, host=host,
                    gpus=gpus, processes=processes, phases=phases, expect=expect)


def _host(r: Reader, v: object) -> Host:
    m = r.mapping(v, "host")
    v2.gate(r, m, "host", r.version, v2.V2_HOST)
    r.keys(m, "host", ("cpus", "numa_nodes", "governor", "cpu_max_mhz", "mem_total_bytes", "disks", "nfs", "nics",
                       *v2.V2_HOST), ("cpus",))
    cpus = r.integer(m["cpus"], "host.cpus", 1, MAX_CPUS)
    nodes: list[frozenset[int]] = []
    if "numa_nodes" in m:
        seen: dict[int, int] = {}
        raw_nodes = r.seq(m["numa_nodes"], "host.numa_nodes")
        if not raw_nodes:
            raise r.fail("host.numa_nodes", "must list at least one node")
        for i, n in enumerate(raw_nodes):
            p = item("host.numa_nodes", i)
            nm = r.mapping(n, p)
            r.keys(nm, p, ("cpus",), ("cpus",))
            cl = r.cpulist(nm["cpus"], p + ".cpus", cpus)
            for c in cl:
                if c in seen:
                    raise r.fail(p + ".cpus", f"CPU {c} is already in node {seen[c]}")
                seen[c] = i
            nodes.append(cl)
        missing = sorted(set(range(cpus)) - set(seen))
        if missing:
            raise r.fail("host.numa_nodes", f"CPU {missing[0]} belongs to no node")
    else:
        nodes.append(frozenset(range(cpus)))
    gov = governor(r, m.get("governor", "performance"), "host.governor")
    disks: tuple[str, ...] = ("nvme0n1",)
    if "disks" in m:
        lst = r.seq(m["disks"], "host.disks")
        names = []
        for i, d in enumerate(lst):
            s = r.string(d, item("host.disks", i))
            if not DEVICE_NAME.match(s):
                raise r.fail(item("host.disks", i), f"bad block device name {s!r}")
            if s in names:
                raise r.fail(item("host.disks", i), f"disk {s!r} listed twice")
            names.append(s)
        disks = tuple(names)
    return Host(
        cpus=cpus, numa_nodes=tuple(nodes), governor=gov,
        cpu_max_mhz=r._positive(m.get("cpu_max_mhz", 3000), "host.cpu_max_mhz", hi=MAX_MHZ),
        mem_total_bytes=r.integer(m.get("mem_total_bytes", 549755813888), "host.mem_total_bytes", 1),
        disks=disks, nfs=r.boolean(m.get("nfs", False), "host.nfs"),
        cgroup_version=v2.cgroup_version(r, m), cgroups=v2.cgroups(r, m.get("cgroups"), cpus),
    )


def _host_kubernetes(r: Reader, v: object, host: Host, gpus: tuple[Gpu, ...]) -> Host:
    """``host.kubernetes`` (version 2), read once the GPUs it assigns are known."""
    m = r.mapping(v, "host")
    if "kubernetes" not in m or m["kubernetes"] is None:
        return host
    return dataclasses.replace(host, kubernetes=v2.kubernetes(r, m["kubernetes"], host.cgroups, gpus))


def _gpus(r: Reader, v: object, host: Host) -> tuple[Gpu, ...]:
    lst = r.seq(v, "gpus")
    out: list[Gpu] = []
    indices: set[int] = set()
    bdfs: dict[str, str] = {}
    for i, g in enumerate(lst):
        p = item("gpus", i)
        m = r.mapping(g, p)
        r.keys(m, p, ("index", "name", "uuid", "pci_bus_id", "numa_node", "pcie", "upstream", "gpm",
                      "max_sm_clock_mhz", "power_limit_w", "memory_total_bytes", "mig", "nvlinks", "nvlink_remote",
                      "nvlink_speed_mbps"), ("pci_bus_id",))
        index = r.integer(m.get("index", i), p + ".index", 0, 1023)
        if index in indices:
            raise r.fail(p + ".index", f"GPU index {index} used twice")
        indices.add(index)
        bdf = _bdf(r, m["pci_bus_id"], p + ".pci_bus_id")
        if bdf in bdfs:
            raise r.fail(p + ".pci_bus_id", f"{bdf} already used by {bdfs[bdf]}")
        bdfs[bdf] = p
        numa = r.integer(m.get("numa_node", 0), p + ".numa_node", -1)
        if numa >= len(host.numa_nodes):
            raise r.fail(p + ".numa_node", f"node {numa} does not exist (host has {len(host.numa_nodes)})")
        pcie = _pcie(r, m.get("pcie", {}), p + ".pcie")
        upstream: list[Bridge] = []
        for j, b in enumerate(r.seq(m.get("upstream", []), p + ".upstream")):
            bp = item(p + ".upstream", j)
            bm = r.mapping(b, bp)
            r.keys(bm, bp, ("bdf", "max_gen", "max_width"), ("bdf",))
            bb = _bdf(r, bm["bdf"], bp + ".bdf")
            if bb == bdf:
                raise r.fail(bp + ".bdf", "a bridge cannot have the GPU's own address")
            if any(x.bdf == bb for x in upstream):
                raise r.fail(bp + ".bdf", f"{bb} appears twice in the chain")
            if bb in bdfs and bdfs[bb].endswith(".pci_bus_id"):
                raise r.fail(bp + ".bdf", f"{bb} is a GPU ({bdfs[bb]})")
            upstream.append(Bridge(bb, generation(r, bm.get("max_gen", pcie.max_gen), bp + ".max_gen"),
                                   width(r, bm.get("max_width", pcie.max_width), bp + ".max_width")))
        uuid = r.string(m.get("uuid", f"GPU-00000000-0000-0000-0000-{index:012d}"), p + ".uuid")
        name = r.string(m.get("name", "NVIDIA H100 80GB HBM3"), p + ".name")
        memory = r.integer(m.get("memory_total_bytes", 85899345920), p + ".memory_total_bytes", 1)
        out.append(Gpu(
            index=index, name=name, uuid=uuid,
            pci_bus_id=bdf, numa_node=numa, pcie=pcie, upstream=tuple(upstream),
            gpm=r.boolean(m.get("gpm", True), p + ".gpm"),
            max_sm_clock_mhz=r._positive(m.get("max_sm_clock_mhz", 1980), p + ".max_sm_clock_mhz", hi=MAX_MHZ),
            power_limit_w=r._positive(m.get("power_limit_w", 700), p + ".power_limit_w", hi=MAX_WATTS),
            memory_total_bytes=memory,
            mig=None if m.get("mig") is None else _mig_instances(r, m["mig"], p + ".mig", uuid, name, memory=memory),
            **ic.gpu_links(r, m, p),
        ))
    # A bridge address may be shared by several GPUs' chains (a switch above two GPUs) but must then be the
    # same device: same position relative to the root is not required, same caps are.
    caps: dict[str, tuple[int, int, str]] = {}
    for g in out:
        for b in g.upstream:
            if b.bdf in bdfs:
                raise r.fail(f"gpus (index {g.index}).upstream", f"{b.bdf} is a GPU address")
            prev = caps.setdefault(b.bdf, (b.max_gen, b.max_width, str(g.index)))
            if prev[:2] != (b.max_gen, b.max_width):
                raise r.fail(f"gpus (index {g.index}).upstream", f"bridge {b.bdf} has different max_gen/max_width "
                             f"than under GPU {prev[2]}")
    return tuple(out)


MAX_MIG_INSTANCES = 7  # GPU instances per GPU on A100/H100/B200 (NVIDIA MIG user guide)


def _mig_instances(r: Reader, v: object, path: str, uuid: str, name: str, *, memory: int) -> tuple[MigInstance, ...]:
    """Project key ``gpus[].mig``: the GPU is in MIG mode with these GPU instances (docs/simulator.md)."""
    lst = r.seq(v, path)
    if len(lst) > MAX_MIG_INSTANCES:
        raise r.fail(path, f"{len(lst)} instances: a GPU has at most {MAX_MIG_INSTANCES}")
    out: list[MigInstance] = []
    for i, raw in enumerate(lst):
        ip = item(path, i)
        m = r.mapping(raw, ip)
        r.keys(m, ip, ("gi", "ci", "uuid", "name", "memory_total_bytes"), ("gi",))
        gi = r.integer(m["gi"], ip + ".gi", 0, 1023)
        if any(x.gi == gi for x in out):
            raise r.fail(ip + ".gi", f"GPU instance {gi} listed twice")
        out.append(MigInstance(
            gi=gi, ci=r.integer(m.get("ci", 0), ip + ".ci", 0, 1023),
            uuid=r.string(m.get("uuid", f"MIG-{uuid.removeprefix('GPU-')}-{gi}"), ip + ".uuid"),
            name=r.string(m.get("name", f"{name} MIG {gi}"), ip + ".name"),
            memory_total_bytes=r.integer(m.get("memory_total_bytes", memory // max(1, len(lst))),
                                         ip + ".memory_total_bytes", 1),
        ))
    return tuple(out)


def _process_mig(r: Reader, m: Mapping[str, object], p: str, gl: list[int], gpus: tuple[Gpu, ...]) -> int | None:
    """Project key ``processes[].mig``: the GPU instance a process runs on; required on a MIG-mode GPU."""
    by_index = {g.index: g for g in gpus}
    mig_gpus = [i for i in gl if by_index[i].mig is not None]
    if "mig" not in m:
        if mig_gpus:
            raise r.fail(p, f"GPU {mig_gpus[0]} is in MIG mode: name the instance the process runs on (mig: <gi>)")
        return None
    gi = r.integer(m["mig"], p + ".mig", 0, 1023)
    for i in gl:
        inst = by_index[i].mig
        if inst is None:
            raise r.fail(p + ".mig", f"GPU {i} is not in MIG mode (gpus[].mig)")
        if all(x.gi != gi for x in inst):
            raise r.fail(p + ".mig", f"GPU {i} has no GPU instance {gi} (has: {list_str({x.gi for x in inst})})")
    return gi


def _bdf(r: Reader, v: object, path: str) -> str:
    s = r.string(v, path).strip()
    norm = pci.normalize(s)
    if norm is None or len(s) != 12:
        raise r.fail(path, f"bad PCI address {s!r} (expected domain:bus:device.function, e.g. 0000:82:00.0; "
                     "device 00-1f, function 0-7)")
    return norm


def _pcie(r: Reader, v: object, path: str) -> PcieCaps:
    m = r.mapping(v, path)
    r.keys(m, path, ("max_gen", "max_width", "gpu_max_gen", "gpu_max_width"))
    mg = generation(r, m.get("max_gen", 5), path + ".max_gen")
    mw = width(r, m.get("max_width", 16), path + ".max_width")
    return PcieCaps(mg, mw, generation(r, m.get("gpu_max_gen", mg), path + ".gpu_max_gen"),
                    width(r, m.get("gpu_max_width", mw), path + ".gpu_max_width"))


def _processes(r: Reader, v: object, host: Host, gpus: tuple[Gpu, ...]) -> tuple[Process, ...]:
    lst = r.seq(v if v is not None else [], "processes")
    if len(lst) > MAX_PROCESSES:
        raise r.fail("processes", f"{len(lst)} entries: more than {MAX_PROCESSES} processes")
    known = {g.index for g in gpus}
    out: list[Process] = []
    total_threads = 0
    for i, pr in enumerate(lst):
        p = item("processes", i)
        m = r.mapping(pr, p)
        v2.gate(r, m, p, r.version, v2.V2_PROCESS)
        r.keys(m, p, ("pid", "comm", "gpus", "cpus_allowed", "mems_allowed", "threads", "mig", *v2.V2_PROCESS),
               ("pid", "gpus"))
        pid = r.integer(m["pid"], p + ".pid", 1, 4194304)
        threads = r.integer(m.get("threads", 1), p + ".threads", 1)
        if threads > MAX_THREADS:
            raise r.fail(p + ".threads", f"{threads}: at most {MAX_THREADS} threads (all processes together)")
        total_threads += threads
        if total_threads > MAX_THREADS:
            raise r.fail(p + ".threads", f"{total_threads} threads so far: more than {MAX_THREADS} threads in all "
                         "processes together")
        if pid + threads - 1 > 4194304:
            raise r.fail(p + ".threads", f"tids {pid}..{pid + threads - 1} pass the kernel's pid limit 4194304")
        comm = r.string(m.get("comm", "python"), p + ".comm")
        if not comm or len(comm.encode()) > 15 or "\n" in comm or "\0" in comm:
            raise r.fail(p + ".comm", f"bad comm {comm!r} (1-15 bytes, one line, like the kernel's TASK_COMM_LEN)")
        gl: list[int] = []
        for j, gi in enumerate(r.seq(m["gpus"], p + ".gpus")):
            idx = r.integer(gi, item(p + ".gpus", j))
            if idx not in known:
                raise r.fail(item(p + ".gpus", j), f"unknown GPU index {idx} (known: {list_str(known)})")
            if idx in gl:
                raise r.fail(item(p + ".gpus", j), f"GPU {idx} listed twice")
            gl.append(idx)
        ppid, group, start_s, exit_s = v2.process_tree(r, m, p, host.cgroups)
        remotes, pipes, receiving = v2.process_links(r, m, p, threads)
        if ppid == pid:
            raise r.fail(p + ".ppid", f"process {pid} cannot be its own parent")
        cpuset = host.cgroups[group].cpuset if group is not None else None
        cpus = r.cpulist(m["cpus_allowed"], p + ".cpus_allowed", host.cpus) if "cpus_allowed" in m else \
            (cpuset if cpuset is not None else frozenset(range(host.cpus)))
        mems = r.cpulist(m["mems_allowed"], p + ".mems_allowed", len(host.numa_nodes), "node") \
            if "mems_allowed" in m else frozenset(range(len(host.numa_nodes)))
        for other in out:
            lo, hi = pid, pid + threads - 1
            olo, ohi = other.pid, other.pid + other.threads - 1
            if lo <= ohi and olo <= hi:
                raise r.fail(p + ".pid", f"tids {lo}..{hi} overlap process {other.pid} (tids {olo}..{ohi})")
        out.append(Process(pid=pid, comm=comm, gpus=tuple(gl), cpus_allowed=cpus, mems_allowed=mems, threads=threads,
                           mig=_process_mig(r, m, p, gl, gpus),
                           ppid=ppid, cgroup=group, start_s=start_s, exit_s=exit_s,
                           tcp_remotes=remotes, pipes=pipes, receiving_threads=receiving, job=v2.rank_of(r, m, p)))
    v2.check_tree(r, tuple(out))
    return tuple(out)


def _expect(r: Reader, v: object, phases: tuple[Phase, ...], gpus: tuple[Gpu, ...]) -> tuple[Expectation, ...]:
    lst = r.seq(v if v is not None else [], "expect")
    names = {p.name for p in phases}
    known = {g.index for g in gpus}
    out: list[Expectation] = []
    for i, e in enumerate(lst):
        p = item("expect", i)
        m = r.mapping(e, p)
        v2.gate(r, m, p, r.version, v2.V2_EXPECT)
        r.keys(m, p, ("phase", "gpus", "findings", "no_findings", "mig", *v2.V2_EXPECT), ("phase",))
        phase = r.string(m["phase"], p + ".phase")
        if phase not in names:
            raise r.fail(p + ".phase", f"unknown phase {phase!r} (phases: {', '.join(q.name for q in phases)})")
        verdicts: dict[int, tuple[str, ...]] = {}
        for idx, cause in indexed(r, r.mapping(m.get("gpus") or {}, p + ".gpus"), p + ".gpus", known, "GPU").items():
            if any(g.index == idx and g.mig is not None for g in gpus):
                raise r.fail(f"{p}.gpus.{idx}", f"GPU {idx} is in MIG mode and judged per instance: give its "
                             f"instances' verdicts under {p}.mig.{idx}")
            verdicts[idx] = v2.verdicts(r, cause, f"{p}.gpus.{idx}", r.version)
        findings: list[tuple[str, int | None]] = []
        for j, f in enumerate(r.seq(m.get("findings") or [], p + ".findings")):
            fp = item(p + ".findings", j)
            fm = r.mapping(f, fp)
            r.keys(fm, fp, ("check", "gpu"), ("check",))
            check = r.string(fm["check"], fp + ".check")
            if check not in FINDINGS:
                raise r.fail(fp + ".check", f"unknown finding {check!r} (known: {', '.join(FINDINGS)})")
            gpu: int | None = None
            if fm.get("gpu") is not None:
                gpu = r.integer(fm["gpu"], fp + ".gpu")
                if gpu not in known:
                    raise r.fail(fp + ".gpu", f"unknown GPU index {gpu} (known: {list_str(known)})")
            findings.append((check, gpu))
        within: float | None = None
        if m.get("within_s") is not None:
            within = r.number(m["within_s"], p + ".within_s", 0.0)
            ph = next(q for q in phases if q.name == phase)
            if within > ph.duration_s:
                raise r.fail(p + ".within_s", f"{within:g} s is past the end of phase {phase!r} ({ph.duration_s:g} s)")
        out.append(Expectation(
            phase, MappingProxyType(verdicts), tuple(findings),
            v2.finding_bans(r, m.get("no_findings"), p + ".no_findings", r.version, known),
            within_s=within,
            no_findings_anytime=v2.finding_bans(r, m.get("no_findings_anytime"), p + ".no_findings_anytime",
                                                r.version, known),
            evidence_contains=v2.evidence_contains(r, m.get("evidence_contains"), p + ".evidence_contains", known),
            workload=v2.workload(r, m.get("workload"), p + ".workload", known),
            mig=_expect_mig(r, m.get("mig"), p + ".mig", gpus),
        ))
    return tuple(out)


def _expect_mig(r: Reader, v: object, path: str, gpus: tuple[Gpu, ...]) -> MappingProxyType[tuple[int, int], str]:
    """Project key ``expect[].mig``: ``{<gpu index>: {<GPU instance id>: verdict}}``."""
    out: dict[tuple[int, int], str] = {}
    if v is None:
        return MappingProxyType(out)
    mig_gpus = {g.index: g for g in gpus if g.mig is not None}
    for idx, per in indexed(r, r.mapping(v, path), path, set(mig_gpus), "MIG-mode GPU").items():
        gp = f"{path}.{idx}"
        known = {x.gi for x in mig_gpus[idx].mig or ()}
        for gi, cause in indexed(r, r.mapping(per, gp), gp, known, "GPU instance").items():
            c = r.string(cause, f"{gp}.{gi}")
            if c not in VERDICTS:
                raise r.fail(f"{gp}.{gi}", f"unknown verdict {c!r} (known: {', '.join(VERDICTS)})")
            out[(idx, gi)] = c
    return MappingProxyType(out)


__all__ = [
    "CLOCK_EVENT_REASONS",
    "CPU_MODES",
    "DISK_KEYS",
    "FRACTION",
    "GPU_NUMERIC",
    "NFS_OPS",
    "NONNEG",
    "PSI_KEYS",
    "THREAD_STATES",
    "Bridge",
    "CpuModes",
    "DiskState",
    "Expectation",
    "Gpu",
    "GpuState",
    "Host",
    "HostState",
    "Link",
    "MemoryState",
    "NfsState",
    "Noise",
    "PcieCaps",
    "Phase",
    "Process",
    "ProcessState",
    "Scenario",
    "ScenarioError",
    "Square",
    "ThreadGroup",
    "from_dict",
    "load",
    "loads",
]
