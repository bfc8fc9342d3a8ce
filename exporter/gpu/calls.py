"""What NVML costs: the duration of every NVML call the backend makes, counted and summed per kind of call.

Exported as the summary ``gpufeed_nvml_call_duration_seconds{call}`` -- ``_count`` and ``_sum``, the mean per
call their ratio (DESIGN.md "Sampling that pays only for what it learns"): NVML calls serialise on the driver's
global lock, so a slow call here is time the workload's own threads may have waited for the driver too (MangoHud
#2104: a monitoring loop holding the lock ~10 s of every 15 s). The set of kinds is fixed and small (the series
budget counts them: 3 kinds x (sum + count) = 6 host-level series):

- ``reads``: what the fast and buffered paths read at every tick -- ``nvmlDeviceGetFieldValues`` (batched
  counters), GPM samples and metrics (``nvmlGpmSampleGet``, ``nvmlGpmMigSampleGet``, ``nvmlGpmMetricsGet``),
  the driver's buffered utilisation samples (``nvmlDeviceGetSamples``, or ``nvmlDeviceGetUtilizationRates``
  where there are none); tens of microseconds each, one kind so that the budget pays for the calls that differ;
- ``processes``: process enumeration (``nvmlDeviceGetComputeRunningProcesses_v3``/``_v2``,
  ``nvmlDeviceGetProcessUtilization``, ``nvmlDeviceGetProcessesUtilizationInfo``), the calls that take the
  driver's lock longest (~4.5 ms measured);
- ``device``: everything else -- the slow path's getters, the SM clock, MIG and identity queries, handles,
  ``nvmlInit``/``nvmlShutdown``, GPM sample allocation, event-set set-up.

It was a histogram with buckets at 1 ms and 10 ms until the 8-GPU host with its network adapters needed those 9
series for DESIGN.md's 200 host-level ones: no rule or board read them, and a driver that holds its lock for long
shows in the mean of its kind (a batched read takes tens of microseconds, a process enumeration ~4.5 ms) and, past
a sampler's deadline, in gpufeed_collector_success and the collector_failed log line. ``nvmlEventSetWait_v2``
is not timed: it blocks until an event comes or its timeout passes by design, which says nothing of the
driver's cost. Durations are wall-clock time (``time.perf_counter``) whatever clock the engine runs on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from exporter.samples.gpu import CallTotals
from exporter.samples.rows import RowMap

READS, PROCESSES, DEVICE = "reads", "processes", "device"
KINDS = (READS, PROCESSES, DEVICE)
_KIND_OF: Mapping[str, str] = MappingProxyType({
    "nvmlDeviceGetFieldValues": READS,
    "nvmlGpmSampleGet": READS,
    "nvmlGpmMigSampleGet": READS,
    "nvmlGpmMetricsGet": READS,
    "nvmlDeviceGetSamples": READS,
    "nvmlDeviceGetUtilizationRates": READS,
    "nvmlDeviceGetComputeRunningProcesses_v3": PROCESSES,
    "nvmlDeviceGetComputeRunningProcesses_v2": PROCESSES,
    "nvmlDeviceGetProcessUtilization": PROCESSES,
    "nvmlDeviceGetProcessesUtilizationInfo": PROCESSES,
})


def kind_of(name: str) -> str:
    """The kind of the NVML function ``name`` (the ``call`` label); a ``name:detail`` key counts as ``name``."""
    return _KIND_OF.get(name.partition(":")[0], DEVICE)


class CallTimes:
    """Thread-safe accumulator of NVML call durations per kind (the backend's sampler threads and the Xid
    event thread both call NVML)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._sums: dict[str, float] = {}
        self._version = 0
        self._snap: tuple[int, Mapping[str, CallTotals]] = (0, RowMap(CallTotals))

    def observe(self, name: str, seconds: float) -> None:
        """Count one call of NVML function ``name`` that took ``seconds``."""
        kind = kind_of(name)
        with self._lock:
            self._counts[kind] = self._counts.get(kind, 0) + 1
            self._sums[kind] = self._sums.get(kind, 0.0) + seconds
            self._version += 1

    def call(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, timed as a call of ``name`` (also when it raises)."""
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.observe(name, time.perf_counter() - t0)

    def snapshot(self) -> Mapping[str, CallTotals]:
        """Every kind seen so far: its count and summed duration; immutable.

        Every GpuSample holds one (a call comes between any two samples), so it is a RowMap: one object the
        cycle collector tracks per sample, not a mapping and a row per kind (exporter/samples/rows.py).
        """
        with self._lock:
            if self._snap[0] == self._version:
                return self._snap[1]
            snap = RowMap(CallTotals, {kind: (self._counts[kind], self._sums[kind])
                                       for kind in KINDS if kind in self._counts})
            self._snap = (self._version, snap)
            return snap
