"""A strict fake of the ``pynvml`` module, so the real GPU backend runs in CI and under ``--simulate``.

``FakeNvml`` is a module-like object: the backend gets it instead of ``pynvml`` (through
``ctx.shared["nvml"]``) and calls the same function names. It

- raises the *real* ``pynvml.NVMLError`` subclasses (``NVMLError(NVML_ERROR_NOT_SUPPORTED)`` is an
  ``NVMLError_NotSupported``),
- returns the real ``pynvml`` ctypes structs where the binding does (``nvmlPciInfo_t``,
  ``c_nvmlFieldValue_t`` arrays, ``c_nvmlSample_t``, ``c_nvmlMemory_t``, ``c_nvmlUtilization_t``,
  ``c_nvmlProcessUtilizationSample_t``), and objects with the same attribute names otherwise,
- forwards constants (``NVML_*``, ``nvmlClocks*``) and the ``NVMLError*`` classes from the real module,
- fails loudly (``AssertionError("FakeNvml: unexpected call ...")``) on any other attribute, on a field
  id or GPM metric it does not model, and on ``nvmlDeviceGetPcieThroughput`` (blocks ~20 ms; banned).

Its whole device state is one plain JSON-serialisable dict, so a simulator can compute it in one process,
write it to a file, and the daemon's ``FakeNvml.from_file(path)`` reloads it whenever the file changes
(write it to a temporary file and ``os.replace`` it, so a reader never sees half a file; an unreadable or
invalid file keeps the previous state and is counted in ``reload_errors``).

State (every key optional unless marked required; unknown keys are an error naming the key)
-----------------------------------------------------------------------------------------
Top level::

    {"t": 0.0,                  # seconds, the fake's clock. Driver timestamps (samples, GPM) derive from it:
                                #   microsecond timestamps are round(t * 1e6). Only differences matter.
     "driver_version": "550.54.15",
     "init_error": null,        # NVML error name (see "Error names"): nvmlInit raises it, e.g.
                                #   "library_not_found" (no driver), "driver_not_loaded", "no_permission"
     "devices": [ {...}, ... ]} # the GPUs, in NVML index order

Per device (the NVML index is the position in ``devices``; ``index``, if given, must equal it)::

    identity      "index": int, "uuid": "GPU-...", "name": "NVIDIA H100 80GB HBM3",
                  "pci_bus_id": "0000:82:00.0"   (required; sysfs form -- NVML reports "00000000:82:00.0")
    capability    "gpm": true                    GPM supported (Hopper+); false -> isSupportedDevice=0
                  "pcie_counter_bits": 32        width at which fields 197/198 wrap (32 -> reported as
                                                 NVML_VALUE_TYPE_UNSIGNED_INT, 64 -> UNSIGNED_LONG_LONG)
    faults        "lost": false                  every call for this GPU (handle lookup included) raises
                                                 GPU_IS_LOST; clear it to model recovery after a reset
                  "lost_error": "gpu_is_lost"    error of the calls *after* the first lost one (real drivers
                                                 often answer "unknown" then)
                  "unsupported": [names]         function names that raise NOT_SUPPORTED for this GPU, and
                                                 "field:<id>" entries whose per-field nvmlReturn is NOT_SUPPORTED
                  "errors": {name: error}        any function name -> error name, raised on every call
    counters (ABSOLUTE values at time t; the fake never advances them itself -- see advance_state)
                  "pcie_tx_bytes": 0, "pcie_rx_bytes": 0   unwrapped byte totals; fields 197/198 report them
                                                 modulo 2**pcie_counter_bits, GPM PCIe rates use the deltas.
                                                 TX is device->host.
                  "pcie_replays": 0              field 94 (NVML_FI_DEV_PCIE_REPLAY_COUNTER)
                  "throttle_ns": {reason: ns}    cumulative clock-event time, fields 74/76/269/270/271 for
                                                 sw_power_cap, sync_boost, sw_thermal, hw_thermal, hw_power_brake
                  "graphics_active_integral", "sm_active_integral", "sm_occupancy_integral",
                  "tensor_active_integral", "dram_active_integral": 0.0
                                                 integral over time of the ratio (0..1) in seconds; a GPM pair
                                                 (s1 at t1, s2 at t2) answers 100*(I2-I1)/(t2-t1) percent
    buffers       "util_samples": [[ts_us, percent], ...]       nvmlDeviceGetSamples(GPU_UTILIZATION_SAMPLES):
                                                 each value is the utilisation over the period ending at ts_us.
                                                 Entries with ts_us > lastSeenTimeStamp are returned, oldest
                                                 first; none -> NOT_FOUND (normal on an idle GPU)
                  "mem_util_samples": [[ts_us, percent], ...]   the same for MEMORY_UTILIZATION_SAMPLES
                  "util_acc": [start_s, gpu_integral, mem_integral]  advance_device's partial sample period
                  "process_util": [{"pid", "ts_us", "sm_pct", "mem_pct"}]  nvmlDeviceGetProcessUtilization,
                                                 the same lastSeen/NOT_FOUND rule
                  "energy_mj": 0                 field 83 (NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION), millijoules
                  Every field of exporter/gpu/fields.py is answered from its ``fake_key`` (the table says which);
                  a field the table lacks is an AssertionError.
    instantaneous "sm_clock_mhz": 345, "max_sm_clock_mhz": 1980, "power_w": 70.0, "power_limit_w": 700.0,
                  "temperature_c": 40, "memory_used_bytes": 0, "memory_total_bytes": 85899345920,
                  "link": {"gen", "width", "max_gen", "max_width", "gpu_max_gen", "gpu_max_width"}
                                                 current / system-limited max / GPU's own max (default 5/16 all)
                  "clock_event_reasons": ["gpu_idle"]   names of SPEC.md (exporter.gpu.constants)
                  "processes": [{"pid": int, "used_memory_bytes": int | null}]   compute processes; pids are
                                                 returned exactly as given, so garbage (0, -1, 2**32-1) tests
                                                 the backend's validation
                  "cpu_affinity": "0-15" | null  cpulist for nvmlDeviceGetCpuAffinity (null -> NOT_SUPPORTED)
                  "memory_affinity": "0" | null  nodelist for nvmlDeviceGetMemoryAffinity (null -> NOT_SUPPORTED)
                  "numa_node_id": null           nvmlDeviceGetNumaNodeId (only coherent GPU-as-NUMA-node
                                                 platforms answer; null -> NOT_SUPPORTED, as on x86 PCIe)

Error names are NVML_ERROR_* without the prefix, lower case: ``not_supported``, ``gpu_is_lost``,
``unknown``, ``library_not_found``, ``driver_not_loaded``, ``not_found``, ``timeout``, ...

``advance_state(state, dt, rates)`` / ``advance_device(dev, t0, t1, **rates)`` move the counters,
integrals and sample buffers forward consistently (the simulator may use them or compute its own).

Test hooks on the object: ``set_state(dict)``, ``state`` (a deep copy), ``calls`` (Counter of function
names), ``gpm_short_pairs`` (GPM pairs taken < 100 ms apart -- must stay 0), ``reload_errors``.
"""

from __future__ import annotations

import copy
import ctypes
import json
import math
import os
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from ctypes import c_ulonglong
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml

from exporter.cpulist import parse_cpulist
from exporter.gpu import constants as C  # noqa: N812 - short, used everywhere
from exporter.gpu import fields

TOP_KEYS = frozenset({"t", "driver_version", "init_error", "devices"})

DEVICE_DEFAULTS: Mapping[str, Any] = {
    "index": None,
    "uuid": None,
    "name": "NVIDIA H100 80GB HBM3",
    "pci_bus_id": None,
    "gpm": True,
    "pcie_counter_bits": 32,
    "lost": False,
    "lost_error": "gpu_is_lost",
    "unsupported": [],
    "errors": {},
    "pcie_tx_bytes": 0,
    "pcie_rx_bytes": 0,
    "pcie_replays": 0,
    "throttle_ns": {},
    "graphics_active_integral": 0.0,
    "sm_active_integral": 0.0,
    "sm_occupancy_integral": 0.0,
    "tensor_active_integral": 0.0,
    "dram_active_integral": 0.0,
    "util_samples": [],
    "mem_util_samples": [],
    "util_acc": None,
    "process_util": [],
    "sm_clock_mhz": 345,
    "max_sm_clock_mhz": 1980,
    "power_w": 70.0,
    "energy_mj": 0,
    "power_limit_w": 700.0,
    "temperature_c": 40,
    "memory_used_bytes": 0,
    "memory_total_bytes": 85899345920,
    "link": {},
    "clock_event_reasons": ["gpu_idle"],
    "processes": [],
    "cpu_affinity": None,
    "memory_affinity": None,
    "numa_node_id": None,
}
LINK_KEYS = ("gen", "width", "max_gen", "max_width", "gpu_max_gen", "gpu_max_width")
LINK_DEFAULTS = {"gen": 5, "width": 16, "max_gen": 5, "max_width": 16, "gpu_max_gen": 5, "gpu_max_width": 16}

# GPM metric id -> (device integral key, scale) for ratio metrics, or the byte counter for PCIe rates.
_GPM_RATIO = {
    C.GPM_GRAPHICS_UTIL: "graphics_active_integral",
    C.GPM_SM_UTIL: "sm_active_integral",
    C.GPM_SM_OCCUPANCY: "sm_occupancy_integral",
    C.GPM_ANY_TENSOR_UTIL: "tensor_active_integral",
    C.GPM_DRAM_BW_UTIL: "dram_active_integral",
}
_GPM_BYTES = {C.GPM_PCIE_TX_PER_SEC: "pcie_tx_bytes", C.GPM_PCIE_RX_PER_SEC: "pcie_rx_bytes"}

_FORWARDED_PREFIXES = ("NVML_", "nvmlClocksEventReason", "nvmlClocksThrottleReason", "NVMLError")
_BANNED = {"nvmlDeviceGetPcieThroughput": "blocks ~20 ms per call; use fields 197/198 (DESIGN.md)"}


class StateError(ValueError):
    """The fake's state dict is malformed; the message names the key."""


def nvml_error(name: str) -> pynvml.NVMLError:
    """The real pynvml exception for an error name like ``not_supported`` (NVML_ERROR_NOT_SUPPORTED)."""
    code = getattr(pynvml, f"NVML_ERROR_{name.upper()}", None)
    if not isinstance(code, int):
        raise StateError(f"unknown NVML error name {name!r}")
    return pynvml.NVMLError(code)


def _check_error_name(name: object, where: str) -> None:
    if not isinstance(name, str) or not isinstance(getattr(pynvml, f"NVML_ERROR_{name.upper()}", None), int):
        raise StateError(f"{where}: unknown NVML error name {name!r}")


def normalize_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``state`` with every default filled in; StateError naming a bad or unknown key."""
    if not isinstance(state, Mapping):
        raise StateError("state must be a mapping")
    unknown = set(state) - TOP_KEYS
    if unknown:
        raise StateError(f"unknown top-level key(s) {sorted(unknown)} (known: {sorted(TOP_KEYS)})")
    out: dict[str, Any] = {
        "t": float(state.get("t", 0.0)),
        "driver_version": str(state.get("driver_version", "550.54.15")),
        "init_error": state.get("init_error"),
        "devices": [],
    }
    if out["init_error"] is not None:
        _check_error_name(out["init_error"], "init_error")
    devices = state.get("devices", [])
    if not isinstance(devices, list):
        raise StateError("devices must be a list")
    seen_uuid: set[str] = set()
    for pos, raw in enumerate(devices):
        where = f"devices[{pos}]"
        if not isinstance(raw, Mapping):
            raise StateError(f"{where} must be a mapping")
        bad = set(raw) - set(DEVICE_DEFAULTS)
        if bad:
            raise StateError(f"{where}: unknown key(s) {sorted(bad)}")
        dev = {k: copy.deepcopy(raw.get(k, v)) for k, v in DEVICE_DEFAULTS.items()}
        if dev["index"] is None:
            dev["index"] = pos
        if dev["index"] != pos:
            raise StateError(f"{where}: index {dev['index']!r} must equal its position {pos}")
        if dev["uuid"] is None:
            dev["uuid"] = f"GPU-00000000-0000-0000-0000-{pos:012d}"
        if dev["uuid"] in seen_uuid:
            raise StateError(f"{where}: duplicate uuid {dev['uuid']!r}")
        seen_uuid.add(dev["uuid"])
        if not isinstance(dev["pci_bus_id"], str):
            raise StateError(f"{where}: pci_bus_id is required (e.g. '0000:82:00.0')")
        if dev["pcie_counter_bits"] not in (32, 64):
            raise StateError(f"{where}: pcie_counter_bits must be 32 or 64")
        link = dict(LINK_DEFAULTS)
        if not isinstance(dev["link"], Mapping) or set(dev["link"]) - set(LINK_KEYS):
            raise StateError(f"{where}: link must be a mapping with keys from {LINK_KEYS}")
        link.update(dev["link"])
        dev["link"] = link
        try:
            C.encode_reasons(dev["clock_event_reasons"])
        except ValueError as e:
            raise StateError(f"{where}: {e}") from e
        if set(dev["throttle_ns"]) - set(fields.THROTTLE_KEYS):
            raise StateError(f"{where}: throttle_ns keys must be from {sorted(fields.THROTTLE_KEYS)}")
        for fn, err in dict(dev["errors"]).items():
            _check_error_name(err, f"{where}.errors[{fn!r}]")
        _check_error_name(dev["lost_error"], f"{where}.lost_error")
        for i, p in enumerate(dev["processes"]):
            if not isinstance(p, Mapping) or "pid" not in p or set(p) - {"pid", "used_memory_bytes"}:
                raise StateError(f"{where}.processes[{i}] must be {{pid, used_memory_bytes}}")
        for i, p in enumerate(dev["process_util"]):
            if not isinstance(p, Mapping) or set(p) != {"pid", "ts_us", "sm_pct", "mem_pct"}:
                raise StateError(f"{where}.process_util[{i}] must be {{pid, ts_us, sm_pct, mem_pct}}")
        out["devices"].append(dev)
    return out


# ---- evolving a state (optional helpers for simulators and tests) -------------------------------------------


def advance_device(
    dev: dict[str, Any],
    t0: float,
    t1: float,
    *,
    gpu_util: float = 0.0,
    mem_util: float = 0.0,
    graphics_active: float | None = None,
    sm_active: float = 0.0,
    sm_occupancy: float = 0.0,
    tensor_active: float = 0.0,
    dram_active: float = 0.0,
    pcie_tx_bytes_per_s: float = 0.0,
    pcie_rx_bytes_per_s: float = 0.0,
    pcie_replays_per_s: float = 0.0,
    throttle: Mapping[str, float] | None = None,
    sample_period_s: float = 1 / 6,
    buffer_len: int = 240,
) -> None:
    """Advance one device dict from ``t0`` to ``t1`` with the given constant rates (fractions 0..1, per s).

    Counters and integrals grow by rate x dt; the driver's utilisation buffers get one sample per
    ``sample_period_s`` boundary, each the average over its own period (so integrating the samples gives
    back the true busy time, to the driver's integer-percent resolution); buffers keep ``buffer_len``.
    """
    dt = t1 - t0
    if dt < 0:
        raise ValueError("time must not go backwards")
    if dt == 0:
        return
    ga = gpu_util if graphics_active is None else graphics_active
    for key, ratio in (("graphics_active_integral", ga), ("sm_active_integral", sm_active),
                       ("sm_occupancy_integral", sm_occupancy), ("tensor_active_integral", tensor_active),
                       ("dram_active_integral", dram_active)):
        dev[key] = float(dev.get(key, 0.0)) + ratio * dt
    for key, rate in (("pcie_tx_bytes", pcie_tx_bytes_per_s), ("pcie_rx_bytes", pcie_rx_bytes_per_s),
                      ("pcie_replays", pcie_replays_per_s)):
        dev[key] = round(int(dev.get(key, 0)) + rate * dt)
    # The energy counter (field 83) integrates the power the state shows over the step.
    dev["energy_mj"] = round(int(dev.get("energy_mj", 0)) + float(dev.get("power_w", 0.0)) * dt * 1e3)
    th = dict(dev.get("throttle_ns", {}))
    for reason, frac in (throttle or {}).items():
        if reason not in fields.THROTTLE_KEYS:
            raise ValueError(f"unknown throttle reason {reason!r}")
        th[reason] = round(int(th.get(reason, 0)) + frac * dt * 1e9)
    dev["throttle_ns"] = th
    # Driver utilisation samples: boundaries at multiples of the period, in the fake's clock.
    acc = dev.get("util_acc") or [math.floor(t0 / sample_period_s) * sample_period_s, 0.0, 0.0]
    start, g_int, m_int = float(acc[0]), float(acc[1]), float(acc[2])
    cur = t0
    util = list(dev.get("util_samples", []))
    mem = list(dev.get("mem_util_samples", []))
    while True:
        boundary = start + sample_period_s
        if boundary > t1 + 1e-12:
            break
        seg = boundary - max(cur, start)
        g_int += gpu_util * max(seg, 0.0)
        m_int += mem_util * max(seg, 0.0)
        ts = round(boundary * 1e6)
        util.append([ts, round(100.0 * g_int / sample_period_s)])
        mem.append([ts, round(100.0 * m_int / sample_period_s)])
        cur, start, g_int, m_int = boundary, boundary, 0.0, 0.0
    seg = t1 - max(cur, start)
    g_int += gpu_util * max(seg, 0.0)
    m_int += mem_util * max(seg, 0.0)
    dev["util_acc"] = [start, g_int, m_int]
    dev["util_samples"] = util[-buffer_len:]
    dev["mem_util_samples"] = mem[-buffer_len:]


def advance_state(state: dict[str, Any], dt: float, rates: Mapping[int, Mapping[str, Any]]) -> None:
    """Advance ``state["t"]`` by ``dt`` and every device named in ``rates`` (index -> advance_device kwargs)."""
    t0 = float(state.get("t", 0.0))
    t1 = t0 + dt
    for dev_index, kw in rates.items():
        advance_device(state["devices"][dev_index], t0, t1, **kw)
    state["t"] = t1


def _state_value(dev: Mapping[str, Any], key: str) -> Any:
    """A device-state value by key; ``a.b`` is key ``b`` of mapping ``a`` (0 when that key is absent)."""
    head, _, rest = key.partition(".")
    value = dev[head]
    return value.get(rest, 0) if rest else value


# ---- the fake module -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FakeHandle:
    """An nvmlDevice_t: remembers the device's UUID (NVML handles stay valid across re-init)."""

    index: int
    uuid: str


@dataclass
class FakeGpmSample:
    """An nvmlGpmSample_t: a snapshot of the device's integrals at sample time."""

    freed: bool = False
    uuid: str | None = None
    t: float = 0.0
    values: dict[str, float] = field(default_factory=dict)


@dataclass
class FakeGpmMetric:
    """One entry of ``c_nvmlGpmMetricsGet_t.metrics``."""

    metricId: int = 0  # noqa: N815 - pynvml's field name
    nvmlReturn: int = 0  # noqa: N815
    value: float = 0.0
    metricInfo: Any = None  # noqa: N815


class FakeGpmMetricsGet(ctypes.Structure):
    """Stands in for ``pynvml.c_nvmlGpmMetricsGet_t`` with the same memory layout; the two sample fields hold
    the fake's sample objects (``py_object``, pointer-sized like the real ``nvmlGpmSample_t``)."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("numMetrics", ctypes.c_uint),
        ("sample1", ctypes.py_object),
        ("sample2", ctypes.py_object),
        ("metrics", pynvml.c_nvmlGpmMetric_t * int(pynvml.NVML_GPM_METRIC_MAX)),
    ]


@dataclass
class FakeGpmSupport:
    """``c_nvmlGpmSupport_t``."""

    version: int
    isSupportedDevice: int  # noqa: N815


@dataclass
class FakeProcessInfo:
    """What pynvml's nvmlStructToFriendlyObject gives for a running process."""

    pid: int
    usedGpuMemory: int | None  # noqa: N815
    gpuInstanceId: int = 0xFFFFFFFF  # noqa: N815
    computeInstanceId: int = 0xFFFFFFFF  # noqa: N815


def _api(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Count the call, reload the state file if it changed, then run the fake function under the lock."""
    name = fn.__name__

    def wrapper(self: FakeNvml, *args: Any) -> Any:
        with self._lock:
            self.calls[name] += 1
            self._maybe_reload()
            return fn(self, *args)

    wrapper.__name__ = name
    wrapper.__doc__ = fn.__doc__
    return wrapper


class FakeNvml:
    """The fake ``pynvml`` module (see the module docstring for the state it serves)."""

    NVMLError = pynvml.NVMLError
    c_nvmlGpmMetricsGet_t = FakeGpmMetricsGet  # noqa: N815 - pynvml's name

    def __init__(self, state: Mapping[str, Any] | None = None) -> None:
        self._lock = threading.RLock()
        self._state = normalize_state(state or {"devices": []})
        self._path: Path | None = None
        self._stamp: tuple[int, int] | None = None
        self._init_count = 0
        self._lost_calls: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.gpm_short_pairs = 0
        self.reload_errors = 0

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> FakeNvml:
        """A fake serving the JSON state in ``path``, reloaded whenever the file's mtime or size changes."""
        p = Path(path)
        fake = cls(json.loads(p.read_text(encoding="utf-8")))
        st = p.stat()
        fake._path, fake._stamp = p, (st.st_mtime_ns, st.st_size)
        return fake

    # ---- test/simulator hooks -------------------------------------------------------------------------------

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Replace the whole state (validated; StateError on a bad key)."""
        norm = normalize_state(state)
        with self._lock:
            self._state = norm
            for dev in norm["devices"]:
                if not dev["lost"]:
                    self._lost_calls.pop(dev["uuid"], None)

    @property
    def state(self) -> dict[str, Any]:
        """A deep copy of the current (normalised) state."""
        with self._lock:
            return copy.deepcopy(self._state)

    def _maybe_reload(self) -> None:
        if self._path is None:
            return
        try:
            st = self._path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == self._stamp:
                return
            data = json.loads(self._path.read_text(encoding="utf-8"))
            self.set_state(data)
            self._stamp = stamp
        except (OSError, ValueError):
            self.reload_errors += 1

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name.startswith("_"):
            raise AttributeError(name)
        if name in _BANNED:
            raise AssertionError(f"FakeNvml: {name} must never be called: {_BANNED[name]}")
        if name.startswith(_FORWARDED_PREFIXES) and hasattr(pynvml, name):
            return getattr(pynvml, name)
        raise AssertionError(f"FakeNvml: unexpected call {name} (not modelled by the fake)")

    # ---- internals ------------------------------------------------------------------------------------------

    def _need_init(self) -> None:
        if self._init_count <= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def _device(self, handle: object, fn: str) -> dict[str, Any]:
        """The device behind ``handle``, after the lost/error/unsupported injections for call ``fn``."""
        self._need_init()
        if not isinstance(handle, FakeHandle):
            raise AssertionError(f"FakeNvml: {fn} got a handle that is not from nvmlDeviceGetHandleByIndex: {handle!r}")
        dev: dict[str, Any] | None = next((d for d in self._state["devices"] if d["uuid"] == handle.uuid), None)
        if dev is None:  # the device left the bus between enumeration and this call
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        self._inject(dev, fn)
        return dev

    def _inject(self, dev: Mapping[str, Any], fn: str) -> None:
        if dev["lost"]:
            n = self._lost_calls[dev["uuid"]]
            self._lost_calls[dev["uuid"]] = n + 1
            raise nvml_error("gpu_is_lost" if n == 0 else dev["lost_error"])
        err = dev["errors"].get(fn)
        if err is not None:
            raise nvml_error(err)
        if fn in dev["unsupported"]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _now_us(self) -> int:
        return round(float(self._state["t"]) * 1e6)

    # ---- init and enumeration -------------------------------------------------------------------------------

    @_api
    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's name
        """Initialise (reference-counted, like NVML); raises the state's init_error if set."""
        err = self._state["init_error"]
        if err is not None:
            raise nvml_error(err)
        self._init_count += 1

    @_api
    def nvmlShutdown(self) -> None:  # noqa: N802
        """Drop one init reference."""
        self._need_init()
        self._init_count -= 1

    @_api
    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        """The driver version string."""
        self._need_init()
        return str(self._state["driver_version"])

    @_api
    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        """Number of GPUs (lost ones included, as NVML does)."""
        self._need_init()
        return len(self._state["devices"])

    @_api
    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:  # noqa: N802
        """A handle; a lost GPU raises GPU_IS_LOST already here."""
        self._need_init()
        devs = self._state["devices"]
        if not isinstance(index, int) or not 0 <= index < len(devs):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        dev = devs[index]
        self._inject(dev, "nvmlDeviceGetHandleByIndex")
        return FakeHandle(index, dev["uuid"])

    @_api
    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:  # noqa: N802
        return str(self._device(handle, "nvmlDeviceGetUUID")["uuid"])

    @_api
    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:  # noqa: N802
        return str(self._device(handle, "nvmlDeviceGetName")["name"])

    @_api
    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> Any:  # noqa: N802
        """``nvmlPciInfo_t`` with busId in NVML's 8-hex-digit-domain upper-case form."""
        dev = self._device(handle, "nvmlDeviceGetPciInfo")
        domain, bus, devfn = dev["pci_bus_id"].split(":")
        nvml_id = f"{int(domain, 16):08X}:{bus.upper()}:{devfn.upper()}"
        info = pynvml.nvmlPciInfo_t()
        info.busId = nvml_id.encode()
        info.busIdLegacy = nvml_id.encode()
        info.domain, info.bus = int(domain, 16), int(bus, 16)
        info.device = int(devfn.split(".")[0], 16)
        return info

    # ---- fast path ------------------------------------------------------------------------------------------

    @_api
    def nvmlDeviceGetFieldValues(self, handle: FakeHandle, field_ids: list[Any]) -> Any:  # noqa: N802
        """An array of ``c_nvmlFieldValue_t`` with per-field nvmlReturn, like the binding returns."""
        dev = self._device(handle, "nvmlDeviceGetFieldValues")
        arr = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        now = self._now_us()
        for i, requested in enumerate(field_ids):
            fid, scope = requested if isinstance(requested, tuple) else (requested, 0)
            fv = arr[i]
            fv.fieldId, fv.scopeId, fv.timestamp, fv.latencyUsec = fid, scope, now, 0
            if f"field:{fid}" in dev["unsupported"]:
                fv.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            f = fields.BY_ID.get(fid)
            if f is None:
                raise AssertionError(f"FakeNvml: nvmlDeviceGetFieldValues asked for unmodelled field id {fid}")
            fv.nvmlReturn = pynvml.NVML_SUCCESS
            raw = _state_value(dev, f.state_key)
            value = round(float(raw) * f.fake_scale) if f.fake_scale != 1.0 else int(raw)
            bits = {fields.PCIE: dev["pcie_counter_bits"], fields.UINT: 32}.get(f.value_type, 64)
            if bits == 32:
                fv.valueType, fv.value.uiVal = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, value % (1 << 32)
            else:
                fv.valueType, fv.value.ullVal = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, value % (1 << 64)
        return arr

    @_api
    def nvmlGpmQueryDeviceSupport(self, handle: FakeHandle) -> FakeGpmSupport:  # noqa: N802
        dev = self._device(handle, "nvmlGpmQueryDeviceSupport")
        return FakeGpmSupport(version=int(pynvml.NVML_GPM_SUPPORT_VERSION), isSupportedDevice=int(bool(dev["gpm"])))

    @_api
    def nvmlGpmSampleAlloc(self) -> FakeGpmSample:  # noqa: N802
        self._need_init()
        return FakeGpmSample()

    @_api
    def nvmlGpmSampleFree(self, sample: FakeGpmSample) -> None:  # noqa: N802
        if not isinstance(sample, FakeGpmSample) or sample.freed:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        sample.freed = True

    @_api
    def nvmlGpmSampleGet(self, handle: FakeHandle, sample: FakeGpmSample) -> FakeGpmSample:  # noqa: N802
        """Snapshot the device's integrals and PCIe byte totals into ``sample``."""
        dev = self._device(handle, "nvmlGpmSampleGet")
        if not dev["gpm"]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not isinstance(sample, FakeGpmSample) or sample.freed:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        sample.uuid, sample.t = dev["uuid"], float(self._state["t"])
        sample.values = {k: float(dev[k]) for k in (*_GPM_RATIO.values(), *_GPM_BYTES.values())}
        return sample

    @_api
    def nvmlGpmMetricsGet(self, mg: FakeGpmMetricsGet) -> FakeGpmMetricsGet:  # noqa: N802
        """Averages over the two samples: 100*(I2-I1)/(t2-t1) for ratios, MiB/s for PCIe."""
        self._need_init()
        if not isinstance(mg, FakeGpmMetricsGet) or mg.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        try:
            s1, s2 = mg.sample1, mg.sample2
        except ValueError:  # a py_object field never set
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT) from None
        if not isinstance(s1, FakeGpmSample) or not isinstance(s2, FakeGpmSample) or s1.freed or s2.freed \
                or s1.uuid is None or s1.uuid != s2.uuid:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        dt = s2.t - s1.t
        if 0 < dt < C.GPM_MIN_PAIR_SECONDS - 1e-6:
            self.gpm_short_pairs += 1
        for m in mg.metrics[: mg.numMetrics]:
            mid = int(m.metricId)
            if mid not in _GPM_RATIO and mid not in _GPM_BYTES:
                raise AssertionError(f"FakeNvml: nvmlGpmMetricsGet asked for unmodelled GPM metric {mid}")
            if dt <= 0:
                m.nvmlReturn, m.value = pynvml.NVML_ERROR_INVALID_ARGUMENT, 0.0
                continue
            m.nvmlReturn = pynvml.NVML_SUCCESS
            if mid in _GPM_RATIO:
                k = _GPM_RATIO[mid]
                m.value = 100.0 * (s2.values[k] - s1.values[k]) / dt
            else:
                k = _GPM_BYTES[mid]
                m.value = (s2.values[k] - s1.values[k]) / dt / C.MIB
        return mg

    @_api
    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, clock_type: int) -> int:  # noqa: N802
        dev = self._device(handle, "nvmlDeviceGetClockInfo")
        if clock_type not in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
            raise AssertionError(f"FakeNvml: nvmlDeviceGetClockInfo clock type {clock_type} not modelled")
        return int(dev["sm_clock_mhz"])

    @_api
    def nvmlDeviceGetMaxClockInfo(self, handle: FakeHandle, clock_type: int) -> int:  # noqa: N802
        dev = self._device(handle, "nvmlDeviceGetMaxClockInfo")
        if clock_type not in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
            raise AssertionError(f"FakeNvml: nvmlDeviceGetMaxClockInfo clock type {clock_type} not modelled")
        return int(dev["max_sm_clock_mhz"])

    @_api
    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:  # noqa: N802
        """Milliwatts."""
        return round(float(self._device(handle, "nvmlDeviceGetPowerUsage")["power_w"]) * 1000)

    @_api
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeHandle) -> int:  # noqa: N802
        """Milliwatts."""
        return round(float(self._device(handle, "nvmlDeviceGetEnforcedPowerLimit")["power_limit_w"]) * 1000)

    # ---- buffered samples -------------------------------------------------------------------------------------

    @_api
    def nvmlDeviceGetSamples(self, handle: FakeHandle, sampling_type: int, last_seen: int) -> Any:  # noqa: N802
        """``(valueType, [c_nvmlSample_t])`` newer than ``last_seen`` µs; NOT_FOUND when there are none."""
        dev = self._device(handle, "nvmlDeviceGetSamples")
        if sampling_type == C.GPU_UTILIZATION_SAMPLES:
            buf = dev["util_samples"]
        elif sampling_type == C.MEMORY_UTILIZATION_SAMPLES:
            buf = dev["mem_util_samples"]
        else:
            raise AssertionError(f"FakeNvml: nvmlDeviceGetSamples type {sampling_type} not modelled")
        out = []
        for ts, val in buf:
            if int(ts) > int(last_seen):
                s = pynvml.c_nvmlSample_t()
                s.timeStamp = int(ts)
                s.sampleValue.uiVal = int(val)
                out.append(s)
        if not out:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, out)

    @_api
    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> Any:  # noqa: N802
        """``c_nvmlUtilization_t`` from the newest buffered samples (0 when the buffers are empty)."""
        dev = self._device(handle, "nvmlDeviceGetUtilizationRates")
        u = pynvml.c_nvmlUtilization_t()
        u.gpu = int(dev["util_samples"][-1][1]) if dev["util_samples"] else 0
        u.memory = int(dev["mem_util_samples"][-1][1]) if dev["mem_util_samples"] else 0
        return u

    # ---- slow path ----------------------------------------------------------------------------------------------

    @_api
    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:  # noqa: N802
        dev = self._device(handle, "nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise AssertionError(f"FakeNvml: nvmlDeviceGetTemperature sensor {sensor} not modelled")
        return round(float(dev["temperature_c"]))

    @_api
    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle) -> Any:  # noqa: N802
        dev = self._device(handle, "nvmlDeviceGetMemoryInfo")
        m = pynvml.c_nvmlMemory_t()
        m.total, m.used = int(dev["memory_total_bytes"]), int(dev["memory_used_bytes"])
        m.free = max(0, m.total - m.used)
        return m

    def _link(self, handle: FakeHandle, fn: str, key: str) -> int:
        return int(self._device(handle, fn)["link"][key])

    @_api
    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: FakeHandle) -> int:  # noqa: N802
        return self._link(handle, "nvmlDeviceGetCurrPcieLinkGeneration", "gen")

    @_api
    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: FakeHandle) -> int:  # noqa: N802
        return self._link(handle, "nvmlDeviceGetCurrPcieLinkWidth", "width")

    @_api
    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: FakeHandle) -> int:  # noqa: N802
        return self._link(handle, "nvmlDeviceGetMaxPcieLinkGeneration", "max_gen")

    @_api
    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: FakeHandle) -> int:  # noqa: N802
        return self._link(handle, "nvmlDeviceGetMaxPcieLinkWidth", "max_width")

    @_api
    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, handle: FakeHandle) -> int:  # noqa: N802
        return self._link(handle, "nvmlDeviceGetGpuMaxPcieLinkGeneration", "gpu_max_gen")

    @_api
    def nvmlDeviceGetGpuMaxPcieLinkWidth(self, handle: FakeHandle) -> int:  # noqa: N802
        return self._link(handle, "nvmlDeviceGetGpuMaxPcieLinkWidth", "gpu_max_width")

    @_api
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:  # noqa: N802
        dev = self._device(handle, "nvmlDeviceGetCurrentClocksEventReasons")
        return C.encode_reasons(dev["clock_event_reasons"])

    @_api
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeHandle) -> int:  # noqa: N802
        """The pre-R535 name of the same bitmask."""
        dev = self._device(handle, "nvmlDeviceGetCurrentClocksThrottleReasons")
        return C.encode_reasons(dev["clock_event_reasons"])

    @_api
    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[FakeProcessInfo]:  # noqa: N802
        dev = self._device(handle, "nvmlDeviceGetComputeRunningProcesses")
        return [FakeProcessInfo(pid=p["pid"], usedGpuMemory=p.get("used_memory_bytes")) for p in dev["processes"]]

    @_api
    def nvmlDeviceGetProcessUtilization(self, handle: FakeHandle, last_seen: int) -> list[Any]:  # noqa: N802
        """``c_nvmlProcessUtilizationSample_t`` newer than ``last_seen``; NOT_FOUND when none."""
        dev = self._device(handle, "nvmlDeviceGetProcessUtilization")
        out = []
        for p in dev["process_util"]:
            if int(p["ts_us"]) > int(last_seen):
                s = pynvml.c_nvmlProcessUtilizationSample_t()
                s.pid, s.timeStamp = int(p["pid"]) % (1 << 32), int(p["ts_us"])
                s.smUtil, s.memUtil, s.encUtil, s.decUtil = int(p["sm_pct"]), int(p["mem_pct"]), 0, 0
                out.append(s)
        if not out:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return out

    @staticmethod
    def _mask(items: frozenset[int], words: int) -> Any:
        arr = (c_ulonglong * words)()
        for i in items:
            if i < 64 * words:
                arr[i // 64] |= 1 << (i % 64)
        return arr

    @_api
    def nvmlDeviceGetCpuAffinity(self, handle: FakeHandle, cpu_set_size: int) -> Any:  # noqa: N802
        """Array of ``cpu_set_size`` 64-bit words, bit i = CPU i."""
        dev = self._device(handle, "nvmlDeviceGetCpuAffinity")
        if dev["cpu_affinity"] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._mask(parse_cpulist(dev["cpu_affinity"]), cpu_set_size)

    @_api
    def nvmlDeviceGetMemoryAffinity(self, handle: FakeHandle, node_set_size: int, scope: int) -> Any:  # noqa: N802
        """Array of ``node_set_size`` 64-bit words, bit i = NUMA node i."""
        dev = self._device(handle, "nvmlDeviceGetMemoryAffinity")
        if dev["memory_affinity"] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._mask(parse_cpulist(dev["memory_affinity"]), node_set_size)

    @_api
    def nvmlDeviceGetNumaNodeId(self, handle: FakeHandle) -> int:  # noqa: N802
        dev = self._device(handle, "nvmlDeviceGetNumaNodeId")
        if dev["numa_node_id"] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(dev["numa_node_id"])
