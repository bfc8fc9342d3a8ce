"""Scenario files, format version 1 (``shared/scenarios/SPEC.md``): load and validate.

The format is a contract: a file written to the spec that the project has never seen must load. Every
problem is a :class:`ScenarioError` whose message names the file and the key path (``phases[1].gpus.0.
link.gen``) and says what is wrong. Unknown keys are errors. The parts: the model (:mod:`exporter.sim.spec`,
re-exported here), the validation primitives (:mod:`exporter.sim.reader`), the static sections (host, GPUs,
processes) and the expectations (this module), and the phases (:mod:`exporter.sim.phases`).
"""

from __future__ import annotations

import re
from pathlib import Path
from types import MappingProxyType

from exporter import pci, yamlsafe
from exporter.names import FINDINGS, VERDICTS
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
    if version != 1:
        raise r.fail("version", f"unsupported version {version} (this gpufeed reads version 1)")
    name = r.string(top["name"], "name")
    if not name.strip():
        raise r.fail("name", "must not be empty")
    description = r.string(top.get("description", ""), "description") if top.get("description") is not None else ""
    seed = r.integer(top.get("seed", 0), "seed", 0, 2**64 - 1)
    host = _host(r, top["host"])
    gpus = _gpus(r, top["gpus"], host)
    processes = _processes(r, top.get("processes", []), host, gpus)
    phases = phases_of(r, top["phases"], host, gpus, processes)
    expect = _expect(r, top.get("expect", []), phases, gpus)
    return Scenario(path=file, version=version, name=name, description=description.strip(), seed=seed, host=host,
                    gpus=gpus, processes=processes, phases=phases, expect=expect)


def _host(r: Reader, v: object) -> Host:
    m = r.mapping(v, "host")
    r.keys(m, "host", ("cpus", "numa_nodes", "governor", "cpu_max_mhz", "mem_total_bytes", "disks", "nfs"), ("cpus",))
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
    )


def _gpus(r: Reader, v: object, host: Host) -> tuple[Gpu, ...]:
    lst = r.seq(v, "gpus")
    out: list[Gpu] = []
    indices: set[int] = set()
    bdfs: dict[str, str] = {}
    for i, g in enumerate(lst):
        p = item("gpus", i)
        m = r.mapping(g, p)
        r.keys(m, p, ("index", "name", "uuid", "pci_bus_id", "numa_node", "pcie", "upstream", "gpm",
                      "max_sm_clock_mhz", "power_limit_w", "memory_total_bytes"), ("pci_bus_id",))
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
        out.append(Gpu(
            index=index, name=r.string(m.get("name", "NVIDIA H100 80GB HBM3"), p + ".name"), uuid=uuid,
            pci_bus_id=bdf, numa_node=numa, pcie=pcie, upstream=tuple(upstream),
            gpm=r.boolean(m.get("gpm", True), p + ".gpm"),
            max_sm_clock_mhz=r._positive(m.get("max_sm_clock_mhz", 1980), p + ".max_sm_clock_mhz", hi=MAX_MHZ),
            power_limit_w=r._positive(m.get("power_limit_w", 700), p + ".power_limit_w", hi=MAX_WATTS),
            memory_total_bytes=r.integer(m.get("memory_total_bytes", 85899345920), p + ".memory_total_bytes", 1),
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
    known = {g.index for g in gpus}
    out: list[Process] = []
    for i, pr in enumerate(lst):
        p = item("processes", i)
        m = r.mapping(pr, p)
        r.keys(m, p, ("pid", "comm", "gpus", "cpus_allowed", "mems_allowed", "threads"), ("pid", "gpus"))
        pid = r.integer(m["pid"], p + ".pid", 1, 4194304)
        threads = r.integer(m.get("threads", 1), p + ".threads", 1, 100000)
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
        cpus = r.cpulist(m["cpus_allowed"], p + ".cpus_allowed", host.cpus) if "cpus_allowed" in m else \
            frozenset(range(host.cpus))
        mems = r.cpulist(m["mems_allowed"], p + ".mems_allowed", len(host.numa_nodes), "node") \
            if "mems_allowed" in m else frozenset(range(len(host.numa_nodes)))
        for other in out:
            lo, hi = pid, pid + threads - 1
            olo, ohi = other.pid, other.pid + other.threads - 1
            if lo <= ohi and olo <= hi:
                raise r.fail(p + ".pid", f"tids {lo}..{hi} overlap process {other.pid} (tids {olo}..{ohi})")
        out.append(Process(pid=pid, comm=comm, gpus=tuple(gl), cpus_allowed=cpus, mems_allowed=mems, threads=threads))
    return tuple(out)


def _expect(r: Reader, v: object, phases: tuple[Phase, ...], gpus: tuple[Gpu, ...]) -> tuple[Expectation, ...]:
    lst = r.seq(v if v is not None else [], "expect")
    names = {p.name for p in phases}
    known = {g.index for g in gpus}
    out: list[Expectation] = []
    for i, e in enumerate(lst):
        p = item("expect", i)
        m = r.mapping(e, p)
        r.keys(m, p, ("phase", "gpus", "findings", "no_findings"), ("phase",))
        phase = r.string(m["phase"], p + ".phase")
        if phase not in names:
            raise r.fail(p + ".phase", f"unknown phase {phase!r} (phases: {', '.join(q.name for q in phases)})")
        verdicts: dict[int, str] = {}
        for idx, cause in indexed(r, r.mapping(m.get("gpus") or {}, p + ".gpus"), p + ".gpus", known, "GPU").items():
            c = r.string(cause, f"{p}.gpus.{idx}")
            if c not in VERDICTS:
                raise r.fail(f"{p}.gpus.{idx}", f"unknown verdict {c!r} (known: {', '.join(VERDICTS)})")
            verdicts[idx] = c
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
        nof: list[str] = []
        for j, f in enumerate(r.seq(m.get("no_findings") or [], p + ".no_findings")):
            s = r.string(f, item(p + ".no_findings", j))
            if s not in FINDINGS:
                raise r.fail(item(p + ".no_findings", j), f"unknown finding {s!r} (known: {', '.join(FINDINGS)})")
            nof.append(s)
        out.append(Expectation(phase, MappingProxyType(verdicts), tuple(findings), tuple(nof)))
    return tuple(out)


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
