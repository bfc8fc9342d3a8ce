"""Write a scenario's host at time ``t`` as procfs and sysfs trees, laid out exactly as the kernel does.

``Renderer(model, root)`` owns ``root/proc`` and ``root/sys``; point ``--path.procfs`` / ``--path.sysfs`` at
them. ``render(t, groups)`` rewrites only the named groups (see :data:`GROUPS`): a reader that is not due
does not pay for files nobody reads. Every file is written to a temporary name in its directory and moved
into place with ``os.replace``, so a concurrent reader sees the old or the new content, never half.

Static structure (PCI tree, NUMA nodes, block devices, pid and tid directories) is created once by
``setup()``. The PCI tree follows the kernel: each GPU sits in ``/sys/devices/pci<dom>:<bus>/<root port>/
<bridge>/.../<gpu bdf>`` under its ``upstream`` bridges, and ``/sys/bus/pci/devices/<bdf>`` is a relative
symlink to it, as is each device's ``driver``. A link has two ends: the bridge directly above a GPU shows the
GPU's negotiated speed and width (capped at its own maximum), as a real downstream port does.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from exporter import linkmath
from exporter.cpulist import format_cpulist
from exporter.gpu.fields import THROTTLE_KEYS
from exporter.sim import interconnect as ic
from exporter.sim.model import Model
from exporter.sim.spec import Gpu, Process
from exporter.sim.workload_render import WorkloadRenderer
from exporter.sources import SECTOR_BYTES, USER_HZ

NVIDIA_VENDOR = "0x10de"
GPU_CLASS = "0x030200"  # 3D controller: what data-centre NVIDIA GPUs report
BRIDGE_CLASS = "0x060400"  # PCI-to-PCI bridge
BRIDGE_VENDOR = "0x1000"
GPU_DEVICE_IDS = {"H100": "0x2330", "H200": "0x2335", "A100": "0x20b5", "L40S": "0x26b9", "L4": "0x27b8"}
GROUPS = ("stat", "procs", "threads", "disk", "pressure", "memory", "nfs", "pcie", "cpufreq", "cgroups", "nic")
BOOT_OFFSET_S = 1000.0  # the simulated host booted this long before the scenario starts
KIB = 1024  # /proc/meminfo "kB" is KiB
THROTTLE_REASONS = tuple(THROTTLE_KEYS)


def _dev_id(gpu: Gpu) -> str:
    for k, v in GPU_DEVICE_IDS.items():
        if k in gpu.name:
            return v
    return "0x2330"


class Renderer:
    """Renders one scenario's trees under ``root``."""

    def __init__(self, model: Model, root: Path, *, atomic: bool = True) -> None:
        self.model = model
        self.atomic = atomic
        self._written: dict[Path, str] = {}
        self.sc = model.sc
        self.root = root
        self.proc = root / "proc"
        self.sys = root / "sys"
        self._gpu_dirs: dict[int, Path] = {}
        self._parent_dirs: dict[int, Path | None] = {}
        self._ready = False

    # ---- files -------------------------------------------------------------------------------------------

    def write(self, path: Path, text: str) -> None:
        """Replace ``path`` with ``text`` (atomically unless ``atomic`` is off); unchanged content is not rewritten."""
        if self._written.get(path) == text:
            return
        if self.atomic:
            tmp = path.with_name(f".{path.name}.tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
        else:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        self._written[path] = text

    @staticmethod
    def _link(link: Path, target: str) -> None:
        if link.is_symlink() or link.exists():
            return
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, link)

    # ---- static structure --------------------------------------------------------------------------------

    def setup(self) -> None:
        """Create the directory structure and the files that never change."""
        sc = self.sc
        for d in (self.proc / "pressure", self.proc / "net" / "rpc", self.sys / "devices" / "system" / "node",
                  self.sys / "bus" / "pci" / "devices", self.sys / "bus" / "pci" / "drivers" / "nvidia",
                  self.sys / "bus" / "pci" / "drivers" / "pcieport", self.sys / "block"):
            d.mkdir(parents=True, exist_ok=True)
        # NUMA nodes and CPUs.
        node_dir = self.sys / "devices" / "system" / "node"
        for i, cpus in enumerate(sc.host.numa_nodes):
            (node_dir / f"node{i}").mkdir(exist_ok=True)
            self.write(node_dir / f"node{i}" / "cpulist", format_cpulist(cpus) + "\n")
        allnodes = format_cpulist(range(len(sc.host.numa_nodes)))
        self.write(node_dir / "online", allnodes + "\n")
        self.write(node_dir / "possible", allnodes + "\n")
        cpu_dir = self.sys / "devices" / "system" / "cpu"
        for c in range(sc.host.cpus):
            (cpu_dir / f"cpu{c}" / "cpufreq").mkdir(parents=True, exist_ok=True)
            khz = str(int(sc.host.cpu_max_mhz * 1000))  # cpufreq files are in kHz
            self.write(cpu_dir / f"cpu{c}" / "cpufreq" / "cpuinfo_max_freq", khz + "\n")
            self.write(cpu_dir / f"cpu{c}" / "cpufreq" / "scaling_max_freq", khz + "\n")
            self.write(cpu_dir / f"cpu{c}" / "cpufreq" / "cpuinfo_min_freq", str(int(sc.host.cpu_max_mhz * 1000 // 4))
                       + "\n")
        allcpus = format_cpulist(range(sc.host.cpus))
        for f in ("online", "present", "possible"):
            self.write(cpu_dir / f, allcpus + "\n")
        # PCI devices under their bridges.
        for g in sc.gpus:
            self._setup_gpu(g)
        ic.setup_nics(self)
        # Block devices: /sys/block/<name> -> ../devices/virtual/block/<name> (whole devices only).
        for disk in sc.host.disks:
            real = self.sys / "devices" / "virtual" / "block" / disk
            real.mkdir(parents=True, exist_ok=True)
            self.write(real / "size", "7501476528\n")
            self.write(real / "dev", "259:0\n")
            self._link(self.sys / "block" / disk, f"../devices/virtual/block/{disk}")
        # Processes and their threads (those in /proc at t=0; SPEC v2 start_s/exit_s come and go in render()).
        self.workloads = WorkloadRenderer(self, _status)
        self.workloads.setup()
        self._ready = True

    def _setup_gpu(self, g: Gpu) -> None:
        chain = [b.bdf for b in g.upstream] + [g.pci_bus_id]
        top = chain[0]
        d = self.sys / "devices" / f"pci{top[:4]}:{top[5:7]}"
        d.mkdir(parents=True, exist_ok=True)
        parent: Path | None = None
        for i, bdf in enumerate(chain):
            parent = d if i > 0 else None
            d = d / bdf
            d.mkdir(exist_ok=True)
            depth = len(d.relative_to(self.sys).parts)
            up = "/".join([".."] * depth)
            is_gpu = bdf == g.pci_bus_id
            self.write(d / "vendor", (NVIDIA_VENDOR if is_gpu else BRIDGE_VENDOR) + "\n")
            self.write(d / "device", (_dev_id(g) if is_gpu else "0xc010") + "\n")
            self.write(d / "class", (GPU_CLASS if is_gpu else BRIDGE_CLASS) + "\n")
            self.write(d / "subsystem_vendor", (NVIDIA_VENDOR if is_gpu else BRIDGE_VENDOR) + "\n")
            node = g.numa_node
            self.write(d / "numa_node", f"{node}\n")
            local = self.sc.host.numa_nodes[node] if node >= 0 else frozenset(range(self.sc.host.cpus))
            self.write(d / "local_cpulist", format_cpulist(local) + "\n")
            self._link(d / "driver", f"{up}/bus/pci/drivers/{'nvidia' if is_gpu else 'pcieport'}")
            self._link(d / "subsystem", f"{up}/bus/pci")
            rel = "/".join(d.relative_to(self.sys / "devices").parts)
            self._link(self.sys / "bus" / "pci" / "devices" / bdf, f"../../../devices/{rel}")
            for sev in ("nonfatal", "fatal"):
                self.write(d / f"aer_dev_{sev}", _aer(sev, 0))
            if not is_gpu:
                b = g.upstream[i]
                self.write(d / "max_link_speed", linkmath.speed_string(b.max_gen) + "\n")
                self.write(d / "max_link_width", f"{b.max_width}\n")
                self.write(d / "current_link_speed", linkmath.speed_string(b.max_gen) + "\n")
                self.write(d / "current_link_width", f"{b.max_width}\n")
                self.write(d / "aer_dev_correctable", _aer("correctable", 0))
            else:
                self.write(d / "max_link_speed", linkmath.speed_string(g.pcie.max_gen) + "\n")
                self.write(d / "max_link_width", f"{g.pcie.max_width}\n")
        self._gpu_dirs[g.index] = d
        self._parent_dirs[g.index] = parent if g.upstream else None

    # ---- per time ----------------------------------------------------------------------------------------

    def render(self, t: float, groups: Iterable[str] = GROUPS) -> None:
        """Rewrite the files of ``groups`` for scenario time ``t`` (seconds, may pass the end: it loops)."""
        if not self._ready:
            self.setup()
        want = set(groups)
        if "stat" in want:
            self._stat(t)
        if "procs" in want or "threads" in want:
            self._procs(t, threads="threads" in want)
        if "disk" in want:
            self._diskstats(t)
        if "pressure" in want:
            self._pressure(t)
        if "memory" in want:
            self._memory(t)
        if "nfs" in want and self.sc.host.nfs:
            self._nfs(t)
        if "pcie" in want:
            self._pcie(t)
        if "cpufreq" in want:
            self._cpufreq(t)
        if "cgroups" in want:
            self.workloads.cgroups(t)
        if "nic" in want and self.sc.host.nics:
            ic.render_nics(self, t)

    def _stat(self, t: float) -> None:
        """/proc/stat (per-CPU mode ticks), /proc/uptime, /proc/loadavg."""
        m = self.model
        hz = USER_HZ
        lines: list[str] = []
        agg = [0] * 10
        running = blocked = 0
        for p in self.sc.processes:
            if not m.alive(p, t):
                continue
            for plan in m.thread_plan(p, t):
                running += plan.state == "R"
                blocked += plan.state == "D"
        # CPU_MODES order: user, system, iowait, irq, softirq.
        for c, secs in enumerate(m.core_seconds(m.at(t))):
            user, system, iowait, irq, softirq = (int(v * hz) for v in secs)
            idle = int(max(0.0, t - math.fsum(secs)) * hz)
            row = [user, 0, system, idle, iowait, irq, softirq, 0, 0, 0]
            agg = [a + b for a, b in zip(agg, row, strict=True)]
            lines.append(f"cpu{c} " + " ".join(str(x) for x in row))
        up = t + BOOT_OFFSET_S
        text = ("cpu  " + " ".join(str(x) for x in agg) + "\n" + "\n".join(lines) + "\n"
                f"intr 0\nctxt {int(up * 1000)}\nbtime 1767225600\nprocesses {10000 + len(self.sc.processes)}\n"
                f"procs_running {max(1, running)}\nprocs_blocked {blocked}\nsoftirq 0\n")
        self.write(self.proc / "stat", text)
        self.write(self.proc / "uptime", f"{up:.2f} {up * self.sc.host.cpus * 0.9:.2f}\n")
        self.write(self.proc / "loadavg", f"{running + blocked:.2f} {running + blocked:.2f} {running + blocked:.2f} "
                                          f"{max(1, running)}/{1000 + sum(p.threads for p in self.sc.processes)} "
                                          f"{max((p.pid + p.threads for p in self.sc.processes), default=1)}\n")

    def _procs(self, t: float, threads: bool) -> None:
        """/proc/<pid>/{stat,status,io} and, with ``threads``, /proc/<pid>/task/<tid>/stat."""
        m = self.model
        wl = self.workloads
        for p in wl.sync(t):
            plans = m.thread_plan(p, t)
            tticks = [(int(u * USER_HZ), int(s * USER_HZ)) for u, s in m.thread_seconds(p.pid, m.at(t))]
            base = self.proc / str(p.pid)
            ppid = m.workloads.ppid(p, t)
            if threads:
                for i, (plan, (ut, st)) in enumerate(zip(plans, tticks, strict=True)):
                    tid = p.pid + i
                    self.write(base / "task" / str(tid) / "stat",
                               _stat_line(tid, p, state=plan.state, utime=ut, stime=st, threads=p.threads,
                                          cpu=plan.processor, ppid=ppid, comm=plan.comm))
                    wl.thread_files(p, i, plan, ut + st, t)
            leader = plans[0]
            self.write(base / "stat", _stat_line(p.pid, p, state=leader.state, utime=sum(x[0] for x in tticks),
                                                 stime=sum(x[1] for x in tticks), threads=p.threads,
                                                 cpu=leader.processor, ppid=ppid, comm=leader.comm,
                                                 cutime=int(m.workloads.reaped[p.pid].integral(t) * USER_HZ)))
            switches = wl.switches(p, 0, t)
            self.write(base / "status", _status(p, leader.state, m.cpus_allowed(p.pid, t), m.mems_allowed(p.pid, t),
                                                ppid=ppid, switches=switches, comm=leader.comm))
            io = m.proc_io[p.pid]
            rchar = int(io["read_bytes_per_s"].integral(t))
            syscr = int(io["read_syscalls_per_s"].integral(t))
            # read_bytes: what reached the block layer (SPEC v2 storage_read_bytes_per_s; direct and async
            # I/O included, page-cache hits not) -- Documentation/filesystems/proc.rst, /proc/<pid>/io.
            storage = int(m.workloads.storage[p.pid].integral(t))
            self.write(base / "io", f"rchar: {rchar}\nwchar: {rchar // 50}\nsyscr: {syscr}\nsyscw: {syscr // 50}\n"
                                    f"read_bytes: {storage}\nwrite_bytes: 0\n"
                                    "cancelled_write_bytes: 0\n")
            wl.process_files(p, t)

    def _diskstats(self, t: float) -> None:
        """/proc/diskstats: completed I/Os, sectors, milliseconds (Documentation/admin-guide/iostats.rst)."""
        lines = []
        for i, (name, tr) in enumerate(self.model.disks.items()):
            reads = int(tr["reads_per_s"].integral(t))
            writes = int(tr["writes_per_s"].integral(t))
            rsec = int(tr["read_bytes_per_s"].integral(t)) // SECTOR_BYTES
            wsec = int(tr["write_bytes_per_s"].integral(t)) // SECTOR_BYTES
            rms = int(tr["read_ms"].integral(t))
            wms = int(tr["write_ms"].integral(t))
            io_ms = int(tr["busy"].integral(t) * 1000)
            inflight = round(tr["in_flight"].at(t))
            major = 259 if name.startswith("nvme") else 8
            lines.append(f"{major:4d} {i * 16:7d} {name} {reads} 0 {rsec} {rms} {writes} 0 {wsec} {wms} {inflight} "
                         f"{io_ms} {rms + wms} 0 0 0 0 0 0")
        self.write(self.proc / "diskstats", "\n".join(lines) + ("\n" if lines else ""))

    def _pressure(self, t: float) -> None:
        """/proc/pressure/{cpu,io,memory}: ``total=`` in microseconds (Documentation/accounting/psi.rst)."""
        psi = self.model.psi

        def line(kind: str, key: str | None) -> str:
            if key is None:
                return f"{kind} avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
            tr = psi[key]
            avg = [100.0 * (tr.integral(t) - tr.integral(max(0.0, t - w))) / w for w in (10.0, 60.0, 300.0)]
            return (f"{kind} avg10={avg[0]:.2f} avg60={avg[1]:.2f} avg300={avg[2]:.2f} "
                    f"total={int(tr.integral(t) * 1_000_000)}\n")

        self.write(self.proc / "pressure" / "cpu", line("some", "cpu_some") + line("full", None))
        self.write(self.proc / "pressure" / "io", line("some", "io_some") + line("full", "io_full"))
        self.write(self.proc / "pressure" / "memory", line("some", "memory_some") + line("full", "memory_full"))

    def _memory(self, t: float) -> None:
        """/proc/meminfo (kB = KiB) and /proc/vmstat."""
        mem = self.model.memory
        total = self.sc.host.mem_total_bytes
        avail = int(total * mem["available_ratio"].at(t))
        free = avail // 2
        dirty = int(mem["dirty_bytes"].at(t))
        wb = int(mem["writeback_bytes"].at(t))
        kb = {
            "MemTotal": total, "MemFree": free, "MemAvailable": avail, "Buffers": total // 1000,
            "Cached": avail - free, "SwapCached": 0, "Active": (total - avail) // 2, "Inactive": avail // 4,
            "Unevictable": 0, "Mlocked": 0, "SwapTotal": 0, "SwapFree": 0, "Dirty": dirty, "Writeback": wb,
            "AnonPages": total - avail, "Mapped": total // 100, "Shmem": total // 200,
        }
        self.write(self.proc / "meminfo", "".join(f"{k + ':':<16}{v // KIB:>8} kB\n" for k, v in kb.items()))
        oom = int(self.model.oom.integral(t))
        self.write(self.proc / "vmstat", f"nr_free_pages {free // 4096}\nnr_dirty {dirty // 4096}\n"
                                         f"nr_writeback {wb // 4096}\npgpgin 0\npgpgout 0\noom_kill {oom}\n")

    def _nfs(self, t: float) -> None:
        """/proc/net/rpc/nfs: rpc calls/retrans and per-procedure v4 counts (include/linux/nfs4.h order)."""
        ops = {o: int(tr.integral(t)) for o, tr in self.model.nfs_ops.items()}
        retrans = int(self.model.nfs_retrans.integral(t))
        v4 = [0] * 69
        for name, idx in (("read", 1), ("open", 4), ("getattr", 18), ("lookup", 19)):
            v4[idx] = ops[name]
        calls = sum(v4)
        self.write(self.proc / "net" / "rpc" / "nfs",
                   f"net 0 0 0 0\nrpc {calls} {retrans} 0\nproc3 22 " + " ".join(["0"] * 22) + "\n"
                   "proc4 69 " + " ".join(str(x) for x in v4) + "\n")

    def _pcie(self, t: float) -> None:
        """Negotiated link of each GPU (and of the downstream port above it) and the AER correctable total."""
        m = self.model
        for g in self.sc.gpus:
            link = m.link(g.index, t)
            d = self._gpu_dirs[g.index]
            self.write(d / "current_link_speed", linkmath.speed_string(link.gen) + "\n")
            self.write(d / "current_link_width", f"{link.width}\n")
            aer = int(m.gpu_tracks[g.index]["aer_correctable_per_s"].integral(t))
            self.write(d / "aer_dev_correctable", _aer("correctable", aer))
            parent = self._parent_dirs[g.index]
            if parent is not None:
                b = g.upstream[-1]
                self.write(parent / "current_link_speed", linkmath.speed_string(min(link.gen, b.max_gen)) + "\n")
                self.write(parent / "current_link_width", f"{min(link.width, b.max_width)}\n")

    def _cpufreq(self, t: float) -> None:
        """scaling_governor and scaling_cur_freq (kHz) of every CPU."""
        gov = self.model.governor(t)
        base = self.sys / "devices" / "system" / "cpu"
        max_khz = self.sc.host.cpu_max_mhz * 1000
        for c in range(self.sc.host.cpus):
            # powersave and friends run well below max unless the core is busy.
            busy = 1.0 if gov == "performance" else 0.4 + 0.5 * self.model.core_busy_now(c, t)
            cur = max_khz * busy
            self.write(base / f"cpu{c}" / "cpufreq" / "scaling_governor", gov + "\n")
            self.write(base / f"cpu{c}" / "cpufreq" / "scaling_cur_freq", f"{int(cur)}\n")


def _aer(sev: str, total: int) -> str:
    names = {
        "correctable": ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr", "HeaderOF"),
        "nonfatal": ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt", "RxOF", "MalfTLP",
                     "ECRC", "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked", "TLPBlockedErr"),
        "fatal": ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt", "RxOF", "MalfTLP",
                  "ECRC", "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked", "TLPBlockedErr"),
    }[sev]
    total_name = {"correctable": "TOTAL_ERR_COR", "nonfatal": "TOTAL_ERR_NONFATAL", "fatal": "TOTAL_ERR_FATAL"}[sev]
    # Correctable errors on a marginal link are mostly bad DLLPs (replays); put the total there.
    lines = [f"{n} {total if n == 'BadDLLP' else 0}" for n in names]
    return "\n".join([*lines, f"{total_name} {total}"]) + "\n"


def _stat_line(pid: int, p: Process, *, state: str, utime: int, stime: int, threads: int, cpu: int, ppid: int = 1,
               comm: str | None = None, cutime: int = 0) -> str:
    """A /proc/<pid>/stat line with every field through (52) exit_code; see proc(5). ``comm`` is the thread's
    name (SPEC v2 ``threads_cpu[].comm``), the process's by default; (22) starttime is when it appeared."""
    start = int((BOOT_OFFSET_S / 2 + (p.start_s or 0.0)) * USER_HZ)
    fields = [
        str(pid), f"({comm or p.comm})", state, str(ppid), str(p.pid), str(p.pid), "0", "-1", "4194560", "1000", "0",
        "10", "0",
        str(utime), str(stime), str(cutime), "0", "20", "0", str(threads), "0", str(start), "10000000000", "2000000",
        "18446744073709551615", "1", "1", "0", "0", "0", "0", "0", "16781312", "17642", "0", "0", "0", "17",
        str(cpu), "0", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0",
    ]
    return " ".join(fields) + "\n"


def _status(p: Process, state: str, cpus: frozenset[int], mems: frozenset[int], *, ppid: int = 1,
            switches: tuple[int, int] = (100, 10), comm: str | None = None, tid: int | None = None) -> str:
    """/proc/<pid>/status (or a thread's task/<tid>/status) with the fields the collectors read; the
    context-switch counters are the thread's own (the leader's for the process file), as the kernel prints."""
    names = {"R": "R (running)", "S": "S (sleeping)", "D": "D (disk sleep)"}
    return (f"Name:\t{comm or p.comm}\nUmask:\t0022\nState:\t{names.get(state, state)}\nTgid:\t{p.pid}\nNgid:\t0\n"
            f"Pid:\t{p.pid if tid is None else tid}\nPPid:\t{ppid}\nThreads:\t{p.threads}\n"
            f"Cpus_allowed_list:\t{format_cpulist(cpus)}\nMems_allowed_list:\t{format_cpulist(mems)}\n"
            f"voluntary_ctxt_switches:\t{switches[0]}\nnonvoluntary_ctxt_switches:\t{switches[1]}\n")


UTIL_SAMPLE_PERIOD_S = 1 / 6  # the driver's utilisation sample period on most products (anchors-gpu-nvml 4.2)
# How much of the driver's sample buffer the state carries: the reader polls every 1 s, every 4 s while every GPU
# is steady (--collector.gpu.samples-steady-interval), plus its jitter.
UTIL_BUFFER_S = 6.0
XID_WINDOW_S = 600.0  # how far back the state lists Xid events (the fake delivers each once; readers poll at 5 s)


def nvml_state(model: Model, t: float, *, counter_bits: int = 32, samples: bool = True,
               buffer_s: float = UTIL_BUFFER_S) -> dict[str, Any]:
    """The fake NVML's state dict (exporter.sim.fakenvml docstring) for scenario time ``t``.

    Counters and integrals are absolute, exact integrals of the scenario's rates; the utilisation buffer
    holds the samples of the last ``buffer_s`` seconds, each the mean over its own period (empty
    when ``samples`` is false: a caller that polls the buffer rarely fills it only when it is read).
    """
    sc = model.sc
    devices: list[dict[str, Any]] = []
    for g in sc.gpus:
        tr = model.gpu_tracks[g.index]
        link = model.link(g.index, t)
        util = tr["gpu_util"]
        dram = tr["dram_active"]
        util_buf: list[list[int]] = []
        mem_samples: list[list[int]] = []
        p = UTIL_SAMPLE_PERIOD_S
        k_end = math.floor(t / p + 1e-9)
        first = max(1, k_end - int(buffer_s / p)) if samples else k_end + 1
        for k in range(first, k_end + 1):
            a, b = (k - 1) * p, k * p
            ts = round(b * 1e6)
            util_buf.append([ts, round(100.0 * (util.integral(b) - util.integral(a)) / p)])
            mem_samples.append([ts, round(100.0 * (dram.integral(b) - dram.integral(a)) / p)])
        procs = [q for q in sc.processes if g.index in q.gpus and model.alive(q, t)]
        now_util = util.at(t)
        mem_used = int(tr["memory_used_bytes"].at(t))
        dev = {
            "index": g.index, "uuid": g.uuid, "name": g.name, "pci_bus_id": g.pci_bus_id, "gpm": g.gpm,
            "pcie_counter_bits": counter_bits, "lost": model.lost_since(g.index, t),
            "pcie_tx_bytes": int(tr["pcie_tx_bytes_per_s"].integral(t)),
            "pcie_rx_bytes": int(tr["pcie_rx_bytes_per_s"].integral(t)),
            "pcie_replays": int(tr["pcie_replays_per_s"].integral(t)),
            "throttle_ns": {r: int(model.reason_tracks[g.index][r].integral(t) * 1e9) for r in THROTTLE_REASONS},
            "graphics_active_integral": util.integral(t),
            "sm_active_integral": tr["sm_active"].integral(t),
            "sm_occupancy_integral": tr["sm_occupancy"].integral(t),
            "tensor_active_integral": tr["tensor_active"].integral(t),
            "dram_active_integral": dram.integral(t),
            "util_samples": util_buf, "mem_util_samples": mem_samples,
            "process_util": [
                {"pid": q.pid, "ts_us": round(t * 1e6), "sm_pct": round(100.0 * now_util / len(procs)),
                 "mem_pct": round(100.0 * dram.at(t) / len(procs))} for q in procs
            ],
            "sm_clock_mhz": round(tr["sm_clock_mhz"].at(t)), "max_sm_clock_mhz": round(g.max_sm_clock_mhz),
            "power_w": tr["power_w"].at(t), "power_limit_w": g.power_limit_w,
            "energy_mj": int(tr["power_w"].integral(t) * 1e3),
            "temperature_c": round(tr["temperature_c"].at(t)),
            "memory_used_bytes": mem_used, "memory_total_bytes": g.memory_total_bytes,
            "link": {"gen": link.gen, "width": link.width, "max_gen": g.pcie.max_gen, "max_width": g.pcie.max_width,
                     "gpu_max_gen": g.pcie.gpu_max_gen},
            "clock_event_reasons": list(model.reasons_at(g.index, t)),
            "processes": [{"pid": q.pid, "used_memory_bytes": mem_used // len(procs)} for q in procs],
            "cpu_affinity": format_cpulist(sc.host.numa_nodes[g.numa_node]) if g.numa_node >= 0 else None,
            "memory_affinity": str(g.numa_node) if g.numa_node >= 0 else None,
            "numa_node_id": None,
        }
        dev.update(_nvml_health(model, g, t))
        dev["nvlink"] = ic.nvml_links(model, g, t)
        if g.mig is not None:
            dev.update(_nvml_mig(model, g, t, procs))
        devices.append(dev)
    return {"t": t, "driver_version": "550.54.15", "init_error": None, "devices": devices}


def _nvml_health(model: Model, g: Gpu, t: float) -> dict[str, Any]:
    """ECC counts (exact integrals of the scenario's rates; the aggregate counts equal the volatile ones: the
    simulated GPU's InfoROM starts clean), row remapping, and the Xid events of the last XID_WINDOW_S."""
    tr = model.gpu_tracks[g.index]
    corrected, uncorrected = int(tr["ecc_corrected_per_s"].integral(t)), int(tr["ecc_uncorrected_per_s"].integral(t))
    return {
        "ecc": {"corrected_volatile": corrected, "uncorrected_volatile": uncorrected,
                "corrected_aggregate": corrected, "uncorrected_aggregate": uncorrected},
        "remapped_rows": {"correctable": int(tr["remapped_rows_correctable"].at(t)),
                          "uncorrectable": int(tr["remapped_rows_uncorrectable"].at(t)),
                          "pending": int(tr["row_remap_pending"].at(t)), "failure": int(tr["row_remap_failure"].at(t))},
        "xid_events": [{"t": at, "xid": xid, "gi": gi} for at, xid, gi in model.xid_events(g.index, t, XID_WINDOW_S)],
    }


def _nvml_mig(model: Model, g: Gpu, t: float, procs: list[Process]) -> dict[str, Any]:
    """A GPU in MIG mode: its instances with their own GPM integrals, PCIe bytes, memory and processes (the
    GPU's own process list is theirs: the fake derives it)."""
    instances = []
    for x in g.mig or ():
        tr = model.mig_tracks[g.index][x.gi]
        mine = [q for q in procs if q.mig == x.gi]
        used = int(tr["memory_used_bytes"].at(t))
        instances.append({
            "gi": x.gi, "ci": x.ci, "uuid": x.uuid, "name": x.name,
            "memory_used_bytes": used, "memory_total_bytes": x.memory_total_bytes,
            "graphics_active_integral": tr["gpu_util"].integral(t), "sm_active_integral": tr["sm_active"].integral(t),
            "sm_occupancy_integral": tr["sm_occupancy"].integral(t),
            "tensor_active_integral": tr["tensor_active"].integral(t),
            "dram_active_integral": tr["dram_active"].integral(t),
            "pcie_tx_bytes": int(tr["pcie_tx_bytes_per_s"].integral(t)),
            "pcie_rx_bytes": int(tr["pcie_rx_bytes_per_s"].integral(t)),
            "processes": [{"pid": q.pid, "used_memory_bytes": used // len(mine)} for q in mine],
        })
    return {"mig": instances, "processes": [], "process_util": []}
