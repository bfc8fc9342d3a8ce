"""Samples of the workload and kubernetes collectors: the process tree around the GPU processes, the cgroups
they run in, and what the kubelet says owns each GPU. The derived layer turns them into each GPU's workload
(:mod:`exporter.derived.workload`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from exporter.jobident import JobIdentity
from exporter.samples.host import PressureTotals


@dataclass(frozen=True, slots=True)
class ProcNode:
    """One process of the tree: its parent, name, start time (clock ticks since boot: with the pid, the
    process's identity across pid reuse) and the workload group (cgroup path) it is in, if any."""

    pid: int
    ppid: int
    comm: str
    start: int
    group: str | None = None
    # A worker process's network side (read for processes without a GPU context): its established TCP
    # connections' remote ends, and how many of its threads sleep in a receive on a socket (or in poll/select/
    # epoll while it holds one) -- a loader waiting on an object store shows no CPU, no D state and no iowait.
    remotes: tuple[str, ...] = ()
    net_waits: int = 0
    # A sibling of a GPU process (same parent) sharing a pipe with it beyond stdio -- a decode service a
    # launcher started beside the trainer, talking over a multiprocessing queue: that GPU process's pid.
    peer: int = 0


@dataclass(frozen=True, slots=True)
class CgroupCpu:
    """CPU accounting of a cgroup (cumulative): usage, CFS periods, throttled periods and throttled time."""

    usage_s: float | None
    nr_periods: int | None
    nr_throttled: int | None
    throttled_s: float | None


def _no_pressure() -> Mapping[str, PressureTotals]:
    return MappingProxyType({})


def _no_events() -> Mapping[str, int]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class CgroupInfo:
    """A workload group: a container, a Slurm job or a systemd unit, from its cgroup files.

    ``path`` is the group's cgroup path; ``members`` every pid in it and below it. ``cpuset`` is the
    effective cpuset, ``quota_cores`` the smallest CFS quota on the path up to the root (``quota_path`` the
    cgroup that sets it; its ``cpu`` accounting is where throttling shows). ``memory_events`` holds ``high``,
    ``max`` (v1: ``failcnt``, the limit hits) and ``oom_kill`` counts; ``pressure`` the cgroup's PSI (v2 only).
    A value that could not be read is None and its file is named in ``errors``.
    """

    path: str
    version: int
    kind: str  # container | slurm_job | unit
    members: frozenset[int]
    container_id: str | None = None
    runtime: str | None = None
    pod_uid: str | None = None
    slurm_job_id: str | None = None
    unit: str | None = None
    cpuset: frozenset[int] | None = None
    quota_cores: float | None = None
    quota_path: str | None = None
    cpu: CgroupCpu | None = None
    memory_max: int | None = None
    memory_current: int | None = None
    memory_events: Mapping[str, int] = field(default_factory=_no_events)
    pressure: Mapping[str, PressureTotals] = field(default_factory=_no_pressure)
    visible_devices: tuple[str, ...] | None = None  # NVIDIA_VISIBLE_DEVICES of one of its processes
    errors: tuple[str, ...] = ()


def _no_ranks() -> Mapping[int, JobIdentity]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class WorkloadSample:
    """The GPU processes' tree and groups. ``processes`` holds the GPU processes, their descendants and the
    members of their groups (and of containers that see a GPU); ``groups`` is keyed by cgroup path.
    ``cgroup_version`` is None when no cgroup hierarchy could be read (then ``note`` says why). ``ranks`` holds
    each GPU process's job and rank identity (:mod:`exporter.jobident`) where anything names one."""

    processes: Mapping[int, ProcNode]
    groups: Mapping[str, CgroupInfo]
    cgroup_version: int | None
    note: str | None = None
    ranks: Mapping[int, JobIdentity] = field(default_factory=_no_ranks)


@dataclass(frozen=True, slots=True)
class PodDevice:
    """One assignment of the kubelet's pod-resources API: a container of a pod and a device id (GPU UUID)."""

    namespace: str
    pod: str
    container: str
    resource: str
    device: str


@dataclass(frozen=True, slots=True)
class KubernetesSample:
    """The kubelet's answer (``List``): every container's devices, and when it was fetched (engine time)."""

    devices: tuple[PodDevice, ...]
    fetched_t: float
    pods: int
