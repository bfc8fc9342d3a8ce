"""The slow sampling path (default every 5 s): PCIe link state, clock-event reasons, temperature, memory, power
limit, max SM clock, compute processes and their utilisation, the slow fields of the table (ECC and
row-remapping counters, one batched call), MIG mode and instances, and the Xid counts of the event watcher
(:mod:`exporter.gpu.events`).

``nvmlDeviceGetComputeRunningProcesses`` is wrapped in the binding's ``throwOnVersionMismatch``, which turns
FUNCTION_NOT_FOUND into ``NVMLLibraryMismatchError`` (outside ``NVMLError``), so the path calls ``_v3`` and
falls back to ``_v2`` on drivers without it.
"""

from __future__ import annotations

import ctypes
import dataclasses
from types import MappingProxyType
from typing import Any

from exporter import linkmath, log
from exporter.gpu import constants as C  # noqa: N812 - short, used everywhere
from exporter.gpu import fields as F  # noqa: N812
from exporter.gpu.binding import ERR_NOT_FOUND, SUCCESS, code
from exporter.gpu.fieldvalues import FieldValues
from exporter.gpu.nvlink import NvLinkPath
from exporter.gpu.state import DROPPED_PID, NO_FIELDS, GpuState
from exporter.samples.gpu import GpuProcess, GpuSlow, MigSlow

# Compute-process calls, newest struct first (pynvml's unversioned name raises outside NVMLError when the
# driver lacks the newest one: see the module docstring).
PROCESS_CALLS = ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2")
# nvml.h nvmlProcessInfo_v2_t (= _v3): pid u32, usedGpuMemory u64 (aligned), gpuInstanceId u32,
# computeInstanceId u32.
PROCESS_INFO_BYTES = 24
# Per-process utilisation, the older call first (every driver since Maxwell), its R550+ successor second.
PROCESS_UTIL_CALLS = ("nvmlDeviceGetProcessUtilization", "nvmlDeviceGetProcessesUtilizationInfo")
# Process enumeration (the compute-process list and per-process utilisation) holds the driver's global lock for
# milliseconds and can stall the workload's own submission threads (MangoHud #2104): at most once per this many
# seconds per GPU whatever the slow path's interval, except on the first slow cycle after the GPU's activity
# started or stopped (a new workload is found at once). A slow cycle up to PROCESS_EARLY_S early (scheduling
# jitter of a 5 s sampler) counts as on time.
PROCESS_INTERVAL_S = 5.0
PROCESS_EARLY_S = 0.25
# The board's maxima (max and GPU-max PCIe generation, max width, max SM clock) do not change while it runs: read
# at the first slow cycle and every this many seconds after (a driver that answered one late, or a GPU that came
# back, is seen again within a minute); the current link and everything else, at every cycle.
STATIC_INTERVAL_S = 60.0
STATIC_CALLS = (("max_gen", "nvmlDeviceGetMaxPcieLinkGeneration"), ("max_width", "nvmlDeviceGetMaxPcieLinkWidth"),
                ("gpu_max_gen", "nvmlDeviceGetGpuMaxPcieLinkGeneration"))


class SlowPath(FieldValues, NvLinkPath):
    """Link, clock-event reasons, temperature, memory, limits, processes, ECC, MIG and Xid counts of each GPU."""

    _pid_max: int
    _process_s: float

    def _slow_one(self, g: GpuState, now: float) -> GpuSlow:
        nvml, h = self._nvml, g.handle
        self._check_mig(g)

        def get(name: str, *args: Any) -> Any:
            return self._opt(g, name, getattr(nvml, name), h, *args)

        if g.static_t is None or now - g.static_t >= STATIC_INTERVAL_S - PROCESS_EARLY_S:
            g.static = {k: get(f) for k, f in STATIC_CALLS}
            g.static["max_clock"] = get("nvmlDeviceGetMaxClockInfo", nvml.NVML_CLOCK_SM)
            g.static_t = now
        link = {"gen": get("nvmlDeviceGetCurrPcieLinkGeneration"), "width": get("nvmlDeviceGetCurrPcieLinkWidth"),
                **{k: g.static[k] for k, _ in STATIC_CALLS}}
        if link["max_gen"] and link["max_width"]:
            g.link_capacity = _link_bytes_per_s(int(link["max_gen"]), int(link["max_width"]))
        mask = None
        supported = False
        if "nvmlDeviceGetCurrentClocksEventReasons" not in g.disabled:
            mask = get("nvmlDeviceGetCurrentClocksEventReasons")
        if mask is None and "nvmlDeviceGetCurrentClocksEventReasons" in g.disabled:
            mask = get("nvmlDeviceGetCurrentClocksThrottleReasons")  # drivers before R535
        if mask is not None:
            supported = True
        temp = None
        if "nvmlDeviceGetTemperatureV" not in g.disabled:
            temp = get("nvmlDeviceGetTemperatureV", nvml.NVML_TEMPERATURE_GPU)
        if temp is None and "nvmlDeviceGetTemperatureV" in g.disabled:
            # nvmlDeviceGetTemperature is DEPRECATED(13.0) (nvml.h) for the V call; drivers before it have only it.
            temp = get("nvmlDeviceGetTemperature", nvml.NVML_TEMPERATURE_GPU)
        mem = get("nvmlDeviceGetMemoryInfo")
        limit_mw = get("nvmlDeviceGetEnforcedPowerLimit")
        max_clock = g.static["max_clock"]
        enumerate_now = g.processes_t is None or now - g.processes_t >= self._process_s - PROCESS_EARLY_S
        if g.identity.mig_mode:
            processes, mig = self._mig_slow(g, enumerate_now)
        else:
            processes, mig = (self._processes(g) if enumerate_now else g.processes), {}
        if enumerate_now:
            g.processes, g.processes_t = processes, now
        xids, xid_seen = self.events.counts(g.index)
        return GpuSlow(
            link_gen=_int(link["gen"]), link_width=_int(link["width"]),
            max_link_gen=_int(link["max_gen"]), max_link_width=_int(link["max_width"]),
            gpu_max_link_gen=_int(link["gpu_max_gen"]),
            clock_event_reasons=C.decode_reasons(int(mask)) if mask is not None else frozenset(),
            temperature_c=float(temp) if temp is not None else None,
            memory_used_bytes=int(mem.used) if mem is not None else None,
            memory_total_bytes=int(mem.total) if mem is not None else None,
            power_limit_w=float(limit_mw) / 1000.0 if limit_mw is not None else None,
            max_sm_clock_hz=float(max_clock) * 1e6 if max_clock is not None else None,
            processes=processes,
            numa_node=g.identity.numa_node,
            clock_event_reasons_supported=supported,
            # As on the fast path: the fields dict itself, and the one shared empty mapping for what is empty
            # (a proxy per GPU per slow tick is one more object for the cycle collector to traverse).
            fields=self._fields(g, now, F.SLOW),
            xid_errors=xids or NO_FIELDS, xid_last_seen=xid_seen or NO_FIELDS,
            mig=MappingProxyType(mig) if mig else NO_FIELDS,
            nvlink=self._nvlink(g, now),
        )

    def _mig_slow(self, g: GpuState, enumerate_now: bool) -> tuple[tuple[GpuProcess, ...], dict[int, MigSlow]]:
        """Per MIG instance: memory, and its compute processes through its own handle (the whole GPU's list
        needs privileges in MIG mode; enumerated only when ``enumerate_now``, else as last enumerated). The
        GPU's processes are the union, each tagged with its instance."""
        nvml = self._nvml
        procs: list[GpuProcess] = []
        out: dict[int, MigSlow] = {}
        for gi, m in sorted(g.mig.items()):
            try:
                mem = self._opt(g, "nvmlDeviceGetMemoryInfo:mig", nvml.nvmlDeviceGetMemoryInfo, m.handle, raising=True)
                if enumerate_now or not m.processes_seen:
                    # Each compute instance lists its own processes (a process runs in one).
                    m.processes = _merged([p for _, h in sorted(m.compute.items())
                                           for p in self._processes(g, h, raising=True)])
                    m.processes_seen = True
                found = m.processes
            except nvml.NVMLError as e:
                if not self._mig_gone(g, e):
                    self._failed(g, "nvmlDeviceGetMigDeviceHandleByIndex", e)
                continue
            out[gi] = MigSlow(memory_used_bytes=int(mem.used) if mem is not None else None,
                              memory_total_bytes=int(mem.total) if mem is not None else None)
            procs.extend(dataclasses.replace(p, mig=gi, sm_ratio=None) for p in found)
        return tuple(sorted(procs, key=lambda p: (p.pid, p.mig or 0))), out

    def _processes(self, g: GpuState, handle: Any = None, *, raising: bool = False) -> tuple[GpuProcess, ...]:
        """Compute processes of the GPU (or of one MIG device) with validated pids (driver/binding skew returns
        garbage) and their SM share."""
        nvml = self._nvml
        h = g.handle if handle is None else handle
        if not self._process_struct_fits(g):
            return ()
        procs = None
        for name in PROCESS_CALLS:
            if name not in g.disabled:
                procs = self._opt(g, name, getattr(nvml, name), h, raising=raising)
                if name not in g.disabled:
                    break
        if not procs:
            return ()
        mem: dict[int, int | None] = {}
        bad = 0
        for p in procs:
            pid = _valid_pid(getattr(p, "pid", None), self._pid_max)
            if pid is None:
                bad += 1
                continue
            used = getattr(p, "usedGpuMemory", None)
            used_i = int(used) if isinstance(used, int) and 0 <= used < (1 << 62) else None
            if pid in mem and mem[pid] is not None and used_i is not None:
                mem[pid] = int(mem[pid] or 0) + used_i  # the same process listed twice (several contexts)
            elif pid not in mem:
                mem[pid] = used_i
        if bad:
            self._count_dropped(DROPPED_PID, bad)
        if bad and log.once(("gpu_bad_pids", self._tag, str(g.index))):
            self._log.warning("gpu_process_pids_invalid", gpu=g.index, dropped=bad, pid_max=self._pid_max,
                              hint="nvidia-ml-py and driver versions may not match")
        sm = self._process_util(g, set(mem)) if handle is None else None
        return tuple(GpuProcess(pid=pid, used_memory_bytes=mem[pid],
                                sm_ratio=None if sm is None else sm.get(pid, 0.0))
                     for pid in sorted(mem))

    def _process_struct_fits(self, g: GpuState) -> bool:
        """Whether the binding's process struct is the driver's (nvml.h nvmlProcessInfo_v2_t/_v3: 24 bytes).
        nvidia-ml-py 12.535.77's is 32 bytes: the driver writes 24-byte entries that the binding reads at a
        32-byte stride, so every pid after the first is garbage that can name an unrelated process. Then no
        process list is read at all (logged once as an error), rather than attribute work to strangers."""
        struct = getattr(self._nvml, "c_nvmlProcessInfo_v3_t", None) or self._nvml.c_nvmlProcessInfo_t
        size = ctypes.sizeof(struct)
        if size == PROCESS_INFO_BYTES:
            return True
        g.disabled.update(PROCESS_CALLS)
        if log.once(("gpu_process_struct_mismatch", self._tag)):
            self._log.error("gpu_process_struct_mismatch", binding_bytes=size, driver_bytes=PROCESS_INFO_BYTES,
                            hint="this nvidia-ml-py lays out nvmlProcessInfo_t unlike the driver: upgrade it "
                                 "(pip install -U nvidia-ml-py); GPU processes are not listed until then")
        return False

    def _process_util(self, g: GpuState, pids: set[int]) -> dict[int, float] | None:
        """Latest SM share per pid since the last call (a pid without a sample: 0, as nvml.h returns only
        processes with non-zero utilisation); None when unknown -- unsupported (MIG), or no sample at all while
        the GPU's own samples show it busy.

        ``nvmlDeviceGetProcessUtilization`` is reported to answer nothing useful on Blackwell (HAMi #2015): an
        empty answer on a busy GPU, or the call unsupported, tries ``nvmlDeviceGetProcessesUtilizationInfo``
        (R550+), the same samples in the newer struct."""
        for name in PROCESS_UTIL_CALLS:
            if name in g.disabled:
                continue
            got = self._util_samples(g, name, pids)
            if got:
                return got
            if got is not None and not g.active:
                return got  # an idle GPU: no process had non-zero utilisation, each one's share is 0
        return None

    def _util_samples(self, g: GpuState, name: str, pids: set[int]) -> dict[int, float] | None:
        """One per-process utilisation call: the newest SM share of each pid in ``pids`` that has a sample;
        None when the call failed."""
        nvml = self._nvml
        try:
            samples = self._timed(name, getattr(nvml, name), g.handle, g.proc_last_seen)
        except nvml.NVMLError as e:
            # NOT_FOUND: no process had non-zero utilisation since lastSeen. SUCCESS: the binding raises
            # NVMLError(NVML_SUCCESS) when the sizing call finds nothing to return (it expects
            # INSUFFICIENT_SIZE): the same answer.
            if code(e) in (ERR_NOT_FOUND, SUCCESS):
                return {}
            self._failed(g, name, e)
            return None
        latest: dict[int, tuple[int, float]] = {}
        for s in samples:
            pid, ts = _valid_pid(s.pid, self._pid_max), int(s.timeStamp)
            g.proc_last_seen = max(g.proc_last_seen, ts)
            if pid is None:
                self._count_dropped(DROPPED_PID)
                continue
            if pid not in pids:
                continue
            if pid not in latest or ts >= latest[pid][0]:
                latest[pid] = (ts, min(max(float(s.smUtil), 0.0), 100.0) / 100.0)
        return {pid: v for pid, (_, v) in latest.items()}


def _merged(procs: list[GpuProcess]) -> tuple[GpuProcess, ...]:
    """One entry per pid (a process with contexts in two compute instances of one GPU instance is listed by
    both): memory added up, unknown if either is."""
    by_pid: dict[int, GpuProcess] = {}
    for p in procs:
        q = by_pid.get(p.pid)
        if q is None:
            by_pid[p.pid] = p
            continue
        used = None if p.used_memory_bytes is None or q.used_memory_bytes is None else (
            p.used_memory_bytes + q.used_memory_bytes)
        by_pid[p.pid] = dataclasses.replace(q, used_memory_bytes=used)
    return tuple(by_pid[pid] for pid in sorted(by_pid))


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


def _valid_pid(v: object, pid_max: int) -> int | None:
    """A pid that can exist on this host (0 < pid < pid_max), else None."""
    if not isinstance(v, int) or isinstance(v, bool):
        return None
    return v if 0 < v < pid_max else None


def _link_bytes_per_s(gen: int, width: int) -> float | None:
    """The link's encoded data rate (an upper bound of what it moves: the counter-wrap check errs early)."""
    try:
        return linkmath.encoded_bytes_per_second(gen, width)
    except ValueError:
        return None

