"""cgroup formats, v1 and v2: ``/proc/<pid>/cgroup`` lines, the files of a cgroup, and what a path says about
who owns it (container id, Kubernetes pod UID, Slurm job, systemd unit). Pure parsing; the I/O is the
workload collector's (:mod:`exporter.collectors.workload`).

References: Documentation/admin-guide/cgroup-v2.rst (``cpu.max``, ``cpu.stat``, ``memory.events``,
``cpuset.cpus.effective``, PSI files), Documentation/admin-guide/cgroup-v1/{cpusets,memory}.rst and
Documentation/scheduler/sched-bwc.rst (``cpu.cfs_quota_us``, ``cpu.stat`` ``throttled_time`` in ns),
proc(5) (``/proc/<pid>/cgroup``: ``hierarchy-ID:controller-list:cgroup-path``).

Path shapes recognised (the kubelet's two cgroup drivers, the container runtimes, Slurm's two plugins)::

    /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6f1c..._...slice/cri-containerd-<id>.scope
    /kubepods.slice/kubepods-pod<uid>.slice/crio-<id>.scope            (guaranteed QoS, CRI-O)
    /kubepods/burstable/pod6f1c...-.../<id>                              (cgroupfs driver)
    /system.slice/docker-<id>.scope   /docker/<id>                         (docker, systemd / cgroupfs)
    /system.slice/slurmstepd.scope/job_4242/step_0/user/task_0           (Slurm, cgroup/v2)
    /slurm/uid_1000/job_4242/step_0                                        (Slurm, cgroup/v1)
    /system.slice/trainer.service   /user.slice/user-1000.slice/session-3.scope   (systemd units)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A container id as runtimes write it: 64 hex digits (docker, containerd, CRI-O).
_CONTAINER_SCOPE = re.compile(r"^(?:(cri-containerd|crio|docker|containerd)-)?([0-9a-f]{64})(?:\.scope)?$")
_POD = re.compile(r"^(?:kubepods-(?:besteffort-|burstable-|guaranteed-)?)?pod([0-9a-fA-F_-]{32,36})(?:\.slice)?$")
_SLURM_JOB = re.compile(r"^job_(\d+)$")
_UNIT = re.compile(r"^[A-Za-z0-9:_.@\\-]+\.(service|scope)$")
# systemd slices and scopes that hold many unrelated processes: never a workload's own group.
_SHARED = frozenset({"init.scope", "system.slice", "user.slice", "machine.slice", "kubepods.slice", "kubepods",
                     "slurmstepd.scope", "containerd.service", "docker.service", "crio.service", "kubelet.service"})
OWN_CGROUP = "cgroup"  # the kind of a group known only as a GPU process's own cgroup
RUNTIMES = {"cri-containerd": "containerd", "containerd": "containerd", "crio": "cri-o", "docker": "docker"}
NO_LIMIT = None


class CgroupFormatError(ValueError):
    """A cgroup file that does not say what the kernel writes there."""


@dataclass(frozen=True, slots=True)
class Membership:
    """Where a process sits: the v2 path (``0::``) and the v1 path per controller (hybrid hosts have both)."""

    unified: str | None
    controllers: tuple[tuple[str, str], ...]  # (controller list as mounted, e.g. "cpu,cpuacct", path)

    def v1(self, controller: str) -> tuple[str, str] | None:
        """(mount name, path) of the v1 hierarchy that has ``controller`` (cpu, cpuset, memory, pids...)."""
        for names, path in self.controllers:
            if controller in names.split(","):
                return names, path
        return None

    @property
    def path(self) -> str:
        """The path that names the process's place: the unified one, else the first v1 controller's."""
        if self.unified is not None and (self.unified != "/" or not self.controllers):
            return self.unified
        for want in ("cpu", "memory", "pids", "name=systemd"):
            hit = self.v1(want)
            if hit is not None and hit[1] != "/":
                return hit[1]
        return self.unified or (self.controllers[0][1] if self.controllers else "/")


def parse_proc_cgroup(text: str) -> Membership:
    """``/proc/<pid>/cgroup``: ``0::/path`` (v2) and ``N:ctrl[,ctrl]:/path`` lines (v1)."""
    unified: str | None = None
    ctrls: list[tuple[str, str]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[0].isdigit() or not parts[2].startswith("/"):
            raise CgroupFormatError(f"not a cgroup line: {line[:80]!r}")
        hid, names, path = parts
        path = path.removesuffix(" (deleted)")
        if hid == "0" and names == "":
            unified = path
        elif names:
            ctrls.append((names, path))
    if unified is None and not ctrls:
        raise CgroupFormatError("no cgroup lines")
    return Membership(unified, tuple(ctrls))


@dataclass(frozen=True, slots=True)
class Owner:
    """Who a cgroup path belongs to, and which ancestor of it is the workload's group (None: none is)."""

    group: str | None  # the container / job / unit cgroup: every process below it is in the same workload
    kind: str | None  # "container", "slurm_job", "unit" or "cgroup" (own_group)
    container_id: str | None = None
    runtime: str | None = None
    pod_uid: str | None = None
    slurm_job_id: str | None = None
    unit: str | None = None


def owner_of(path: str) -> Owner:
    """What a cgroup path says about its owner; the root, a bare slice and shared services own nothing."""
    parts = [p for p in path.split("/") if p]
    pod_uid: str | None = None
    for i, part in enumerate(parts):
        pm = _POD.match(part)
        if pm is not None and (i > 0 and parts[0].startswith("kubepods")):
            pod_uid = pm.group(1).replace("_", "-").lower()
        cm = _CONTAINER_SCOPE.match(part)
        if cm is not None and (i > 0 or cm.group(1)):
            runtime = RUNTIMES.get(cm.group(1) or ("docker" if parts[0] == "docker" else ""))
            if runtime is None and pod_uid is not None:
                runtime = "cri"  # cgroupfs driver: the path does not name the runtime
            return Owner("/" + "/".join(parts[:i + 1]), "container", container_id=cm.group(2), runtime=runtime,
                         pod_uid=pod_uid)
        jm = _SLURM_JOB.match(part)
        if jm is not None and any("slurm" in q for q in parts[:i]):
            return Owner("/" + "/".join(parts[:i + 1]), "slurm_job", slurm_job_id=jm.group(1))
    for i in range(len(parts) - 1, -1, -1):
        part = parts[i]
        if part in _SHARED or (part.startswith(("kubepods", "user-")) and part.endswith(".slice")):
            break
        if _UNIT.match(part) and not part.endswith(".slice"):
            return Owner("/" + "/".join(parts[:i + 1]), "unit", unit=part)
    return Owner(None, None, pod_uid=pod_uid)


def own_group(path: str) -> Owner:
    """A process's own cgroup as its group when no owner is recognised in the path (:func:`owner_of`): any path
    below the root and outside the shared slices (``system.slice`` ...), whatever made it -- its CPU quota,
    cpuset and memory limit apply all the same (YARN ``/hadoop-yarn/container_*``, LXC ``/lxc.payload.c1``,
    podman on cgroupfs ``/libpod_parent/libpod-<id>``, ``cgcreate -g cpu:/trainer``)."""
    parts = [p for p in path.split("/") if p]
    if not parts or parts[-1] in _SHARED or parts[-1].endswith(".slice"):
        return Owner(None, None)
    return Owner("/" + "/".join(parts), OWN_CGROUP)


def ancestors(path: str) -> list[str]:
    """``path`` and its ancestors below the root, deepest first: /a/b/c, /a/b, /a."""
    parts = [p for p in path.split("/") if p]
    return ["/" + "/".join(parts[:i]) for i in range(len(parts), 0, -1)]


# ---- files -------------------------------------------------------------------------------------------------------


def parse_cpu_max(text: str) -> tuple[float | None, int]:
    """v2 ``cpu.max``: ``$MAX $PERIOD`` in microseconds, ``max`` = no limit -> (quota in cores or None, period)."""
    parts = text.split()
    if len(parts) != 2 or not parts[1].isdigit() or int(parts[1]) <= 0:
        raise CgroupFormatError(f"cpu.max: {text.strip()[:40]!r}")
    period = int(parts[1])
    if parts[0] == "max":
        return None, period
    if not parts[0].isdigit():
        raise CgroupFormatError(f"cpu.max: {text.strip()[:40]!r}")
    return int(parts[0]) / period, period


def parse_cfs(quota_text: str, period_text: str) -> tuple[float | None, int]:
    """v1 ``cpu.cfs_quota_us`` (-1 = no limit) and ``cpu.cfs_period_us`` -> (quota in cores or None, period)."""
    try:
        quota, period = int(quota_text.strip()), int(period_text.strip())
    except ValueError as e:
        raise CgroupFormatError(f"cpu.cfs_quota_us/cpu.cfs_period_us: {e}") from e
    if period <= 0:
        raise CgroupFormatError(f"cpu.cfs_period_us: {period}")
    return (None if quota < 0 else quota / period), period


def parse_flat_keyed(text: str) -> dict[str, int]:
    """A flat-keyed file (``key value`` per line): cpu.stat, memory.events, memory.oom_control."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2:
            raise CgroupFormatError(f"not 'key value': {line[:60]!r}")
        try:
            out[parts[0]] = int(parts[1])
        except ValueError as e:
            raise CgroupFormatError(f"not an integer in {line[:60]!r}") from e
    return out


def parse_memory_limit(text: str, version: int) -> int | None:
    """v2 ``memory.max`` (``max`` = none) or v1 ``memory.limit_in_bytes`` (a value near 2^63 = none)."""
    s = text.strip()
    if version == 2 and s == "max":
        return None
    if not s.isdigit():
        raise CgroupFormatError(f"memory limit: {s[:40]!r}")
    v = int(s)
    # v1 without a limit reports PAGE_COUNTER_MAX pages in bytes, rounded to the page size: ~2^63.
    return None if version == 1 and v >= 1 << 62 else v


def visible_devices(environ: bytes) -> tuple[str, ...] | None:
    """``NVIDIA_VISIBLE_DEVICES`` from a process's NUL-separated environment (the NVIDIA device plugin and
    ``docker --gpus`` set it to the GPUs given to the container), None when unset. Nothing else is kept."""
    for entry in environ.split(b"\0"):
        if entry.startswith(b"NVIDIA_VISIBLE_DEVICES="):
            value = entry.split(b"=", 1)[1].decode("ascii", "replace").strip()
            return tuple(v.strip() for v in value.split(",") if v.strip())
    return None
