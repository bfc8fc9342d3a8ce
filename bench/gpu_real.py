"""The real-GPU validation run: one command on a fresh NVIDIA host with PyTorch answers what only a driver can.

    python bench/gpu_real.py [--out DIR] [--seconds 38] [--budget 480]
    python bench/gpu_real.py --dry-run --out DIR        # here: CPU workloads over bench/nvmlstub

Sections, in order, each written to ``results.json`` in the results folder (default
``bench/results/<UTC date>-<gpu name>/``) and summarised in ``summary.md``:

- ``host``: driver version and branch, CUDA driver version, NVML version, per GPU: GSP firmware mode,
  persistence mode, MIG mode, PCIe link generation and width (current and maximum), GPM support; the uid,
  capabilities and the driver's RmProfilingAdminOnly setting (profiling permission).
- ``calls``: every NVML call the backend makes (and the replacements issue 38 names), through plain pynvml,
  each timed over ``--reps`` repetitions: return codes by name, p50/p99/max microseconds. An error is a result
  (NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND, a function the binding lacks), never a crash.
  ``backend_calls``: the backend itself run for a few seconds with its own per-call profile.
- ``fields``: every field of exporter/gpu/fields.py read every 10 ms for ``--trace-seconds`` under load
  (matmul and pinned copies running): value types, return codes, the driver's refresh period (from changes
  of each field's own timestamp), the period and size of value steps, the largest value (above 2^32?) and
  decreases (wraps or resets). The raw trace goes to ``fields_trace.json``.
- ``gpm``: GPM samples every 100 ms over the same span, metrics from 100 ms pairs and from 1 s pairs of the
  same samples side by side, non-finite values counted.
- ``workloads``: ``gpufeed serve`` on a free 127.0.0.1 port, then each workload of bench/gpu_workloads.py
  (idle, matmul, tiny kernels, a starved DataLoader, pinned copies, batch-1 inference) for ``--seconds``:
  /metrics scraped every second, the daemon's verdict (gpufeed_gpu_bottleneck) and rates set against the
  workload's own ground truth (CUDA events, bytes copied, kernels launched), the time from the workload's
  start to the first correct verdict, the daemon's CPU.
- ``ab``: the launch-bound and batch-1 workloads' step latency with the daemon running, then stopped.

Bounded: every workload runs in its own process with a deadline and is killed (its process group) on overrun;
the daemon is stopped with SIGTERM, then SIGKILL; a section that no longer fits ``--budget`` is skipped and
says so; SIGTERM to this script stops everything it started. ``--dry-run`` runs the same code paths on the
CPU (torch CPU tensors where torch imports, else pure-Python stand-ins) against bench/nvmlstub, the C
stand-in for libnvidia-ml: it checks the harness, and its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import itertools
import json
import math
import os
import platform
import re
import signal
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import nvmlstub, procs, procstat
from bench.gpu_workloads import WORKLOADS
from bench.scrape import percentile
from exporter.gpu.fields import FIELDS, ON_PATH, SLOW

REPO = Path(__file__).resolve().parent.parent
WORKLOAD_SCRIPT = REPO / "bench" / "gpu_workloads.py"
AB_WORKLOADS = ("tiny_kernels", "batch1")
# GPM metrics the backend asks for (nvml.h nvmlGpmMetricId_t).
GPM_METRICS = {1: "graphics_util", 2: "sm_util", 3: "sm_occupancy", 5: "any_tensor_util", 10: "dram_bw_util",
               20: "pcie_tx_mib_s", 21: "pcie_rx_mib_s"}
# Traced beside the table: nvidia-ml-py up to 13.580.65 numbered the SW/HW thermal and HW power-brake
# clock-event counters 251-253, where nvml.h (API 13, and the binding from 13.580.82) has them at 269-271 and
# puts power-smoothing fields at 251-253. Which ids a driver answers, and with what, is only seen on one.
EXTRA_FIELD_IDS = {251: "id 251 (old binding: sw_thermal)", 252: "id 252 (old binding: hw_thermal)",
                   253: "id 253 (old binding: hw_power_brake)"}
VALUE_TYPES = {0: "double", 1: "uint", 2: "ulong", 3: "ull", 4: "sll", 5: "sint", 6: "ushort"}
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
_BOTTLENECK = re.compile(r'^gpufeed_gpu_bottleneck\{([^}]*)\} (\S+)', re.M)
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)", re.M)
RATE_SERIES = ("gpufeed_gpu_busy_seconds_total", "gpufeed_gpu_sm_active_seconds_total",
               "gpufeed_gpu_pcie_rx_bytes_total", "gpufeed_gpu_pcie_tx_bytes_total",
               "gpufeed_gpu_waiting_seconds_total", "gpufeed_gpu_state_seconds_total",
               "gpufeed_gpu_throttle_seconds_total", "gpufeed_gpu_energy_joules_total")


@dataclass
class Plan:
    """Durations (seconds) and sizes of one run; ``dry()`` shrinks the defaults for the CPU dry run."""

    seconds: float = 38.0  # each workload's measured loop
    ab_seconds: float = 12.0  # each arm of the A/B
    trace_seconds: float = 4.0  # the 10 ms field trace
    gpm_seconds: float = 3.0  # GPM samples every 100 ms
    reps: int = 50  # repetitions per NVML call
    budget: float = 480.0  # the whole run (the device script's timeout allows 30 s more)
    setup_s: float = 60.0  # the most a workload's imports and allocation may take before its loop
    start_s: float = 25.0  # what they are expected to take (torch's import, CUDA's start): budget checks
    scrape_every: float = 1.0
    dry_run: bool = False

    @classmethod
    def dry(cls) -> Plan:
        return cls(seconds=3.0, ab_seconds=1.5, trace_seconds=1.0, gpm_seconds=1.0, reps=5, budget=120.0,
                   setup_s=20.0, start_s=2.0, scrape_every=0.5, dry_run=True)


@dataclass
class Budget:
    """The whole run's deadline."""

    seconds: float
    start: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return self.start + self.seconds - time.monotonic()

    def allows(self, need: float) -> bool:
        return self.left() >= need


def error_name(nvml: Any, e: BaseException) -> str:
    """NVML_ERROR_* name of an NVMLError (by its value), else the exception's type and text."""
    value = getattr(e, "value", None)
    if isinstance(e, nvml.NVMLError) and isinstance(value, int):
        for k, v in vars(nvml).items():
            if k.startswith("NVML_ERROR_") and v == value:
                return str(k[len("NVML_ERROR_"):])
        return f"NVML_{value}"
    return f"{type(e).__name__}: {e}"[:200]


def ask(nvml: Any, name: str, *args: Any) -> Any:
    """``nvml.<name>(*args)``'s value, JSON-ready, or ``{"error": NAME}`` (a function the binding lacks
    included)."""
    try:
        return jsonable(getattr(nvml, name)(*args))
    except Exception as e:
        return {"error": error_name(nvml, e)}


def jsonable(v: Any) -> Any:
    """A JSON-ready form of what a pynvml call returned (ctypes structures as dicts, bytes decoded)."""
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v if not (isinstance(v, float) and not math.isfinite(v)) else repr(v)
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v[:16]]
    if isinstance(v, ctypes.Structure):
        return {name: jsonable(getattr(v, name)) for name, *_ in v._fields_}
    if isinstance(v, ctypes.Array):
        return [jsonable(x) for x in list(v)[:16]]
    return repr(v)[:200]


# ---- host facts ---------------------------------------------------------------------------------------------

def host_facts(nvml: Any, handles: list[Any]) -> dict[str, Any]:
    """Driver, CUDA, NVML versions and each GPU's GSP, persistence, MIG, PCIe link and GPM state."""
    driver = ask(nvml, "nvmlSystemGetDriverVersion")
    cuda = ask(nvml, "nvmlSystemGetCudaDriverVersion_v2")
    out: dict[str, Any] = {
        "driver_version": driver,
        "driver_branch": f"R{driver.split('.')[0]}" if isinstance(driver, str) else None,
        "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else cuda,
        "nvml_version": ask(nvml, "nvmlSystemGetNVMLVersion"),
        "binding": _binding_version(),
        "uid": os.getuid(), "euid": os.geteuid(),
        "capabilities": _status_field("CapEff"),
        "rm_profiling_admin_only": _profiling_admin_only(),
        "kernel": platform.release(), "python": platform.python_version(), "cpus": os.cpu_count(),
        "gpus": [],
    }
    for h in handles:
        gsp = ask(nvml, "nvmlDeviceGetGspFirmwareMode", h)
        out["gpus"].append({
            "name": ask(nvml, "nvmlDeviceGetName", h),
            "uuid": ask(nvml, "nvmlDeviceGetUUID", h),
            "architecture": ask(nvml, "nvmlDeviceGetArchitecture", h),
            "gsp_firmware_mode": {"enabled": gsp[0], "default": gsp[1]} if isinstance(gsp, list) else gsp,
            "gsp_firmware_version": ask(nvml, "nvmlDeviceGetGspFirmwareVersion", h),
            "persistence_mode": ask(nvml, "nvmlDeviceGetPersistenceMode", h),
            "mig_mode": ask(nvml, "nvmlDeviceGetMigMode", h),
            "pcie": {
                "current_gen": ask(nvml, "nvmlDeviceGetCurrPcieLinkGeneration", h),
                "current_width": ask(nvml, "nvmlDeviceGetCurrPcieLinkWidth", h),
                "max_gen": ask(nvml, "nvmlDeviceGetMaxPcieLinkGeneration", h),
                "max_width": ask(nvml, "nvmlDeviceGetMaxPcieLinkWidth", h),
                "gpu_max_gen": ask(nvml, "nvmlDeviceGetGpuMaxPcieLinkGeneration", h),
            },
            "gpm_supported": _gpm_supported(nvml, h),
        })
    return out


def _gpm_supported(nvml: Any, h: Any) -> Any:
    """nvmlGpmQueryDeviceSupport's isSupportedDevice (1 on Hopper and newer), or ``{"error": NAME}``."""
    sup = ask(nvml, "nvmlGpmQueryDeviceSupport", h)
    return sup.get("isSupportedDevice", sup) if isinstance(sup, dict) else sup


def _binding_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("nvidia-ml-py")
    except metadata.PackageNotFoundError:
        return None


def _status_field(name: str) -> str | None:
    """A line of /proc/self/status (CapEff: the effective capabilities)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(name + ":"):
                return line.split(":", 1)[1].strip()
    return None


def _profiling_admin_only() -> str | None:
    """RmProfilingAdminOnly from /proc/driver/nvidia/params: 1 = profiling counters need admin rights."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/driver/nvidia/params").read_text().splitlines():
            if line.startswith("RmProfilingAdminOnly"):
                return line.split(":", 1)[1].strip()
    return None


# ---- every NVML call, timed ----------------------------------------------------------------------------------

# label -> (pynvml function, its arguments after the device handle). An argument "NVML_..." is the binding's
# constant of that name, "FAST"/"SLOW" the field ids of that path; a label starting with "system:" takes no
# handle. Each NVML call the backend makes (exporter/gpu/backend.py), and the replacements issue 38 names.
CALLS: dict[str, tuple[str, tuple[Any, ...]]] = {
    "system:nvmlSystemGetDriverVersion": ("nvmlSystemGetDriverVersion", ()),
    "system:nvmlDeviceGetCount": ("nvmlDeviceGetCount", ()),
    "system:nvmlDeviceGetHandleByIndex(0)": ("nvmlDeviceGetHandleByIndex", (0,)),
    "nvmlDeviceGetUUID": ("nvmlDeviceGetUUID", ()),
    "nvmlDeviceGetName": ("nvmlDeviceGetName", ()),
    "nvmlDeviceGetPciInfo": ("nvmlDeviceGetPciInfo", ()),
    "nvmlGpmQueryDeviceSupport": ("nvmlGpmQueryDeviceSupport", ()),
    "nvmlDeviceGetCpuAffinity": ("nvmlDeviceGetCpuAffinity", (16,)),
    "nvmlDeviceGetMemoryAffinity": ("nvmlDeviceGetMemoryAffinity", (4, "NVML_AFFINITY_SCOPE_NODE")),
    "nvmlDeviceGetMigMode": ("nvmlDeviceGetMigMode", ()),
    "nvmlDeviceGetMaxMigDeviceCount": ("nvmlDeviceGetMaxMigDeviceCount", ()),
    "nvmlDeviceGetMigDeviceHandleByIndex(0)": ("nvmlDeviceGetMigDeviceHandleByIndex", (0,)),
    "nvmlDeviceGetFieldValues(fast)": ("nvmlDeviceGetFieldValues", ("FAST",)),
    "nvmlDeviceGetFieldValues(slow)": ("nvmlDeviceGetFieldValues", ("SLOW",)),
    "nvmlDeviceGetClockInfo(SM)": ("nvmlDeviceGetClockInfo", ("NVML_CLOCK_SM",)),
    "nvmlDeviceGetMaxClockInfo(SM)": ("nvmlDeviceGetMaxClockInfo", ("NVML_CLOCK_SM",)),
    "nvmlDeviceGetPowerUsage": ("nvmlDeviceGetPowerUsage", ()),
    "nvmlDeviceGetEnforcedPowerLimit": ("nvmlDeviceGetEnforcedPowerLimit", ()),
    "nvmlDeviceGetSamples(GPU)": ("nvmlDeviceGetSamples", ("NVML_GPU_UTILIZATION_SAMPLES", 0)),
    "nvmlDeviceGetSamples(MEM)": ("nvmlDeviceGetSamples", ("NVML_MEMORY_UTILIZATION_SAMPLES", 0)),
    "nvmlDeviceGetUtilizationRates": ("nvmlDeviceGetUtilizationRates", ()),
    "nvmlDeviceGetCurrPcieLinkGeneration": ("nvmlDeviceGetCurrPcieLinkGeneration", ()),
    "nvmlDeviceGetCurrPcieLinkWidth": ("nvmlDeviceGetCurrPcieLinkWidth", ()),
    "nvmlDeviceGetMaxPcieLinkGeneration": ("nvmlDeviceGetMaxPcieLinkGeneration", ()),
    "nvmlDeviceGetMaxPcieLinkWidth": ("nvmlDeviceGetMaxPcieLinkWidth", ()),
    "nvmlDeviceGetGpuMaxPcieLinkGeneration": ("nvmlDeviceGetGpuMaxPcieLinkGeneration", ()),
    "nvmlDeviceGetCurrentClocksEventReasons": ("nvmlDeviceGetCurrentClocksEventReasons", ()),
    "nvmlDeviceGetCurrentClocksThrottleReasons": ("nvmlDeviceGetCurrentClocksThrottleReasons", ()),
    "nvmlDeviceGetTemperature(GPU)": ("nvmlDeviceGetTemperature", ("NVML_TEMPERATURE_GPU",)),
    "nvmlDeviceGetTemperatureV(GPU)": ("nvmlDeviceGetTemperatureV", ("NVML_TEMPERATURE_GPU",)),
    "nvmlDeviceGetMemoryInfo": ("nvmlDeviceGetMemoryInfo", ()),
    "nvmlDeviceGetComputeRunningProcesses_v3": ("nvmlDeviceGetComputeRunningProcesses_v3", ()),
    "nvmlDeviceGetComputeRunningProcesses_v2": ("nvmlDeviceGetComputeRunningProcesses_v2", ()),
    "nvmlDeviceGetMPSComputeRunningProcesses_v3": ("nvmlDeviceGetMPSComputeRunningProcesses_v3", ()),
    "nvmlDeviceGetProcessUtilization": ("nvmlDeviceGetProcessUtilization", (0,)),
    "nvmlDeviceGetProcessesUtilizationInfo": ("nvmlDeviceGetProcessesUtilizationInfo", (0,)),
    "nvmlDeviceGetSupportedEventTypes": ("nvmlDeviceGetSupportedEventTypes", ()),
}


def _args(nvml: Any, args: tuple[Any, ...]) -> list[Any]:
    """CALLS arguments with the binding's constants and the field ids filled in."""
    ids = {"FAST": [f.field_id for f in ON_PATH["fast"]], "SLOW": [f.field_id for f in ON_PATH[SLOW]]}
    return [ids[a] if a in ids else getattr(nvml, a) if isinstance(a, str) else a for a in args]


def time_call(nvml: Any, fn: Callable[[], Any], reps: int) -> dict[str, Any]:
    """``fn`` called ``reps`` times: return codes by name, latency percentiles (µs), the first answer."""
    codes: dict[str, int] = {}
    lat: list[float] = []
    first: Any = None
    for i in range(reps):
        t0 = time.perf_counter()
        try:
            v = fn()
            code = "SUCCESS"
        except Exception as e:
            v, code = None, error_name(nvml, e)
        lat.append((time.perf_counter() - t0) * 1e6)
        codes[code] = codes.get(code, 0) + 1
        if i == 0:
            first = jsonable(v) if code == "SUCCESS" else None
    return {"returns": codes, "p50_us": _r(percentile(lat, 50)), "p99_us": _r(percentile(lat, 99)),
            "max_us": _r(max(lat)), "first": first}


def _r(v: float, nd: int = 1) -> float | None:
    return round(v, nd) if math.isfinite(v) else None


def time_calls(nvml: Any, handles: list[Any], reps: int) -> dict[str, Any]:
    """Every call of ``call_table`` on every GPU; the event-set calls once per GPU."""
    out: dict[str, Any] = {}
    for i, h in enumerate(handles):
        per: dict[str, Any] = {}
        for label, (name, args) in CALLS.items():
            head = () if label.startswith("system:") else (h,)
            try:
                fn, full = getattr(nvml, name), [*head, *_args(nvml, args)]
            except AttributeError as e:  # the binding lacks the function or a constant
                per[label] = {"returns": {error_name(nvml, e): reps}}
                continue
            per[label] = time_call(nvml, partial(fn, *full), reps)
        per["nvmlEventSetWait_v2(1 ms)"] = _event_wait(nvml, h, max(1, reps // 10))
        out[str(i)] = per
    return out


def _event_wait(nvml: Any, h: Any, reps: int) -> dict[str, Any]:
    """Xid events armed as the backend arms them; a 1 ms wait timed (TIMEOUT is the normal answer)."""
    try:
        es = nvml.nvmlEventSetCreate()
    except Exception as e:
        return {"returns": {error_name(nvml, e): 1}}
    try:
        reg = ask(nvml, "nvmlDeviceRegisterEvents", h, nvml.nvmlEventTypeXidCriticalError, es)
        res = time_call(nvml, lambda: nvml.nvmlEventSetWait_v2(es, 1), reps)
        return res | {"register": reg}
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlEventSetFree(es)


def backend_calls(nvml: Any, seconds: float) -> dict[str, Any]:
    """The backend's own fast (100 ms), buffered (1 s) and slow paths for ``seconds``, with its profile."""
    from exporter.gpu.backend import NvmlBackend

    backend = NvmlBackend(lambda: nvml, profile=True)
    errors: list[str] = []
    try:
        end = time.monotonic() + seconds
        nxt = {"fast": 0.0, "buffered": 0.0, "slow": 0.0}
        period = {"fast": 0.1, "buffered": 1.0, "slow": 5.0}
        while time.monotonic() < end:
            now = time.monotonic()
            for path, due in nxt.items():
                if now >= due:
                    try:
                        getattr(backend, path)()
                    except Exception as e:
                        errors.append(f"{path}: {e!r}"[:300])
                    nxt[path] = now + period[path]
            time.sleep(max(0.0, min(*nxt.values(), end) - time.monotonic()))
        stats = {name: {"calls": st.calls, "errors": st.errors, "last": st.last,
                        "mean_us": round(st.total_us / st.calls, 1) if st.calls else None,
                        "max_us": round(st.max_us, 1)}
                 for name, st in sorted(getattr(backend, "stats", {}).items())}
        return {"driver": getattr(backend, "driver_version", None), "calls": stats, "errors": errors[:20]}
    finally:
        backend.close()


# ---- field trace --------------------------------------------------------------------------------------------

def trace_fields(nvml: Any, handles: list[Any], seconds: float, period: float = 0.01) -> dict[str, Any]:
    """Every field of the table read every ``period`` s on every GPU: per read, per field
    ``[host_ms, ret, type, value, ts_us, latency_us]``."""
    ids = [f.field_id for f in FIELDS] + list(EXTRA_FIELD_IDS)
    rows: dict[str, dict[str, list[list[Any]]]] = {str(i): {str(fid): [] for fid in ids}
                                                    for i in range(len(handles))}
    t0 = time.monotonic()
    nxt = t0
    while True:
        now = time.monotonic()
        if now - t0 >= seconds:
            break
        for i, h in enumerate(handles):
            host_ms = round((time.monotonic() - t0) * 1e3, 3)
            try:
                values = nvml.nvmlDeviceGetFieldValues(h, ids)
            except Exception as e:
                for fid in ids:
                    rows[str(i)][str(fid)].append([host_ms, error_name(nvml, e), None, None, None, None])
                continue
            for v in values:
                ret = int(v.nvmlReturn)
                vt = int(v.valueType)
                val = getattr(v.value, _VALUE_MEMBER.get(vt, "ullVal")) if ret == 0 else None
                rows[str(i)].setdefault(str(int(v.fieldId)), []).append(
                    [host_ms, ret, vt, jsonable(val), int(v.timestamp), int(v.latencyUsec)])
        nxt += period
        time.sleep(max(0.0, nxt - time.monotonic()))
    return rows


def analyse_trace(nvml: Any, rows: dict[str, dict[str, list[list[Any]]]]) -> dict[str, Any]:
    """Per GPU and field: return codes, value types, refresh period (from the field's own timestamps), the
    period and size of value steps, the largest value and whether it passed 2^32, decreases."""
    names = {str(f.field_id): f.key for f in FIELDS} | {str(k): v for k, v in EXTRA_FIELD_IDS.items()}
    codes = {v: k[len("NVML_ERROR_"):] for k, v in vars(nvml).items()
             if k.startswith("NVML_ERROR_") and isinstance(v, int)}
    out: dict[str, Any] = {}
    for gpu, fields in rows.items():
        per: dict[str, Any] = {}
        for fid, reads in fields.items():
            rets: dict[str, int] = {}
            for r in reads:
                name = "SUCCESS" if r[1] == 0 else (codes.get(r[1], str(r[1])) if isinstance(r[1], int) else r[1])
                rets[name] = rets.get(name, 0) + 1
            ok = [r for r in reads if r[1] == 0 and isinstance(r[3], (int, float))]
            ts = [r[4] for r in ok]
            ts_steps = [b - a for a, b in itertools.pairwise(ts) if b != a]
            changes = [(a, b) for a, b in itertools.pairwise(ok) if b[3] != a[3]]
            change_ms = [y[1][0] - x[1][0] for x, y in itertools.pairwise(changes)]
            steps = [b[3] - a[3] for a, b in changes]
            values = [r[3] for r in ok]
            per[fid] = {
                "key": names.get(fid), "reads": len(reads), "returns": rets,
                "value_types": sorted({VALUE_TYPES.get(r[2], str(r[2])) for r in ok}),
                "timestamp_changes": len(ts_steps),
                "refresh_ms": _spread([s / 1e3 for s in ts_steps]),
                "value_changes": len(changes),
                "value_change_every_ms": _spread(change_ms),
                "step": _spread([float(s) for s in steps if s > 0]),
                "decreases": sum(1 for s in steps if s < 0),
                "min_value": min(values) if values else None,
                "max_value": max(values) if values else None,
                "above_2_32": bool(values) and max(values) >= 2**32,
                "latency_us": _spread([float(r[5]) for r in ok]),
            }
        out[gpu] = per
    return out


def _spread(xs: list[float]) -> dict[str, float | None] | None:
    if not xs:
        return None
    return {"min": round(min(xs), 3), "median": round(statistics.median(xs), 3), "max": round(max(xs), 3),
            "n": len(xs)}


# ---- GPM ----------------------------------------------------------------------------------------------------

def gpm_compare(nvml: Any, handles: list[Any], seconds: float) -> dict[str, Any]:
    """GPM samples every 100 ms on each supporting GPU; metrics of each 100 ms pair and of 1 s pairs of the same
    samples; sample and metrics call latencies."""
    out: dict[str, Any] = {}
    for i, h in enumerate(handles):
        sup = _gpm_supported(nvml, h)
        if sup != 1:
            out[str(i)] = {"supported": sup}
            continue
        out[str(i)] = _gpm_one(nvml, h, seconds)
    return out


def _gpm_one(nvml: Any, h: Any, seconds: float) -> dict[str, Any]:
    n = max(2, round(seconds / 0.1) + 1)
    samples: list[Any] = []
    taken: list[tuple[float, Any]] = []
    get_us: list[float] = []
    errors: dict[str, int] = {}
    try:
        for _ in range(n):
            samples.append(nvml.nvmlGpmSampleAlloc())
        t0 = time.monotonic()
        for k, s in enumerate(samples):
            time.sleep(max(0.0, t0 + 0.1 * k - time.monotonic()))
            a = time.perf_counter()
            try:
                nvml.nvmlGpmSampleGet(h, s)
                taken.append((time.monotonic(), s))
            except Exception as e:
                name = error_name(nvml, e)
                errors[name] = errors.get(name, 0) + 1
            get_us.append((time.perf_counter() - a) * 1e6)
        pairs_100 = [_gpm_pair(nvml, a, b) for a, b in itertools.pairwise(taken)]
        pairs_1s = [_gpm_pair(nvml, taken[j], taken[j + 10]) for j in range(0, len(taken) - 10, 10)]
        return {"supported": 1, "samples": len(taken), "sample_errors": errors,
                "sample_get_us": {"p50": _r(percentile(get_us, 50)), "p99": _r(percentile(get_us, 99))},
                "metrics_get_us": _spread([p["us"] for p in pairs_100 if "us" in p]),
                "pairs_100ms": pairs_100, "pairs_1s": pairs_1s,
                "nonfinite_100ms": sum(p.get("nonfinite", 0) for p in pairs_100),
                "per_metric": _gpm_agree(pairs_100, pairs_1s)}
    except Exception as e:
        return {"supported": 1, "error": error_name(nvml, e)}
    finally:
        for s in samples:
            with contextlib.suppress(Exception):
                nvml.nvmlGpmSampleFree(s)


def _gpm_pair(nvml: Any, a: tuple[float, Any], b: tuple[float, Any]) -> dict[str, Any]:
    mg = nvml.c_nvmlGpmMetricsGet_t()
    mg.version = nvml.NVML_GPM_METRICS_GET_VERSION
    mg.numMetrics = len(GPM_METRICS)
    mg.sample1, mg.sample2 = a[1], b[1]
    for k, mid in enumerate(GPM_METRICS):
        mg.metrics[k].metricId = mid
    t = time.perf_counter()
    try:
        nvml.nvmlGpmMetricsGet(mg)
    except Exception as e:
        return {"dt_ms": round((b[0] - a[0]) * 1e3, 2), "error": error_name(nvml, e)}
    us = (time.perf_counter() - t) * 1e6
    values: dict[str, Any] = {}
    nonfinite = 0
    for k, mid in enumerate(GPM_METRICS):
        m = mg.metrics[k]
        if int(m.nvmlReturn) != 0:
            values[GPM_METRICS[mid]] = {"ret": int(m.nvmlReturn)}
            continue
        v = float(m.value)
        nonfinite += not math.isfinite(v)
        values[GPM_METRICS[mid]] = round(v, 4) if math.isfinite(v) else repr(v)
    return {"t_s": round(a[0], 3), "dt_ms": round((b[0] - a[0]) * 1e3, 2), "us": round(us, 1),
            "nonfinite": nonfinite, "values": values}


def _gpm_agree(p100: list[dict[str, Any]], p1s: list[dict[str, Any]]) -> dict[str, Any]:
    """Per metric: the 1 s pair's value next to the time-weighted mean of the 100 ms pairs inside it."""
    out: dict[str, Any] = {}
    for name in GPM_METRICS.values():
        rows = []
        for big in p1s:
            t0, t1 = big["t_s"], big["t_s"] + big["dt_ms"] / 1e3
            inner = [p for p in p100 if "values" in p and t0 - 1e-6 <= p["t_s"] < t1 - 1e-6
                     and isinstance(p["values"].get(name), float)]
            whole = big.get("values", {}).get(name)
            if inner and isinstance(whole, float):
                w = sum(p["dt_ms"] for p in inner)
                mean = sum(p["values"][name] * p["dt_ms"] for p in inner) / w if w else math.nan
                rows.append({"one_s": whole, "mean_of_100ms": round(mean, 4), "pairs": len(inner)})
        out[name] = rows
    return out


# ---- the daemon and the workloads ---------------------------------------------------------------------------

def parse_metrics(text: str) -> dict[str, float]:
    """``name{labels}`` -> value of every sample line of the RATE_SERIES."""
    out: dict[str, float] = {}
    for m in _SAMPLE.finditer(text):
        if m.group(1) in RATE_SERIES:
            with contextlib.suppress(ValueError):
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def verdicts(text: str) -> dict[str, str]:
    """gpu (and mig) -> current cause, from gpufeed_gpu_bottleneck."""
    out: dict[str, str] = {}
    for m in _BOTTLENECK.finditer(text):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if float(m.group(2)) == 1.0:
            key = labels.get("gpu", "?") + (f"/{labels['mig']}" if labels.get("mig") else "")
            out[key] = labels.get("cause", "?")
    return out


class Daemon:
    """``gpufeed serve`` on a free 127.0.0.1 port (bench/procs.py: its own process group, SIGTERM then
    SIGKILL), its log kept in the results folder."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.port = procs.free_port()
        self.proc = procs.gpufeed(self.port, [], log_level="info")
        self.proc.env = env  # the stub's library path in a dry run
        self.log = log

    def start(self, timeout: float) -> None:
        self.proc.start()
        procs.wait_ready(self.proc, self.port, timeout=timeout)

    def scrape(self) -> str:
        status, body = procs.get(self.port, timeout=5.0)
        return body.decode(errors="replace") if status == 200 else ""

    def cpu(self) -> float | None:
        try:
            return procstat.cpu_seconds(self.proc.pid)
        except Exception:
            return None

    def stop(self) -> int | None:
        with contextlib.suppress(OSError), self.log.open("a") as f:
            f.write(self.proc.log_text())
        return self.proc.stop(grace=5.0)


class Workload:
    """One bench/gpu_workloads.py child: started in its own process group, killed at its deadline."""

    def __init__(self, name: str, seconds: float, mode: str, env: dict[str, str]) -> None:
        self.name = name
        self.proc = procs.Proc(f"workload-{name}", [sys.executable, str(WORKLOAD_SCRIPT), name, f"{seconds}", mode],
                               env=env)

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.proc.log_text().splitlines():
            if line.startswith('{"event"'):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out

    def started(self, deadline: float) -> float | None:
        """Wall-clock time the measured loop began, once announced before ``deadline`` (monotonic)."""
        while time.monotonic() < deadline and self.proc.alive():
            for e in self.events():
                if e["event"] == "start":
                    return float(e["t"])
            time.sleep(0.05)
        for e in self.events():
            if e["event"] == "start":
                return float(e["t"])
        return None

    def result(self, deadline: float) -> dict[str, Any]:
        """Its result line, waiting until ``deadline`` (monotonic), then the process is stopped either way."""
        while time.monotonic() < deadline and self.proc.alive():
            time.sleep(0.05)
        overran = self.proc.alive()
        rc = self.proc.stop(grace=3.0)
        res = next((e for e in self.events() if e["event"] == "result"), None)
        if res is None:
            return {"error": f"no result (rc={rc}{', killed at its deadline' if overran else ''})",
                    "log_tail": self.proc.log_tail(1500)}
        res.pop("event", None)
        return res | {"rc": rc}


def run_workload(name: str, plan: Plan, env: dict[str, str], daemon: Daemon | None) -> dict[str, Any]:
    """One workload (or idle) for plan.seconds, the daemon scraped every plan.scrape_every."""
    mode = "cpu" if plan.dry_run else "cuda"
    expected = WORKLOADS[name]
    w = None if name == "idle" else Workload(name, plan.seconds, mode, env)
    out: dict[str, Any] = {"expected": expected}
    try:
        if w is not None:
            w.proc.start()
            t_start = w.started(time.monotonic() + plan.setup_s)
            if t_start is None:
                return out | {"truth": w.result(time.monotonic() + 1.0), "error": "workload never started"}
        else:
            t_start = time.time()
        timeline: list[list[Any]] = []
        first: tuple[float, str] | None = None
        last: tuple[float, str] | None = None
        cpu0 = daemon.cpu() if daemon else None
        w0 = time.monotonic()
        while time.time() < t_start + plan.seconds:
            if daemon is not None:
                with contextlib.suppress(OSError):
                    text = daemon.scrape()
                    t_rel = round(time.time() - t_start, 2)
                    v = verdicts(text)
                    timeline.append([t_rel, v])
                    if first is None and text:
                        first = (t_rel, text)
                    last = (t_rel, text)
            time.sleep(max(0.0, min(plan.scrape_every, t_start + plan.seconds - time.time())))
        cpu1 = daemon.cpu() if daemon else None
        out["truth"] = w.result(time.monotonic() + 30.0) if w is not None else {"wall_s": plan.seconds}
        if daemon is not None:
            out |= judge(expected, timeline, first, last)
            if cpu0 is not None and cpu1 is not None:
                out["daemon_cpu_core_fraction"] = round((cpu1 - cpu0) / (time.monotonic() - w0), 4)
            if last is not None:
                out["final_metrics"] = last[1]
    finally:
        if w is not None:
            w.proc.stop(grace=3.0)
    return out


def judge(expected: str, timeline: list[list[Any]], first: tuple[float, str] | None,
          last: tuple[float, str] | None) -> dict[str, Any]:
    """Verdicts of GPU 0 over the workload: what was seen, the share that was right, when it first was, rates."""
    gpu0 = [(t, v.get("0") or next(iter(v.values()), None)) for t, v in timeline]
    seen: dict[str, int] = {}
    for _, c in gpu0:
        seen[str(c)] = seen.get(str(c), 0) + 1
    correct = [t for t, c in gpu0 if c == expected]
    half = [c for t, c in gpu0 if timeline and t >= timeline[-1][0] / 2]
    out: dict[str, Any] = {
        "verdicts_seen": seen, "timeline": gpu0,
        "detection_s": correct[0] if correct else None,
        "correct_share_second_half": round(sum(c == expected for c in half) / len(half), 3) if half else None,
    }
    if first is not None and last is not None and last[0] > first[0]:
        a, b = parse_metrics(first[1]), parse_metrics(last[1])
        dt = last[0] - first[0]
        out["rates"] = {k: round((b[k] - a[k]) / dt, 6) for k in sorted(b) if k in a and '{gpu="0"' in k}
    return out


def compare(result: dict[str, Any]) -> dict[str, Any]:
    """The daemon's rates next to the workload's own ground truth."""
    rates, truth = result.get("rates", {}), result.get("truth", {})
    out: dict[str, Any] = {}

    def rate(prefix: str) -> float | None:
        vals = [v for k, v in rates.items() if k.startswith(prefix)]
        return round(sum(vals), 4) if vals else None

    out["daemon_busy_ratio"] = rate("gpufeed_gpu_busy_seconds_total")
    out["daemon_sm_active_ratio"] = rate("gpufeed_gpu_sm_active_seconds_total")
    out["truth_busy_ratio"] = truth.get("busy_ratio")
    out["daemon_pcie_rx_bytes_per_s"] = rate("gpufeed_gpu_pcie_rx_bytes_total")
    out["truth_h2d_bytes_per_s"] = truth.get("h2d_bytes_per_s")
    out["daemon_waiting_ratio"] = rate("gpufeed_gpu_waiting_seconds_total")
    return {k: v for k, v in out.items() if v is not None}


# ---- the run ------------------------------------------------------------------------------------------------

class Run:
    """One validation run: the sections in order, each recorded (or its error, or why it was skipped)."""

    def __init__(self, plan: Plan, out: Path, nvml: Any, env: dict[str, str]) -> None:
        self.plan, self.out, self.nvml, self.env = plan, out, nvml, env
        self.budget = Budget(plan.budget)
        self.results: dict[str, Any] = {"meta": {"dry_run": plan.dry_run, "plan": vars(plan),
                                                 "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                                        "errors": []}
        self.handles: list[Any] = []

    def section(self, name: str, need: float, fn: Callable[[], Any]) -> Any:
        """``fn()`` recorded under ``name``; skipped when ``need`` s no longer fit; an exception recorded."""
        t0 = time.monotonic()
        if not self.budget.allows(need):
            self.results[name] = {"skipped": f"budget: {self.budget.left():.0f} s left, needs {need:.0f} s"}
            return None
        try:
            self.results[name] = fn()
        except Exception as e:
            self.results[name] = {"error": repr(e)[:500]}
            self.results["errors"].append({"section": name, "error": repr(e)[:500],
                                           "traceback": traceback.format_exc()[-2000:]})
        self.results.setdefault("section_seconds", {})[name] = round(time.monotonic() - t0, 2)
        return self.results[name]

    def execute(self) -> dict[str, Any]:
        nvml = self.nvml
        try:
            nvml.nvmlInit()
        except Exception as e:
            why = error_name(nvml, e)
            self.results["errors"].append({"section": "init", "error": why})
            for name in ("host", "calls", "backend_calls", "fields", "gpm"):
                self.results[name] = {"skipped": f"nvmlInit failed: {why}"}
            nvml = None
        if nvml is not None:
            try:
                count = nvml.nvmlDeviceGetCount()
                for i in range(count):
                    try:
                        self.handles.append(nvml.nvmlDeviceGetHandleByIndex(i))
                    except Exception as e:  # this GPU is unreachable (NO_PERMISSION, ...); the others are probed
                        self.results["errors"].append({"section": "handles", "gpu": i,
                                                       "error": error_name(nvml, e)})
                self.section("host", 1, lambda: host_facts(nvml, self.handles))
                self.section("calls", 5, lambda: time_calls(nvml, self.handles, self.plan.reps))
                self.section("backend_calls", 10, lambda: backend_calls(nvml, 1.0 if self.plan.dry_run else 6.0))
                self.section("fields", self.plan.trace_seconds + self.plan.gpm_seconds + self.plan.setup_s,
                             self._under_load)
            finally:
                with contextlib.suppress(Exception):
                    nvml.nvmlShutdown()
        self.section("workloads", 30 + self.plan.seconds, self._workloads)
        return self.results

    def _under_load(self) -> dict[str, Any]:
        """The field trace and GPM with matmul and pinned copies running (their ground truth kept)."""
        nvml, plan = self.nvml, self.plan
        span = plan.trace_seconds + plan.gpm_seconds + plan.start_s / 5
        mode = "cpu" if plan.dry_run else "cuda"
        load = [Workload(n, span, mode, self.env) for n in ("matmul", "h2d_pinned")]
        try:
            for w in load:
                w.proc.start()
            for w in load:
                w.started(time.monotonic() + plan.setup_s)
            rows = trace_fields(nvml, self.handles, plan.trace_seconds)
            (self.out / "fields_trace.json").write_text(json.dumps(rows, separators=(",", ":")) + "\n")
            self.results["gpm"] = gpm_compare(nvml, self.handles, plan.gpm_seconds)
            return {"load": {w.name: w.result(time.monotonic() + 15.0) for w in load},
                    "per_gpu": analyse_trace(nvml, rows)}
        finally:
            for w in load:
                w.proc.stop(grace=3.0)

    def _workloads(self) -> dict[str, Any]:
        plan = self.plan
        out: dict[str, Any] = {}
        daemon = Daemon(self.env, self.out / "daemon.log")
        try:
            daemon.start(timeout=60.0)
            per = plan.seconds + plan.start_s
            for name in WORKLOADS:
                if not self.budget.allows(per):
                    out[name] = {"skipped": f"budget: {self.budget.left():.0f} s left"}
                    continue
                try:
                    r = run_workload(name, plan, self.env, daemon)
                except Exception as e:
                    r = {"error": repr(e)[:500]}
                    self.results["errors"].append({"section": f"workload {name}", "error": repr(e)[:500]})
                final = r.pop("final_metrics", None)
                if final:
                    (self.out / f"{name}.prom").write_text(final)
                r["compare"] = compare(r)
                out[name] = r
            self.results["ab"] = {"running": self._ab_arm(daemon)}
        finally:
            self.results["daemon"] = {"port": daemon.port, "rc": daemon.stop()}
        self.results["ab"]["stopped"] = self._ab_arm(None)
        return out

    def _ab_arm(self, daemon: Daemon | None) -> dict[str, Any]:
        plan = Plan(**(vars(self.plan) | {"seconds": self.plan.ab_seconds}))
        arm: dict[str, Any] = {}
        for name in AB_WORKLOADS:
            if not self.budget.allows(plan.seconds + plan.start_s):
                arm[name] = {"skipped": f"budget: {self.budget.left():.0f} s left"}
                continue
            w = Workload(name, plan.seconds, "cpu" if plan.dry_run else "cuda", self.env)
            try:
                w.proc.start()
                w.started(time.monotonic() + plan.setup_s)
                arm[name] = w.result(time.monotonic() + plan.seconds + 30.0)
            finally:
                w.proc.stop(grace=3.0)
            if daemon is not None:
                arm[name]["daemon_alive"] = daemon.proc.alive()
        return arm


# ---- the summary --------------------------------------------------------------------------------------------

def summary_md(res: dict[str, Any]) -> str:
    """A readable summary of results.json: one section per part of the run."""
    lines = ["# gpufeed real-GPU validation run", ""]
    meta = res.get("meta", {})
    lines += [f"Started {meta.get('started')}; dry run: {meta.get('dry_run')}; "
              f"plan: {json.dumps(meta.get('plan'), sort_keys=True)}", ""]
    lines += ["## Host", ""]
    host = res.get("host") or {}
    for k in ("driver_version", "driver_branch", "cuda_driver_version", "nvml_version", "binding", "uid", "euid",
              "capabilities", "rm_profiling_admin_only", "kernel", "python", "cpus"):
        lines.append(f"- {k}: `{json.dumps(host.get(k))}`")
    for i, g in enumerate(host.get("gpus", []) if isinstance(host.get("gpus"), list) else []):
        lines.append(f"- GPU {i}: `{json.dumps(g, sort_keys=True)}`")
    if "skipped" in host or "error" in host:
        lines.append(f"- {json.dumps(host)}")
    lines += ["", "## NVML calls", "", "| gpu | call | returns | p50 µs | p99 µs | max µs |",
              "|---|---|---|---|---|---|"]
    calls = res.get("calls") or {}
    for gpu, per in calls.items() if not {"skipped", "error"} & set(calls) else []:
        for name, c in per.items():
            lines.append(f"| {gpu} | {name} | {_codes(c.get('returns'))} | {c.get('p50_us')} | {c.get('p99_us')} | "
                         f"{c.get('max_us')} |")
    if {"skipped", "error"} & set(calls):
        lines.append(f"\n{json.dumps(calls)}")
    bc = res.get("backend_calls") or {}
    lines += ["", "## The backend's own calls (profile)", ""]
    for name, c in (bc.get("calls") or {}).items():
        shown = c | {"last": str(c.get("last"))[:100]}
        lines.append(f"- {name}: {json.dumps(shown, sort_keys=True)}")
    if bc.get("errors") or "error" in bc or "skipped" in bc:
        lines.append(f"- errors: {json.dumps(bc.get('errors') or bc)}")
    lines += ["", "## Fields (10 ms trace under load)", "",
              "| gpu | id | key | returns | types | refresh ms (median) | value change every ms | step median | "
              "max | > 2^32 | decreases |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    fields = res.get("fields") or {}
    for gpu, per in (fields.get("per_gpu") or {}).items():
        for fid, f in per.items():
            lines.append(f"| {gpu} | {fid} | {f['key']} | {_codes(f['returns'])} | {','.join(f['value_types'])} | "
                         f"{_med(f['refresh_ms'])} | {_med(f['value_change_every_ms'])} | {_med(f['step'])} | "
                         f"{f['max_value']} | {f['above_2_32']} | {f['decreases']} |")
    if "skipped" in fields or "error" in fields:
        lines.append(f"\n{json.dumps(fields)}")
    lines += ["", "## GPM: 100 ms pairs against 1 s pairs of the same samples", ""]
    for gpu, g in (res.get("gpm") or {}).items():
        if not isinstance(g, dict) or "per_metric" not in g:
            lines.append(f"- GPU {gpu}: {json.dumps(g)[:300]}")
            continue
        lines.append(f"- GPU {gpu}: {g['samples']} samples, sample errors {g['sample_errors']}, SampleGet "
                     f"{g['sample_get_us']} µs, MetricsGet {g['metrics_get_us']} µs, non-finite "
                     f"{g['nonfinite_100ms']}")
        for m, rows in g["per_metric"].items():
            lines.append(f"  - {m}: " + "; ".join(f"1 s {r['one_s']} vs 100 ms mean {r['mean_of_100ms']}"
                                                  for r in rows))
    lines += ["", "## Workloads with the daemon running", "",
              "| workload | expected | verdicts seen | first correct (s) | correct, 2nd half | daemon busy | "
              "truth busy | daemon PCIe rx B/s | truth H2D B/s | daemon CPU | ground truth |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    wl = res.get("workloads") or {}
    for name, r in wl.items() if isinstance(wl, dict) and not {"skipped", "error"} & set(wl) else []:
        c = r.get("compare", {})
        truth = r.get("truth", {})
        gt = {k: truth[k] for k in ("steps", "step_ms", "kernels_per_s", "data_wait_ratio", "bytes_copied",
                                    "tflops", "error") if k in truth}
        lines.append(f"| {name} | {r.get('expected')} | {_codes(r.get('verdicts_seen'))} | {r.get('detection_s')} | "
                     f"{r.get('correct_share_second_half')} | {c.get('daemon_busy_ratio')} | "
                     f"{c.get('truth_busy_ratio')} | {c.get('daemon_pcie_rx_bytes_per_s')} | "
                     f"{c.get('truth_h2d_bytes_per_s')} | {r.get('daemon_cpu_core_fraction')} | "
                     f"`{json.dumps(gt or r.get('skipped') or r.get('error'))}` |")
    if {"skipped", "error"} & set(wl):
        lines.append(f"\n{json.dumps(wl)}")
    lines += ["", "## A/B: step latency with the daemon running and stopped", "",
              "| workload | running p50 ms | running p99 ms | stopped p50 ms | stopped p99 ms |",
              "|---|---|---|---|---|"]
    ab = res.get("ab") or {}
    for name in AB_WORKLOADS:
        on = (ab.get("running") or {}).get(name, {}).get("step_ms") or {}
        off = (ab.get("stopped") or {}).get(name, {}).get("step_ms") or {}
        lines.append(f"| {name} | {on.get('p50')} | {on.get('p99')} | {off.get('p50')} | {off.get('p99')} |")
    lines += ["", "## Errors", ""]
    errors = res.get("errors") or []
    lines += [f"- {e.get('section')}: {e.get('error')}" for e in errors] or ["- none"]
    lines += ["", f"Section seconds: {json.dumps(res.get('section_seconds'))}", ""]
    return "\n".join(lines)


def _codes(c: Any) -> str:
    return ", ".join(f"{k} x{v}" for k, v in c.items()) if isinstance(c, dict) else str(c)


def _med(s: Any) -> Any:
    return s["median"] if isinstance(s, dict) else None


# ---- entry --------------------------------------------------------------------------------------------------

def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", s).strip("-").lower() or "gpu"


def default_out(nvml: Any, dry_run: bool) -> Path:
    """bench/results/<UTC date>-<first GPU's name>/ (the name read once through NVML)."""
    name = "dry-run" if dry_run else "no-gpu"
    with contextlib.suppress(Exception):
        nvml.nvmlInit()
        try:
            name = _slug(str(jsonable(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(0)))))
            name += "-dry-run" if dry_run else ""
        finally:
            nvml.nvmlShutdown()
    return REPO / "bench" / "results" / f"{time.strftime('%Y%m%d-%H%M', time.gmtime())}-{name}"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="results folder (default bench/results/<date>-<gpu name>/)")
    ap.add_argument("--dry-run", action="store_true", help="CPU workloads over bench/nvmlstub (checks the harness)")
    ap.add_argument("--seconds", type=float, help="each workload's measured seconds (default 38; dry 3)")
    ap.add_argument("--ab-seconds", type=float, help="each A/B arm's seconds (default 12; dry 1.5)")
    ap.add_argument("--trace-seconds", type=float, help="the 10 ms field trace (default 4; dry 1)")
    ap.add_argument("--gpm-seconds", type=float, help="GPM at 100 ms (default 3; dry 1)")
    ap.add_argument("--reps", type=int, help="repetitions per NVML call (default 50; dry 5)")
    ap.add_argument("--budget", type=float, help="the whole run's seconds (default 480; dry 120)")
    ns = ap.parse_args(argv)
    plan = Plan.dry() if ns.dry_run else Plan()
    for k in ("seconds", "ab_seconds", "trace_seconds", "gpm_seconds", "reps", "budget"):
        if getattr(ns, k) is not None:
            setattr(plan, k, getattr(ns, k))
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    import pynvml

    if plan.dry_run:
        lib = nvmlstub.build()
        env["NVML_STUB_GPUS"] = os.environ["NVML_STUB_GPUS"] = env.get("NVML_STUB_GPUS", "1")
        env["LD_LIBRARY_PATH"] = str(lib.parent) + (os.pathsep + env["LD_LIBRARY_PATH"]
                                                    if env.get("LD_LIBRARY_PATH") else "")
        nvmlstub.load(lib)
    out = ns.out or default_out(pynvml, plan.dry_run)
    out.mkdir(parents=True, exist_ok=True)
    # SIGTERM (timeout(1), the device tool) unwinds like Ctrl-C: every child and the daemon are stopped.
    signal.signal(signal.SIGTERM, _interrupt)
    run = Run(plan, out, pynvml, env)
    watchdog = threading.Timer(plan.budget + 30, lambda: os.kill(os.getpid(), signal.SIGTERM))
    watchdog.daemon = True
    watchdog.start()
    try:
        res = run.execute()
    except KeyboardInterrupt:
        run.results["errors"].append({"section": "run", "error": "interrupted (SIGTERM or Ctrl-C)"})
        res = run.results
    finally:
        watchdog.cancel()
    res["meta"]["seconds"] = round(time.monotonic() - run.budget.start, 1)
    (out / "results.json").write_text(json.dumps(res, indent=1, sort_keys=True, default=repr) + "\n")
    (out / "summary.md").write_text(summary_md(res))
    print(f"gpu_real: results in {out} ({res['meta']['seconds']} s, {len(res['errors'])} errors)")
    return 1 if any(e.get("section") == "run" for e in res["errors"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
