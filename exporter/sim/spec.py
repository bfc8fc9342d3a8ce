"""The scenario model, format versions 1 and 2 (``shared/scenarios/SPEC.md``): the validated, resolved values a
loaded scenario is made of. Loading and validation are in :mod:`exporter.sim.scenario`; the meaning of a
numeric :data:`Value` in time is in :mod:`exporter.sim.signal`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Union

from exporter import clockevents


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

CLOCK_EVENT_REASONS = tuple(clockevents.CLOCK_EVENT_REASONS)
THREAD_STATES = ("R", "S", "D")
CPU_MODES = ("user", "system", "iowait", "irq", "softirq")
DISK_KEYS = ("reads_per_s", "read_bytes_per_s", "writes_per_s", "write_bytes_per_s", "await_ms", "in_flight")
NFS_OPS = ("read", "getattr", "open", "lookup")
PSI_KEYS = ("cpu_some", "io_some", "io_full", "memory_some", "memory_full")

# Bounds that keep an accepted scenario playable: SPEC.md sets no limits, these are far beyond any real host
# and stop files that would exhaust memory or never finish (a square wave of period 1e-6 s, a phase of 1e300 s,
# rates of 1e308 whose integrals overflow to infinity).
MAX_MAGNITUDE = 1e15  # any rate, size or count per second (1 PB/s); counters stay finite over MAX_TIMELINE_S
MIN_PERIOD_S = 0.01  # a square wave's period: 10x below the 100 ms sampling floor, nothing sees finer
MAX_PHASE_S = 86400.0  # one phase: a day
MAX_TIMELINE_S = 7 * 86400.0  # all phases: a week (diagnose plays it at ~60x real time: ~3 h)
MAX_PIECES = 1_000_000  # constant pieces of all patterns over the timeline, weighted by the cores they land on
MAX_MHZ = 1e6  # clocks (1 THz)
MAX_CPUS = 8192  # Linux's largest NR_CPUS (x86 MAXSMP); 65536 simulated CPUs took 230 MiB before any render
# Threads of all processes together (each a /proc/<pid>/task/<tid> tree rendered and read every tick): 40 x
# 100,000 reached 6.6 GB in diagnose, 1 x 100,000 wrote 400,204 files; the largest shipped scenario has 1328.
MAX_THREADS = 8192
MAX_PROCESSES = 1024  # processes[] entries (the largest shipped scenario has 72)
MAX_WATTS = 1e6

# Valid range of each numeric GPU / process / host state key; noise is clipped to it.
FRACTION = (0.0, 1.0)
NONNEG = (0.0, MAX_MAGNITUDE)
GPU_NUMERIC: Mapping[str, tuple[float, float]] = MappingProxyType({
    "gpu_util": FRACTION, "sm_active": FRACTION, "sm_occupancy": FRACTION, "tensor_active": FRACTION,
    "dram_active": FRACTION, "pcie_tx_bytes_per_s": NONNEG, "pcie_rx_bytes_per_s": NONNEG,
    "sm_clock_mhz": NONNEG, "power_w": NONNEG, "temperature_c": (-273.0, 1000.0),
    "memory_used_bytes": NONNEG, "pcie_replays_per_s": NONNEG, "aer_correctable_per_s": NONNEG,
})

# ---- GPU health and MIG (project keys, docs/simulator.md; SPEC.md leaves MIG and Xid to the project) ---------
# Numeric GPU state keys for ECC and row remapping: rates of the volatile ECC counts, remapped-row counts.
GPU_HEALTH_NUMERIC: Mapping[str, tuple[float, float]] = MappingProxyType({
    "ecc_corrected_per_s": NONNEG, "ecc_uncorrected_per_s": NONNEG,
    "remapped_rows_correctable": NONNEG, "remapped_rows_uncorrectable": NONNEG,
})
# The activity of a GPU in MIG mode belongs to its instances: these GPU state keys are set per instance
# (``phases[].gpus.<i>.mig.<gi>``) and the GPU's own are derived from them.
MIG_NUMERIC: Mapping[str, tuple[float, float]] = MappingProxyType({
    k: GPU_NUMERIC[k] for k in ("gpu_util", "sm_active", "sm_occupancy", "tensor_active", "dram_active",
                                "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "memory_used_bytes")
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
class MigInstance:
    """A MIG device of a GPU in MIG mode (project key ``gpus[].mig``)."""

    gi: int
    ci: int
    uuid: str
    name: str
    memory_total_bytes: int


@dataclass(frozen=True, slots=True)
class Gpu:
    """A GPU as the host sees it. ``mig`` is None when MIG mode is off, else its instances (maybe none)."""

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
    mig: tuple[MigInstance, ...] | None = None
    nvlinks: int = 0  # NVLinks (0: PCIe only); exporter/sim/interconnect.py
    nvlink_remote: str = "switch"
    nvlink_speed_mbps: int = 25000


@dataclass(frozen=True, slots=True)
class RankOf:
    """One process's place in a distributed job (version-2 key ``processes[].job``): what its launcher puts in
    its environment -- torchrun's ``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE`` / ``TORCHELASTIC_RUN_ID``, or
    ``srun``'s ``SLURM_JOB_ID`` / ``SLURM_STEP_ID`` / ``SLURM_PROCID`` / ``SLURM_NTASKS``."""

    id: str
    rank: int
    world_size: int
    local_rank: int = 0
    launcher: str = "torchrun"  # torchrun | slurm

    def environ(self) -> tuple[str, ...]:
        """The variables the launcher sets, as ``KEY=value``."""
        if self.launcher == "slurm":
            return (f"SLURM_JOB_ID={self.id}", "SLURM_STEP_ID=0", f"SLURM_PROCID={self.rank}",
                    f"SLURM_LOCALID={self.local_rank}", f"SLURM_NTASKS={self.world_size}")
        return (f"RANK={self.rank}", f"LOCAL_RANK={self.local_rank}", f"WORLD_SIZE={self.world_size}",
                f"TORCHELASTIC_RUN_ID={self.id}", "MASTER_ADDR=10.0.0.1", "MASTER_PORT=29500")


@dataclass(frozen=True, slots=True)
class Process:
    """A process using GPUs; its tids are ``pid .. pid+threads-1``. ``mig`` is the GPU instance it runs on
    when its GPUs are in MIG mode (project key ``processes[].mig``)."""

    pid: int
    comm: str
    gpus: tuple[int, ...]
    cpus_allowed: frozenset[int]
    mems_allowed: frozenset[int]
    threads: int
    mig: int | None = None
    # Version 2 (processes[].ppid, cgroup, start_s, exit_s): the parent pid as the file gave it, the name of
    # its entry in host.cgroups (None: the root cgroup), and when it appears in / leaves /proc and NVML.
    ppid: int = 1
    cgroup: str | None = None
    start_s: float | None = None
    exit_s: float | None = None
    # Project keys (version 2, docs/simulator.md): established TCP connections' remote ends, pipes shared by
    # name with other processes, and how many of its threads are blocked receiving on its first connection.
    tcp_remotes: tuple[str, ...] = ()
    pipes: tuple[str, ...] = ()
    receiving_threads: int = 0
    job: RankOf | None = None  # version 2: processes[].job, the distributed job it is one rank of

    def alive(self, t: float) -> bool:
        """Whether the process exists at scenario time ``t`` (SPEC v2 ``start_s``/``exit_s``; an ``exit_s``
        equal to a phase end is still seen by that phase's last evaluation)."""
        return (self.start_s is None or t >= self.start_s) and (self.exit_s is None or t <= self.exit_s)


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
    # Version 2: the cgroup hierarchy the simulator lays out, the cgroups processes name, and the kubelet's
    # pod-resources answer (None: no kubelet on this host).
    cgroup_version: int = 2
    cgroups: Mapping[str, Cgroup] = field(default_factory=lambda: MappingProxyType({}))
    kubernetes: Kubernetes | None = None
    nics: tuple[Nic, ...] = ()  # network adapters on the GPUs' PCIe switches


@dataclass(frozen=True, slots=True)
class Cgroup:
    """A cgroup of ``host.cgroups`` (SPEC v2): its path and limits; ``None`` means no limit."""

    name: str
    path: str  # absolute in the hierarchy, e.g. /kubepods.slice/.../cri-containerd-<id>.scope
    cpu_quota_cores: float | None
    cpu_period_us: int
    cpuset: frozenset[int] | None  # None: every CPU
    memory_max_bytes: int | None


@dataclass(frozen=True, slots=True)
class PodContainer:
    """One container of a pod in the kubelet's answer: its name, its cgroup's entry name, the GPUs assigned."""

    name: str
    cgroup: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Pod:
    """A pod the kubelet's pod-resources API lists."""

    name: str
    namespace: str
    uid: str
    containers: tuple[PodContainer, ...]


@dataclass(frozen=True, slots=True)
class Kubernetes:
    """``host.kubernetes``: what the node's kubelet pod-resources API answers (static)."""

    pods: tuple[Pod, ...]


# ---- resolved state ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Link:
    """A negotiated link."""

    gen: int
    width: int


@dataclass(frozen=True, slots=True)
class MigState:
    """Resolved state of one MIG instance in a phase (the activity keys of a GPU, per instance)."""

    gpu_util: Value
    sm_active: Value
    sm_occupancy: Value
    tensor_active: Value
    dram_active: Value
    pcie_tx_bytes_per_s: Value
    pcie_rx_bytes_per_s: Value
    memory_used_bytes: Value


@dataclass(frozen=True, slots=True)
class Nic:
    """A network adapter port on the PCIe switch of ``gpus`` (GPU indices): exporter/sim/interconnect.py."""

    name: str
    kind: str
    gpus: tuple[int, ...]
    bdf: str
    rate_gbps: float


@dataclass(frozen=True, slots=True)
class NvLinkState:
    """A GPU's NVLinks in a phase: the links down (None: all of them) and the rates of its counters."""

    down: tuple[int, ...] | None = ()
    tx_bytes_per_s: Value = 0.0
    rx_bytes_per_s: Value = 0.0
    replays_per_s: Value = 0.0
    recoveries_per_s: Value = 0.0


@dataclass(frozen=True, slots=True)
class NicState:
    """An adapter in a phase (``rate_gbps`` None: the rate it was described with)."""

    up: bool = True
    rate_gbps: float | None = None
    rx_bytes_per_s: Value = 0.0
    tx_bytes_per_s: Value = 0.0
    symbol_errors_per_s: Value = 0.0
    link_downed_per_s: Value = 0.0


NO_NVLINK = NvLinkState()


@dataclass(frozen=True, slots=True)
class XidEvent:
    """An Xid error the driver reports ``at_s`` seconds into its phase (on MIG instance ``mig``, if given)."""

    at_s: float
    xid: int
    mig: int | None = None


@dataclass(frozen=True, slots=True)
class GpuState:
    """Resolved GPU state in a phase. ``None`` means "the spec's derived default" (it depends on gpu_util).

    Project keys (docs/simulator.md): ECC rates and remapped rows, row-remap flags, the phase's Xid events
    (not carried over: an event happens once) and, on a GPU in MIG mode, each instance's state.
    """

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
    ecc_corrected_per_s: Value = 0.0
    ecc_uncorrected_per_s: Value = 0.0
    remapped_rows_correctable: Value = 0.0
    remapped_rows_uncorrectable: Value = 0.0
    row_remap_pending: bool = False
    row_remap_failure: bool = False
    xid_events: tuple[XidEvent, ...] = ()
    mig: Mapping[int, MigState] = field(default_factory=lambda: MappingProxyType({}))
    nvlink: NvLinkState = NO_NVLINK


@dataclass(frozen=True, slots=True)
class ThreadGroup:
    """``count`` threads, each at ``user`` and ``system`` core fractions, in ``state``."""

    count: int
    user: Value
    system: Value
    state: str
    # Version 2: thread name (None: the process's comm), share of wall time runnable but not running
    # (task/<tid>/schedstat run delay), context-switch rates (task/<tid>/status).
    comm: str | None = None
    run_delay: Value = 0.0
    voluntary_switches_per_s: Value = 0.0
    nonvoluntary_switches_per_s: Value = 0.0


@dataclass(frozen=True, slots=True)
class ProcessState:
    """Resolved process state in a phase."""

    threads_cpu: tuple[ThreadGroup, ...]
    read_bytes_per_s: Value
    read_syscalls_per_s: Value
    cpus_allowed: frozenset[int]
    mems_allowed: frozenset[int]
    storage_read_bytes_per_s: Value = 0.0  # version 2: read_bytes of /proc/<pid>/io
    children_cpu: Value = 0.0  # version 2 (project key): cores its reaped children used (cutime of /proc/<pid>/stat)


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
    cgroups: Mapping[str, CgroupState] = field(default_factory=lambda: MappingProxyType({}))  # v2, by name
    nics: Mapping[str, NicState] = field(default_factory=lambda: MappingProxyType({}))  # by adapter name


CGROUP_PSI_KEYS = ("cpu_some", "cpu_full", "memory_some", "memory_full", "io_some", "io_full")
MEMORY_EVENT_KEYS = ("high_per_s", "max_per_s", "oom_kill_per_s")


@dataclass(frozen=True, slots=True)
class CgroupState:
    """Resolved state of one cgroup in a phase (SPEC v2 ``host.cgroups``); rates per second, fractions 0..1."""

    nr_throttled_per_s: Value = 0.0
    throttled_fraction: Value = 0.0
    memory_current_bytes: Value = 0.0
    memory_events: Mapping[str, Value] = field(
        default_factory=lambda: MappingProxyType(dict.fromkeys(MEMORY_EVENT_KEYS, 0.0)))
    psi: Mapping[str, Value] = field(default_factory=lambda: MappingProxyType(dict.fromkeys(CGROUP_PSI_KEYS, 0.0)))


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


# The attribution labels of gpufeed_workload_info (DESIGN.md "Workloads"), in exposition order.
WORKLOAD_LABELS = ("container_id", "namespace", "pod", "container", "slurm_job_id", "unit", "job_id", "rank",
                   "world_size", "slurm_step")


@dataclass(frozen=True, slots=True)
class Expectation:
    """One ``expect`` entry. ``gpus`` maps a GPU to the verdicts accepted (version 2: a list = any of them);
    ``no_findings`` / ``no_findings_anytime`` hold (check, GPU) pairs, GPU None for a bare name (banned on
    every GPU and host-wide)."""

    phase: str
    gpus: Mapping[int, tuple[str, ...]]
    findings: tuple[tuple[str, int | None], ...]
    no_findings: tuple[tuple[str, int | None], ...]
    mig: Mapping[tuple[int, int], str] = field(default_factory=lambda: MappingProxyType({}))  # (GPU, instance)
    within_s: float | None = None
    no_findings_anytime: tuple[tuple[str, int | None], ...] = ()
    evidence_contains: Mapping[int, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    workload: Mapping[int, Mapping[str, str]] = field(default_factory=lambda: MappingProxyType({}))


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


