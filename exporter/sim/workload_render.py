"""The version-2 workload files of a simulated host: process directories that come and go, the process tree,
thread names, run delay and context switches, ``/proc/<pid>/cgroup`` and the cgroup hierarchy itself.

Laid out as the kernel does (Documentation/admin-guide/cgroup-v2.rst, cgroup-v1/*.rst, proc(5)):

- ``/proc/<pid>/task/<tid>/{comm,schedstat,status}`` and ``/proc/<pid>/task/<pid>/children``;
  ``/proc/<pid>/schedstat`` is the leader thread's, as ``status``'s context switches are.
- cgroup v2 (``host.cgroup_version: 2``): one unified hierarchy at ``<sysfs>/fs/cgroup`` with
  ``cgroup.controllers`` at the root; each cgroup has ``cgroup.procs``, ``cpu.max``, ``cpu.stat``,
  ``cpuset.cpus.effective``, ``memory.max``, ``memory.current``, ``memory.events`` and
  ``{cpu,memory,io}.pressure``; ``/proc/<pid>/cgroup`` is ``0::<path>``.
- cgroup v1: one hierarchy per controller -- ``cpu,cpuacct`` (with the ``cpu`` and ``cpuacct`` links a
  distribution makes), ``cpuset``, ``memory``, ``pids`` -- with ``cpu.cfs_quota_us``/``cpu.cfs_period_us``,
  ``cpu.stat`` (``throttled_time`` in ns), ``cpuacct.usage``, ``cpuset.cpus``/``cpuset.effective_cpus``,
  ``memory.limit_in_bytes``, ``memory.usage_in_bytes``, ``memory.failcnt`` (limit hits: SPEC's
  ``max_per_s``) and ``memory.oom_control`` (``oom_kill``); no pressure files (v1 has none per cgroup).
- ``/proc/<pid>/environ`` of a process in a pod's container carries ``NVIDIA_VISIBLE_DEVICES`` with the
  UUIDs of the GPUs the device plugin assigned (as the NVIDIA device plugin's default ``envvar`` strategy
  does) and ``HOSTNAME`` = the pod name.
"""

from __future__ import annotations

import ipaddress
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exporter import syscalls
from exporter.cpulist import format_cpulist
from exporter.sim.model import ThreadPlan
from exporter.sim.spec import Cgroup, Process
from exporter.sources import USER_HZ

SOCKET_INODES = 7_000_000  # inodes of the simulated sockets and pipes (any numbers no other file uses)
PIPE_INODES = 8_000_000
TCP_HEADER = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout "
              "inode\n")

V1_HIERARCHIES = (("12", "pids"), ("11", "memory"), ("9", "cpuset"), ("4", "cpu,cpuacct"), ("1", "name=systemd"))
V1_DIRS = ("cpu,cpuacct", "cpuset", "memory", "pids", "systemd")
V1_NO_LIMIT = 9223372036854771712  # memory.limit_in_bytes without a limit (PAGE_COUNTER_MAX pages, 4 KiB)
BASE_SWITCHES = (100, 10)  # context switches every simulated thread has made before the scenario starts


def _psi(some: float, full: float | None, t: float) -> str:
    """A pressure file from the integrals (seconds stalled) of some and full: ``total=`` in microseconds."""
    def line(kind: str, v: float) -> str:
        return f"{kind} avg10=0.00 avg60=0.00 avg300=0.00 total={int(v * 1_000_000)}\n"
    return line("some", some) + line("full", full if full is not None else 0.0)


class WorkloadRenderer:
    """The version-2 part of a :class:`~exporter.sim.render.Renderer` (same root, same write cache)."""

    def __init__(self, r: Any, status: Callable[..., str]) -> None:
        # ``r`` is the exporter.sim.render.Renderer that owns the root and the write cache; ``status`` its
        # /proc/<pid>/status writer (render.py imports this module, not the other way round).
        self.r = r
        self._status = status
        self.model = r.model
        self.sc = r.sc
        self.cgroot = r.sys / "fs" / "cgroup"
        self._present: set[int] = set()
        self._pod_of: dict[str, tuple[str, tuple[str, ...]]] = {}
        k8s = self.sc.host.kubernetes
        if k8s is not None:
            uuids = {g.index: g.uuid for g in self.sc.gpus}
            for pod in k8s.pods:
                for c in pod.containers:
                    self._pod_of[c.cgroup] = (pod.name, tuple(uuids[i] for i in c.gpus))
        # Project keys tcp_remotes / pipes: one socket inode per connection, one pipe inode per name, and the
        # namespace's /proc/net/tcp{,6} every process shows.
        self._sockets: dict[int, list[int]] = {}
        tcp: dict[str, list[str]] = {"tcp": [], "tcp6": []}
        inode = SOCKET_INODES
        for p in self.sc.processes:
            for remote in p.tcp_remotes:
                inode += 1
                self._sockets.setdefault(p.pid, []).append(inode)
                name, line = _tcp_line(len(tcp["tcp"]) + len(tcp["tcp6"]), remote, inode)
                tcp[name].append(line)
        self._net = {k: TCP_HEADER + "".join(v) for k, v in tcp.items()}
        names = sorted({n for p in self.sc.processes for n in p.pipes})
        self._pipes = {n: PIPE_INODES + i for i, n in enumerate(names)}

    # ---- structure ---------------------------------------------------------------------------------------------

    def setup(self) -> None:
        """The cgroup hierarchy and the processes in /proc at t=0."""
        v1 = self.sc.host.cgroup_version == 1
        if v1:
            for sub in V1_DIRS:
                (self.cgroot / sub).mkdir(parents=True, exist_ok=True)
            for name in ("cpu", "cpuacct"):
                alias = self.cgroot / name
                if not alias.is_symlink() and not alias.exists():
                    os.symlink("cpu,cpuacct", alias)
        else:
            self.cgroot.mkdir(parents=True, exist_ok=True)
            self.r.write(self.cgroot / "cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n")
        for cg in self.sc.host.cgroups.values():
            for d in self._dirs(cg.path):
                d.mkdir(parents=True, exist_ok=True)
        self.sync(0.0)
        self.cgroups(0.0)

    def _dirs(self, path: str) -> list[Path]:
        """Every directory of ``path`` (and its ancestors) in each hierarchy."""
        parts = path.strip("/").split("/")
        bases = [self.cgroot / d for d in V1_DIRS] if self.sc.host.cgroup_version == 1 else [self.cgroot]
        return [b.joinpath(*parts[:i]) for b in bases for i in range(1, len(parts) + 1)]

    def sync(self, t: float) -> list[Process]:
        """Create the directories of processes that appeared and remove those of processes that exited (SPEC v2
        ``start_s``/``exit_s``); the live processes, pids ascending."""
        alive: list[Process] = self.model.workloads.alive(t)
        now = {p.pid for p in alive}
        for pid in sorted(self._present - now):
            base = self.r.proc / str(pid)
            shutil.rmtree(base, ignore_errors=True)
            prefix = str(base) + os.sep
            for path in [q for q in self.r._written if str(q).startswith(prefix)]:
                del self.r._written[path]
        for p in alive:
            if p.pid not in self._present:
                self._create(p)
        self._present = now
        return alive

    def _create(self, p: Process) -> None:
        base = self.r.proc / str(p.pid)
        for tid in range(p.pid, p.pid + p.threads):
            (base / "task" / str(tid)).mkdir(parents=True, exist_ok=True)
        self.r.write(base / "comm", p.comm + "\n")
        self.r.write(base / "cmdline", f"{p.comm}\0train.py\0")
        self.r.write(base / "cgroup", self._proc_cgroup(p))
        env = ["PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/root"]
        if p.job is not None:
            env.extend(p.job.environ())
        pod = self._pod_of.get(p.cgroup or "")
        if pod is not None:
            env.append(f"HOSTNAME={pod[0]}")
            if pod[1]:
                env.append(f"NVIDIA_VISIBLE_DEVICES={','.join(pod[1])}")
        self.r.write(base / "environ", "".join(e + "\0" for e in env))
        self._links(p, base)

    def _links(self, p: Process, base: Path) -> None:
        """fd/ (its connections' sockets from 3 up, then its pipes), ns/net, net/tcp{,6} and each thread's
        syscall: the first ``receiving_threads`` blocked in recvfrom on its first connection."""
        if not (p.tcp_remotes or p.pipes):
            return
        fd = 3
        for inode in self._sockets.get(p.pid, ()):
            self.r._link(base / "fd" / str(fd), f"socket:[{inode}]")
            fd += 1
        for name in p.pipes:
            self.r._link(base / "fd" / str(fd), f"pipe:[{self._pipes[name]}]")
            fd += 1
        self.r._link(base / "ns" / "net", "net:[4026531840]")
        (base / "net").mkdir(exist_ok=True)
        for name, text in self._net.items():
            self.r.write(base / "net" / name, text)
        recv = syscalls.RECVFROM.get(syscalls.MACHINE, 45)
        for ti in range(p.threads):
            blocked = ti < p.receiving_threads
            self.r.write(base / "task" / str(p.pid + ti) / "syscall",
                         f"{recv} 0x3 0x7f0000000000 0x10000 0x0 0x0 0x0 0x7ffc00000000 0x7f0000001000\n" if blocked
                         else "running\n")

    def _proc_cgroup(self, p: Process) -> str:
        """/proc/<pid>/cgroup: ``hierarchy-ID:controllers:path`` per hierarchy (v2: the one ``0::`` line)."""
        path = self.sc.host.cgroups[p.cgroup].path if p.cgroup is not None else "/"
        if self.sc.host.cgroup_version == 1:
            return "".join(f"{hid}:{ctrl}:{path}\n" for hid, ctrl in V1_HIERARCHIES)
        return f"0::{path}\n"

    # ---- per time ----------------------------------------------------------------------------------------------

    def switches(self, p: Process, ti: int, t: float) -> tuple[int, int]:
        """(voluntary, nonvoluntary) context switches of thread ``ti`` of ``p`` at ``t``."""
        _, vol, nonvol = self.model.workloads.thread_counters(p.pid, ti, t)
        return BASE_SWITCHES[0] + int(vol), BASE_SWITCHES[1] + int(nonvol)

    def thread_files(self, p: Process, ti: int, plan: ThreadPlan, ticks: int, t: float) -> None:
        """task/<tid>/{comm,schedstat,status} of one thread (written with the deep sampler's files)."""
        tid = p.pid + ti
        d = self.r.proc / str(p.pid) / "task" / str(tid)
        comm = plan.comm or p.comm
        self.r.write(d / "comm", comm + "\n")
        self.r.write(d / "schedstat", self._schedstat(p, ti, ticks, t))
        m = self.model
        self.r.write(d / "status", self._status(p, plan.state, m.cpus_allowed(p.pid, t), m.mems_allowed(p.pid, t),
                                           ppid=m.workloads.ppid(p, t), switches=self.switches(p, ti, t),
                                           comm=comm, tid=tid))

    def _schedstat(self, p: Process, ti: int, ticks: int, t: float) -> str:
        """``<ns on CPU> <ns runnable but waiting> <timeslices>`` (Documentation/scheduler/sched-stats.rst)."""
        delay, vol, nonvol = self.model.workloads.thread_counters(p.pid, ti, t)
        on_cpu = int(ticks * 1_000_000_000 // USER_HZ)
        return f"{on_cpu} {int(delay * 1e9)} {sum(BASE_SWITCHES) + int(vol) + int(nonvol)}\n"

    def process_files(self, p: Process, t: float) -> None:
        """The leader's schedstat and children (the process-level files)."""
        base = self.r.proc / str(p.pid)
        ticks = sum(int(u * USER_HZ) + int(s * USER_HZ) for u, s in self.model.thread_seconds(p.pid, self.model.at(t))
                    [:1])
        self.r.write(base / "schedstat", self._schedstat(p, 0, ticks, t))
        kids = self.model.workloads.children(p.pid, t)
        self.r.write(base / "task" / str(p.pid) / "children", "".join(f"{k} " for k in kids))

    def cgroups(self, t: float) -> None:
        """Every named cgroup's files at ``t``, and the root's cgroup.procs."""
        wl = self.model.workloads
        if self.sc.host.cgroup_version == 1:
            for cg in self.sc.host.cgroups.values():
                self._v1(cg, t)
        else:
            for cg in self.sc.host.cgroups.values():
                self._v2(cg, t)
            rooted = [p.pid for p in wl.alive(t) if p.cgroup is None]
            self.r.write(self.cgroot / "cgroup.procs", "".join(f"{x}\n" for x in rooted))

    def _counters(self, cg: Cgroup, t: float) -> dict[str, float]:
        tr = self.model.workloads.cgroups[cg.name]
        out = {k: v.integral(t) for k, v in tr.items() if k != "memory_current_bytes"}
        out["memory_current_bytes"] = tr["memory_current_bytes"].at(t)
        return out

    def _periods(self, cg: Cgroup, t: float, throttled: float) -> tuple[int, int]:
        """(nr_periods, nr_throttled): periods with a quota set elapse at 1/period; throttled ones are capped."""
        if cg.cpu_quota_cores is None:
            return 0, 0
        periods = math.floor(t * 1e6 / cg.cpu_period_us)
        return periods, min(periods, int(throttled))

    def _members(self, cg: Cgroup, t: float) -> str:
        return "".join(f"{p.pid}\n" for p in self.model.workloads.members(cg.name, t))

    def _v2(self, cg: Cgroup, t: float) -> None:
        d = self.cgroot.joinpath(*cg.path.strip("/").split("/"))
        c = self._counters(cg, t)
        user, system = self.model.workloads.cgroup_cpu_seconds(cg.name, t)
        periods, throttled = self._periods(cg, t, c["nr_throttled_per_s"])
        w = self.r.write
        w(d / "cgroup.procs", self._members(cg, t))
        quota = "max" if cg.cpu_quota_cores is None else str(round(cg.cpu_quota_cores * cg.cpu_period_us))
        w(d / "cpu.max", f"{quota} {cg.cpu_period_us}\n")
        w(d / "cpu.stat", f"usage_usec {int((user + system) * 1e6)}\nuser_usec {int(user * 1e6)}\n"
                          f"system_usec {int(system * 1e6)}\nnr_periods {periods}\nnr_throttled {throttled}\n"
                          f"throttled_usec {int(c['throttled_fraction'] * 1e6)}\nnr_bursts 0\nburst_usec 0\n")
        cpus = cg.cpuset if cg.cpuset is not None else frozenset(range(self.sc.host.cpus))
        w(d / "cpuset.cpus.effective", format_cpulist(cpus) + "\n")
        w(d / "memory.max", ("max" if cg.memory_max_bytes is None else str(cg.memory_max_bytes)) + "\n")
        w(d / "memory.current", f"{int(c['memory_current_bytes'])}\n")
        oom = int(c["events.oom_kill_per_s"])
        w(d / "memory.events", f"low 0\nhigh {int(c['events.high_per_s'])}\nmax {int(c['events.max_per_s'])}\n"
                               f"oom {oom}\noom_kill {oom}\noom_group_kill 0\n")
        for res in ("cpu", "memory", "io"):
            w(d / f"{res}.pressure", _psi(c[f"psi.{res}_some"], c[f"psi.{res}_full"], t))

    def _v1(self, cg: Cgroup, t: float) -> None:
        parts = cg.path.strip("/").split("/")
        cpu = (self.cgroot / "cpu,cpuacct").joinpath(*parts)
        cpuset = (self.cgroot / "cpuset").joinpath(*parts)
        mem = (self.cgroot / "memory").joinpath(*parts)
        c = self._counters(cg, t)
        user, system = self.model.workloads.cgroup_cpu_seconds(cg.name, t)
        periods, throttled = self._periods(cg, t, c["nr_throttled_per_s"])
        w = self.r.write
        procs = self._members(cg, t)
        for d in (cpu, cpuset, mem, (self.cgroot / "pids").joinpath(*parts)):
            w(d / "cgroup.procs", procs)
        quota = -1 if cg.cpu_quota_cores is None else round(cg.cpu_quota_cores * cg.cpu_period_us)
        w(cpu / "cpu.cfs_quota_us", f"{quota}\n")
        w(cpu / "cpu.cfs_period_us", f"{cg.cpu_period_us}\n")
        w(cpu / "cpu.stat", f"nr_periods {periods}\nnr_throttled {throttled}\n"
                            f"throttled_time {int(c['throttled_fraction'] * 1e9)}\n")
        w(cpu / "cpuacct.usage", f"{int((user + system) * 1e9)}\n")
        w(cpu / "cpuacct.stat", f"user {int(user * USER_HZ)}\nsystem {int(system * USER_HZ)}\n")
        cpus = format_cpulist(cg.cpuset if cg.cpuset is not None else range(self.sc.host.cpus))
        w(cpuset / "cpuset.cpus", cpus + "\n")
        w(cpuset / "cpuset.effective_cpus", cpus + "\n")
        w(mem / "memory.limit_in_bytes", f"{cg.memory_max_bytes or V1_NO_LIMIT}\n")
        w(mem / "memory.usage_in_bytes", f"{int(c['memory_current_bytes'])}\n")
        w(mem / "memory.failcnt", f"{int(c['events.max_per_s'])}\n")
        w(mem / "memory.oom_control", f"oom_kill_disable 0\nunder_oom 0\noom_kill {int(c['events.oom_kill_per_s'])}\n")


def _tcp_line(sl: int, remote: str, inode: int) -> tuple[str, str]:
    """(``tcp`` or ``tcp6``, an ESTABLISHED line of /proc/net/tcp to ``remote``) as the kernel prints it:
    addresses as 32-bit words in host (little-endian) order, ports in hex
    (Documentation/networking/proc_net_tcp.rst)."""
    host, _, port = remote.rpartition(":")
    ip = ipaddress.ip_address(host.strip("[]"))
    raw = ip.packed
    words = "".join(raw[i:i + 4][::-1].hex().upper() for i in range(0, len(raw), 4))
    local = "0100007F" if ip.version == 4 else "00000000000000000000000001000000"
    name = "tcp" if ip.version == 4 else "tcp6"
    return name, (f"{sl:4d}: {local}:{40000 + sl:04X} {words}:{int(port):04X} 01 00000000:00000000 00:00000000 "
                  f"00000000  1000        0 {inode} 1 0000000000000000 20 4 30 10 -1\n")
