"""Scenario files, format version 1 (``shared/scenarios/SPEC.md``): load, validate, resolve phases.

The format is a contract: a file written to the spec that the project has never seen must load. Every
problem is a :class:`ScenarioError` whose message names the file and the key path (``phases[1].gpus.0.
link.gen``) and says what is wrong. Unknown keys are errors.

Phases are stored twice: as written (``Phase.raw_*``, partial) and resolved (``Phase.gpus`` etc.), where
state carries over from the previous phase key by key, nested mappings included (``host.disks.sda.
await_ms`` can change alone), and the initial state is the spec's defaults. Numeric state values are
:data:`Value` (a float, a :class:`Square` or a :class:`Noise`); their meaning in time lives in
:mod:`exporter.sim.signal`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Union

import yaml

from exporter import linkmath, pci
from exporter.cpulist import CpulistError, parse_cpulist
from exporter.names import FINDINGS, VERDICTS


class ScenarioError(Exception):
    """An invalid scenario; the message names the file and the key path."""


@dataclass(frozen=True, slots=True)
class Square:
    """``high`` for the first ``duty`` x ``period_s`` seconds of each period (from the phase start), then ``low``."""

    high: float
    low: float
    period_s: float
    duty: float


@dataclass(frozen=True, slots=True)
class Noise:
    """Gaussian ``mean`` +- ``sd``, clipped to the key's valid range, drawn from the scenario seed."""

    mean: float
    sd: float


Value = Union[float, Square, Noise]  # noqa: UP007 - a runtime alias, kept 3.10-compatible

CLOCK_EVENT_REASONS = (
    "gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost", "sw_thermal",
    "hw_thermal", "hw_power_brake", "display_clock",
)
THREAD_STATES = ("R", "S", "D")
CPU_MODES = ("user", "system", "iowait", "irq", "softirq")
DISK_KEYS = ("reads_per_s", "read_bytes_per_s", "writes_per_s", "write_bytes_per_s", "await_ms", "in_flight")
NFS_OPS = ("read", "getattr", "open", "lookup")
PSI_KEYS = ("cpu_some", "io_some", "io_full", "memory_some", "memory_full")
_DEVNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,31}$")

# Valid range of each numeric GPU / process / host state key; noise is clipped to it.
FRACTION = (0.0, 1.0)
NONNEG = (0.0, math.inf)
GPU_NUMERIC: Mapping[str, tuple[float, float]] = MappingProxyType({
    "gpu_util": FRACTION, "sm_active": FRACTION, "sm_occupancy": FRACTION, "tensor_active": FRACTION,
    "dram_active": FRACTION, "pcie_tx_bytes_per_s": NONNEG, "pcie_rx_bytes_per_s": NONNEG,
    "sm_clock_mhz": NONNEG, "power_w": NONNEG, "temperature_c": (-273.0, 1000.0),
    "memory_used_bytes": NONNEG, "pcie_replays_per_s": NONNEG, "aer_correctable_per_s": NONNEG,
})


# ---- static parts -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bridge:
    """A PCIe bridge between the root complex and a GPU (root first)."""

    bdf: str
    max_gen: int
    max_width: int


@dataclass(frozen=True, slots=True)
class PcieCaps:
    """System-limited max link (sysfs ``max_link_*``) and the GPU's own capability."""

    max_gen: int
    max_width: int
    gpu_max_gen: int
    gpu_max_width: int


@dataclass(frozen=True, slots=True)
class Gpu:
    """A GPU as the host sees it."""

    index: int
    name: str
    uuid: str
    pci_bus_id: str  # sysfs form, lower case
    numa_node: int
    pcie: PcieCaps
    upstream: tuple[Bridge, ...]
    gpm: bool
    max_sm_clock_mhz: float
    power_limit_w: float
    memory_total_bytes: int


@dataclass(frozen=True, slots=True)
class Process:
    """A process using GPUs; its tids are ``pid .. pid+threads-1``."""

    pid: int
    comm: str
    gpus: tuple[int, ...]
    cpus_allowed: frozenset[int]
    mems_allowed: frozenset[int]
    threads: int


@dataclass(frozen=True, slots=True)
class Host:
    """Static host description."""

    cpus: int
    numa_nodes: tuple[frozenset[int], ...]
    governor: str
    cpu_max_mhz: float
    mem_total_bytes: int
    disks: tuple[str, ...]
    nfs: bool


# ---- resolved state ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Link:
    """A negotiated link."""

    gen: int
    width: int


@dataclass(frozen=True, slots=True)
class GpuState:
    """Resolved GPU state in a phase. ``None`` means "the spec's derived default" (it depends on gpu_util)."""

    gpu_util: Value
    sm_active: Value
    sm_occupancy: Value
    tensor_active: Value
    dram_active: Value
    pcie_tx_bytes_per_s: Value
    pcie_rx_bytes_per_s: Value
    link: Link
    sm_clock_mhz: Value | None
    power_w: Value | None
    temperature_c: Value
    clock_event_reasons: tuple[str, ...] | None
    memory_used_bytes: Value
    pcie_replays_per_s: Value
    aer_correctable_per_s: Value
    lost: bool


@dataclass(frozen=True, slots=True)
class ThreadGroup:
    """``count`` threads, each at ``user`` and ``system`` core fractions, in ``state``."""

    count: int
    user: Value
    system: Value
    state: str


@dataclass(frozen=True, slots=True)
class ProcessState:
    """Resolved process state in a phase."""

    threads_cpu: tuple[ThreadGroup, ...]
    read_bytes_per_s: Value
    read_syscalls_per_s: Value
    cpus_allowed: frozenset[int]
    mems_allowed: frozenset[int]


@dataclass(frozen=True, slots=True)
class CpuModes:
    """Core fractions per mode."""

    user: Value
    system: Value
    iowait: Value
    irq: Value
    softirq: Value

    def get(self, mode: str) -> Value:
        """The value of ``mode`` (one of CPU_MODES)."""
        v: Value = getattr(self, mode)
        return v


@dataclass(frozen=True, slots=True)
class DiskState:
    """Rates of one block device."""

    reads_per_s: Value
    read_bytes_per_s: Value
    writes_per_s: Value
    write_bytes_per_s: Value
    await_ms: Value
    in_flight: Value


@dataclass(frozen=True, slots=True)
class NfsState:
    """NFS client op rates."""

    ops_per_s: Mapping[str, Value]
    retrans_per_s: Value


@dataclass(frozen=True, slots=True)
class MemoryState:
    """What /proc/meminfo shows."""

    available_ratio: Value
    dirty_bytes: Value
    writeback_bytes: Value


@dataclass(frozen=True, slots=True)
class HostState:
    """Resolved host state in a phase."""

    cpu_background: CpuModes
    cpu_cores: tuple[tuple[frozenset[int], CpuModes], ...]  # in file order; a later entry wins on overlap
    disks: Mapping[str, DiskState]
    nfs: NfsState
    psi: Mapping[str, Value]
    memory: MemoryState
    oom_kills_per_s: Value
    governor: str


@dataclass(frozen=True, slots=True)
class Phase:
    """One phase: its resolved state for every GPU, process and the host, and where it sits in time."""

    name: str
    duration_s: float
    start_s: float
    index: int
    gpus: Mapping[int, GpuState]
    processes: Mapping[int, ProcessState]
    host: HostState

    @property
    def end_s(self) -> float:
        """Scenario time at the end of the phase."""
        return self.start_s + self.duration_s


@dataclass(frozen=True, slots=True)
class Expectation:
    """One ``expect`` entry."""

    phase: str
    gpus: Mapping[int, str]
    findings: tuple[tuple[str, int | None], ...]
    no_findings: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Scenario:
    """A loaded, validated scenario."""

    path: str
    version: int
    name: str
    description: str
    seed: int
    host: Host
    gpus: tuple[Gpu, ...]
    processes: tuple[Process, ...]
    phases: tuple[Phase, ...]
    expect: tuple[Expectation, ...]

    @property
    def duration_s(self) -> float:
        """Length of one pass of the timeline."""
        return self.phases[-1].end_s

    def gpu(self, index: int) -> Gpu:
        """The GPU with NVML index ``index``."""
        for g in self.gpus:
            if g.index == index:
                return g
        raise KeyError(index)

    def phase_at(self, t: float) -> Phase:
        """The phase playing at scenario time ``t`` (0 <= t < duration; the last phase at or past the end)."""
        for p in self.phases:
            if t < p.end_s:
                return p
        return self.phases[-1]


# ---- the reader ------------------------------------------------------------------------------------------------


class _Reader:
    """Validation helpers that know the file and build key paths for messages."""

    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, path: str, msg: str) -> ScenarioError:
        return ScenarioError(f"{self.file}: {path or '<top level>'}: {msg}")

    def mapping(self, v: object, path: str) -> Mapping[Any, Any]:
        if not isinstance(v, Mapping):
            raise self.fail(path, f"must be a mapping, not {_kind(v)}")
        return v

    def seq(self, v: object, path: str) -> list[Any]:
        if not isinstance(v, list):
            raise self.fail(path, f"must be a list, not {_kind(v)}")
        return v

    def keys(self, m: Mapping[Any, Any], path: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> None:
        for k in m:
            if not isinstance(k, str) or k not in allowed:
                raise self.fail(_join(path, k), f"unknown key (allowed: {', '.join(allowed)})")
        for k in required:
            if k not in m:
                raise self.fail(_join(path, k), "required key missing")

    def number(self, v: object, path: str, lo: float = -math.inf, hi: float = math.inf) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.fail(path, f"must be a number, not {_kind(v)}")
        f = float(v)
        if math.isnan(f) or not lo <= f <= hi:
            raise self.fail(path, f"{v!r} out of range [{lo:g}, {hi:g}]")
        return f

    def integer(self, v: object, path: str, lo: int = -(2**63), hi: int = 2**63) -> int:
        if isinstance(v, bool):
            raise self.fail(path, f"must be an integer, not {_kind(v)}")
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, int):
            raise self.fail(path, f"must be an integer, not {_kind(v)}")
        if not lo <= v <= hi:
            raise self.fail(path, f"{v} out of range [{lo}, {hi}]")
        return v

    def string(self, v: object, path: str) -> str:
        if not isinstance(v, str):
            raise self.fail(path, f"must be a string, not {_kind(v)}")
        return v

    def boolean(self, v: object, path: str) -> bool:
        if not isinstance(v, bool):
            raise self.fail(path, f"must be true or false, not {_kind(v)}")
        return v

    def cpulist(self, v: object, path: str, limit: int, what: str = "CPU") -> frozenset[int]:
        if isinstance(v, int) and not isinstance(v, bool):
            v = str(v)
        text = self.string(v, path)
        try:
            cpus = parse_cpulist(text)
        except CpulistError as e:
            raise self.fail(path, str(e)) from e
        if not cpus:
            raise self.fail(path, f"empty {what} list")
        bad = sorted(c for c in cpus if c >= limit)
        if bad:
            raise self.fail(path, f"{what} {bad[0]} does not exist (host has {limit})")
        return cpus

    def value(self, v: object, path: str, rng: tuple[float, float]) -> Value:
        """A number, ``{square: {...}}`` or ``{noise: {...}}``."""
        lo, hi = rng
        if isinstance(v, Mapping):
            self.keys(v, path, ("square", "noise"))
            if len(v) != 1:
                raise self.fail(path, "a pattern is exactly one of square or noise")
            if "square" in v:
                p = _join(path, "square")
                sq = self.mapping(v["square"], p)
                self.keys(sq, p, ("high", "low", "period_s", "duty"), ("high", "low", "period_s", "duty"))
                return Square(
                    high=self.number(sq["high"], _join(p, "high"), lo, hi),
                    low=self.number(sq["low"], _join(p, "low"), lo, hi),
                    period_s=self._positive(sq["period_s"], _join(p, "period_s")),
                    duty=self.number(sq["duty"], _join(p, "duty"), 0.0, 1.0),
                )
            p = _join(path, "noise")
            nz = self.mapping(v["noise"], p)
            self.keys(nz, p, ("mean", "sd"), ("mean", "sd"))
            return Noise(
                mean=self.number(nz["mean"], _join(p, "mean"), lo, hi),
                sd=self.number(nz["sd"], _join(p, "sd"), 0.0),
            )
        return self.number(v, path, lo, hi)

    def _positive(self, v: object, path: str) -> float:
        f = self.number(v, path, 0.0)
        if f <= 0:
            raise self.fail(path, "must be positive")
        return f


def _kind(v: object) -> str:
    if v is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a mapping"}.get(type(v), type(v).__name__)


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _item(path: str, i: int) -> str:
    return f"{path}[{i}]"


# ---- loading ---------------------------------------------------------------------------------------------------


def load(path: str | Path) -> Scenario:
    """Read and validate a scenario file; ScenarioError (file and key named) on any problem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ScenarioError(f"{p}: cannot read: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise ScenarioError(f"{p}: not UTF-8 text: {e}") from e
    return loads(text, str(p))


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 floats (``1.5e9``, ``6e9``: YAML 1.1 reads them as strings) and no duplicate keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, list | dict):
                continue
            if key in seen and key != "<<":
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def loads(text: str, file: str = "<scenario>") -> Scenario:
    """Validate scenario YAML text; ``file`` names it in messages."""
    try:
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as e:
        raise ScenarioError(f"{file}: invalid YAML: {e}") from e
    return from_dict(data, file)


def from_dict(data: object, file: str = "<scenario>") -> Scenario:
    """Validate an already-parsed document."""
    r = _Reader(file)
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
    phases = _phases(r, top["phases"], host, gpus, processes)
    expect = _expect(r, top.get("expect", []), phases, gpus)
    return Scenario(path=file, version=version, name=name, description=description.strip(), seed=seed, host=host,
                    gpus=gpus, processes=processes, phases=phases, expect=expect)


def _host(r: _Reader, v: object) -> Host:
    m = r.mapping(v, "host")
    r.keys(m, "host", ("cpus", "numa_nodes", "governor", "cpu_max_mhz", "mem_total_bytes", "disks", "nfs"), ("cpus",))
    cpus = r.integer(m["cpus"], "host.cpus", 1, 65536)
    nodes: list[frozenset[int]] = []
    if "numa_nodes" in m:
        seen: dict[int, int] = {}
        raw_nodes = r.seq(m["numa_nodes"], "host.numa_nodes")
        if not raw_nodes:
            raise r.fail("host.numa_nodes", "must list at least one node")
        for i, n in enumerate(raw_nodes):
            p = _item("host.numa_nodes", i)
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
    governor = _governor(r, m.get("governor", "performance"), "host.governor")
    disks: tuple[str, ...] = ("nvme0n1",)
    if "disks" in m:
        lst = r.seq(m["disks"], "host.disks")
        names = []
        for i, d in enumerate(lst):
            s = r.string(d, _item("host.disks", i))
            if not _DEVNAME.match(s):
                raise r.fail(_item("host.disks", i), f"bad block device name {s!r}")
            if s in names:
                raise r.fail(_item("host.disks", i), f"disk {s!r} listed twice")
            names.append(s)
        disks = tuple(names)
    return Host(
        cpus=cpus, numa_nodes=tuple(nodes), governor=governor,
        cpu_max_mhz=r._positive(m.get("cpu_max_mhz", 3000), "host.cpu_max_mhz"),
        mem_total_bytes=r.integer(m.get("mem_total_bytes", 549755813888), "host.mem_total_bytes", 1),
        disks=disks, nfs=r.boolean(m.get("nfs", False), "host.nfs"),
    )


def _governor(r: _Reader, v: object, path: str) -> str:
    s = r.string(v, path)
    if not re.match(r"^[a-z_]{1,32}$", s):
        raise r.fail(path, f"bad governor name {s!r}")
    return s


def _gpus(r: _Reader, v: object, host: Host) -> tuple[Gpu, ...]:
    lst = r.seq(v, "gpus")
    out: list[Gpu] = []
    indices: set[int] = set()
    bdfs: dict[str, str] = {}
    for i, g in enumerate(lst):
        p = _item("gpus", i)
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
            bp = _item(p + ".upstream", j)
            bm = r.mapping(b, bp)
            r.keys(bm, bp, ("bdf", "max_gen", "max_width"), ("bdf",))
            bb = _bdf(r, bm["bdf"], bp + ".bdf")
            if bb == bdf:
                raise r.fail(bp + ".bdf", "a bridge cannot have the GPU's own address")
            if any(x.bdf == bb for x in upstream):
                raise r.fail(bp + ".bdf", f"{bb} appears twice in the chain")
            if bb in bdfs and bdfs[bb].endswith(".pci_bus_id"):
                raise r.fail(bp + ".bdf", f"{bb} is a GPU ({bdfs[bb]})")
            upstream.append(Bridge(bb, _gen(r, bm.get("max_gen", pcie.max_gen), bp + ".max_gen"),
                                   _width(r, bm.get("max_width", pcie.max_width), bp + ".max_width")))
        uuid = r.string(m.get("uuid", f"GPU-00000000-0000-0000-0000-{index:012d}"), p + ".uuid")
        out.append(Gpu(
            index=index, name=r.string(m.get("name", "NVIDIA H100 80GB HBM3"), p + ".name"), uuid=uuid,
            pci_bus_id=bdf, numa_node=numa, pcie=pcie, upstream=tuple(upstream),
            gpm=r.boolean(m.get("gpm", True), p + ".gpm"),
            max_sm_clock_mhz=r._positive(m.get("max_sm_clock_mhz", 1980), p + ".max_sm_clock_mhz"),
            power_limit_w=r._positive(m.get("power_limit_w", 700), p + ".power_limit_w"),
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


def _bdf(r: _Reader, v: object, path: str) -> str:
    s = r.string(v, path).strip()
    norm = pci.normalize(s)
    if norm is None or len(s) != 12:
        raise r.fail(path, f"bad PCI address {s!r} (expected domain:bus:device.function, e.g. 0000:82:00.0; "
                     "device 00-1f, function 0-7)")
    return norm


def _gen(r: _Reader, v: object, path: str) -> int:
    g = r.integer(v, path)
    if g not in linkmath.GENERATIONS:
        raise r.fail(path, f"PCIe generation must be 1-6, not {g}")
    return g


def _width(r: _Reader, v: object, path: str) -> int:
    w = r.integer(v, path)
    if w not in (1, 2, 4, 8, 12, 16, 32):
        raise r.fail(path, f"PCIe width must be 1, 2, 4, 8, 12, 16 or 32, not {w}")
    return w


def _pcie(r: _Reader, v: object, path: str) -> PcieCaps:
    m = r.mapping(v, path)
    r.keys(m, path, ("max_gen", "max_width", "gpu_max_gen", "gpu_max_width"))
    mg = _gen(r, m.get("max_gen", 5), path + ".max_gen")
    mw = _width(r, m.get("max_width", 16), path + ".max_width")
    return PcieCaps(mg, mw, _gen(r, m.get("gpu_max_gen", mg), path + ".gpu_max_gen"),
                    _width(r, m.get("gpu_max_width", mw), path + ".gpu_max_width"))


def _processes(r: _Reader, v: object, host: Host, gpus: tuple[Gpu, ...]) -> tuple[Process, ...]:
    lst = r.seq(v if v is not None else [], "processes")
    known = {g.index for g in gpus}
    out: list[Process] = []
    for i, pr in enumerate(lst):
        p = _item("processes", i)
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
            idx = r.integer(gi, _item(p + ".gpus", j))
            if idx not in known:
                raise r.fail(_item(p + ".gpus", j), f"unknown GPU index {idx} (known: {_list(known)})")
            if idx in gl:
                raise r.fail(_item(p + ".gpus", j), f"GPU {idx} listed twice")
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


def _list(s: set[int]) -> str:
    return ", ".join(str(x) for x in sorted(s)) or "none"


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


def _gpu_partial(r: _Reader, v: object, path: str, gpu: Gpu) -> Partial:
    m = r.mapping(v if v is not None else {}, path)
    r.keys(m, path, _GPU_STATE_KEYS)
    out: Partial = {}
    for k, raw in m.items():
        kp = _join(path, k)
        if k in GPU_NUMERIC:
            out[k] = r.value(raw, kp, GPU_NUMERIC[k])
        elif k == "link":
            lm = r.mapping(raw, kp)
            r.keys(lm, kp, ("gen", "width"))
            link: Partial = {}
            if "gen" in lm:
                link["gen"] = _gen(r, lm["gen"], kp + ".gen")
                if link["gen"] > gpu.pcie.gpu_max_gen:
                    raise r.fail(kp + ".gen", f"Gen{link['gen']} is above the GPU's own max Gen{gpu.pcie.gpu_max_gen}")
            if "width" in lm:
                link["width"] = _width(r, lm["width"], kp + ".width")
                if link["width"] > gpu.pcie.gpu_max_width:
                    raise r.fail(kp + ".width",
                                 f"x{link['width']} is above the GPU's own max x{gpu.pcie.gpu_max_width}")
            out[k] = link
        elif k == "clock_event_reasons":
            reasons: list[str] = []
            for j, x in enumerate(r.seq(raw, kp)):
                s = r.string(x, _item(kp, j))
                if s not in CLOCK_EVENT_REASONS:
                    raise r.fail(_item(kp, j),
                                 f"unknown clock event reason {s!r} (known: {', '.join(CLOCK_EVENT_REASONS)})")
                if s not in reasons:
                    reasons.append(s)
            out[k] = tuple(reasons)
        else:
            out[k] = r.boolean(raw, kp)
    return out


def _proc_partial(r: _Reader, v: object, path: str, proc: Process, host: Host) -> Partial:
    m = r.mapping(v if v is not None else {}, path)
    r.keys(m, path, ("threads_cpu", "read_bytes_per_s", "read_syscalls_per_s", "cpus_allowed", "mems_allowed"))
    out: Partial = {}
    for k, raw in m.items():
        kp = _join(path, k)
        if k == "threads_cpu":
            groups: list[ThreadGroup] = []
            total = 0
            for j, tg in enumerate(r.seq(raw, kp)):
                gp = _item(kp, j)
                gm = r.mapping(tg, gp)
                r.keys(gm, gp, ("count", "user", "system", "state"), ("count",))
                count = r.integer(gm["count"], gp + ".count", 1)
                state = r.string(gm.get("state", "S"), gp + ".state")
                if state not in THREAD_STATES:
                    raise r.fail(gp + ".state", f"thread state must be R, S or D, not {state!r}")
                total += count
                if total > proc.threads:
                    raise r.fail(gp + ".count", f"{total} threads described but process {proc.pid} has "
                                 f"{proc.threads} (processes[].threads)")
                groups.append(ThreadGroup(count, r.value(gm.get("user", 0.0), gp + ".user", FRACTION),
                                          r.value(gm.get("system", 0.0), gp + ".system", FRACTION), state))
            out[k] = tuple(groups)
        elif k in ("read_bytes_per_s", "read_syscalls_per_s"):
            out[k] = r.value(raw, kp, NONNEG)
        elif k == "cpus_allowed":
            out[k] = r.cpulist(raw, kp, host.cpus)
        else:
            out[k] = r.cpulist(raw, kp, len(host.numa_nodes), "node")
    return out


def _modes_partial(r: _Reader, v: object, path: str) -> Partial:
    m = r.mapping(v, path)
    r.keys(m, path, CPU_MODES)
    return {k: r.value(x, _join(path, k), FRACTION) for k, x in m.items()}


def _host_partial(r: _Reader, v: object, path: str, host: Host) -> Partial:
    m = r.mapping(v if v is not None else {}, path)
    r.keys(m, path, ("cpu_background", "cpu_cores", "disks", "nfs", "psi", "memory", "oom_kills_per_s", "governor"))
    out: Partial = {}
    for k, raw in m.items():
        kp = _join(path, k)
        if k == "cpu_background":
            out[k] = _modes_partial(r, raw, kp)
        elif k == "cpu_cores":
            cm = r.mapping(raw, kp)
            cores: Partial = {}
            for cl, modes in cm.items():
                key = str(cl)
                cpus = r.cpulist(key, _join(kp, key), host.cpus)
                cores[key] = {"_cpus": cpus, **_modes_partial(r, modes, _join(kp, key))}
            out[k] = cores
        elif k == "disks":
            dm = r.mapping(raw, kp)
            disks: Partial = {}
            for dev, st in dm.items():
                dp = _join(kp, dev)
                if dev not in host.disks:
                    raise r.fail(dp, f"unknown disk {dev!r} (host.disks: {', '.join(host.disks) or 'none'})")
                sm = r.mapping(st, dp)
                r.keys(sm, dp, DISK_KEYS)
                disks[str(dev)] = {x: r.value(y, _join(dp, x), NONNEG) for x, y in sm.items()}
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
                nfs["ops_per_s"] = {x: r.value(y, _join(kp + ".ops_per_s", x), NONNEG) for x, y in om.items()}
            if "retrans_per_s" in nm:
                nfs["retrans_per_s"] = r.value(nm["retrans_per_s"], kp + ".retrans_per_s", NONNEG)
            out[k] = nfs
        elif k == "psi":
            pm = r.mapping(raw, kp)
            r.keys(pm, kp, PSI_KEYS)
            out[k] = {x: r.value(y, _join(kp, x), FRACTION) for x, y in pm.items()}
        elif k == "memory":
            mm = r.mapping(raw, kp)
            r.keys(mm, kp, ("available_ratio", "dirty_bytes", "writeback_bytes"))
            out[k] = {x: r.value(y, _join(kp, x), FRACTION if x == "available_ratio" else NONNEG)
                      for x, y in mm.items()}
        elif k == "oom_kills_per_s":
            out[k] = r.value(raw, kp, NONNEG)
        else:
            out[k] = _governor(r, raw, kp)
    return out


def _indexed(r: _Reader, m: Mapping[Any, Any], path: str, known: set[int], what: str) -> dict[int, Any]:
    out: dict[int, Any] = {}
    for k, v in m.items():
        kp = _join(path, k)
        try:
            idx = int(str(k), 10) if not isinstance(k, bool) else None
        except ValueError:
            idx = None
        if idx is None:
            raise r.fail(kp, f"{what} key must be an integer, not {k!r}")
        if idx not in known:
            raise r.fail(kp, f"unknown {what} {idx} (known: {_list(known)})")
        out[idx] = v
    return out


def _phases(r: _Reader, v: object, host: Host, gpus: tuple[Gpu, ...], procs: tuple[Process, ...]) -> tuple[Phase, ...]:
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
    for i, ph in enumerate(lst):
        p = _item("phases", i)
        m = r.mapping(ph, p)
        r.keys(m, p, ("name", "duration_s", "gpus", "processes", "host"), ("name", "duration_s"))
        name = r.string(m["name"], p + ".name")
        if not name:
            raise r.fail(p + ".name", "must not be empty")
        if name in names:
            raise r.fail(p + ".name", f"phase name {name!r} used twice")
        names.add(name)
        duration = r._positive(m["duration_s"], p + ".duration_s")
        gpus_m = r.mapping(m.get("gpus") or {}, p + ".gpus")
        for idx, gv in _indexed(r, gpus_m, p + ".gpus", set(gpu_by), "GPU").items():
            gstate[idx] = _merge(gstate[idx], _gpu_partial(r, gv, f"{p}.gpus.{idx}", gpu_by[idx]))
        procs_m = r.mapping(m.get("processes") or {}, p + ".processes")
        for pid, pv in _indexed(r, procs_m, p + ".processes", set(proc_by), "pid").items():
            pstate[pid] = _merge(pstate[pid], _proc_partial(r, pv, f"{p}.processes.{pid}", proc_by[pid], host))
        hstate = _merge(hstate, _host_partial(r, m.get("host") or {}, p + ".host", host))
        out.append(Phase(
            name=name, duration_s=duration, start_s=start, index=i,
            gpus=MappingProxyType({g: _gpu_state(gstate[g], gpu_by[g]) for g in sorted(gstate)}),
            processes=MappingProxyType({q: _proc_state(pstate[q], proc_by[q]) for q in sorted(pstate)}),
            host=_host_state(hstate, host),
        ))
        start += duration
    return tuple(out)


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
    )


def _proc_state(s: Partial, proc: Process) -> ProcessState:
    return ProcessState(
        threads_cpu=s.get("threads_cpu", ()), read_bytes_per_s=s.get("read_bytes_per_s", 0.0),
        read_syscalls_per_s=s.get("read_syscalls_per_s", 0.0),
        cpus_allowed=s.get("cpus_allowed", proc.cpus_allowed), mems_allowed=s.get("mems_allowed", proc.mems_allowed),
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
    )


def _expect(r: _Reader, v: object, phases: tuple[Phase, ...], gpus: tuple[Gpu, ...]) -> tuple[Expectation, ...]:
    lst = r.seq(v if v is not None else [], "expect")
    names = {p.name for p in phases}
    known = {g.index for g in gpus}
    out: list[Expectation] = []
    for i, e in enumerate(lst):
        p = _item("expect", i)
        m = r.mapping(e, p)
        r.keys(m, p, ("phase", "gpus", "findings", "no_findings"), ("phase",))
        phase = r.string(m["phase"], p + ".phase")
        if phase not in names:
            raise r.fail(p + ".phase", f"unknown phase {phase!r} (phases: {', '.join(q.name for q in phases)})")
        verdicts: dict[int, str] = {}
        for idx, cause in _indexed(r, r.mapping(m.get("gpus") or {}, p + ".gpus"), p + ".gpus", known, "GPU").items():
            c = r.string(cause, f"{p}.gpus.{idx}")
            if c not in VERDICTS:
                raise r.fail(f"{p}.gpus.{idx}", f"unknown verdict {c!r} (known: {', '.join(VERDICTS)})")
            verdicts[idx] = c
        findings: list[tuple[str, int | None]] = []
        for j, f in enumerate(r.seq(m.get("findings") or [], p + ".findings")):
            fp = _item(p + ".findings", j)
            fm = r.mapping(f, fp)
            r.keys(fm, fp, ("check", "gpu"), ("check",))
            check = r.string(fm["check"], fp + ".check")
            if check not in FINDINGS:
                raise r.fail(fp + ".check", f"unknown finding {check!r} (known: {', '.join(FINDINGS)})")
            gpu: int | None = None
            if fm.get("gpu") is not None:
                gpu = r.integer(fm["gpu"], fp + ".gpu")
                if gpu not in known:
                    raise r.fail(fp + ".gpu", f"unknown GPU index {gpu} (known: {_list(known)})")
            findings.append((check, gpu))
        nof: list[str] = []
        for j, f in enumerate(r.seq(m.get("no_findings") or [], p + ".no_findings")):
            s = r.string(f, _item(p + ".no_findings", j))
            if s not in FINDINGS:
                raise r.fail(_item(p + ".no_findings", j), f"unknown finding {s!r} (known: {', '.join(FINDINGS)})")
            nof.append(s)
        out.append(Expectation(phase, MappingProxyType(verdicts), tuple(findings), tuple(nof)))
    return tuple(out)
