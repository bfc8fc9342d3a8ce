"""What feeds each GPU: the process tree around its NVML processes and the cgroups they run in.

NVML lists only processes holding a CUDA context; a GPU is fed by more -- the data-loader worker processes a
PyTorch ``DataLoader(num_workers=N)`` forks, tokenizer pools, everything in the same container or job. Every
``--collector.workload.interval`` (5 s: a job that ends and the next that starts are followed within one
classifier window, and the cgroup counters give the window at least three samples) this collector reads:

- the process table (``/proc/<pid>/stat``: parent, name, start time), incrementally: a pid is read once when
  it appears and again only if its parent exits (re-parenting), so a pass costs one directory listing plus
  the new processes -- the GPU processes' descendants follow from it;
- ``/proc/<pid>/cgroup`` of each GPU process, and the workload group its path names (a container, a Slurm
  job, a systemd unit: :func:`exporter.cgroup.owner_of`), with every process in that group
  (``cgroup.procs`` of the group and below);
- that group's files, cgroup v1 or v2 under ``<path.sysfs>/fs/cgroup``: the CFS quota on the path up to the
  root (``cpu.max`` / ``cpu.cfs_quota_us``) and its throttling (``cpu.stat``), the effective cpuset, the
  memory limit and usage, ``memory.events`` (v1: ``memory.failcnt``, ``memory.oom_control``) and, v2 only,
  ``{cpu,memory,io}.pressure``;
- for a GPU process whose parent is not init: the pipes it holds beyond stdio (``/proc/<pid>/fd``), and those
  of its siblings -- a sibling sharing one (a launcher's queue to a decode service) joins its workload;
- for each worker process (no GPU context): its established TCP connections (``fd`` -> socket inode ->
  ``/proc/<pid>/net/tcp{,6}``, once per network namespace) and its threads asleep receiving on them
  (``task/<tid>/syscall``): a loader waiting on an object store;
- with ``--collector.workload.container-env`` (default on) and a GPU that NVML shows no process for (a
  container in another pid namespace): ``NVIDIA_VISIBLE_DEVICES`` from one process of each container
  (``/proc/<pid>/environ``, once per container; no other variable is kept), so the container the device
  plugin gave that GPU to is still found.

It publishes the processes without a GPU context to ``ctx.targets`` (``publish_workload``): the proc
collector inspects them like the GPU processes. Which GPU each process feeds is decided in the derived
layer (:mod:`exporter.derived.workload`). A cgroup file that cannot be read or parsed leaves that value
unknown (logged once, named in the sample); an unreadable hierarchy leaves the tree. Sample::

    gpufeed_workload_processes 72
    gpufeed_workload_groups{kind="container"} 8
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import ipaddress
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter import cgroup as cg
from exporter import jobident, log, syscalls
from exporter.collectors import register
from exporter.collectors.pressure import parse_psi
from exporter.cpulist import CpulistError, parse_cpulist
from exporter.samples.host import PressureTotals
from exporter.samples.workload import CgroupCpu, CgroupInfo, ProcNode, WorkloadSample
from exporter.sampling import WORKLOAD, Collector, CollectorContext, CollectorError, Option
from exporter.snapshot import Snapshot
from exporter.sources import CHUNK, GONE, MAX_BYTES, read_bytes, read_text

ENVIRON_MAX = 128 << 10  # ARG_MAX-sized environments exist; the variable sought is near the start anyway
MAX_GROUP_DIRS = 256  # cgroup directories walked below one group (a Slurm job: steps x tasks)
CONTAINER_SCAN_EVERY = 15  # passes between walks of the container hierarchies for GPU-visible containers
CONTAINER_ROOTS = ("kubepods.slice", "kubepods", "system.slice", "docker", "machine.slice")
LIMITS_EVERY = 6  # passes between re-reads of a group's quota and memory limit (30 s at the default interval)
KINDS = ("container", "slurm_job", "unit")
# The largest number a cgroup counter or limit holds (the kernel's are u64); past it a value is unknown.
COUNTER_MAX = 1 << 64
MAX_SIBLINGS = 32  # siblings of one GPU process whose descriptors are read
MAX_FDS = 1024  # descriptors of one process looked at for pipes
MAX_NET_THREADS = 64  # threads of one worker process whose system call is read
NET_TCP_MAX = 4 << 20  # /proc/net/tcp of a namespace with ~30,000 connections


@register
class WorkloadCollector(Collector):
    """The GPU processes' descendants and container / job cgroups: the unit the verdict is judged on."""

    name = WORKLOAD
    help = ("Process trees and cgroups (v1/v2) of the GPU processes: descendants, container/job members, CPU quota "
            "and throttling, cpuset, memory limit and events, PSI, identity from the cgroup path.")
    default_interval = 5.0
    options = (
        Option("cgroupfs", "str", "", "Where the cgroup hierarchy is mounted (default: <path.sysfs>/fs/cgroup)."),
        Option("container-env", "bool", True,
               "Read NVIDIA_VISIBLE_DEVICES (nothing else) from one process per container, to find the container "
               "of a GPU that NVML lists no process for."),
        Option("max-processes", "int", 2048, "Inspect at most this many workload processes (the rest are logged)."),
        Option("job-env", "bool", True,
               "Read the launcher's rank and job variables (an allow-list: RANK, WORLD_SIZE, SLURM_JOB_ID, ...; "
               "nothing else) once from each GPU process's environment, for its job and rank identity."),
    )

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        root = str(ctx.options.get("cgroupfs", "") or "")
        self.cgroot = Path(root) if root else ctx.sys("fs", "cgroup")
        self.container_env = bool(ctx.options.get("container-env", True))
        self.max_processes = max(1, int(ctx.options.get("max-processes", 2048)))
        self.job_env = bool(ctx.options.get("job-env", True))
        # (pid, start time) -> the allow-listed environment's identity, None when unreadable: read once per process.
        self._ranks: dict[tuple[int, int], jobident.JobIdentity | None] = {}
        self._tag = f"{id(self):x}"
        self._table: dict[int, ProcNode] = {}
        self._env: dict[tuple[str, int], tuple[str, ...] | None] = {}
        self._containers: tuple[str, ...] = ()
        self._passes = 0
        self._pass = 0
        # Limits (quota on the path to the root, memory limit) change on a resize only: read every
        # LIMITS_EVERY passes per group, the counters every pass.
        self._limit_cache: dict[str, tuple[int, dict[str, object]]] = {}

    # ---- the pass ---------------------------------------------------------------------------------------------

    def update(self) -> WorkloadSample:
        self._pass += 1
        by_gpu = self.ctx.targets.by_gpu()
        roots = frozenset().union(*by_gpu.values()) if by_gpu else frozenset()
        if not roots and not (self.container_env and by_gpu and self.ctx.proc().is_dir()):
            # No GPU process and no GPU to find a container for: nothing to follow (and no /proc needed).
            self._table.clear()
            self.ctx.targets.publish_workload(())
            return WorkloadSample(processes=MappingProxyType({}), groups=MappingProxyType({}),
                                  cgroup_version=self._version())
        fresh = self._scan_table()
        version = self._version()
        memberships: dict[int, cg.Membership] = {}
        groups: dict[str, CgroupInfo] = {}
        note: str | None = None
        if version is None:
            note = f"no cgroup hierarchy at {self.cgroot} (check --path.sysfs / --collector.workload.cgroupfs)"
        ranks: dict[int, jobident.JobIdentity] = {}
        for pid in sorted(roots):
            m = self._membership(pid)
            if m is None:
                continue
            memberships[pid] = m
            ident = self._identity(pid, m.path)
            if ident is not None:
                ranks[pid] = ident
            if version is None:
                continue
            owner = cg.owner_of(m.path)
            if owner.group is None:
                # A path no orchestrator's naming is recognised in (YARN, LXC, podman on cgroupfs, a hand-made
                # group): its limits apply all the same. The process's own cgroup is read for them; its other
                # processes are not taken as the workload's (nothing says they are the job's).
                owner = cg.own_group(m.path)
                if owner.group is not None and owner.group in groups:
                    groups[owner.group] = _with_member(groups[owner.group], pid)
            if owner.group is not None and owner.group not in groups:
                groups[owner.group] = self._group(owner, m, version, root=pid)
        if version is not None and self.container_env and any(not v for v in by_gpu.values()):
            for path in self._gpu_containers(version):
                if path not in groups:
                    info = self._group(cg.owner_of(path), None, version)
                    if info.visible_devices:
                        groups[path] = info
        for stale in [p for p in self._limit_cache if p not in groups]:
            del self._limit_cache[stale]
        keep = self._relevant(roots, groups)
        if self._reused(keep - fresh):  # a pid of the workload is another process now: follow the new tree
            keep = self._relevant(roots, groups)
        children = self._children()
        peers = _piped_siblings(self.ctx.proc, self._table, children, roots, keep)
        keep |= _descendants(children, peers, self.max_processes)
        nodes: dict[int, ProcNode] = {}
        group_of = {pid: path for path, info in groups.items() for pid in info.members}
        tcp: dict[str, dict[int, str]] = {}  # per network namespace: socket inode -> remote end
        for pid in sorted(keep):
            node = self._table.get(pid)
            if node is None:
                continue
            remotes, waits = ((), 0) if pid in roots else _network(self.ctx.proc, pid, tcp)
            nodes[pid] = ProcNode(node.pid, node.ppid, node.comm, node.start, group_of.get(pid), remotes, waits,
                                  peers.get(pid, 0))
        self.ctx.targets.publish_workload(p for p in nodes if p not in roots)
        live = {(p, n.start) for p, n in self._table.items()}
        for key in [k for k in self._ranks if k not in live]:
            del self._ranks[key]
        return WorkloadSample(processes=MappingProxyType(nodes), groups=MappingProxyType(groups),
                              cgroup_version=version, note=note, ranks=MappingProxyType(ranks))

    def _children(self) -> dict[int, list[int]]:
        """Parent pid -> its children's pids, from the process table."""
        children: dict[int, list[int]] = {}
        for node in self._table.values():
            children.setdefault(node.ppid, []).append(node.pid)
        return children

    def _relevant(self, roots: frozenset[int], groups: Mapping[str, CgroupInfo]) -> set[int]:
        """The GPU processes, their descendants and their groups' members (and their descendants), bounded."""
        children = self._children()
        out: set[int] = set()
        todo = [p for p in sorted(roots) if p in self._table]
        for info in groups.values():
            todo.extend(sorted(p for p in info.members if p in self._table))
        while todo and len(out) < self.max_processes:
            pid = todo.pop()
            if pid in out:
                continue
            out.add(pid)
            todo.extend(children.get(pid, ()))
        if todo and log.once(("workload_truncated", self._tag)):
            self.log.warning("workload_truncated", inspected=len(out), limit=self.max_processes,
                             hint="raise --collector.workload.max-processes")
        return out

    # ---- the process table ------------------------------------------------------------------------------------

    def _scan_table(self) -> set[int]:
        """Refresh the pid -> (parent, name, start) table: new pids and re-parented ones are read (returned)."""
        try:
            names = os.listdir(self.ctx.proc())
        except OSError as e:
            raise CollectorError(f"{self.ctx.proc()}: {e.strerror or e} (check --path.procfs)") from e
        live = {int(n) for n in names if n.isdigit()}
        for pid in [p for p in self._table if p not in live]:
            del self._table[pid]
        stale = [p for p, n in self._table.items() if n.ppid > 1 and n.ppid not in live]
        fresh = (live - self._table.keys()) | set(stale)
        for pid in sorted(fresh):
            node = self._stat(pid)
            if node is not None:
                self._table[pid] = node
            else:
                self._table.pop(pid, None)
        return fresh

    def _reused(self, pids: set[int]) -> bool:
        """Look ``pids`` up again (the workload's, not read this pass): a pid whose start time (proc(5) field 22)
        changed belongs to another process now -- one that took a worker's pid between two passes is not the
        GPU's workload -- and is replaced in the table by what its stat says now. True when one changed."""
        changed = False
        for pid in sorted(pids):
            old, node = self._table.get(pid), self._stat(pid)
            if node is None:
                changed |= self._table.pop(pid, None) is not None
            elif old is None or node.start != old.start or node.ppid != old.ppid:
                self._table[pid] = node
                changed = True
        return changed

    def _stat(self, pid: int) -> ProcNode | None:
        """Parent, name and start time from /proc/<pid>/stat; None when gone or malformed."""
        try:
            text = read_text(self.ctx.proc(pid, "stat"), limit=CHUNK)
        except OSError:
            return None
        lpar, rpar = text.find("("), text.rfind(")")
        rest = text[rpar + 2:].split() if 0 <= lpar < rpar else []
        # proc(5): (4) ppid is rest[1], (22) starttime rest[19].
        if len(rest) < 20 or not rest[1].isdigit() or not rest[19].isdigit():
            return None
        return ProcNode(pid, int(rest[1]), text[lpar + 1:rpar], int(rest[19]))

    def _membership(self, pid: int) -> cg.Membership | None:
        """/proc/<pid>/cgroup; None when the process is gone or the file is malformed (logged once)."""
        try:
            text = read_text(self.ctx.proc(pid, "cgroup"), limit=CHUNK)
            return cg.parse_proc_cgroup(text)
        except OSError as e:
            if e.errno not in GONE and log.once(("workload_cgroup_unreadable", self._tag, str(pid))):
                self.log.warning("workload_cgroup_unreadable", pid=pid, error=e.strerror or str(e))
            return None
        except cg.CgroupFormatError as e:
            if log.once(("workload_cgroup_malformed", self._tag, str(pid))):
                self.log.warning("workload_cgroup_malformed", pid=pid, file=f"/proc/{pid}/cgroup", reason=str(e))
            return None

    def _identity(self, pid: int, path: str) -> jobident.JobIdentity | None:
        """The process's job and rank: its environment's allow-listed variables (read once per process) merged
        with what its cgroup path says; None when neither names anything."""
        node = self._table.get(pid)
        env: jobident.JobIdentity | None = None
        if self.job_env and node is not None:
            key = (pid, node.start)
            if key not in self._ranks:
                self._ranks[key] = self._environ(pid)
            env = self._ranks[key]
        ident = jobident.merge(env, jobident.from_cgroup_path(path))
        named = ident.job_id or ident.rank is not None or ident.world_size is not None or ident.slurm_step
        return ident if named else None

    def _environ(self, pid: int) -> jobident.JobIdentity | None:
        """The allow-listed variables of /proc/<pid>/environ; None when it cannot be read (another uid without
        CAP_SYS_PTRACE, hidepid, gone, or over ENVIRON_MAX)."""
        try:
            raw = read_bytes(self.ctx.proc(pid, "environ"), limit=ENVIRON_MAX)
        except OSError as e:
            if e.errno not in GONE and log.once(("workload_environ_unreadable", self._tag, str(pid))):
                self.log.debug("workload_environ_unreadable", pid=pid, error=e.strerror or str(e),
                               action="identity from the cgroup path only")
            return None
        return jobident.from_environ(jobident.allowed_environ(raw))

    # ---- cgroups ----------------------------------------------------------------------------------------------

    def _version(self) -> int | None:
        """2 when the unified hierarchy is mounted at the cgroup root, 1 for per-controller mounts, else None."""
        if (self.cgroot / "cgroup.controllers").is_file():
            return 2
        if any((self.cgroot / d).is_dir() for d in ("cpu", "cpu,cpuacct", "memory", "cpuset")):
            return 1
        return None

    def _dir(self, version: int, controller: str, path: str, m: cg.Membership | None) -> Path:
        """The directory of ``path`` in the hierarchy holding ``controller``."""
        rel = path.strip("/").split("/") if path.strip("/") else []
        if version == 2:
            return self.cgroot.joinpath(*rel)
        hit = m.v1(controller) if m is not None else None
        for name in ((hit[0],) if hit else ()) + (controller, f"{controller},cpuacct", f"cpuacct,{controller}"):
            base = self.cgroot / name
            if base.is_dir():
                return base.joinpath(*rel)
        return (self.cgroot / controller).joinpath(*rel)

    def _read(self, path: Path, errors: list[str], limit: int = CHUNK) -> str | None:
        """One cgroup file: None when absent (this kernel or controller lacks it); unreadable is recorded."""
        try:
            return read_text(path, limit=limit)
        except FileNotFoundError:
            return None
        except OSError as e:
            errors.append(f"{path}: {e.strerror or e}")
            return None

    def _parsed(self, path: Path, errors: list[str], fn: Callable[[str], object]) -> object | None:
        text = self._read(path, errors)
        if text is None:
            return None
        try:
            got = fn(text)
        except (cg.CgroupFormatError, CpulistError, ValueError, OverflowError) as e:
            # OverflowError: a number parsed whole that no float holds (a 400-digit quota divided by its period).
            errors.append(f"{path}: {e}")
            return None
        if isinstance(got, int) and not -COUNTER_MAX <= got <= COUNTER_MAX:
            errors.append(f"{path}: {str(got)[:20]}...: out of range")
            return None
        if isinstance(got, dict):  # flat-keyed: a value out of range is that key unknown, the others stand
            for key in [k for k, v in got.items() if isinstance(v, int) and not -COUNTER_MAX <= v <= COUNTER_MAX]:
                errors.append(f"{path}: {key}: out of range")
                del got[key]
        return got

    def _group(self, owner: cg.Owner, m: cg.Membership | None, version: int, root: int | None = None) -> CgroupInfo:
        """The group's members, limits, counters and pressure; failures leave values unknown (logged once). A
        group known only as a GPU process's own cgroup (kind ``cgroup``) lists that process alone."""
        assert owner.group is not None and owner.kind is not None
        path = owner.group
        errors: list[str] = []
        if owner.kind == cg.OWN_CGROUP:
            members = {root} if root is not None else set()
        else:
            members = self._members(self._dir(version, "cpu", path, m), errors)
        info = self._v2(path, errors) if version == 2 else self._v1(path, m, errors)
        env = self._visible(path, members) if owner.kind == "container" and self.container_env else None
        for err in errors:
            if log.once(("workload_cgroup_file", self._tag, err)):
                self.log.warning("workload_cgroup_file_failed", cgroup=path, error=err, action="value unknown")
        return CgroupInfo(path=path, version=version, kind=owner.kind, members=frozenset(members),
                          container_id=owner.container_id, runtime=owner.runtime, pod_uid=owner.pod_uid,
                          slurm_job_id=owner.slurm_job_id, unit=owner.unit, visible_devices=env,
                          errors=tuple(errors), **info)  # type: ignore[arg-type]

    def _members(self, top: Path, errors: list[str]) -> set[int]:
        """Pids in ``cgroup.procs`` of ``top`` and every cgroup below it (bounded)."""
        out: set[int] = set()
        todo, seen = [top], 0
        while todo and seen < MAX_GROUP_DIRS:
            d = todo.pop()
            seen += 1
            # One pid a line, 8 bytes each at 7 digits: a group of 12,000 passes the CHUNK other files are held to.
            text = self._read(d / "cgroup.procs", errors, limit=MAX_BYTES)
            if text is not None:
                out.update(int(x) for x in text.split() if x.isdigit())
            try:
                with os.scandir(d) as it:  # d_type: no stat per entry
                    todo.extend(Path(e.path) for e in it if e.is_dir(follow_symlinks=False))
            except OSError as e:
                if e.errno not in (errno.ENOENT, errno.ENOTDIR):
                    errors.append(f"{d}: {e.strerror or e}")
        return out

    def _quota(self, path: str, errors: list[str], read: object) -> tuple[float | None, str | None]:
        """The smallest quota on ``path`` and its ancestors, and where it is set."""
        best: tuple[float | None, str | None] = (None, None)
        for p in cg.ancestors(path):
            got = read(p, errors)  # type: ignore[operator]
            if got is not None and got[0] is not None and (best[0] is None or got[0] < best[0]):
                best = (got[0], p)
        return best

    def _pressure(self, d: Path, errors: list[str]) -> dict[str, PressureTotals]:
        out: dict[str, PressureTotals] = {}
        for res in ("cpu", "memory", "io"):
            text = self._read(d / f"{res}.pressure", errors)
            if text is None:
                continue
            try:
                # The same format as /proc/pressure/* (Documentation/accounting/psi.rst, "Cgroup2 interface").
                out[res] = parse_psi(res, text)
            except CollectorError as e:
                errors.append(f"{d / f'{res}.pressure'}: {e}")
        return out

    def _limits(self, path: str, version: int, m: cg.Membership | None, errors: list[str]) -> dict[str, object]:
        """The group's quota (and where it is set), cpuset and memory limit, re-read every LIMITS_EVERY passes."""
        hit = self._limit_cache.get(path)
        if hit is not None and self._pass - hit[0] < LIMITS_EVERY:
            return hit[1]
        mine: list[str] = []
        lim = self._limits_v2(path, mine) if version == 2 else self._limits_v1(path, m, mine)
        errors.extend(mine)
        if not mine:  # a failed read is retried next pass
            self._limit_cache[path] = (self._pass, lim)
        return lim

    def _limits_v2(self, path: str, errors: list[str]) -> dict[str, object]:
        def quota(p: str, errs: list[str]) -> object | None:
            return self._parsed(self._dir(2, "cpu", p, None) / "cpu.max", errs, cg.parse_cpu_max)

        q, qpath = self._quota(path, errors, quota)
        cpus = self._parsed(self._dir(2, "cpuset", path, None) / "cpuset.cpus.effective", errors,
                            lambda t: parse_cpulist(t.strip()))
        limits = [self._parsed(self._dir(2, "memory", p, None) / "memory.max", errors,
                               lambda t: cg.parse_memory_limit(t, 2)) for p in cg.ancestors(path)]
        mem = [x for x in limits if isinstance(x, int)]
        return {"cpuset": cpus if cpus else None, "quota_cores": q, "quota_path": qpath,
                "memory_max": min(mem) if mem else None}

    def _limits_v1(self, path: str, m: cg.Membership | None, errors: list[str]) -> dict[str, object]:
        # On v1 each controller has its own hierarchy: a process's cpu and memory paths may differ (a group made
        # in one only). The path named is its cpu path; the memory limit is read on its memory path.
        mem_path = _own(m, "memory", path)

        def quota(p: str, errs: list[str]) -> object | None:
            d = self._dir(1, "cpu", p, m)
            qt, pt = self._read(d / "cpu.cfs_quota_us", errs), self._read(d / "cpu.cfs_period_us", errs)
            if qt is None or pt is None:
                return None
            try:
                return cg.parse_cfs(qt, pt)
            except (cg.CgroupFormatError, OverflowError) as e:
                errs.append(f"{d}: {e}")
                return None

        q, qpath = self._quota(path, errors, quota)
        sdir = self._dir(1, "cpuset", path, m)
        cpus = self._parsed(sdir / "cpuset.effective_cpus", errors, lambda t: parse_cpulist(t.strip()))
        if cpus is None:
            cpus = self._parsed(sdir / "cpuset.cpus", errors, lambda t: parse_cpulist(t.strip()))
        limits = [self._parsed(self._dir(1, "memory", p, m) / "memory.limit_in_bytes", errors,
                               lambda t: cg.parse_memory_limit(t, 1)) for p in cg.ancestors(mem_path)]
        mem = [x for x in limits if isinstance(x, int)]
        return {"cpuset": cpus if cpus else None, "quota_cores": q, "quota_path": qpath,
                "memory_max": min(mem) if mem else None}

    def _v2(self, path: str, errors: list[str]) -> dict[str, object]:
        d = self._dir(2, "cpu", path, None)
        lim = self._limits(path, 2, None, errors)
        qpath = lim["quota_path"]
        stat = self._parsed(self._dir(2, "cpu", str(qpath or path), None) / "cpu.stat", errors, cg.parse_flat_keyed)
        cpu = None
        if isinstance(stat, dict):
            usage, thr = stat.get("usage_usec"), stat.get("throttled_usec")
            cpu = CgroupCpu(usage_s=None if usage is None else usage / 1e6, nr_periods=stat.get("nr_periods"),
                            nr_throttled=stat.get("nr_throttled"), throttled_s=None if thr is None else thr / 1e6)
        current = self._parsed(d / "memory.current", errors, lambda t: int(t.strip()))
        events = self._parsed(d / "memory.events", errors, cg.parse_flat_keyed)
        ev = {k: events[k] for k in ("high", "max", "oom_kill") if k in events} if isinstance(events, dict) else {}
        return {**lim, "cpu": cpu, "memory_current": current if isinstance(current, int) else None,
                "memory_events": MappingProxyType(ev), "pressure": MappingProxyType(self._pressure(d, errors))}

    def _v1(self, path: str, m: cg.Membership | None, errors: list[str]) -> dict[str, object]:
        lim = self._limits(path, 1, m, errors)
        qpath = lim["quota_path"]
        stat = self._parsed(self._dir(1, "cpu", str(qpath or path), m) / "cpu.stat", errors, cg.parse_flat_keyed)
        usage = self._parsed(self._dir(1, "cpuacct", _own(m, "cpuacct", path), m) / "cpuacct.usage", errors,
                             lambda t: int(t.strip()))
        cpu = None
        if isinstance(stat, dict):
            thr = stat.get("throttled_time")  # nanoseconds (Documentation/scheduler/sched-bwc.rst)
            cpu = CgroupCpu(usage_s=usage / 1e9 if isinstance(usage, int) else None, nr_periods=stat.get("nr_periods"),
                            nr_throttled=stat.get("nr_throttled"), throttled_s=None if thr is None else thr / 1e9)
        mdir = self._dir(1, "memory", _own(m, "memory", path), m)
        current = self._parsed(mdir / "memory.usage_in_bytes", errors, lambda t: int(t.strip()))
        ev: dict[str, int] = {}
        failcnt = self._parsed(mdir / "memory.failcnt", errors, lambda t: int(t.strip()))
        if isinstance(failcnt, int):
            ev["max"] = failcnt  # v1 counts hits of the limit in failcnt (cgroup-v1/memory.rst 5.4)
        oom = self._parsed(mdir / "memory.oom_control", errors, cg.parse_flat_keyed)
        if isinstance(oom, dict) and "oom_kill" in oom:
            ev["oom_kill"] = oom["oom_kill"]
        return {**lim, "cpu": cpu, "memory_current": current if isinstance(current, int) else None,
                "memory_events": MappingProxyType(ev), "pressure": MappingProxyType({})}

    # ---- containers that see a GPU ----------------------------------------------------------------------------

    def _gpu_containers(self, version: int) -> tuple[str, ...]:
        """Container cgroups under the kubelet's and the runtimes' hierarchies (walked every few passes)."""
        self._passes += 1
        if self._containers and self._passes % CONTAINER_SCAN_EVERY != 1:
            return self._containers
        top = self._dir(version, "cpu", "/", None)
        found: list[str] = []
        todo = [(top / r, 1) for r in CONTAINER_ROOTS if (top / r).is_dir()]
        walked = 0
        while todo and walked < 4 * MAX_GROUP_DIRS:
            d, depth = todo.pop()
            walked += 1
            rel = "/" + str(d.relative_to(top))
            owner = cg.owner_of(rel)
            if owner.kind == "container" and owner.group == rel:
                found.append(rel)
                continue
            if depth >= 5:
                continue
            try:
                todo.extend((e, depth + 1) for e in d.iterdir() if e.is_dir() and not e.is_symlink())
            except OSError:
                continue
        self._containers = tuple(sorted(found))
        live = set(self._containers)
        for key in [k for k in self._env if k[0] not in live]:
            del self._env[key]
        return self._containers

    def _visible(self, path: str, members: set[int]) -> tuple[str, ...] | None:
        """NVIDIA_VISIBLE_DEVICES of the container's lowest pid, read once per (container, pid)."""
        if not members:
            return None
        pid = min(members)
        key = (path, pid)
        if key not in self._env:
            try:
                raw = read_bytes(self.ctx.proc(pid, "environ"), limit=ENVIRON_MAX)
            except OSError:
                raw = b""  # gone, or not ours to read: unknown (kept so it is not retried every pass)
            vis = cg.visible_devices(raw)
            self._env[key] = vis if vis and vis[0] not in ("void", "none") else None
        return self._env[key]

    # ---- exposition -------------------------------------------------------------------------------------------

    def metrics(self, snap: Snapshot) -> Iterator[Metric]:
        s: WorkloadSample | None = snap.value(self.name)
        if s is None:
            return
        procs = GaugeMetricFamily(
            "gpufeed_workload_processes", "Processes inspected as part of the GPUs' workloads (GPU processes, their "
            "descendants, their container/job members).")
        procs.add_metric([], float(len(s.processes)))
        groups = GaugeMetricFamily(
            "gpufeed_workload_groups", "Container, Slurm job and systemd unit cgroups the GPU processes run in.",
            labels=["kind"])
        for kind in KINDS:
            groups.add_metric([kind], float(sum(1 for g in s.groups.values() if g.kind == kind)))
        yield procs
        yield groups


def _own(m: cg.Membership | None, controller: str, path: str) -> str:
    """The process's own path in ``controller``'s v1 hierarchy where it is in a group there, else ``path``."""
    hit = m.v1(controller) if m is not None else None
    return hit[1] if hit is not None and hit[1] != "/" else path


def _with_member(info: CgroupInfo, pid: int) -> CgroupInfo:
    """A GPU process's own cgroup, read for another GPU process already: this one is in it too."""
    return dataclasses.replace(info, members=info.members | {pid})


# ---- the network side of a worker, and pipes ------------------------------------------------------------------

ProcPath = Callable[..., Path]


def _network(proc: ProcPath, pid: int, tcp: dict[str, dict[int, str]]) -> tuple[tuple[str, ...], int]:
    """(remote ends of its established TCP connections, threads waiting to receive) of one process; nothing
    when its files cannot be read (gone, or not ours)."""
    socks: dict[int, int] = {}  # fd -> socket inode
    fd_dir = proc(pid, "fd")
    try:
        for name in os.listdir(fd_dir):
            with contextlib.suppress(OSError):
                link = os.readlink(os.path.join(fd_dir, name))
                if link.startswith("socket:[") and name.isdigit():
                    socks[int(name)] = int(link[8:-1])
    except OSError:
        return (), 0
    if not socks:
        return (), 0
    try:
        ns = os.readlink(proc(pid, "ns", "net"))
    except OSError:
        ns = f"pid {pid}"
    conns = tcp.get(ns)
    if conns is None:
        conns = tcp[ns] = _tcp(proc, pid)
    remotes = tuple(sorted({r for i in socks.values() if i in conns and (r := _remote(conns[i]))}))
    waits = 0
    try:
        tids = os.listdir(proc(pid, "task"))
    except OSError:
        return remotes, 0
    for tid in tids[:MAX_NET_THREADS]:
        try:
            text = read_text(proc(pid, "task", tid, "syscall"), limit=CHUNK)
        except OSError:
            continue
        call = _blocking_call(text)
        if call is None:
            continue
        nr, arg = call
        if (nr in syscalls.RECEIVES and socks.get(arg) in conns) or (nr in syscalls.WAITS and remotes):
            waits += 1
    return remotes, waits


def _remote(raw: str) -> str:
    """:func:`remote_address`, or '' for a malformed one (skipped, as a line that cannot be split is)."""
    try:
        return remote_address(raw)
    except ValueError:
        return ""


def _tcp(proc: ProcPath, pid: int) -> dict[int, str]:
    """Established TCP connections of ``pid``'s network namespace: socket inode -> remote address as the kernel
    prints it (/proc/<pid>/net/tcp and tcp6, Documentation/networking/proc_net_tcp.rst)."""
    out: dict[int, str] = {}
    for name in ("tcp", "tcp6"):
        try:
            text = read_text(proc(pid, "net", name), limit=NET_TCP_MAX)
        except OSError:
            continue
        out.update(established(text))
    return out


# ---- siblings that feed a GPU process ----------------------------------------------------------------------------

def _piped_siblings(proc: ProcPath, table: Mapping[int, ProcNode], children: Mapping[int, list[int]],
                    roots: frozenset[int], keep: set[int]) -> dict[int, int]:
    """Siblings of each GPU process (children of its parent, not init's) that share a pipe with it on a
    descriptor beyond stdio: sibling pid -> GPU pid. A launcher's queue between a decode service and the
    trainer is such a pipe; a pipe both inherited as stdout (a supervisor's log) is not counted."""
    out: dict[int, int] = {}
    for root in sorted(roots):
        gpu = table.get(root)
        if gpu is None or gpu.ppid <= 1:
            continue
        siblings = [p for p in sorted(children.get(gpu.ppid, ())) if p not in keep and p not in roots]
        if not siblings:
            continue
        mine = _pipes(proc, root)
        if not mine:
            continue
        for sib in siblings[:MAX_SIBLINGS]:
            if sib not in out and mine & _pipes(proc, sib):
                out[sib] = root
    return out


def _descendants(children: Mapping[int, list[int]], pids: Mapping[int, int], limit: int) -> set[int]:
    """``pids`` and their descendants in the process table (at most ``limit``, bounded like the workload)."""
    out: set[int] = set()
    todo = list(pids)
    while todo and len(out) < limit:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo.extend(children.get(pid, ()))
    return out


def _pipes(proc: ProcPath, pid: int) -> set[int]:
    """Inodes of the pipes ``pid`` holds on descriptors 3 and up (/proc/<pid>/fd links ``pipe:[N]``)."""
    fd_dir = proc(pid, "fd")
    out: set[int] = set()
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return out
    for name in names[:MAX_FDS]:
        if not name.isdigit() or int(name) < 3:
            continue
        with contextlib.suppress(OSError):
            link = os.readlink(os.path.join(fd_dir, name))
            if link.startswith("pipe:["):
                out.add(int(link[6:-1]))
    return out


def _blocking_call(text: str) -> tuple[int, int] | None:
    """(system call number, first argument) of a thread blocked in a call; None when running or not blocked."""
    parts = text.split()
    if len(parts) < 2 or not parts[0].isdigit():
        return None  # "running", or "-1 ..." (blocked, not in a system call)
    try:
        return int(parts[0]), int(parts[1], 16)
    except ValueError:
        return None


def parse_tcp(text: str) -> dict[int, str]:
    """/proc/net/tcp{,6}: socket inode -> remote ``addr:port`` of each ESTABLISHED (01) connection."""
    return {inode: r for inode, raw in established(text).items() if (r := _remote(raw))}


def established(text: str) -> dict[int, str]:
    """/proc/net/tcp{,6}: socket inode -> the kernel's hex ``rem_address`` (``0100007F:1F90``) of each ESTABLISHED
    (01) connection. Only split, not decoded: a namespace may hold ~30,000 connections of which a worker owns a
    few (decoding every one cost 150 ms, splitting costs ~40)."""
    out: dict[int, str] = {}
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) >= 10 and f[3] == "01" and f[9].isdigit():
            out[int(f[9])] = f[2]
    return out


@functools.lru_cache(maxsize=1024)
def remote_address(raw: str) -> str:
    """``addr:port`` of a hex ``rem_address`` (``[addr]:port`` for IPv6); ValueError when malformed."""
    addr, _, port = raw.partition(":")
    data = bytes.fromhex(addr)
    # The address is the kernel's __be32 words printed as host-order hex: reverse each 4-byte word.
    words = b"".join(data[i:i + 4][::-1] for i in range(0, len(data), 4))
    ip = ipaddress.ip_address(words)
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    host = str(mapped or ip)
    return f"[{host}]:{int(port, 16)}" if ":" in host else f"{host}:{int(port, 16)}"
