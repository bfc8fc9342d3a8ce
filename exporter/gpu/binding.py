"""The NVML binding's raw surface, as gpufeed uses it: return codes, value types, and the ctypes buffers of the
two hot calls unpacked in one C call each (pynvml's Python-level ``__getattribute__`` on every field was most of
the fast path's cost). Nothing here imports ``pynvml``: values are nvml.h's, compared by value, so the backend
and the strict fake agree without importing the binding at module import time.
"""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass, field
from typing import Any

# Error codes (nvml.h nvmlReturn_t); compared by value so this module never imports pynvml itself.
SUCCESS = 0
ERR_UNINITIALIZED = 1
ERR_INVALID_ARGUMENT = 2
ERR_NOT_SUPPORTED = 3
ERR_NO_PERMISSION = 4
ERR_NOT_FOUND = 6
ERR_INSUFFICIENT_POWER = 8
ERR_DRIVER_NOT_LOADED = 9
ERR_TIMEOUT = 10
ERR_IRQ_ISSUE = 11
ERR_LIBRARY_NOT_FOUND = 12
ERR_FUNCTION_NOT_FOUND = 13
ERR_GPU_IS_LOST = 15
ERR_UNKNOWN = 999
DISABLING = {ERR_NOT_SUPPORTED: "not_supported", ERR_FUNCTION_NOT_FOUND: "function_not_found",
              ERR_NO_PERMISSION: "no_permission"}
# Names of return codes for labels and logs (nvml.h nvmlReturn_t, NVML_ERROR_ without the prefix, lower case).
ERROR_NAMES = {ERR_INVALID_ARGUMENT: "invalid_argument", ERR_NOT_SUPPORTED: "not_supported",
               ERR_NO_PERMISSION: "no_permission", ERR_NOT_FOUND: "not_found",
               ERR_INSUFFICIENT_POWER: "insufficient_power", ERR_DRIVER_NOT_LOADED: "driver_not_loaded",
               ERR_TIMEOUT: "timeout", ERR_IRQ_ISSUE: "irq_issue", ERR_LIBRARY_NOT_FOUND: "library_not_found",
               ERR_FUNCTION_NOT_FOUND: "function_not_found", ERR_GPU_IS_LOST: "gpu_is_lost", ERR_UNKNOWN: "unknown"}
UNAVAILABLE = {ERR_LIBRARY_NOT_FOUND: "NVML library not found (no NVIDIA driver installed)"}
# NVML value types of nvmlFieldValue_t (pynvml NVML_VALUE_TYPE_*).
VT_DOUBLE, VT_UINT, VT_ULONG, VT_ULL, VT_SLL, VT_SINT, VT_USHORT = range(7)
M64 = 1 << 64
MODULUS = {VT_UINT: 1 << 32, VT_ULONG: M64, VT_ULL: M64, VT_USHORT: 1 << 16}



class ArrayTypes:
    """Keeps alive the ctypes array types that the binding's calls size per call.

    pynvml builds each result buffer's type when it is called (``c_nvmlFieldValue_t * len(fieldIds)``,
    ``count * c_nvmlSample_t``), and ctypes keeps an array type in its cache only while something else references
    it. A type references itself (its MRO), so once the call's result is dropped the type is cyclic garbage: the
    next collection finds ~6 objects to free per type, and the next call with that length builds the class again
    (issue 14: 35 array types per 30 s in the daemon's young collections). Holding a reference to each array type
    seen makes every later call of that length get the same type from ctypes' cache: nothing to build, nothing to
    collect. At most ``limit`` types are held (a buffer length the driver has not used yet is then built per call
    again, as without this), so a driver that returns ever-new lengths cannot grow it without bound."""

    def __init__(self, limit: int = 256) -> None:
        self.limit = limit
        self._held: set[type] = set()

    def hold(self, value: Any) -> None:
        """Keep the array type behind ``value``: a ctypes array, or a non-empty list of elements sliced out of one
        (nvmlDeviceGetSamples returns ``array[0:count]``; each element's ``_b_base_`` is the array)."""
        if isinstance(value, list):
            if not value:
                return
            value = getattr(value[0], "_b_base_", None)
        if isinstance(value, ctypes.Array):
            t = type(value)
            if t not in self._held and len(self._held) < self.limit:
                self._held.add(t)

    def __len__(self) -> int:
        return len(self._held)


@dataclass
class CallStats:
    """What one NVML function returned and cost (bench/gpu_real.py reads these)."""

    calls: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    total_us: float = 0.0
    max_us: float = 0.0
    last: str = ""


def code(e: BaseException) -> int:
    v = getattr(e, "value", None)
    return int(v) if isinstance(v, int) else -1


def reason(e: BaseException) -> str:
    """The return code of an NVML error as a label value: ``no_permission``, ``irq_issue``, ``error_42``."""
    rc = code(e)
    return ERROR_NAMES.get(rc, f"error_{rc}")


def errname(e: BaseException) -> str:
    return f"{type(e).__name__}({code(e)})" if hasattr(e, "value") else repr(e)


def describe(v: Any, depth: int = 0) -> str:
    """A short readable rendering of what an NVML call returned (ctypes structs, arrays, tuples)."""
    if depth > 2:
        return "..."
    fields = getattr(type(v), "_fields_", None)
    if fields is not None:
        return "{" + ", ".join(f"{f[0]}={describe(getattr(v, f[0]), depth + 1)}" for f in fields[:8]) + "}"
    if isinstance(v, list | tuple) or (hasattr(v, "__len__") and hasattr(v, "_length_")):
        items = list(v)
        body = ", ".join(describe(x, depth + 1) for x in items[:4])
        return f"[{body}{', ...' if len(items) > 4 else ''}] (n={len(items)})"
    return repr(v)[:120]


# c_nvmlFieldValue_t: fieldId u32 @0, scopeId u32 @4, timestamp i64 @8, latencyUsec i64 @16, valueType i32 @24,
# nvmlReturn u32 @28, value (8-byte union) @32 -- 40 bytes (nvml.h). c_nvmlGpmMetric_t: metricId u32 @0,
# nvmlReturn u32 @4, value double @8, metricInfo (3 pointers) @16 -- 40 bytes. Unpacking the raw buffer in one
# C call avoids pynvml's Python-level __getattribute__ on every field, the bulk of the fast path's cost.
FIELD_VALUE = struct.Struct("<IIqqiIQ")
GPM_METRIC = struct.Struct("<IId24x")


def read_field_values(arr: Any) -> list[tuple[int, int, int, int | None, int]]:
    """``(fieldId, nvmlReturn, valueType, integer value, timestamp)`` for each entry of an nvmlFieldValue_t
    array; the timestamp is the driver's, in microseconds (when the value was taken: exporter/gpu/counters.py
    judges a counter's step by it)."""
    try:
        buf = memoryview(arr).cast("B")
    except TypeError:
        buf = None
    if buf is not None and len(buf) == FIELD_VALUE.size * len(arr):
        return [(fid, ret, vt, _field_int(vt, raw), ts)
                for fid, _scope, ts, _lat, vt, ret, raw in FIELD_VALUE.iter_unpack(buf)]
    out: list[tuple[int, int, int, int | None, int]] = []
    for fv in arr:  # not a ctypes array: read the attributes
        vt = int(fv.valueType)
        v = fv.value
        raw = {VT_DOUBLE: None, VT_UINT: v.uiVal, VT_ULONG: v.ullVal, VT_ULL: v.ullVal,
               VT_SLL: v.sllVal, VT_SINT: v.siVal, VT_USHORT: v.usVal}.get(vt)
        if vt == VT_DOUBLE:
            raw = int(v.dVal)
        out.append((int(fv.fieldId), int(fv.nvmlReturn), vt, None if raw is None else int(raw), int(fv.timestamp)))
    return out


def _field_int(vt: int, raw: int) -> int | None:
    """The integer in an nvmlValue_t's 8 bytes (read as little-endian u64) for its value type."""
    if vt == VT_UINT:
        return raw & 0xFFFFFFFF
    if vt in (VT_ULL, VT_ULONG):
        return raw
    if vt == VT_SLL:
        return raw - (1 << 64) if raw >= 1 << 63 else raw
    if vt == VT_SINT:
        low = raw & 0xFFFFFFFF
        return low - (1 << 32) if low >= 1 << 31 else low
    if vt == VT_USHORT:
        return raw & 0xFFFF
    if vt == VT_DOUBLE:
        return int(struct.unpack("<d", raw.to_bytes(8, "little"))[0])
    return None


def read_gpm_metrics(mg: Any, n: int) -> list[tuple[int, int, float]]:
    """``(metricId, nvmlReturn, value)`` of the first ``n`` metrics of a c_nvmlGpmMetricsGet_t."""
    metrics = mg.metrics
    if isinstance(metrics, ctypes.Array) and ctypes.sizeof(metrics._type_) == GPM_METRIC.size:
        raw = ctypes.string_at(ctypes.addressof(metrics), GPM_METRIC.size * n)
        return [(mid, ret, val) for mid, ret, val in GPM_METRIC.iter_unpack(raw)]
    return [(int(m.metricId), int(m.nvmlReturn), float(m.value)) for m in metrics[:n]]


def sample_value(v: Any, vt: int) -> float:
    if vt == VT_DOUBLE:
        return float(v.dVal)
    if vt in (VT_ULL, VT_ULONG):
        return float(v.ullVal)
    return float(v.uiVal)


