"""A strict fake of the ``pynvml`` module, so the real GPU backend runs in CI and under ``--simulate``.

``FakeNvml`` is a module-like object: the backend gets it instead of ``pynvml`` (through ``ctx.nvml``) and
calls the same function names. It is strict about the surface of the *installed* binding (nvidia-ml-py):

- every function it offers exists in ``pynvml`` with the same signature (parameter names, kinds, defaults;
  ``tests/gpu/test_binding_conformance.py`` checks it, and checks every name the backend uses);
- a name the real module lacks raises ``AttributeError``, as ``pynvml`` itself does (a backend calling a
  function the binding does not define fails here exactly as it would on a real host);
- a name the binding has but the fake does not model, a field id or GPM metric it does not model, and
  ``nvmlDeviceGetPcieThroughput`` (blocks ~20 ms; banned) raise ``AssertionError("FakeNvml: ...")``;
- it raises the *real* ``pynvml.NVMLError`` subclasses (``NVMLError(NVML_ERROR_NOT_SUPPORTED)`` is an
  ``NVMLError_NotSupported``);
- it returns the real binding's types: device handles are ``c_nvmlDevice_t`` pointers (the same pointer for
  the same device every time, as NVML does), GPM samples ``c_nvmlGpmSample_t``, event sets
  ``c_nvmlEventSet_t``; ``nvmlPciInfo_t``, ``c_nvmlFieldValue_t`` arrays, ``c_nvmlSample_t``,
  ``c_nvmlMemory_t``, ``c_nvmlUtilization_t``, ``c_nvmlProcessUtilizationSample_t``, ``c_nvmlGpmSupport_t``,
  ``c_nvmlEventData_t``, and processes as the binding's ``nvmlFriendlyObject`` of ``c_nvmlProcessInfo_v3_t``;
  ``nvmlGpmMetricsGet`` fills the real ``c_nvmlGpmMetricsGet_t``;
- forwards constants (``NVML_*``, ``nvmlClocks*``, ``nvmlEventType*``), the structs and the ``NVMLError*``
  classes from the real module.

Its whole device state is one plain JSON-serialisable dict, so a simulator can compute it in one process and
hand it to the daemon: ``FakeNvml.from_exchange(dir)`` serves what an ``exporter.sim.exchange.Writer``
publishes there (the numbers through shared memory, the rest as JSON only when it changes -- what
``serve --simulate`` uses, so the daemon pays for a new state what it would pay a real driver: nearly
nothing), and ``FakeNvml.from_file(path)`` reloads a JSON file whenever it changes (write it to a temporary
file and ``os.replace`` it, so a reader never sees half a file). Either way an unreadable or invalid state
keeps the previous one and is counted in ``reload_errors``.

State (every key optional unless marked required; unknown keys are an error naming the key)
-----------------------------------------------------------------------------------------
Top level::

    {"t": 0.0,                  # seconds, the fake's clock. Driver timestamps (samples, GPM) derive from it:
                                #   microsecond timestamps are round(t * 1e6). Only differences matter.
     "driver_version": "550.54.15",
     "init_error": null,        # NVML error name (see "Error names"): nvmlInit raises it, e.g.
                                #   "library_not_found" (no driver), "driver_not_loaded", "no_permission"
     "driver_fields": null,     # null: every field of exporter/gpu/fields.py is answered. An error name
                                #   ("not_supported", "invalid_argument"): a field whose driver_branch is
                                #   newer than driver_version's branch answers that per-field nvmlReturn, as a
                                #   driver without the field does (197/198 before R555, 269-271 before R575)
     "devices": [ {...}, ... ]} # the GPUs, in NVML index order

Per device (the NVML index is the position in ``devices``; ``index``, if given, must equal it)::

    identity      "index": int, "uuid": "GPU-...", "name": "NVIDIA H100 80GB HBM3",
                  "pci_bus_id": "0000:82:00.0"   (required; sysfs form -- NVML reports "00000000:82:00.0")
    capability    "gpm": true                    GPM supported (Hopper+); false -> isSupportedDevice=0
                  "pcie_counter_bits": 32        width at which fields 197/198 wrap (32 -> reported as
                                                 NVML_VALUE_TYPE_UNSIGNED_INT, 64 -> UNSIGNED_LONG_LONG)
                  "pcie_counter_value_type": null   "uint" / "ull": the value type reported for 197/198
                                                 whatever the width ("ull" with 32 bits: a 32-bit hardware
                                                 counter in a 64-bit slot, which nvml.h does not rule out)
                  "gpm_nan": []                  GPM metric ids answered NaN with SUCCESS (nvml.h does not rule
                                                 it out; a pair inside one internal refresh is the likely cause)
                  "field_refresh_s": {}          field id -> seconds, or a list of seconds (cycled: irregular):
                                                 the driver refreshes that field's value only so often; a read
                                                 in between answers the value and timestamp of the newest
                                                 refresh (the first read at least a period after the previous)
    faults        "lost": false                  every call for this GPU (handle lookup included) raises
                                                 GPU_IS_LOST; clear it to model recovery after a reset
                  "lost_error": "gpu_is_lost"    error of the calls *after* the first lost one (real drivers
                                                 often answer "unknown" then)
                  "unsupported": [names]         function names that raise NOT_SUPPORTED for this GPU, and
                                                 "field:<id>" entries whose per-field nvmlReturn is NOT_SUPPORTED
                  "errors": {name: error}        any function name -> error name, raised on every call
                                                 ("nvmlDeviceGetHandleByIndex": "no_permission": this index
                                                 refuses its handle, as a GPU hidden by a cgroup does)
    counters (ABSOLUTE values at time t; the fake never advances them itself -- see advance_state)
                  "pcie_tx_bytes": 0, "pcie_rx_bytes": 0   unwrapped byte totals; fields 197/198 report them
                                                 modulo 2**pcie_counter_bits, GPM PCIe rates use the deltas.
                                                 TX is device->host.
                  "pcie_replays": 0              field 94 (NVML_FI_DEV_PCIE_REPLAY_COUNTER)
                  "throttle_ns": {reason: ns}    cumulative clock-event time, fields 74/76/269/270/271 for
                                                 sw_power_cap, sync_boost, sw_thermal, hw_thermal, hw_power_brake
                  "energy_mj": 0                 field 83 (NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION), millijoules
                  "ecc": {"corrected_volatile", "uncorrected_volatile", "corrected_aggregate",
                          "uncorrected_aggregate"}      ECC totals, fields 3/4/5/6 (absent key: 0)
                  "remapped_rows": {"correctable", "uncorrectable", "pending", "failure"}
                                                 row remapping, fields 142/143/144/145 (absent key: 0)
                  "graphics_active_integral", "sm_active_integral", "sm_occupancy_integral",
                  "tensor_active_integral", "dram_active_integral": 0.0
                                                 integral over time of the ratio (0..1) in seconds; a GPM pair
                                                 (s1 at t1, s2 at t2) answers 100*(I2-I1)/(t2-t1) percent
                  Every field of exporter/gpu/fields.py is answered from its ``fake_key`` (the table says which);
                  a field the table lacks is an AssertionError.
    buffers       "util_samples": [[ts_us, percent], ...]       nvmlDeviceGetSamples(GPU_UTILIZATION_SAMPLES):
                                                 each value is the utilisation over the period ending at ts_us.
                                                 Entries with ts_us > lastSeenTimeStamp are returned, oldest
                                                 first; none -> NOT_FOUND (normal on an idle GPU)
                  "mem_util_samples": [[ts_us, percent], ...]   the same for MEMORY_UTILIZATION_SAMPLES
                  "util_acc": [start_s, gpu_integral, mem_integral]  advance_device's partial sample period
                  "process_util": [{"pid", "ts_us", "sm_pct", "mem_pct"}]  nvmlDeviceGetProcessUtilization,
                                                 the same lastSeen/NOT_FOUND rule
    events        "xid_events": [{"t": s, "xid": n, "gi": id | null}, ...]
                                                 Xid errors the driver reports (nvmlEventTypeXidCriticalError),
                                                 in time order: nvmlEventSetWait_v2 on an event set the device
                                                 is registered with delivers each event once, as soon as the
                                                 fake's ``t`` reaches its ``t`` -- the fake remembers how far it
                                                 delivered in time, so the list may be a sliding window of
                                                 recent events (a looping simulator's is). ``gi`` is the GPU
                                                 instance of a MIG device (null: the whole GPU)
    instantaneous "sm_clock_mhz": 345, "max_sm_clock_mhz": 1980, "power_w": 70.0, "power_limit_w": 700.0,
                  "temperature_c": 40, "memory_used_bytes": 0, "memory_total_bytes": 85899345920,
                  "link": {"gen", "width", "max_gen", "max_width", "gpu_max_gen"}
                                                 current / system-limited max / GPU's own max generation
                                                 (default 5/16 all; NVML has no "GPU's own max width" call)
                  "clock_event_reasons": ["gpu_idle"]   names of SPEC.md (exporter.gpu.constants)
                  "processes": [{"pid": int, "used_memory_bytes": int | null}]   compute processes; pids go
                                                 into the binding's c_uint field as given (so garbage like 0,
                                                 2**32-1 tests the backend's validation; -1 reads back as
                                                 2**32-1, as from the driver); null memory -> None
                  "cpu_affinity": "0-15" | null  cpulist for nvmlDeviceGetCpuAffinity (null -> NOT_SUPPORTED)
                  "memory_affinity": "0" | null  nodelist for nvmlDeviceGetMemoryAffinity (null -> NOT_SUPPORTED)
                  "numa_node_id": null           nvmlDeviceGetNumaNodeId (only coherent GPU-as-NUMA-node
                                                 platforms answer; null -> NOT_SUPPORTED, as on x86 PCIe)
    NVLink        "nvlink": [link, ...]          one entry per link (empty: no NVLink); exporter/sim/fakenvlink.py
    MIG           "mig": null | [instance, ...]  null: MIG mode off. A list (possibly empty): MIG mode on, with
                                                 these GPU instances, one MIG device each, in
                                                 nvmlDeviceGetMigDeviceHandleByIndex order. In MIG mode the
                                                 whole GPU answers NOT_SUPPORTED to utilisation samples and rates
                                                 and per-process utilisation (nvml.h: not supported on MIG), its
                                                 compute processes are its instances' (``processes`` must be
                                                 empty), per-instance GPM is nvmlGpmMigSampleGet, and the whole
                                                 GPU's own GPM (nvmlGpmSampleGet) answers the device's integrals
                  "max_mig_devices": 7           nvmlDeviceGetMaxMigDeviceCount

A MIG instance (an entry of ``mig``)::

                  "gi": int (required)           GPU instance id (nvmlDeviceGetGpuInstanceId)
                  "ci": 0                        compute instance id; (gi, ci) unique. Several entries with one
                                                 gi are the compute instances of one GPU instance, each a MIG
                                                 device of its own (UUID, name, processes); what the GPU
                                                 instance shares -- GPM, memory, PCIe bytes -- is its first
                                                 entry's. A MIG device destroyed and created again at the same
                                                 (gi, ci) answers through the same handle (nvml.h: MIG handles
                                                 may be reused)
                  "uuid": "MIG-<gpu uuid>-<gi>[-<ci>]", "name": "<gpu name> MIG <gi>[ CI <ci>]"   ([...]: ci > 0)
                  "memory_used_bytes": 0, "memory_total_bytes": 10737418240   nvmlDeviceGetMemoryInfo(MIG)
                  the five GPM integrals and "pcie_tx_bytes" / "pcie_rx_bytes", as on a device (per instance)
                  "processes": [{"pid", "used_memory_bytes"}]   the instance's compute processes

Error names are NVML_ERROR_* without the prefix, lower case: ``not_supported``, ``gpu_is_lost``,
``unknown``, ``library_not_found``, ``driver_not_loaded``, ``not_found``, ``timeout``, ...

``advance_state(state, dt, rates)`` / ``advance_device(dev, t0, t1, **rates)`` move the counters,
integrals and sample buffers forward consistently (the simulator may use them or compute its own).

Test hooks on the object: ``set_state(dict)``, ``state`` (a deep copy), ``calls`` (Counter of function
names), ``gpm_short_pairs`` (GPM pairs taken < 100 ms apart -- must stay 0), ``reload_errors``,
``event_sets`` (live event sets).
"""

from __future__ import annotations

import copy
import ctypes
import functools
import json
import math
import os
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from ctypes import c_ulonglong, c_void_p
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml

from exporter.cpulist import parse_cpulist
from exporter.gpu import constants as C  # noqa: N812 - short, used everywhere
from exporter.gpu import fields
from exporter.gpu.binding import (
    ERR_INVALID_ARGUMENT,
    ERR_NOT_SUPPORTED,
    FIELD_VALUE,
    GPM_METRIC,
    SUCCESS,
    VT_UINT,
    VT_ULL,
)
from exporter.sim import fakenvlink
from exporter.sim.exchange import Reader

TOP_KEYS = frozenset({"t", "driver_version", "init_error", "driver_fields", "devices"})

DEVICE_DEFAULTS: Mapping[str, Any] = {
    "index": None,
    "uuid": None,
    "name": "NVIDIA H100 80GB HBM3",
    "pci_bus_id": None,
    "gpm": True,
    "pcie_counter_bits": 32,
    "pcie_counter_value_type": None,
    "field_refresh_s": {},
    "gpm_nan": [],
    "lost": False,
    "lost_error": "gpu_is_lost",
    "unsupported": [],
    "errors": {},
    "pcie_tx_bytes": 0,
    "pcie_rx_bytes": 0,
    "pcie_replays": 0,
    "throttle_ns": {},
    "ecc": {},
    "remapped_rows": {},
    "graphics_active_integral": 0.0,
    "sm_active_integral": 0.0,
    "sm_occupancy_integral": 0.0,
    "tensor_active_integral": 0.0,
    "dram_active_integral": 0.0,
    "util_samples": [],
    "mem_util_samples": [],
    "util_acc": None,
    "process_util": [],
    "xid_events": [],
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
    "mig": None,
    "max_mig_devices": 7,
    "nvlink": [],
}
LINK_KEYS = ("gen", "width", "max_gen", "max_width", "gpu_max_gen")
LINK_DEFAULTS = {"gen": 5, "width": 16, "max_gen": 5, "max_width": 16, "gpu_max_gen": 5}
# The subkeys of the mapping-valued state keys the field table reads (``ecc.corrected_volatile`` ...).
FIELD_SUBKEYS: Mapping[str, frozenset[str]] = {
    head: frozenset(f.state_key.partition(".")[2] for f in fields.FIELDS if f.state_key.partition(".")[0] == head)
    for head in ("ecc", "remapped_rows")
}
GPM_INTEGRALS = ("graphics_active_integral", "sm_active_integral", "sm_occupancy_integral",
                 "tensor_active_integral", "dram_active_integral")
MIG_DEFAULTS: Mapping[str, Any] = {
    "gi": None, "ci": 0, "uuid": None, "name": None, "memory_used_bytes": 0, "memory_total_bytes": 10737418240,
    **dict.fromkeys(GPM_INTEGRALS, 0.0), "pcie_tx_bytes": 0, "pcie_rx_bytes": 0, "processes": [],
}
# A MIG-mode GPU answers NOT_SUPPORTED to these on its whole-GPU handle (nvml.h: utilisation samples, rates
# and per-process utilisation "not currently supported" on MIG-enabled GPUs). Whole-GPU GPM it answers:
# nvmlGpmSampleGet "supports the device handle and MIG device handle" (to refuse it, list it in unsupported).
MIG_UNSUPPORTED = frozenset({"nvmlDeviceGetSamples", "nvmlDeviceGetUtilizationRates",
                             "nvmlDeviceGetProcessUtilization", "nvmlDeviceGetProcessesUtilizationInfo"})
# The functions the fake answers for a MIG device handle; any other one given a MIG handle is not modelled.
MIG_HANDLE_CALLS = frozenset({"nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo",
                              "nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId",
                              "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"})
NO_ID = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of a process or event outside any MIG instance

# GPM metric id -> the integral key it averages, or the byte counter of a PCIe rate.
_GPM_RATIO = {
    C.GPM_GRAPHICS_UTIL: "graphics_active_integral",
    C.GPM_SM_UTIL: "sm_active_integral",
    C.GPM_SM_OCCUPANCY: "sm_occupancy_integral",
    C.GPM_ANY_TENSOR_UTIL: "tensor_active_integral",
    C.GPM_DRAM_BW_UTIL: "dram_active_integral",
}
_GPM_BYTES = {C.GPM_PCIE_TX_PER_SEC: "pcie_tx_bytes", C.GPM_PCIE_RX_PER_SEC: "pcie_rx_bytes"}
_GPM_KEYS = (*_GPM_RATIO.values(), *_GPM_BYTES.values())
_GPM_MAX_METRICS = pynvml.c_nvmlGpmMetricsGet_t.metrics.size // ctypes.sizeof(pynvml.c_nvmlGpmMetric_t)


@dataclass(frozen=True)
class _GpmElements:
    """The first ``n`` c_nvmlGpmMetric_t of a request in one read (metricId, metricInfo's 24 bytes) and one write
    (metricId, nvmlReturn, value, metricInfo as read): a request answered in two struct calls, not 2n."""

    read: struct.Struct
    write: struct.Struct


@functools.lru_cache(maxsize=8)
def _gpm_elements(n: int) -> _GpmElements:
    assert GPM_METRIC.size == 16 + 24, "c_nvmlGpmMetric_t: id, return, value (16 bytes), then 3 pointers"
    return _GpmElements(struct.Struct("<" + "I12x24s" * n), struct.Struct("<" + "Iid24s" * n))


@functools.lru_cache(maxsize=64)
def _gpm_plan(ids: tuple[int, ...]) -> tuple[tuple[int, bool], ...] | None:
    """Per requested metric: (position in a sample's values, whether it is a ratio); None when one is not
    modelled (the request is then answered metric by metric up to it, which raises)."""
    out: list[tuple[int, bool]] = []
    for mid in ids:
        key = _GPM_RATIO.get(mid) or _GPM_BYTES.get(mid)
        if key is None:
            return None
        out.append((_GPM_KEYS.index(key), mid in _GPM_RATIO))
    return tuple(out)

_FORWARDED_PREFIXES = ("NVML_", "nvmlClocksEventReason", "nvmlClocksThrottleReason", "nvmlEventType", "NVMLError",
                       "c_nvml", "nvmlPciInfo", "struct_c_nvml", "nvmlFriendlyObject", "nvmlStructToFriendlyObject")
_BANNED = {"nvmlDeviceGetPcieThroughput": "blocks ~20 ms per call; use fields 197/198 (DESIGN.md)"}
# Longest slice an event wait sleeps before looking at the state again (a state file may have changed).
_EVENT_POLL_S = 0.05


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


def _check_processes(procs: object, where: str) -> None:
    if not isinstance(procs, list):
        raise StateError(f"{where} must be a list")
    for i, p in enumerate(procs):
        if not isinstance(p, Mapping) or "pid" not in p or set(p) - {"pid", "used_memory_bytes"}:
            raise StateError(f"{where}[{i}] must be {{pid, used_memory_bytes}}")


def _normalize_mig(dev: dict[str, Any], where: str) -> None:
    """Fill in and check the MIG instances of one device (``dev["mig"]`` not None)."""
    if not isinstance(dev["mig"], list):
        raise StateError(f"{where}.mig must be null or a list of instances")
    if dev["processes"]:
        raise StateError(f"{where}: a MIG-mode device's compute processes belong to its instances "
                         "(mig[].processes), not to processes")
    if not isinstance(dev["max_mig_devices"], int) or len(dev["mig"]) > dev["max_mig_devices"]:
        raise StateError(f"{where}: more MIG instances than max_mig_devices ({dev['max_mig_devices']})")
    seen: set[tuple[int, int]] = set()
    out = []
    for i, raw in enumerate(dev["mig"]):
        w = f"{where}.mig[{i}]"
        if not isinstance(raw, Mapping):
            raise StateError(f"{w} must be a mapping")
        bad = set(raw) - set(MIG_DEFAULTS)
        if bad:
            raise StateError(f"{w}: unknown key(s) {sorted(bad)}")
        inst = {k: copy.deepcopy(raw.get(k, v)) for k, v in MIG_DEFAULTS.items()}
        gi, ci = inst["gi"], inst["ci"]
        for key, v in (("gi", gi), ("ci", ci)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise StateError(f"{w}.{key} must be a non-negative integer, not {v!r}")
        if (gi, ci) in seen:
            raise StateError(f"{w}: (gi, ci) ({gi}, {ci}) is not unique")
        seen.add((gi, ci))
        if inst["uuid"] is None:
            inst["uuid"] = f"MIG-{dev['uuid'].removeprefix('GPU-')}-{gi}" + (f"-{ci}" if ci else "")
        if inst["name"] is None:
            inst["name"] = f"{dev['name']} MIG {gi}" + (f" CI {ci}" if ci else "")
        _check_processes(inst["processes"], f"{w}.processes")
        out.append(inst)
    dev["mig"] = out


def _branch(version: str) -> int:
    """The driver branch of a version string ("550.54.15" -> 550)."""
    try:
        return int(version.split(".", maxsplit=1)[0])
    except ValueError:
        raise StateError(f"driver_version {version!r} does not start with a branch number") from None


def _refresh_periods(raw: object, where: str) -> dict[str, list[float]]:
    """``field_refresh_s`` as field id (a string, as JSON keys are) -> the refresh periods, cycled."""
    if not isinstance(raw, Mapping):
        raise StateError(f"{where}.field_refresh_s must be a mapping of field id to seconds")
    out: dict[str, list[float]] = {}
    for fid, periods in raw.items():
        if str(fid) not in {str(f.field_id) for f in fields.FIELDS}:
            raise StateError(f"{where}.field_refresh_s: {fid!r} is not a field of exporter/gpu/fields.py")
        seq = periods if isinstance(periods, list) else [periods]
        if not seq or not all(isinstance(p, int | float) and not isinstance(p, bool) and p > 0 for p in seq):
            raise StateError(f"{where}.field_refresh_s[{fid!r}] must be seconds > 0 or a list of them")
        out[str(fid)] = [float(p) for p in seq]
    return out


def _check_xid_events(events: object, dev: Mapping[str, Any], where: str) -> None:
    if not isinstance(events, list):
        raise StateError(f"{where}.xid_events must be a list")
    gis = {m["gi"] for m in dev["mig"] or ()}
    prev_t = -math.inf
    for i, e in enumerate(events):
        w = f"{where}.xid_events[{i}]"
        if not isinstance(e, Mapping) or not {"t", "xid"} <= set(e) or set(e) - {"t", "xid", "gi"}:
            raise StateError(f"{w} must be {{t, xid, gi}} (gi optional)")
        if not isinstance(e["xid"], int) or not 0 <= e["xid"] < 1 << 64:
            raise StateError(f"{w}.xid must be an unsigned integer")
        if not isinstance(e["t"], int | float) or float(e["t"]) < prev_t:
            raise StateError(f"{w}.t must be a number, in time order")
        prev_t = float(e["t"])
        if e.get("gi") is not None and e["gi"] not in gis:
            raise StateError(f"{w}.gi {e['gi']!r} is not a MIG instance of this device")


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
        "driver_fields": state.get("driver_fields"),
        "devices": [],
    }
    if out["init_error"] is not None:
        _check_error_name(out["init_error"], "init_error")
    if out["driver_fields"] is not None:
        _check_error_name(out["driver_fields"], "driver_fields")
        _branch(out["driver_version"])
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
        if dev["pcie_counter_value_type"] not in (None, "uint", "ull"):
            raise StateError(f"{where}: pcie_counter_value_type must be null, 'uint' or 'ull'")
        dev["field_refresh_s"] = _refresh_periods(dev["field_refresh_s"], where)
        if not isinstance(dev["gpm_nan"], list) or set(dev["gpm_nan"]) - set(_GPM_RATIO) - set(_GPM_BYTES):
            raise StateError(f"{where}.gpm_nan must be a list of modelled GPM metric ids")
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
        for head, keys in FIELD_SUBKEYS.items():
            if not isinstance(dev[head], Mapping) or set(dev[head]) - keys:
                raise StateError(f"{where}: {head} must be a mapping with keys from {sorted(keys)}")
        for fn in dev["unsupported"]:
            if not (isinstance(fn, str) and (fn.startswith("field:") or callable(getattr(pynvml, fn, None)))):
                raise StateError(f"{where}.unsupported: {fn!r} is neither a function of the installed pynvml "
                                 "nor 'field:<id>'")
        for fn, err in dict(dev["errors"]).items():
            if not callable(getattr(pynvml, str(fn), None)):
                raise StateError(f"{where}.errors: {fn!r} is not a function of the installed pynvml")
            _check_error_name(err, f"{where}.errors[{fn!r}]")
        _check_error_name(dev["lost_error"], f"{where}.lost_error")
        _check_processes(dev["processes"], f"{where}.processes")
        for i, p in enumerate(dev["process_util"]):
            if not isinstance(p, Mapping) or set(p) != {"pid", "ts_us", "sm_pct", "mem_pct"}:
                raise StateError(f"{where}.process_util[{i}] must be {{pid, ts_us, sm_pct, mem_pct}}")
        if dev["mig"] is not None:
            _normalize_mig(dev, where)
        _check_xid_events(dev["xid_events"], dev, where)
        try:
            dev["nvlink"] = fakenvlink.normalize_links(dev["nvlink"], where)
        except ValueError as e:
            raise StateError(str(e)) from e
        out["devices"].append(dev)
    return out


# ---- evolving a state (optional helpers for simulators and tests) -------------------------------------------


def _advance_activity(target: dict[str, Any], dt: float, ratios: Mapping[str, float], tx: float, rx: float) -> None:
    """GPM integrals and PCIe byte totals of a device or a MIG instance, over ``dt`` at constant rates."""
    for key in GPM_INTEGRALS:
        target[key] = float(target.get(key, 0.0)) + ratios.get(key, 0.0) * dt
    for key, rate in (("pcie_tx_bytes", tx), ("pcie_rx_bytes", rx)):
        target[key] = round(int(target.get(key, 0)) + rate * dt)


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
    mig: Mapping[int, Mapping[str, float]] | None = None,
    sample_period_s: float = 1 / 6,
    buffer_len: int = 240,
) -> None:
    """Advance one device dict from ``t0`` to ``t1`` with the given constant rates (fractions 0..1, per s).

    Counters and integrals grow by rate x dt; the driver's utilisation buffers get one sample per
    ``sample_period_s`` boundary, each the average over its own period (so integrating the samples gives
    back the true busy time, to the driver's integer-percent resolution); buffers keep ``buffer_len``.
    ``mig`` maps a GPU instance id to that instance's rates (``graphics_active``, ``sm_active``,
    ``sm_occupancy``, ``tensor_active``, ``dram_active``, ``pcie_tx_bytes_per_s``, ``pcie_rx_bytes_per_s``);
    the instances' PCIe traffic also counts on the whole GPU's byte counters (one link).
    """
    dt = t1 - t0
    if dt < 0:
        raise ValueError("time must not go backwards")
    if dt == 0:
        return
    ga = gpu_util if graphics_active is None else graphics_active
    _advance_activity(dev, dt, {"graphics_active_integral": ga, "sm_active_integral": sm_active,
                                "sm_occupancy_integral": sm_occupancy, "tensor_active_integral": tensor_active,
                                "dram_active_integral": dram_active}, pcie_tx_bytes_per_s, pcie_rx_bytes_per_s)
    for gi, r in (mig or {}).items():
        inst = next((m for m in dev.get("mig") or () if m["gi"] == gi), None)
        if inst is None:
            raise ValueError(f"device has no MIG instance {gi}")
        tx, rx = float(r.get("pcie_tx_bytes_per_s", 0.0)), float(r.get("pcie_rx_bytes_per_s", 0.0))
        _advance_activity(inst, dt, {f"{k}_integral": float(r.get(k, 0.0)) for k in (
            "graphics_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active")}, tx, rx)
        dev["pcie_tx_bytes"] = round(int(dev.get("pcie_tx_bytes", 0)) + tx * dt)
        dev["pcie_rx_bytes"] = round(int(dev.get("pcie_rx_bytes", 0)) + rx * dt)
    dev["pcie_replays"] = round(int(dev.get("pcie_replays", 0)) + pcie_replays_per_s * dt)
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


def _address(ptr: object) -> int | None:
    """The address a ctypes pointer holds (None for NULL or a non-pointer)."""
    if not isinstance(ptr, ctypes._Pointer):
        return None
    return ctypes.cast(ptr, c_void_p).value


# c_nvmlSample_t: timeStamp u64 @0, sampleValue (8-byte union, uiVal its low 4 bytes) @8 -- 16 bytes. The fake
# fills the driver's buffers through their memory, as the driver does; per-attribute writes through pynvml's
# Python hooks cost ~3 us a sample (tests/gpu/test_binding_conformance.py ties the layout to the binding).
SAMPLE = struct.Struct("<QQ")
# Of a c_nvmlGpmMetric_t (exporter.gpu.binding.GPM_METRIC): nvmlReturn u32 @4 and value double @8, what the
# driver writes back (metricId is the caller's, metricInfo is left as it was).
GPM_RESULT = struct.Struct("<Id")
# The head of a c_nvmlGpmMetricsGet_t: version u32, numMetrics u32, sample1 and sample2 pointers (native), then
# the metrics array; read as the driver does, without building a pointer object per sample through pynvml.
GPM_REQUEST = struct.Struct("@IIPP")
GPM_METRICS_AT = GPM_REQUEST.size
_M64 = (1 << 64) - 1


@dataclass(frozen=True)
class _FieldPlan:
    """How to answer one nvmlDeviceGetFieldValues request of one device: per requested field, ``(fieldId,
    scopeId, state key head, subkey or None, fake_scale, width, error)`` -- width 32/64 bits, 0 for the device's
    pcie_counter_bits (a number: read at every call), head None for a field the device answers ``error`` for
    (NOT_SUPPORTED, or the state's driver_fields code for a field newer than its driver branch) -- and the
    struct that packs the whole array in one call."""

    items: tuple[tuple[int, int, str | None, str | None, float, int, int], ...]
    packer: struct.Struct


@dataclass(frozen=True)
class _HandleKey:
    """What a device handle stands for: a GPU (by UUID: NVML handles stay valid across re-init) or one of its
    MIG devices (by GPU and compute instance id: an instance destroyed and created again in the same place gets
    the same handle back, as nvml.h warns MIG handles may be reused)."""

    uuid: str
    gi: int | None = None
    ci: int = 0


@dataclass
class _GpmSample:
    """What the fake keeps behind one ``c_nvmlGpmSample_t``: a snapshot of integrals at sample time."""

    freed: bool = False
    source: tuple[str, int | None] | None = None  # (device uuid, GPU instance id or None)
    t: float = 0.0
    values: tuple[float, ...] = ()  # the integrals and byte totals, in _GPM_KEYS order


class _Opaque:
    """Objects the fake keeps behind opaque binding pointers (``c_nvmlGpmSample_t``, ``c_nvmlEventSet_t``): each
    new one is a pointer to a struct the fake keeps alive, found again by the address it holds."""

    def __init__(self, struct: type[Any], pointer: type[Any]) -> None:
        self._struct, self._pointer = struct, pointer
        self._by_address: dict[int, tuple[Any, Any]] = {}
        # By id() of the pointer object handed out (kept alive here, so the id is not reused): the caller passing
        # that very object back is found without reading the address it holds (ctypes.cast, ~1 us).
        self._by_id: dict[int, tuple[Any, Any]] = {}

    def new(self, obj: Any) -> Any:
        struct = self._struct()
        self._by_address[ctypes.addressof(struct)] = (struct, obj)
        ptr = ctypes.pointer(struct)
        self._by_id[id(ptr)] = (ptr, obj)
        return ptr

    def get(self, ptr: object) -> Any:
        """The object behind ``ptr``; INVALID_ARGUMENT for anything else or a freed one, as NVML answers."""
        entry = self._by_id.get(id(ptr))
        if entry is None or entry[0] is not ptr:  # a copy (a struct field read back): by the address it holds
            addr = _address(ptr) if isinstance(ptr, self._pointer) else None
            entry = self._by_address.get(addr) if addr is not None else None
        if entry is None or entry[1].freed:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return entry[1]

    def at(self, address: int) -> Any:
        """The object at ``address`` (a pointer read out of a struct's memory), as :meth:`get` answers."""
        entry = self._by_address.get(address)
        if entry is None or entry[1].freed:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return entry[1]

    def live(self) -> list[Any]:
        return [obj for _, obj in self._by_address.values() if not obj.freed]


@dataclass
class _EventSet:
    """What the fake keeps behind one ``c_nvmlEventSet_t``: the devices registered and for which types."""

    types: dict[str, int] = field(default_factory=dict)  # device uuid -> event type mask
    freed: bool = False


def _api(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Count the call, reload the state file if it changed, then run the fake function under the lock. The
    wrapper keeps the function's signature (``inspect.signature`` follows ``__wrapped__``), which the
    conformance test compares with the real binding's."""
    name = fn.__name__

    @functools.wraps(fn)
    def wrapper(self: FakeNvml, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self.calls[name] += 1
            if self._look_due():
                self._maybe_reload()
            return fn(self, *args, **kwargs)

    return wrapper


def _api_events(fn: Callable[..., Any]) -> Callable[..., Any]:
    """:func:`_api` for the event wait, which reads only Xid events: from the exchange, new numbers are taken
    only while some device has events (their times are numbers) or a new shape is pending (an event, a lost
    GPU); otherwise the GPU samplers' own calls take them -- the Xid thread waking twice a second to take a
    state it does not read was a cost only the simulation paid."""
    name = fn.__name__

    @functools.wraps(fn)
    def wrapper(self: FakeNvml, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self.calls[name] += 1
            if self._exchange is None or self._has_events or self._exchange.shape_pending():
                self._maybe_reload()
            return fn(self, *args, **kwargs)

    return wrapper


class _FakeCore:
    """The fake's state and what every call goes through: loading and reloading the state, handles, the
    lost/error/unsupported injections. The calls are in the classes below, :class:`FakeNvml` last."""

    NVMLError = pynvml.NVMLError

    def __init__(self, state: Mapping[str, Any] | None = None) -> None:
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._state = normalize_state(state or {"devices": []})
        self._path: Path | None = None
        self._stamp: tuple[int, int] | None = None
        self._exchange: Reader | None = None  # from_exchange
        self._min_poll_s = 0.0  # from_exchange: the shortest real time between two looks at the exchange
        self._polled_at = -math.inf
        self._monotonic = time.monotonic  # the clock of those looks (a test steps its own)
        self._init_count = 0
        self._lost_calls: Counter[str] = Counter()
        # Handles, samples and event sets are real binding pointers to objects the fake keeps alive; the
        # address a pointer holds says which one it is.
        self._handle_ptrs: dict[_HandleKey, Any] = {}
        self._handle_keys: dict[int, _HandleKey] = {}  # by the address the pointer holds
        self._handle_ids: dict[int, _HandleKey] = {}  # by id() of the one pointer object handed out (kept alive)
        self._samples = _Opaque(pynvml.struct_c_nvmlGpmSample_t, pynvml.c_nvmlGpmSample_t)
        self._event_sets = _Opaque(pynvml.struct_c_nvmlEventSet_t, pynvml.c_nvmlEventSet_t)
        # Per device UUID: (time of the newest event delivered, how many events at exactly that time were).
        self._xid_delivered: dict[str, tuple[float, int]] = {}
        # Derived from the state's shape, rebuilt by _install (a shape changes only through it): the devices by
        # UUID, whether any has Xid events, and nvmlDeviceGetFieldValues' plans per (UUID, request).
        self._by_uuid: dict[str, dict[str, Any]] = {}
        self._has_events = False
        self._field_plans: dict[tuple[str, tuple[Any, ...]], _FieldPlan] = {}
        # Per (device UUID, field id) with a refresh period: (timestamp µs, value, refreshes so far).
        self._field_refresh: dict[tuple[str, int], tuple[int, int, int]] = {}
        self.calls: Counter[str] = Counter()
        self.gpm_short_pairs = 0
        self.reload_errors = 0
        self._index()

    # ---- test/simulator hooks -------------------------------------------------------------------------------

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Replace the whole state (validated; StateError on a bad key)."""
        self._install(normalize_state(state))

    def _install(self, norm: dict[str, Any]) -> None:
        """Serve ``norm`` (normalised) from now on."""
        with self._lock:
            self._state = norm
            self._index()
            for dev in norm["devices"]:
                if not dev["lost"]:
                    self._lost_calls.pop(dev["uuid"], None)
            self._rewind()
            self._cond.notify_all()  # a new shape may bring an event, a lost GPU

    def _index(self) -> None:  # under self._lock
        """What the calls look up, derived from the state's shape once rather than at every call."""
        self._by_uuid = {d["uuid"]: d for d in self._state["devices"]}
        self._has_events = any(d["xid_events"] for d in self._state["devices"])
        self._field_plans.clear()

    def _values_changed(self) -> None:  # under self._lock
        """The state's numbers moved (its time among them): wake event waiters when an event may have come due.
        Without events none can: waking the watcher thread at every new state (~70 us of CPU on a VM each, 10-20
        a second) was a cost of the simulation that the real blocking call never has."""
        self._rewind()
        if self._has_events:
            self._cond.notify_all()

    def _rewind(self) -> None:  # under self._lock
        """After time went back (a test or a looping simulator restarted the clock), deliver Xid events from the
        new time on."""
        if self._xid_delivered:
            t = float(self._state["t"])
            for uuid, done in list(self._xid_delivered.items()):
                if done[0] > t:
                    del self._xid_delivered[uuid]

    @property
    def state(self) -> dict[str, Any]:
        """A deep copy of the current (normalised) state."""
        with self._lock:
            if self._exchange is not None:
                self._exchange.settle_all()
            return copy.deepcopy(self._state)

    @property
    def event_sets(self) -> int:
        """Event sets created and not freed yet."""
        with self._lock:
            return len(self._event_sets.live())

    def _look_due(self) -> bool:
        """Whether a call looks at the exchange now (always, but within ``min_poll_s`` of the last look)."""
        if self._min_poll_s <= 0.0:
            return True
        now = self._monotonic()
        if now - self._polled_at < self._min_poll_s:
            return False
        self._polled_at = now
        return True

    def _maybe_reload(self) -> None:
        if self._exchange is not None:
            try:
                got = self._exchange.poll(settle=False)  # devices and sample buffers: when read (_resolve, _buffer)
            except (OSError, ValueError, StateError):
                self.reload_errors += 1
                return
            if got is None and self._exchange.busy:
                self._polled_at = -math.inf  # met a write in progress: the next call looks again
            if got is not None:
                if got[1]:
                    self._install(got[0])
                else:
                    self._values_changed()
            return
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
        if name.startswith("_"):
            raise AttributeError(name)
        if not hasattr(pynvml, name):
            # Exactly what the real module does: a name the installed binding lacks does not exist.
            raise AttributeError(f"module 'pynvml' has no attribute {name!r} (the installed nvidia-ml-py "
                                 f"{getattr(pynvml, '__version__', '')} does not define it)")
        if name in _BANNED:
            raise AssertionError(f"FakeNvml: {name} must never be called: {_BANNED[name]}")
        if name.startswith(_FORWARDED_PREFIXES):
            value = getattr(pynvml, name)
            self.__dict__[name] = value  # the binding's own object; found without this lookup from now on
            return value
        raise AssertionError(f"FakeNvml: unexpected call {name} (not modelled by the fake)")

    # ---- internals ------------------------------------------------------------------------------------------

    def _need_init(self) -> None:
        if self._init_count <= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def _handle(self, key: _HandleKey) -> Any:
        """The one ``c_nvmlDevice_t`` for ``key`` (the same pointer every time, as NVML's handles are)."""
        ptr = self._handle_ptrs.get(key)
        if ptr is None:
            ptr = self._handle_ptrs[key] = ctypes.pointer(pynvml.struct_c_nvmlDevice_t())
            self._handle_keys[ctypes.addressof(ptr.contents)] = key
            self._handle_ids[id(ptr)] = key
        return ptr

    def _settle_device(self, dev: Mapping[str, Any]) -> None:
        """``dev``'s numbers as of the newest state taken (a call that reads a device not through its handle)."""
        if self._exchange is not None:
            self._exchange.settle_group(dev)

    def _resolve(self, handle: object, fn: str) -> tuple[_HandleKey, dict[str, Any]]:
        """The key and device behind ``handle``, after the lost/error/unsupported injections for ``fn``."""
        self._need_init()
        key = self._handle_ids.get(id(handle))
        if key is None or self._handle_ptrs.get(key) is not handle:
            # A copy of a handle (a struct field read back, e.g. c_nvmlEventData_t.device): by address.
            addr = _address(handle) if isinstance(handle, pynvml.c_nvmlDevice_t) else None
            key = self._handle_keys.get(addr) if addr is not None else None
        if key is None:
            raise AssertionError(f"FakeNvml: {fn} got a handle that is not from nvmlDeviceGetHandleByIndex or "
                                 f"nvmlDeviceGetMigDeviceHandleByIndex: {handle!r}")
        dev = self._by_uuid.get(key.uuid)
        if dev is None:  # the device left the bus between enumeration and this call
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        self._settle_device(dev)  # its numbers as of the newest state taken (applied per device, when read)
        if key.gi is not None and fn not in MIG_HANDLE_CALLS:
            raise AssertionError(f"FakeNvml: {fn} is not modelled for a MIG device handle")
        self._inject(dev, fn)
        if key.gi is None and dev["mig"] is not None and fn in MIG_UNSUPPORTED:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return key, dev

    def _device(self, handle: object, fn: str) -> dict[str, Any]:
        """The whole-GPU device behind ``handle``."""
        return self._resolve(handle, fn)[1]

    def _instance(self, dev: Mapping[str, Any], gi: int, ci: int | None = None) -> dict[str, Any]:
        """MIG device (``gi``, ``ci``) of ``dev`` -- ``ci`` None: the GPU instance's first, which holds what the
        GPU instance shares (GPM, memory) --; NOT_FOUND when it is gone (destroyed since enumeration)."""
        for m in dev["mig"] or ():
            if m["gi"] == gi and (ci is None or m["ci"] == ci):
                return dict(m)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

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

    def _buffer(self, dev: Mapping[str, Any], key: str) -> Any:
        """``dev[key]``, one of the driver's sample buffers, brought up to the newest state taken: from the
        exchange they are applied when read (exchange.DEFERRED), not at every new state."""
        if self._exchange is not None:
            self._exchange.settle(dev, key)
        return dev[key]

    def _now_us(self) -> int:
        return round(float(self._state["t"]) * 1e6)


class _FakeFastPath(_FakeCore):
    """The calls of the backend's fast path: field values, GPM, clocks and power."""

    def _field_plan(self, dev: Mapping[str, Any], fieldIds: list[Any]) -> _FieldPlan:  # noqa: N803
        """The plan of a request (AssertionError for a field the fake does not model, every call: not cached)."""
        items: list[tuple[int, int, str | None, str | None, float, int, int]] = []
        missing = self._state["driver_fields"]
        branch = _branch(self._state["driver_version"]) if missing is not None else 0
        for requested in fieldIds:
            fid, scope = requested if isinstance(requested, tuple) else (requested, 0)
            if f"field:{fid}" in dev["unsupported"]:
                items.append((fid, scope, None, None, 1.0, 0, ERR_NOT_SUPPORTED))
                continue
            f = fields.BY_ID.get(fid)
            if f is None:
                raise AssertionError(f"FakeNvml: nvmlDeviceGetFieldValues asked for unmodelled field id {fid}")
            if missing is not None and branch < f.driver_branch:
                items.append((fid, scope, None, None, 1.0, 0, int(nvml_error(missing).value)))
                continue
            head, _, rest = f.state_key.partition(".")
            width = {fields.PCIE: 0, fields.UINT: 32}.get(f.value_type, 64)
            items.append((fid, scope, head, rest or None, f.fake_scale, width, SUCCESS))
        return _FieldPlan(tuple(items), struct.Struct("<" + FIELD_VALUE.format.lstrip("<") * len(items)))

    @_api
    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list[Any]) -> Any:  # noqa: N802, N803
        """An array of ``c_nvmlFieldValue_t`` with per-field nvmlReturn, like the binding returns."""
        dev = self._device(handle, "nvmlDeviceGetFieldValues")
        try:
            request = (dev["uuid"], tuple(fieldIds))
            plan = self._field_plans.get(request)
        except TypeError:  # an unhashable request (a list of lists): planned afresh
            request, plan = None, None
        if plan is None:
            plan = self._field_plan(dev, fieldIds)
            if request is not None:
                self._field_plans[request] = plan
        arr = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        now = self._now_us()
        # Filled as the driver does, through the struct's memory, in one call (the layout test ties FIELD_VALUE
        # to the binding's c_nvmlFieldValue_t); per-attribute writes through pynvml's hooks were most of the cost.
        out: list[int] = []
        refresh = dev["field_refresh_s"]
        for fid, scope, head, rest, scale, width, error in plan.items:
            if head is None:
                out += (fid, scope, now, 0, 0, error, 0)
                continue
            raw = dev[head] if rest is None else dev[head].get(rest, 0)
            value = round(float(raw) * scale) if scale != 1.0 else int(raw)
            bits = width or dev["pcie_counter_bits"]
            vt = VT_UINT if bits == 32 else VT_ULL
            if width == 0 and dev["pcie_counter_value_type"] is not None:
                vt = VT_UINT if dev["pcie_counter_value_type"] == "uint" else VT_ULL
            ts = now
            if refresh and str(fid) in refresh:
                ts, value = self._refreshed(dev["uuid"], fid, refresh[str(fid)], now, value)
            out += (fid, scope, ts, 0, vt, SUCCESS, value % (1 << bits))
        plan.packer.pack_into(arr, 0, *out)
        return arr

    def _refreshed(self, uuid: str, fid: int, periods: list[float], now_us: int, value: int) -> tuple[int, int]:
        """``(timestamp, value)`` of a field the driver refreshes every ``periods`` seconds (cycled: irregular
        refresh): the value taken at its newest refresh, the first read at least a period after the one before
        (or the first read, or after time went back)."""
        key = (uuid, fid)
        got = self._field_refresh.get(key)
        if got is None or now_us < got[0] or now_us - got[0] >= round(periods[got[2] % len(periods)] * 1e6):
            got = self._field_refresh[key] = (now_us, value, 0 if got is None else got[2] + 1)
        return got[0], got[1]

    @_api
    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any:  # noqa: N802
        dev = self._device(device, "nvmlGpmQueryDeviceSupport")
        sup = pynvml.c_nvmlGpmSupport_t()
        sup.version, sup.isSupportedDevice = int(pynvml.NVML_GPM_SUPPORT_VERSION), int(bool(dev["gpm"]))
        return sup

    @_api
    def nvmlGpmSampleAlloc(self) -> Any:  # noqa: N802
        """A ``c_nvmlGpmSample_t``."""
        self._need_init()
        return self._samples.new(_GpmSample())

    def _sample(self, ptr: object) -> _GpmSample:
        sample: _GpmSample = self._samples.get(ptr)
        return sample

    @_api
    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:  # noqa: N802, N803
        self._sample(gpmSample).freed = True

    def _snapshot(self, sample: _GpmSample, source: tuple[str, int | None], values: Mapping[str, Any]) -> None:
        sample.source, sample.t = source, float(self._state["t"])
        sample.values = tuple(map(values.__getitem__, _GPM_KEYS))

    @_api
    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:  # noqa: N802, N803
        """Snapshot the device's integrals and PCIe byte totals into ``gpmSample``."""
        dev = self._device(device, "nvmlGpmSampleGet")
        if not dev["gpm"]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self._snapshot(self._sample(gpmSample), (dev["uuid"], None), dev)
        return gpmSample

    @_api
    def nvmlGpmMigSampleGet(self, device: Any, gpuInstanceId: int, gpmSample: Any) -> Any:  # noqa: N802, N803
        """Snapshot one MIG instance's integrals (``device`` is the whole GPU's handle, as in nvml.h)."""
        dev = self._device(device, "nvmlGpmMigSampleGet")
        if not dev["gpm"] or dev["mig"] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        inst = self._instance(dev, gpuInstanceId)
        self._snapshot(self._sample(gpmSample), (dev["uuid"], int(gpuInstanceId)), inst)
        return gpmSample

    @_api
    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:  # noqa: N802, N803
        """Averages over the two samples: 100*(I2-I1)/(t2-t1) for ratios, MiB/s for PCIe."""
        self._need_init()
        mg = metricsGet
        if not isinstance(mg, pynvml.c_nvmlGpmMetricsGet_t):
            raise AssertionError(f"FakeNvml: nvmlGpmMetricsGet wants a c_nvmlGpmMetricsGet_t, not {mg!r}")
        version, n, first, second = GPM_REQUEST.unpack_from(mg, 0)
        if version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        s1, s2 = self._samples.at(first), self._samples.at(second)
        if s1.source is None or s1.source != s2.source:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        dt = s2.t - s1.t
        if 0 < dt < C.GPM_MIN_PAIR_SECONDS - 1e-6:
            self.gpm_short_pairs += 1
        # Read and written through the metrics' memory, as the driver does (GPM_METRIC, GPM_RESULT), in order:
        # an unmodelled metric raises after the ones before it were answered, as before.
        if n > _GPM_MAX_METRICS:
            raise AssertionError(f"FakeNvml: nvmlGpmMetricsGet numMetrics {n} outside the request's metrics array")
        v1, v2 = s1.values, s2.values
        nan = self._by_uuid[s1.source[0]]["gpm_nan"] if s1.source[0] in self._by_uuid else ()
        elems = _gpm_elements(n)
        got = elems.read.unpack_from(mg, GPM_METRICS_AT)  # (metricId, metricInfo's bytes) per metric
        plan = _gpm_plan(got[0::2])
        if plan is not None:  # every metric modelled: all answered in one write, metricInfo left as it was
            out: list[Any] = []
            for (pos, is_ratio), mid, info in zip(plan, got[0::2], got[1::2], strict=True):
                value = 0.0 if dt <= 0 else (100.0 * (v2[pos] - v1[pos]) / dt if is_ratio else
                                             (v2[pos] - v1[pos]) / dt / C.MIB)
                if nan and mid in nan:
                    value = math.nan
                out += (mid, ERR_INVALID_ARGUMENT if dt <= 0 else SUCCESS, value, info)
            elems.write.pack_into(mg, GPM_METRICS_AT, *out)
            return mg
        for i in range(n):
            at = GPM_METRICS_AT + i * GPM_METRIC.size
            mid = GPM_METRIC.unpack_from(mg, at)[0]
            ratio, counter = _GPM_RATIO.get(mid), _GPM_BYTES.get(mid)
            if ratio is None and counter is None:
                raise AssertionError(f"FakeNvml: nvmlGpmMetricsGet asked for unmodelled GPM metric {mid}")
            key = _GPM_KEYS.index(ratio if ratio is not None else counter)
            if dt <= 0:
                GPM_RESULT.pack_into(mg, at + 4, ERR_INVALID_ARGUMENT, 0.0)
            elif mid in nan:
                GPM_RESULT.pack_into(mg, at + 4, SUCCESS, math.nan)
            elif ratio is not None:
                GPM_RESULT.pack_into(mg, at + 4, SUCCESS, 100.0 * (v2[key] - v1[key]) / dt)
            else:
                GPM_RESULT.pack_into(mg, at + 4, SUCCESS, (v2[key] - v1[key]) / dt / C.MIB)
        return mg

    @_api
    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:  # noqa: N802
        dev = self._device(handle, "nvmlDeviceGetClockInfo")
        if type not in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
            raise AssertionError(f"FakeNvml: nvmlDeviceGetClockInfo clock type {type} not modelled")
        return int(dev["sm_clock_mhz"])

    @_api
    def nvmlDeviceGetMaxClockInfo(self, handle: Any, type: int) -> int:  # noqa: N802
        dev = self._device(handle, "nvmlDeviceGetMaxClockInfo")
        if type not in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
            raise AssertionError(f"FakeNvml: nvmlDeviceGetMaxClockInfo clock type {type} not modelled")
        return int(dev["max_sm_clock_mhz"])

    @_api
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:  # noqa: N802
        """Milliwatts."""
        return round(float(self._device(handle, "nvmlDeviceGetPowerUsage")["power_w"]) * 1000)

    @_api
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:  # noqa: N802
        """Milliwatts."""
        return round(float(self._device(handle, "nvmlDeviceGetEnforcedPowerLimit")["power_limit_w"]) * 1000)



class _FakeEvents(_FakeCore):
    """The event-set calls the Xid watcher makes."""

    @_api
    def nvmlEventSetCreate(self) -> Any:  # noqa: N802
        """A ``c_nvmlEventSet_t``."""
        self._need_init()
        return self._event_sets.new(_EventSet())

    def _event_set(self, ptr: object) -> _EventSet:
        es: _EventSet = self._event_sets.get(ptr)
        return es

    @_api
    def nvmlEventSetFree(self, eventSet: Any) -> None:  # noqa: N802, N803
        self._event_set(eventSet).freed = True
        self._cond.notify_all()

    @_api
    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:  # noqa: N802
        """Xid critical errors and the ECC events on every fake GPU."""
        self._device(handle, "nvmlDeviceGetSupportedEventTypes")
        return int(pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeSingleBitEccError
                   | pynvml.nvmlEventTypeDoubleBitEccError)

    @_api
    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:  # noqa: N802, N803
        dev = self._device(handle, "nvmlDeviceRegisterEvents")
        es = self._event_set(eventSet)
        modelled = int(pynvml.nvmlEventTypeXidCriticalError)
        if int(eventTypes) & ~modelled:
            raise AssertionError(f"FakeNvml: nvmlDeviceRegisterEvents types {int(eventTypes):#x} not modelled "
                                 "(only nvmlEventTypeXidCriticalError)")
        es.types[dev["uuid"]] = es.types.get(dev["uuid"], 0) | int(eventTypes)

    def _undelivered(self, es: _EventSet) -> bool:
        """Whether a device registered in ``es`` has an Xid event in its list not delivered yet (it becomes due
        when the state's ``t`` reaches it)."""
        for dev in self._state["devices"]:
            events = dev["xid_events"]
            if not events or not es.types.get(dev["uuid"], 0) & pynvml.nvmlEventTypeXidCriticalError:
                continue
            self._settle_device(dev)  # its events' times as of the newest state taken
            last, n_at_last = self._xid_delivered.get(dev["uuid"], (-math.inf, 0))
            newest = float(events[-1]["t"])
            if newest > last or (newest == last and sum(float(e["t"]) == newest for e in events) > n_at_last):
                return True
        return False

    def _next_event(self, es: _EventSet) -> Any | None:
        """The oldest due, undelivered Xid event of a registered device, as ``c_nvmlEventData_t``."""
        t = float(self._state["t"])
        due: list[tuple[float, int, dict[str, Any], dict[str, Any]]] = []
        for pos, dev in enumerate(self._state["devices"]):
            if not es.types.get(dev["uuid"], 0) & pynvml.nvmlEventTypeXidCriticalError:
                continue
            if dev["lost"]:
                raise nvml_error("gpu_is_lost")
            if not dev["xid_events"]:
                continue
            self._settle_device(dev)  # its events' times as of the newest state taken
            last, n_at_last = self._xid_delivered.get(dev["uuid"], (-math.inf, 0))
            seen_at_last = 0
            for ev in dev["xid_events"]:
                et = float(ev["t"])
                if et > t:
                    break
                if et == last:
                    seen_at_last += 1
                    if seen_at_last <= n_at_last:
                        continue
                if et >= last:
                    due.append((et, pos, dev, ev))
                    break
        if not due:
            return None
        et, _, dev, ev = min(due, key=lambda d: (d[0], d[1]))
        last, n_at_last = self._xid_delivered.get(dev["uuid"], (-math.inf, 0))
        self._xid_delivered[dev["uuid"]] = (et, n_at_last + 1 if et == last else 1)
        data = pynvml.c_nvmlEventData_t()
        gi = ev.get("gi")
        data.device = self._handle(_HandleKey(dev["uuid"]))  # the whole GPU; a MIG instance is gpuInstanceId
        data.eventType = pynvml.nvmlEventTypeXidCriticalError
        data.eventData = int(ev["xid"])
        data.gpuInstanceId = NO_ID if gi is None else int(gi)
        data.computeInstanceId = NO_ID
        return data

    @_api_events
    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> Any:  # noqa: N802, N803
        """The next due event of the set's devices; waits (real time) up to ``timeoutms`` for one, then raises
        NVML_ERROR_TIMEOUT as the binding does. A lost registered GPU raises GPU_IS_LOST."""
        deadline = time.monotonic() + max(0, int(timeoutms)) / 1000.0
        while True:
            self._need_init()
            es = self._event_set(eventSet)
            data = self._next_event(es)
            if data is not None:
                return data
            left = deadline - time.monotonic()
            if left <= 0:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
            # Releases the lock; _install (a new state or shape) notifies. From the exchange, new numbers matter
            # only while an event is not due yet; otherwise only a new shape can bring one, and the GPU
            # samplers' own calls install it (a steady GPU's at least every second), which wakes this wait: it
            # sleeps to its timeout as the real call does (each wake-up of a thread costs ~70 us of CPU on a
            # VM; the 4 a second a 250 ms look took showed as 0.15 -> 0.10% of a core in tick-resolution samples).
            pending = self._exchange is None or self._undelivered(es)
            self._cond.wait(min(left, _EVENT_POLL_S) if pending else left)
            if self._exchange is None or self._undelivered(es) or self._exchange.shape_pending():
                # New numbers matter only to an event not yet due (they advance ``t``); a new event, a lost
                # GPU, is a new shape. The real call blocks in the driver at no cost to the daemon: taking
                # every new state here, ~10 a second, charged it what no real host pays.
                self._maybe_reload()


class _FakeNvLink(_FakeCore):
    """The NVLink calls and field values (exporter/sim/fakenvlink.py: the state and the answers)."""

    def _links(self, dev: Mapping[str, Any]) -> Mapping[str, Any]:
        """``dev`` with its ``nvlink`` list brought up to the newest state taken (applied when read, as the
        sample buffers are: exchange.DEFERRED)."""
        self._buffer(dev, "nvlink")
        return dev

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list[Any]) -> Any:  # noqa: N802, N803
        """NVLink fields (scopeId: the link) answered here, every other request by the fast path's."""
        if not any(isinstance(f, tuple) and f[0] in fakenvlink.FIELDS for f in fieldIds):
            return super().nvmlDeviceGetFieldValues(handle, fieldIds)  # type: ignore[misc]
        with self._lock:
            self.calls["nvmlDeviceGetFieldValues"] += 1
            if self._look_due():
                self._maybe_reload()
            dev = self._device(handle, "nvmlDeviceGetFieldValues")
            self._buffer(dev, "nvlink")
            arr = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
            now = self._now_us()
            answer = fakenvlink.field_answers(dev)
            for i, requested in enumerate(fieldIds):
                fid, scope = requested if isinstance(requested, tuple) else (requested, 0)
                if fid not in fakenvlink.FIELDS:
                    raise AssertionError(f"FakeNvml: NVLink and other fields in one request ({fid})")
                ret, value = answer(fid, scope)
                FIELD_VALUE.pack_into(arr, i * FIELD_VALUE.size, fid, scope, now, 0, VT_ULL, ret, value)
            return arr

    @_api
    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:  # noqa: N802
        up = fakenvlink.link_of(self._links(self._device(device, "nvmlDeviceGetNvLinkState")), link)["up"]
        return int(pynvml.NVML_FEATURE_ENABLED if up else pynvml.NVML_FEATURE_DISABLED)

    @_api
    def nvmlDeviceGetNvLinkVersion(self, device: Any, link: int) -> int:  # noqa: N802
        return int(fakenvlink.link_of(self._links(self._device(device, "nvmlDeviceGetNvLinkVersion")), link)["version"])

    @_api
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:  # noqa: N802
        dev = self._links(self._device(handle, "nvmlDeviceGetNvLinkRemoteDeviceType"))
        remote = fakenvlink.link_of(dev, link)["remote"]
        return int(fakenvlink.REMOTE_TYPES[remote])

    @_api
    def nvmlDeviceGetNvLinkErrorCounter(self, device: Any, link: int, counter: int) -> int:  # noqa: N802
        key = fakenvlink.ERROR_COUNTERS.get(int(counter))
        if key is None:
            raise AssertionError(f"FakeNvml: nvmlDeviceGetNvLinkErrorCounter counter {counter} not modelled")
        return int(fakenvlink.link_of(self._links(self._device(device, "nvmlDeviceGetNvLinkErrorCounter")), link)[key])


class FakeNvml(_FakeNvLink, _FakeFastPath, _FakeEvents):
    """The fake ``pynvml`` module (see the module docstring for the state it serves)."""

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> FakeNvml:
        """A fake serving the JSON state in ``path``, reloaded whenever the file's mtime or size changes."""
        p = Path(path)
        fake = cls(json.loads(p.read_text(encoding="utf-8")))
        st = p.stat()
        fake._path, fake._stamp = p, (st.st_mtime_ns, st.st_size)
        return fake

    @classmethod
    def from_exchange(cls, directory: str | os.PathLike[str], *, min_poll_s: float = 0.0) -> FakeNvml:
        """A fake serving the state a simulator publishes in ``directory`` through :mod:`exporter.sim.exchange`
        (what ``serve --simulate`` uses): a change of values costs the daemon an unpack, not a JSON parse.

        ``min_poll_s``: a call looks at the exchange only when the last look is at least this old (real seconds).
        ``serve --simulate`` passes a tenth of the simulator's publish period: the calls of one sampling tick
        (a dozen within a millisecond or two) then look once, and what they serve is never staler than the
        simulator's own publish jitter. 0 (tests): every call looks."""
        fake = cls()
        fake._min_poll_s = float(min_poll_s)
        fake._exchange = Reader(Path(directory), normalize_state)
        # The simulator writes continuously: a poll that meets a write in progress takes nothing. Retry, briefly.
        deadline = time.monotonic() + 5.0
        while (got := fake._exchange.poll()) is None:
            if time.monotonic() > deadline:
                raise StateError(f"{directory}: no complete state published within 5 s")
            time.sleep(0.005)
        fake._install(got[0])
        return fake


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
        """Drop one init reference; the last one invalidates every event set (NVML frees them)."""
        self._need_init()
        self._init_count -= 1
        if self._init_count == 0:
            for es in self._event_sets.live():
                es.freed = True
            self._cond.notify_all()

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
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:  # noqa: N802
        """A ``c_nvmlDevice_t``; a lost GPU raises GPU_IS_LOST already here."""
        self._need_init()
        devs = self._state["devices"]
        if not isinstance(index, int) or not 0 <= index < len(devs):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        dev = devs[index]
        self._inject(dev, "nvmlDeviceGetHandleByIndex")
        return self._handle(_HandleKey(dev["uuid"]))

    @_api
    def nvmlDeviceGetUUID(self, handle: Any) -> str:  # noqa: N802
        key, dev = self._resolve(handle, "nvmlDeviceGetUUID")
        return str(dev["uuid"] if key.gi is None else self._instance(dev, key.gi, key.ci)["uuid"])

    @_api
    def nvmlDeviceGetName(self, handle: Any) -> str:  # noqa: N802
        key, dev = self._resolve(handle, "nvmlDeviceGetName")
        return str(dev["name"] if key.gi is None else self._instance(dev, key.gi, key.ci)["name"])

    @_api
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:  # noqa: N802
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

    # ---- MIG ------------------------------------------------------------------------------------------------

    @_api
    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:  # noqa: N802
        """``[current, pending]``, NVML_DEVICE_MIG_ENABLE while the state lists MIG instances (even none)."""
        dev = self._device(device, "nvmlDeviceGetMigMode")
        mode = pynvml.NVML_DEVICE_MIG_DISABLE if dev["mig"] is None else pynvml.NVML_DEVICE_MIG_ENABLE
        return [mode, mode]

    @_api
    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:  # noqa: N802
        return int(self._device(device, "nvmlDeviceGetMaxMigDeviceCount")["max_mig_devices"])

    @_api
    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:  # noqa: N802
        """The MIG device at ``index`` (instance list order); NOT_FOUND past the existing instances, as NVML
        answers for an unpopulated slot; INVALID_ARGUMENT past max_mig_devices."""
        dev = self._device(device, "nvmlDeviceGetMigDeviceHandleByIndex")
        if not isinstance(index, int) or not 0 <= index < int(dev["max_mig_devices"]):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if dev["mig"] is None or index >= len(dev["mig"]):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        inst = dev["mig"][index]
        return self._handle(_HandleKey(dev["uuid"], int(inst["gi"]), int(inst["ci"])))

    @_api
    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:  # noqa: N802
        key, dev = self._resolve(device, "nvmlDeviceGetGpuInstanceId")
        if key.gi is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # not a MIG device handle
        return int(self._instance(dev, key.gi, key.ci)["gi"])

    @_api
    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:  # noqa: N802
        key, dev = self._resolve(device, "nvmlDeviceGetComputeInstanceId")
        if key.gi is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(self._instance(dev, key.gi, key.ci)["ci"])

    # ---- buffered samples -------------------------------------------------------------------------------------

    @_api
    def nvmlDeviceGetSamples(self, device: Any, sampling_type: int, timeStamp: int) -> Any:  # noqa: N802, N803
        """``(valueType, [c_nvmlSample_t])`` newer than ``timeStamp`` µs; NOT_FOUND when there are none."""
        dev = self._device(device, "nvmlDeviceGetSamples")
        if sampling_type == C.GPU_UTILIZATION_SAMPLES:
            buf = self._buffer(dev, "util_samples")
        elif sampling_type == C.MEMORY_UTILIZATION_SAMPLES:
            buf = self._buffer(dev, "mem_util_samples")
        else:
            raise AssertionError(f"FakeNvml: nvmlDeviceGetSamples type {sampling_type} not modelled")
        since = int(timeStamp)
        # What the driver copies out: the newer entries in the buffer's order, into a c_nvmlSample_t array the
        # binding slices into its list (``c_samples[0:count]``), the value as uiVal (ctypes' truncation: mod 2**32).
        newer = [(int(ts) & _M64, int(val) & 0xFFFFFFFF) for ts, val in buf if int(ts) > since]
        if not newer:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        arr = (pynvml.c_nvmlSample_t * len(newer))()
        for i, (ts, val) in enumerate(newer):
            SAMPLE.pack_into(arr, i * SAMPLE.size, ts, val)
        return (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, arr[0 : len(newer)])

    @_api
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:  # noqa: N802
        """``c_nvmlUtilization_t`` from the newest buffered samples (0 when the buffers are empty)."""
        dev = self._device(handle, "nvmlDeviceGetUtilizationRates")
        u = pynvml.c_nvmlUtilization_t()
        util, mem = self._buffer(dev, "util_samples"), self._buffer(dev, "mem_util_samples")
        u.gpu = int(util[-1][1]) if util else 0
        u.memory = int(mem[-1][1]) if mem else 0
        return u

    # ---- slow path ----------------------------------------------------------------------------------------------

    @_api
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:  # noqa: N802
        dev = self._device(handle, "nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise AssertionError(f"FakeNvml: nvmlDeviceGetTemperature sensor {sensor} not modelled")
        return round(float(dev["temperature_c"]))

    @_api
    def nvmlDeviceGetTemperatureV(self, handle: Any, sensor: int, version: int = pynvml.nvmlTemperature_v1) -> int:  # noqa: N802
        """The current temperature call (nvml.h: nvmlDeviceGetTemperature is deprecated for it)."""
        dev = self._device(handle, "nvmlDeviceGetTemperatureV")
        if sensor != pynvml.NVML_TEMPERATURE_GPU or version != pynvml.nvmlTemperature_v1:
            raise AssertionError(f"FakeNvml: nvmlDeviceGetTemperatureV sensor {sensor} version {version:#x} "
                                 "not modelled")
        return round(float(dev["temperature_c"]))

    @_api
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:  # noqa: N802
        """``c_nvmlMemory_t`` of the GPU, or of one MIG instance for a MIG device handle."""
        if version:
            raise AssertionError("FakeNvml: nvmlDeviceGetMemoryInfo version 2 (c_nvmlMemory_v2_t) not modelled")
        key, dev = self._resolve(handle, "nvmlDeviceGetMemoryInfo")
        src = dev if key.gi is None else self._instance(dev, key.gi)  # a GPU instance's memory: its first entry
        m = pynvml.c_nvmlMemory_t()
        m.total, m.used = int(src["memory_total_bytes"]), int(src["memory_used_bytes"])
        m.free = max(0, m.total - m.used)
        return m

    def _link(self, handle: Any, fn: str, key: str) -> int:
        return int(self._device(handle, fn)["link"][key])

    @_api
    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:  # noqa: N802
        return self._link(handle, "nvmlDeviceGetCurrPcieLinkGeneration", "gen")

    @_api
    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:  # noqa: N802
        return self._link(handle, "nvmlDeviceGetCurrPcieLinkWidth", "width")

    @_api
    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:  # noqa: N802
        return self._link(handle, "nvmlDeviceGetMaxPcieLinkGeneration", "max_gen")

    @_api
    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:  # noqa: N802
        return self._link(handle, "nvmlDeviceGetMaxPcieLinkWidth", "max_width")

    @_api
    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, handle: Any) -> int:  # noqa: N802
        return self._link(handle, "nvmlDeviceGetGpuMaxPcieLinkGeneration", "gpu_max_gen")

    @_api
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:  # noqa: N802
        dev = self._device(handle, "nvmlDeviceGetCurrentClocksEventReasons")
        return C.encode_reasons(dev["clock_event_reasons"])

    @_api
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:  # noqa: N802
        """The pre-R535 name of the same bitmask."""
        dev = self._device(handle, "nvmlDeviceGetCurrentClocksThrottleReasons")
        return C.encode_reasons(dev["clock_event_reasons"])

    @staticmethod
    def _process_objects(procs: list[Mapping[str, Any]], gi: int, ci: int) -> list[Any]:
        """What the binding returns: ``nvmlFriendlyObject`` of ``c_nvmlProcessInfo_v3_t`` per process, with
        NVML_VALUE_NOT_AVAILABLE memory as None (pynvml's own rule)."""
        out = []
        for p in procs:
            c = pynvml.c_nvmlProcessInfo_v3_t()
            c.pid = int(p["pid"]) % (1 << 32)
            used = p.get("used_memory_bytes")
            c.usedGpuMemory = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value if used is None else int(used)
            c.gpuInstanceId, c.computeInstanceId = gi, ci
            obj = pynvml.nvmlStructToFriendlyObject(c)
            if obj.usedGpuMemory == pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
                obj.usedGpuMemory = None
            out.append(obj)
        return out

    def _compute_processes(self, handle: Any, fn: str) -> list[Any]:
        key, dev = self._resolve(handle, fn)
        if key.gi is not None:
            inst = self._instance(dev, key.gi, key.ci)
            return self._process_objects(inst["processes"], int(inst["gi"]), int(inst["ci"]))
        if dev["mig"] is None:
            return self._process_objects(dev["processes"], NO_ID, NO_ID)
        # The whole GPU of a MIG-mode device lists every instance's processes (NVML does with privileges).
        return [o for m in dev["mig"] for o in self._process_objects(m["processes"], int(m["gi"]), int(m["ci"]))]

    @_api
    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any) -> list[Any]:  # noqa: N802
        return self._compute_processes(handle, "nvmlDeviceGetComputeRunningProcesses_v3")

    @_api
    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any) -> list[Any]:  # noqa: N802
        """Drivers before the v3 struct; the same list."""
        return self._compute_processes(handle, "nvmlDeviceGetComputeRunningProcesses_v2")

    def _process_samples(self, handle: Any, fn: str, struct: type[Any], timeStamp: int) -> list[Any]:  # noqa: N803
        """The device's per-process samples newer than ``timeStamp`` as ``struct``s; NOT_FOUND when none."""
        dev = self._device(handle, fn)
        out = []
        for p in self._buffer(dev, "process_util"):
            if int(p["ts_us"]) > int(timeStamp):
                s = struct()
                s.pid, s.timeStamp = int(p["pid"]) % (1 << 32), int(p["ts_us"])
                s.smUtil, s.memUtil, s.encUtil, s.decUtil = int(p["sm_pct"]), int(p["mem_pct"]), 0, 0
                out.append(s)
        if not out:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return out

    @_api
    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[Any]:  # noqa: N802, N803
        """``c_nvmlProcessUtilizationSample_t`` newer than ``timeStamp``; NOT_FOUND when none."""
        return self._process_samples(handle, "nvmlDeviceGetProcessUtilization",
                                     pynvml.c_nvmlProcessUtilizationSample_t, timeStamp)

    @_api
    def nvmlDeviceGetProcessesUtilizationInfo(self, handle: Any, timeStamp: int) -> list[Any]:  # noqa: N802, N803
        """``c_nvmlProcessUtilizationInfo_v1_t`` (R550+), from the same samples as nvmlDeviceGetProcessUtilization
        (the binding returns the array's slice as the older call does)."""
        return self._process_samples(handle, "nvmlDeviceGetProcessesUtilizationInfo",
                                     pynvml.c_nvmlProcessUtilizationInfo_v1_t, timeStamp)

    @staticmethod
    def _mask(items: frozenset[int], words: int) -> Any:
        arr = (c_ulonglong * words)()
        for i in items:
            if i < 64 * words:
                arr[i // 64] |= 1 << (i % 64)
        return arr

    @_api
    def nvmlDeviceGetCpuAffinity(self, handle: Any, cpuSetSize: int) -> Any:  # noqa: N802, N803
        """Array of ``cpuSetSize`` 64-bit words, bit i = CPU i."""
        dev = self._device(handle, "nvmlDeviceGetCpuAffinity")
        if dev["cpu_affinity"] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._mask(parse_cpulist(dev["cpu_affinity"]), cpuSetSize)

    @_api
    def nvmlDeviceGetMemoryAffinity(self, handle: Any, nodeSetSize: int, scope: int) -> Any:  # noqa: N802, N803
        """Array of ``nodeSetSize`` 64-bit words, bit i = NUMA node i."""
        dev = self._device(handle, "nvmlDeviceGetMemoryAffinity")
        if dev["memory_affinity"] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._mask(parse_cpulist(dev["memory_affinity"]), nodeSetSize)

    @_api
    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:  # noqa: N802
        dev = self._device(handle, "nvmlDeviceGetNumaNodeId")
        if dev["numa_node_id"] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(dev["numa_node_id"])
