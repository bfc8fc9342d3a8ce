"""Each GPU's workload (DESIGN.md "Workloads"): which processes feed it, the cgroup it runs in, who owns it.

Pure functions over the newest GPU slow sample (NVML's processes and their memory per GPU), the workload
collector's process tree and groups, and the kubelet's device assignments:

- **Context processes**: the NVML processes of the GPU -- except a process that NVML also lists on other GPUs
  where it holds at least 4x the memory: that is a stray context (every ``torchrun`` rank touching
  ``cuda:0``), and the process feeds its own GPU, not this one. Without memory figures, a process listed on
  several GPUs belongs to those where it is the only process.
- **Members**: the context processes, their descendants (not descending into another GPU's context
  process: a rank's workers are its own), and the other processes of their container or Slurm job when that
  group serves this GPU alone -- a launcher that serves eight GPUs is pooled with none of them. A systemd unit
  (a login session, a shared service) and a cgroup known only as the process's own (an unrecognised path)
  lend their limits and identity, never their other processes (``POOLED_KINDS``).
- A GPU NVML shows no process for (a container in another pid namespace) takes the processes of the one
  container whose ``NVIDIA_VISIBLE_DEVICES`` names it.
- **Labels** of ``gpufeed_workload_info``: ``container_id`` / ``slurm_job_id`` / ``unit`` from the group's
  cgroup path, ``namespace`` / ``pod`` / ``container`` from the kubelet's assignment of the GPU's UUID, only
  for a GPU that has a workload. One set per GPU (the join in PromQL needs one series per GPU): the group of
  the context process holding the most GPU memory.
- **Job and rank** (:mod:`exporter.jobident`): ``job_id`` / ``rank`` / ``world_size`` / ``slurm_step`` of that
  same context process, from its launcher's variables and its cgroup path; a rank that names no job in a pod
  takes the pod name's stem.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from exporter import jobident
from exporter.cgroup import OWN_CGROUP
from exporter.derived.hostshape import CpuShape
from exporter.samples.gpu import GpuIdentity, GpuSample, GpuSlow
from exporter.samples.workload import CgroupInfo, KubernetesSample, WorkloadSample
from exporter.snapshot import Stamped

STRAY_MEMORY_RATIO = 4.0  # a context with 4x less memory than the same process holds elsewhere is stray
# Groups whose every process is the workload's: a container, a Slurm job. A systemd unit may be a login
# session or a shared service (session-3.scope, jupyter.service: an unrelated compile in the same session is
# no data loader), and a cgroup known only by its limits says nothing about its other processes: for those the
# workload is the GPU processes' own trees, and the group lends its limits and identity only.
POOLED_KINDS = frozenset({"container", "slurm_job"})
UNSEEN_MIN = 0.25  # cores of a group's usage no process accounts for, before they count
UNSEEN_SHARE = 0.2  # ... and at least this share of its usage
LABELS = ("container_id", "namespace", "pod", "container", "slurm_job_id", "unit", *jobident.LABELS)


@dataclass(frozen=True, slots=True)
class Workload:
    """What feeds one GPU. ``context`` are its NVML processes after stray contexts are set aside;
    ``members`` every process of the workload (``context`` included); ``group`` its cgroup, if any."""

    gpu: int
    context: tuple[int, ...]
    members: tuple[int, ...]
    group: CgroupInfo | None = None
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    notes: tuple[str, ...] = ()
    stray: tuple[int, ...] = ()  # NVML processes of this GPU whose own work is on other GPUs
    pooled: bool = False  # every process of ``group`` is in ``members``: its CPU accounting is the workload's
    # Members without a GPU context that hold TCP connections: (pid, threads waiting to receive, remote ends).
    network: tuple[tuple[int, int, tuple[str, ...]], ...] = ()
    rank: jobident.JobIdentity | None = None  # the distributed job its main context process is one rank of

    def describe(self) -> str:
        """The group for evidence: ``container 3b2a1c4d5e6f (pod vision/trainer-0)``, ``Slurm job 4242``."""
        lb = self.labels
        if "pod" in lb:
            who = f"pod {lb.get('namespace', '?')}/{lb['pod']}"
            return f"container {lb['container']} of {who}" if "container" in lb else who
        if "slurm_job_id" in lb:
            return f"Slurm job {lb['slurm_job_id']}"
        if "container_id" in lb:
            return f"container {lb['container_id'][:12]}"
        if "unit" in lb:
            return f"unit {lb['unit']}"
        if self.group is not None and self.group.kind == OWN_CGROUP:
            return f"cgroup {self.group.path}"
        return ""


def _latest_slow(slow: Sequence[Stamped[GpuSample]]) -> dict[int, GpuSlow]:
    out: dict[int, GpuSlow] = {}
    for s in slow:
        for idx, g in s.value.gpus.items():
            if isinstance(g, GpuSlow):
                out[idx] = g
    return out


def homes(slow: Mapping[int, GpuSlow]) -> tuple[dict[int, tuple[int, ...]], dict[int, tuple[int, ...]]]:
    """(GPU -> its context pids, GPU -> its stray pids) from NVML's process lists and memory per GPU."""
    where: dict[int, dict[int, int | None]] = {}
    for idx, g in slow.items():
        for p in g.processes:
            where.setdefault(p.pid, {})[idx] = p.used_memory_bytes
    count = {idx: len(g.processes) for idx, g in slow.items()}
    context: dict[int, list[int]] = {idx: [] for idx in slow}
    stray: dict[int, list[int]] = {idx: [] for idx in slow}
    for pid, gpus in sorted(where.items()):
        if len(gpus) == 1:
            for idx in gpus:
                context[idx].append(pid)
            continue
        mems = list(gpus.values())
        if all(m is not None for m in mems) and max(m or 0 for m in mems) > 0:
            top = max(m or 0 for m in mems)
            home = {i for i, m in gpus.items() if (m or 0) * STRAY_MEMORY_RATIO >= top}
        else:
            home = {i for i in gpus if count.get(i) == 1} or set(gpus)
        for idx in gpus:
            (context if idx in home else stray)[idx].append(pid)
    for idx in slow:
        if not context[idx] and stray[idx]:
            context[idx], stray[idx] = stray[idx], []  # nothing else feeds it: keep what NVML shows
    return ({i: tuple(v) for i, v in context.items()}, {i: tuple(v) for i, v in stray.items()})


def workloads(
    slow: Sequence[Stamped[GpuSample]],
    identities: Mapping[int, GpuIdentity],
    wl: WorkloadSample | None,
    kube: KubernetesSample | None,
) -> dict[int, Workload]:
    """Every GPU's workload (see the module docstring)."""
    latest = _latest_slow(slow)
    ctx, stray = homes(latest)
    for idx in identities:
        ctx.setdefault(idx, ())
        stray.setdefault(idx, ())
    nodes = wl.processes if wl is not None else {}
    children: dict[int, list[int]] = {}
    for n in nodes.values():
        children.setdefault(n.ppid, []).append(n.pid)
    home_of: dict[int, set[int]] = {}
    for idx, pids in ctx.items():
        for p in pids:
            home_of.setdefault(p, set()).add(idx)
    tree: dict[int, set[int]] = {}
    for idx, pids in ctx.items():
        seen = set(pids)
        todo = [c for p in pids for c in children.get(p, ())]
        while todo:
            q = todo.pop()
            if q in seen or (q in home_of and idx not in home_of[q]):
                continue
            seen.add(q)
            todo.extend(children.get(q, ()))
        tree[idx] = seen
    # A sibling sharing a pipe with a context process (the collector's ``peer``), and its descendants, feed that
    # process's GPU like its own workers.
    for idx, pids in ctx.items():
        todo = [n.pid for n in nodes.values() if n.peer and n.peer in pids]
        while todo:
            q = todo.pop()
            if q in tree[idx] or q in home_of:
                continue
            tree[idx].add(q)
            todo.extend(children.get(q, ()))
    claimed = set().union(*tree.values()) if tree else set()
    groups = wl.groups if wl is not None else {}
    group_gpus: dict[str, set[int]] = {}
    for idx, pids in ctx.items():
        for p in pids:
            node = nodes.get(p)
            if node is not None and node.group is not None:
                group_gpus.setdefault(node.group, set()).add(idx)
    memory = {idx: {p.pid: p.used_memory_bytes or 0 for p in g.processes} for idx, g in latest.items()}
    kube_of = _kube_by_uuid(kube)
    out: dict[int, Workload] = {}
    for idx in sorted(ctx):
        members = set(tree[idx])
        notes: list[str] = []
        primary: CgroupInfo | None = None
        by_mem = sorted(ctx[idx], key=lambda p: (-memory.get(idx, {}).get(p, 0), p))
        for p in by_mem:
            node = nodes.get(p)
            if node is not None and node.group is not None and node.group in groups:
                primary = groups[node.group]
                break
        pooled = False
        for path, gpus in group_gpus.items():
            info = groups.get(path)
            if info is None or idx not in gpus:
                continue
            if len(gpus) == 1 and info.kind in POOLED_KINDS:
                members |= {m for m in info.members if m not in claimed and m in nodes}
                pooled = pooled or (primary is not None and path == primary.path)
        uuid = identities[idx].uuid if idx in identities else ""
        if not ctx[idx]:
            hit = [g for g in groups.values() if g.visible_devices and _sees(g.visible_devices, idx, uuid)]
            if len(hit) == 1:
                primary = hit[0]
                members = {m for m in primary.members if m in nodes}
                notes.append(f"NVML lists no process; {len(members)} processes of the container its "
                             "NVIDIA_VISIBLE_DEVICES names")
        if stray.get(idx):
            notes.append(f"pid {','.join(map(str, stray[idx]))} hold{'s' if len(stray[idx]) == 1 else ''} a stray "
                         f"context on GPU {idx} (their work is on other GPUs): judged there, not here")
        if primary is not None and primary.errors:
            notes.append(f"cgroup files of {primary.path} not readable ({len(primary.errors)}): {primary.errors[0]}")
        if wl is None and ctx[idx]:
            notes.append("process tree not sampled (workload collector disabled or failing): GPU processes only")
        elif wl is not None and wl.note and ctx[idx]:
            notes.append(wl.note)
        labels: dict[str, str] = {}
        if members:
            if primary is not None:
                for key in ("container_id", "slurm_job_id", "unit"):
                    v = getattr(primary, key)
                    if v:
                        labels[key] = str(v)
            k = kube_of.get(uuid)
            if k is not None:
                labels.update(namespace=k[0], pod=k[1], container=k[2])
            elif primary is not None and primary.pod_uid:
                notes.append(f"pod {primary.pod_uid}: namespace and name unknown (the kubelet's pod-resources API "
                             "is not available or does not name this GPU)")
        rank = _rank(by_mem, wl, labels.get("pod")) if members else None
        if rank is not None:
            labels.update(rank.labels())
        out[idx] = Workload(gpu=idx, context=ctx[idx], members=tuple(sorted(members)), group=primary,
                            labels=MappingProxyType({k: labels[k] for k in LABELS if k in labels}),
                            notes=tuple(notes), stray=stray.get(idx, ()), pooled=pooled,
                            network=tuple((p, nodes[p].net_waits, nodes[p].remotes) for p in sorted(members)
                                          if p not in ctx[idx] and p in nodes and nodes[p].remotes), rank=rank)
    return out


def _rank(by_mem: Sequence[int], wl: WorkloadSample | None, pod: str | None) -> jobident.JobIdentity | None:
    """The job and rank of the first context process (most GPU memory first) that has one."""
    ranks = wl.ranks if wl is not None else {}
    for p in by_mem:
        ident = ranks.get(p)
        if ident is not None:
            return jobident.with_pod(ident, pod)
    return None


def _sees(visible: tuple[str, ...], index: int, uuid: str) -> bool:
    """Whether NVIDIA_VISIBLE_DEVICES (UUIDs, indices or ``all``) names this GPU."""
    return any(v == uuid or v == str(index) for v in visible)


def _kube_by_uuid(kube: KubernetesSample | None) -> dict[str, tuple[str, str, str]]:
    """GPU UUID -> (namespace, pod, container); a UUID several containers share (time-slicing) names none --
    the pod-resources API does not say which of them a process belongs to, and a label is never guessed."""
    seen: dict[str, set[tuple[str, str, str]]] = {}
    if kube is None:
        return {}
    for d in kube.devices:
        seen.setdefault(d.device, set()).add((d.namespace, d.pod, d.container))
    return {uuid: next(iter(owners)) for uuid, owners in seen.items() if len(owners) == 1}


# ---- the group's counters over the window ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupSignals:
    """Rates of a workload group's counters over the window (None when not measurable)."""

    throttled_ratio: float | None  # throttled periods / periods
    throttled_per_s: float | None  # throttled seconds per second (summed over the group's CPUs)
    usage_cores: float | None
    memory_events: Mapping[str, int]  # increases of high / max / oom_kill
    psi: Mapping[str, float]  # cpu_some, memory_some, memory_full, io_some ... shares of wall time


def group_signals(window: Sequence[Stamped[WorkloadSample]], path: str) -> GroupSignals:
    """Throttling, usage, memory events and PSI of group ``path`` between the first and last sample seeing it."""
    seen = [(s.t, g) for s in window if (g := s.value.groups.get(path)) is not None]
    if len(seen) < 2 or seen[-1][0] <= seen[0][0]:
        return GroupSignals(None, None, None, MappingProxyType({}), MappingProxyType({}))
    (t0, a), (t1, b) = seen[0], seen[-1]
    dt = t1 - t0
    ratio = per_s = usage = None
    if a.cpu is not None and b.cpu is not None:
        if None not in (a.cpu.nr_periods, b.cpu.nr_periods, a.cpu.nr_throttled, b.cpu.nr_throttled):
            periods = (b.cpu.nr_periods or 0) - (a.cpu.nr_periods or 0)
            thr = (b.cpu.nr_throttled or 0) - (a.cpu.nr_throttled or 0)
            ratio = max(0.0, min(1.0, thr / periods)) if periods > 0 else (0.0 if a.quota_cores else None)
        if a.cpu.throttled_s is not None and b.cpu.throttled_s is not None:
            per_s = max(0.0, b.cpu.throttled_s - a.cpu.throttled_s) / dt
        if a.cpu.usage_s is not None and b.cpu.usage_s is not None:
            usage = max(0.0, b.cpu.usage_s - a.cpu.usage_s) / dt
    events = {k: max(0, b.memory_events[k] - a.memory_events.get(k, b.memory_events[k]))
              for k in b.memory_events}
    psi: dict[str, float] = {}
    for res, tb in b.pressure.items():
        ta = a.pressure.get(res)
        if ta is None:
            continue
        psi[f"{res}_some"] = max(0.0, min(1.0, (tb.some - ta.some) / dt))
        if tb.full is not None and ta.full is not None:
            psi[f"{res}_full"] = max(0.0, min(1.0, (tb.full - ta.full) / dt))
    return GroupSignals(ratio, per_s, usage, MappingProxyType(events), MappingProxyType(psi))


def enrich(shape: CpuShape, wl: Workload | None, sig: GroupSignals | None) -> CpuShape:
    """The CPU shape with the workload's capacity (the smaller of cpuset and CFS quota), throttling, own IO
    pressure, group name and notes."""
    if wl is None:
        return shape
    g = wl.group
    n = shape.allowed_cpus
    cap: float | None = None
    why = ""
    if n:
        cap, why = float(n), f"its {n} allowed CPUs"
    if g is not None and g.cpuset:
        k = min(n, len(g.cpuset)) if n else len(g.cpuset)
        if cap is None or k < cap:
            cap, why = float(k), f"its {k}-CPU cpuset"
    quota = g.quota_cores if g is not None else None
    if quota is not None and (cap is None or quota < cap):
        cap, why = quota, f"its {quota:.3g}-CPU quota"
    unseen = 0.0
    if wl.pooled and sig is not None and sig.usage_cores is not None and shape.processes:
        # The group's own CPU accounting beyond every process seen (workers forked and gone between two
        # samples, and not yet reaped); a margin for the group's and the processes' windows not lining up.
        seen = sum(p.cores for p in shape.processes) + shape.reaped_cores
        extra = sig.usage_cores - seen
        if extra >= max(UNSEEN_MIN, UNSEEN_SHARE * sig.usage_cores):
            unseen = extra
    return dataclasses.replace(
        shape, capacity_cores=cap, capacity_why=why, quota_cores=quota, unseen_cores=unseen, network=wl.network,
        throttled_ratio=sig.throttled_ratio if sig is not None else None,
        throttled_per_s=sig.throttled_per_s if sig is not None else None,
        group_io_some=sig.psi.get("io_some") if sig is not None else None,
        group=wl.describe(), notes=wl.notes)
