"""Scenario format version 2 (``shared/scenarios/SPEC.md``, "Version 2"): the workload sections.

Process trees (``ppid``), cgroups (``host.cgroups``, ``processes[].cgroup``, ``cgroup_version``), the
kubelet's answer (``host.kubernetes``), process churn (``start_s``/``exit_s``), the per-thread and cgroup
state keys, and the stricter ``expect`` forms. Every key here is an error in a ``version: 1`` file, naming
the key and the version that introduces it; everything a version-1 file can say keeps its meaning.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from exporter.names import FINDINGS, VERDICTS
from exporter.sim.reader import Reader, indexed, item, join, list_str
from exporter.sim.spec import (
    CGROUP_PSI_KEYS,
    FRACTION,
    MEMORY_EVENT_KEYS,
    NONNEG,
    WORKLOAD_LABELS,
    Cgroup,
    CgroupState,
    Gpu,
    Kubernetes,
    Pod,
    PodContainer,
    Process,
    RankOf,
)

V2_TOP: tuple[str, ...] = ()
V2_HOST = ("cgroup_version", "cgroups", "kubernetes")
V2_PROCESS = ("ppid", "cgroup", "start_s", "exit_s", "tcp_remotes", "pipes", "receiving_threads", "job")
V2_PROCESS_STATE = ("storage_read_bytes_per_s", "children_cpu")
V2_THREAD_GROUP = ("comm", "run_delay", "voluntary_switches_per_s", "nonvoluntary_switches_per_s")
V2_HOST_STATE = ("cgroups",)
V2_EXPECT = ("within_s", "no_findings_anytime", "evidence_contains", "workload")
CGROUP_KEYS = ("path", "cpu_quota_cores", "cpu_period_us", "cpuset", "memory_max_bytes")
CGROUP_STATE_KEYS = ("nr_throttled_per_s", "throttled_fraction", "memory_current_bytes", "memory_events", "psi")
# One path component of a cgroup: what systemd and the container runtimes write (slices escape '-' as \x2d).
_COMPONENT = re.compile(r"^[A-Za-z0-9_.:@+\\-]{1,255}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,252}$")  # a DNS-ish pod / container / cgroup entry name
PID_MAX = 4194304


def gate(r: Reader, m: Mapping[Any, Any], path: str, version: int, keys: tuple[str, ...]) -> None:
    """A version-2 key in a version-1 file is an error naming the key and the version that introduces it."""
    if version >= 2:
        return
    for k in m:
        if k in keys:
            raise r.fail(join(path, k), "needs version: 2 (a version-1 file cannot use it)")


def comm_of(r: Reader, v: object, path: str) -> str:
    """A task name as the kernel keeps it: 1-15 bytes (TASK_COMM_LEN 16 with the NUL), one line."""
    comm = r.string(v, path)
    if not comm or len(comm.encode()) > 15 or "\n" in comm or "\0" in comm:
        raise r.fail(path, f"bad comm {comm!r} (1-15 bytes, one line, like the kernel's TASK_COMM_LEN)")
    return comm


# ---- host ------------------------------------------------------------------------------------------------------


def cgroup_version(r: Reader, m: Mapping[Any, Any]) -> int:
    """``host.cgroup_version``: 1 or 2 (default 2)."""
    v = r.integer(m.get("cgroup_version", 2), "host.cgroup_version")
    if v not in (1, 2):
        raise r.fail("host.cgroup_version", f"must be 1 or 2, not {v}")
    return v


def cgroups(r: Reader, v: object, cpus: int) -> Mapping[str, Cgroup]:
    """``host.cgroups``: name -> cgroup (path, CPU quota and period, cpuset, memory limit)."""
    m = r.mapping(v if v is not None else {}, "host.cgroups")
    out: dict[str, Cgroup] = {}
    paths: dict[str, str] = {}
    for name, raw in m.items():
        p = join("host.cgroups", name)
        if not isinstance(name, str) or not _NAME.match(name):
            raise r.fail(p, f"bad cgroup name {name!r} (letters, digits, '_', '.', '-')")
        cm = r.mapping(raw, p)
        r.keys(cm, p, CGROUP_KEYS, ("path",))
        path = cgroup_path(r, cm["path"], p + ".path")
        if path in paths:
            raise r.fail(p + ".path", f"{path} is already the path of cgroup {paths[path]!r}")
        paths[path] = name
        quota: float | None = None
        if cm.get("cpu_quota_cores") is not None:
            quota = r.number(cm["cpu_quota_cores"], p + ".cpu_quota_cores", 0.0)
            if quota <= 0:
                raise r.fail(p + ".cpu_quota_cores", "must be positive (null = no limit)")
        period = r.integer(cm.get("cpu_period_us", 100000), p + ".cpu_period_us", 1000, 1000000)
        cpuset = r.cpulist(cm["cpuset"], p + ".cpuset", cpus) if cm.get("cpuset") is not None else None
        mem: int | None = None
        if cm.get("memory_max_bytes") is not None:
            mem = r.integer(cm["memory_max_bytes"], p + ".memory_max_bytes", 1)
        out[name] = Cgroup(name=name, path=path, cpu_quota_cores=quota, cpu_period_us=period, cpuset=cpuset,
                           memory_max_bytes=mem)
    return MappingProxyType(out)


def cgroup_path(r: Reader, v: object, path: str) -> str:
    """An absolute cgroup path below the root: ``/a/b.slice/c.scope``."""
    s = r.string(v, path)
    if not s.startswith("/") or s == "/" or len(s) > 4096:
        raise r.fail(path, f"bad cgroup path {s!r} (absolute, below the root, e.g. /system.slice/job.scope)")
    for part in s[1:].split("/"):
        if part in ("", ".", "..") or not _COMPONENT.match(part):
            raise r.fail(path, f"bad cgroup path component {part!r} in {s!r}")
    return s


def kubernetes(r: Reader, v: object, groups: Mapping[str, Cgroup], gpus: tuple[Gpu, ...]) -> Kubernetes:
    """``host.kubernetes``: ``{pods: [{name, namespace, uid, containers: [{name, cgroup, gpus}]}]}``."""
    p = "host.kubernetes"
    m = r.mapping(v if v is not None else {}, p)
    r.keys(m, p, ("pods",))
    known = {g.index for g in gpus}
    pods: list[Pod] = []
    uids: set[str] = set()
    names: set[tuple[str, str]] = set()
    assigned: dict[int, str] = {}
    for i, raw in enumerate(r.seq(m.get("pods") or [], p + ".pods")):
        pp = item(p + ".pods", i)
        pm = r.mapping(raw, pp)
        r.keys(pm, pp, ("name", "namespace", "uid", "containers"), ("name", "namespace", "uid", "containers"))
        name = _label(r, pm["name"], pp + ".name")
        ns = _label(r, pm["namespace"], pp + ".namespace")
        uid = r.string(pm["uid"], pp + ".uid").strip()
        if not re.match(r"^[0-9a-fA-F-]{1,64}$", uid):
            raise r.fail(pp + ".uid", f"bad pod UID {uid!r} (hex digits and '-', as the API server writes them)")
        if uid in uids:
            raise r.fail(pp + ".uid", f"pod UID {uid} used twice")
        uids.add(uid)
        if (ns, name) in names:
            raise r.fail(pp + ".name", f"pod {ns}/{name} listed twice")
        names.add((ns, name))
        containers: list[PodContainer] = []
        for j, craw in enumerate(r.seq(pm["containers"], pp + ".containers")):
            cp = item(pp + ".containers", j)
            cm = r.mapping(craw, cp)
            r.keys(cm, cp, ("name", "cgroup", "gpus"), ("name", "cgroup"))
            cname = _label(r, cm["name"], cp + ".name")
            if any(c.name == cname for c in containers):
                raise r.fail(cp + ".name", f"container {cname!r} listed twice in pod {name}")
            group = r.string(cm["cgroup"], cp + ".cgroup")
            if group not in groups:
                raise r.fail(cp + ".cgroup", f"unknown cgroup {group!r} (host.cgroups: "
                             f"{', '.join(sorted(groups)) or 'none'})")
            gl: list[int] = []
            for k, gi in enumerate(r.seq(cm.get("gpus") or [], cp + ".gpus")):
                gpath = item(cp + ".gpus", k)
                idx = r.integer(gi, gpath)
                if idx not in known:
                    raise r.fail(gpath, f"unknown GPU index {idx} (known: {list_str(known)})")
                if idx in gl:
                    raise r.fail(gpath, f"GPU {idx} listed twice")
                # Two containers may list one GPU (time-slicing replicas of nvidia.com/gpu.shared): gpufeed
                # then names neither, rather than guess.
                assigned.setdefault(idx, f"{ns}/{name}/{cname}")
                gl.append(idx)
            containers.append(PodContainer(cname, group, tuple(gl)))
        pods.append(Pod(name=name, namespace=ns, uid=uid, containers=tuple(containers)))
    return Kubernetes(tuple(pods))


def _label(r: Reader, v: object, path: str) -> str:
    s = r.string(v, path)
    if not _NAME.match(s):
        raise r.fail(path, f"bad name {s!r} (letters, digits, '_', '.', '-'; at most 253)")
    return s


# ---- processes -------------------------------------------------------------------------------------------------


def process_tree(r: Reader, m: Mapping[Any, Any], path: str, groups: Mapping[str, Cgroup],
                 ) -> tuple[int, str | None, float | None, float | None]:
    """``ppid``, ``cgroup``, ``start_s`` and ``exit_s`` of one process entry."""
    ppid = r.integer(m.get("ppid", 1), path + ".ppid", 0, PID_MAX)
    group: str | None = None
    if m.get("cgroup") is not None:
        group = r.string(m["cgroup"], path + ".cgroup")
        if group not in groups:
            raise r.fail(path + ".cgroup", f"unknown cgroup {group!r} (host.cgroups: "
                         f"{', '.join(sorted(groups)) or 'none'})")
    start = r.number(m["start_s"], path + ".start_s", 0.0) if m.get("start_s") is not None else None
    end = r.number(m["exit_s"], path + ".exit_s", 0.0) if m.get("exit_s") is not None else None
    if start is not None and end is not None and end <= start:
        raise r.fail(path + ".exit_s", f"{end:g} is not after start_s {start:g}")
    return ppid, group, start, end


def process_links(r: Reader, m: Mapping[Any, Any], path: str, threads: int,
                  ) -> tuple[tuple[str, ...], tuple[str, ...], int]:
    """``tcp_remotes`` (``addr:port``), ``pipes`` (names) and ``receiving_threads`` of one process entry."""
    remotes: list[str] = []
    for j, raw in enumerate(r.seq(m.get("tcp_remotes", []), path + ".tcp_remotes")):
        s = r.string(raw, f"{path}.tcp_remotes[{j}]")
        host, _, port = s.rpartition(":")
        try:
            ipaddress.ip_address(host.strip("[]"))
            ok = port.isdigit() and 0 < int(port) < 65536
        except ValueError:
            ok = False
        if not ok:
            raise r.fail(f"{path}.tcp_remotes[{j}]", f"not an address:port: {s!r}")
        remotes.append(s)
    pipes = tuple(r.string(x, f"{path}.pipes[{j}]") for j, x in enumerate(r.seq(m.get("pipes", []), path + ".pipes")))
    waiting = r.integer(m.get("receiving_threads", 0), path + ".receiving_threads", 0, threads)
    if waiting and not remotes:
        raise r.fail(path + ".receiving_threads", "needs tcp_remotes (the connection its threads receive on)")
    return tuple(remotes), pipes, waiting


LAUNCHERS = ("torchrun", "slurm")
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def rank_of(r: Reader, m: Mapping[Any, Any], path: str) -> RankOf | None:
    """``processes[].job``: ``{id, rank, world_size, local_rank, launcher}`` -- the distributed job the process is
    one rank of, written to its environment as its launcher would (exporter/jobident.py reads it back)."""
    if m.get("job") is None:
        return None
    p = path + ".job"
    jm = r.mapping(m["job"], p)
    r.keys(jm, p, ("id", "rank", "world_size", "local_rank", "launcher"), ("id", "rank", "world_size"))
    job_id = r.string(jm["id"], p + ".id")
    launcher = r.string(jm.get("launcher", "torchrun"), p + ".launcher")
    if launcher not in LAUNCHERS:
        raise r.fail(p + ".launcher", f"unknown launcher {launcher!r} (known: {', '.join(LAUNCHERS)})")
    if not _JOB_ID.match(job_id) or (launcher == "slurm" and not job_id.isdigit()):
        raise r.fail(p + ".id", f"bad job id {job_id!r} (a Slurm job id is digits; else letters, digits, '._-')")
    world = r.integer(jm["world_size"], p + ".world_size", 1, 1 << 20)
    rank = r.integer(jm["rank"], p + ".rank", 0, world - 1)
    local = r.integer(jm.get("local_rank", 0), p + ".local_rank", 0, world - 1)
    return RankOf(job_id, rank, world, local, launcher)


def check_tree(r: Reader, procs: tuple[Process, ...]) -> None:
    """No process is its own ancestor among the listed processes; a ppid may name a process not listed."""
    parent = {p.pid: p.ppid for p in procs}
    for i, p in enumerate(procs):
        seen = {p.pid}
        q = p.ppid
        while q in parent:
            if q in seen:
                raise r.fail(item("processes", i) + ".ppid", f"process {p.pid} is its own ancestor (ppid cycle)")
            seen.add(q)
            q = parent[q]


# ---- phases ----------------------------------------------------------------------------------------------------


def thread_group_v2(r: Reader, gm: Mapping[Any, Any], gp: str) -> dict[str, Any]:
    """The version-2 keys of one ``threads_cpu`` entry."""
    out: dict[str, Any] = {}
    if gm.get("comm") is not None:
        out["comm"] = comm_of(r, gm["comm"], gp + ".comm")
    if "run_delay" in gm:
        out["run_delay"] = r.value(gm["run_delay"], gp + ".run_delay", FRACTION)
    for k in ("voluntary_switches_per_s", "nonvoluntary_switches_per_s"):
        if k in gm:
            out[k] = r.value(gm[k], join(gp, k), NONNEG)
    return out


def cgroup_state_partial(r: Reader, v: object, path: str, groups: Mapping[str, Cgroup]) -> dict[str, Any]:
    """``host.cgroups`` of a phase: cgroup name -> partial state (merged key by key over the previous)."""
    m = r.mapping(v if v is not None else {}, path)
    out: dict[str, Any] = {}
    for name, raw in m.items():
        p = join(path, name)
        if name not in groups:
            raise r.fail(p, f"unknown cgroup {name!r} (host.cgroups: {', '.join(sorted(groups)) or 'none'})")
        sm = r.mapping(raw, p)
        r.keys(sm, p, CGROUP_STATE_KEYS)
        st: dict[str, Any] = {}
        for k, x in sm.items():
            kp = join(p, k)
            if k == "throttled_fraction":
                st[k] = r.value(x, kp, FRACTION)
            elif k in ("nr_throttled_per_s", "memory_current_bytes"):
                st[k] = r.value(x, kp, NONNEG)
            elif k == "memory_events":
                em = r.mapping(x, kp)
                r.keys(em, kp, MEMORY_EVENT_KEYS)
                st[k] = {e: r.value(y, join(kp, e), NONNEG) for e, y in em.items()}
            else:
                pm = r.mapping(x, kp)
                r.keys(pm, kp, CGROUP_PSI_KEYS)
                st[k] = {e: r.value(y, join(kp, e), FRACTION) for e, y in pm.items()}
        out[str(name)] = st
    return out


def cgroup_states(s: Mapping[str, Any], groups: Mapping[str, Cgroup]) -> Mapping[str, CgroupState]:
    """Every cgroup's resolved state from the merged partials (absent keys: 0)."""
    out: dict[str, CgroupState] = {}
    for name in groups:
        st = s.get(name, {})
        ev = st.get("memory_events", {})
        psi = st.get("psi", {})
        out[name] = CgroupState(
            nr_throttled_per_s=st.get("nr_throttled_per_s", 0.0),
            throttled_fraction=st.get("throttled_fraction", 0.0),
            memory_current_bytes=st.get("memory_current_bytes", 0.0),
            memory_events=MappingProxyType({k: ev.get(k, 0.0) for k in MEMORY_EVENT_KEYS}),
            psi=MappingProxyType({k: psi.get(k, 0.0) for k in CGROUP_PSI_KEYS}),
        )
    return MappingProxyType(out)


# ---- expect ----------------------------------------------------------------------------------------------------


def verdicts(r: Reader, v: object, path: str, version: int) -> tuple[str, ...]:
    """A verdict name, or (version 2) a list of them: any is accepted."""
    items = v if isinstance(v, list) and version >= 2 else [v]
    if isinstance(v, list) and version < 2:
        raise r.fail(path, "a list of verdicts needs version: 2")
    if not items:
        raise r.fail(path, "must name at least one verdict")
    out: list[str] = []
    for j, x in enumerate(items):
        xp = item(path, j) if isinstance(v, list) else path
        c = r.string(x, xp)
        if c not in VERDICTS:
            raise r.fail(xp, f"unknown verdict {c!r} (known: {', '.join(VERDICTS)})")
        out.append(c)
    return tuple(out)


def finding_bans(r: Reader, v: object, path: str, version: int, known: set[int]) -> tuple[tuple[str, int | None], ...]:
    """``no_findings`` items: a bare name (every GPU and host-wide) or (version 2) ``{check, gpu}``."""
    out: list[tuple[str, int | None]] = []
    for j, f in enumerate(r.seq(v or [], path)):
        fp = item(path, j)
        if isinstance(f, Mapping):
            if version < 2:
                raise r.fail(fp, "{check, gpu} needs version: 2")
            r.keys(f, fp, ("check", "gpu"), ("check",))
            check = _finding(r, f["check"], fp + ".check")
            gpu: int | None = None
            if f.get("gpu") is not None:
                gpu = r.integer(f["gpu"], fp + ".gpu")
                if gpu not in known:
                    raise r.fail(fp + ".gpu", f"unknown GPU index {gpu} (known: {list_str(known)})")
            out.append((check, gpu))
        else:
            out.append((_finding(r, f, fp), None))
    return tuple(out)


def _finding(r: Reader, v: object, path: str) -> str:
    s = r.string(v, path)
    if s not in FINDINGS:
        raise r.fail(path, f"unknown finding {s!r} (known: {', '.join(FINDINGS)})")
    return s


def evidence_contains(r: Reader, v: object, path: str, known: set[int]) -> Mapping[int, tuple[str, ...]]:
    """``evidence_contains``: GPU -> substrings (case-insensitive) that must appear in its evidence."""
    out: dict[int, tuple[str, ...]] = {}
    for idx, lst in indexed(r, r.mapping(v or {}, path), path, known, "GPU").items():
        gp = join(path, idx)
        strs = tuple(r.string(s, item(gp, j)) for j, s in enumerate(r.seq(lst, gp)))
        if any(not s for s in strs):
            raise r.fail(gp, "an empty string matches everything; remove it")
        out[idx] = strs
    return MappingProxyType(out)


def workload(r: Reader, v: object, path: str, known: set[int]) -> Mapping[int, Mapping[str, str]]:
    """``workload``: GPU -> attribution labels of gpufeed_workload_info that must hold (``{}``: none at all)."""
    out: dict[int, Mapping[str, str]] = {}
    for idx, lm in indexed(r, r.mapping(v or {}, path), path, known, "GPU").items():
        gp = join(path, idx)
        labels = r.mapping(lm if lm is not None else {}, gp)
        r.keys(labels, gp, WORKLOAD_LABELS)
        vals: dict[str, str] = {}
        for k, x in labels.items():
            # A Slurm job id written as a number is still its label value.
            vals[k] = r.string(str(x) if isinstance(x, int) and not isinstance(x, bool) else x, join(gp, k))
        out[idx] = MappingProxyType(vals)
    return MappingProxyType(out)
