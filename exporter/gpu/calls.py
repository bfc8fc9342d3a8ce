"""What NVML costs: the duration of every NVML call the backend makes, as one histogram per kind of call.

Exported as ``gpufeed_nvml_call_duration_seconds{call}`` (DESIGN.md "Sampling that pays only for what it
learns"): NVML calls serialise on the driver's global lock, so a slow call here is time the workload's own
threads may have waited for the driver too (MangoHud #2104: a monitoring loop holding the lock ~10 s of every
15 s). The set of kinds is fixed and small (the series budget counts them: 3 kinds x (2 buckets + +Inf + sum +
count) = 15 host-level series):

- ``reads``: what the fast and buffered paths read at every tick -- ``nvmlDeviceGetFieldValues`` (batched
  counters), GPM samples and metrics (``nvmlGpmSampleGet``, ``nvmlGpmMigSampleGet``, ``nvmlGpmMetricsGet``),
  the driver's buffered utilisation samples (``nvmlDeviceGetSamples``, or ``nvmlDeviceGetUtilizationRates``
  where there are none); tens of microseconds each, one kind so that the budget pays for the calls that differ;
- ``processes``: process enumeration (``nvmlDeviceGetComputeRunningProcesses_v3``/``_v2``,
  ``nvmlDeviceGetProcessUtilization``, ``nvmlDeviceGetProcessesUtilizationInfo``), the calls that take the
  driver's lock longest (~4.5 ms measured);
- ``device``: everything else -- the slow path's getters, the SM clock, MIG and identity queries, handles,
  ``nvmlInit``/``nvmlShutdown``, GPM sample allocation, event-set set-up.

The buckets are the two bounds that change what a call means for the workload: under 1 ms a cached getter or
a batched field read (tens of microseconds), under 10 ms a process enumeration (~4.5 ms), above it a call that
holds the driver's lock long enough to delay the workload's own submissions (``nvmlInit`` without persistence
mode, a wedged driver). Finer buckets cost 10 host-level series a bucket; the mean per kind is ``_sum /
_count``. ``nvmlEventSetWait_v2``
is not timed: it blocks until an event comes or its timeout passes by design, which says nothing of the
driver's cost. Durations are wall-clock time (``time.perf_counter``) whatever clock the engine runs on.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from exporter.samples.gpu import CallHistogram
from exporter.samples.rows import RowMap

BUCKETS = (1e-3, 1e-2)
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
        self._counts: dict[str, list[int]] = {}
        self._sums: dict[str, float] = {}
        self._version = 0
        self._snap: tuple[int, Mapping[str, CallHistogram]] = (0, RowMap(CallHistogram))

    def observe(self, name: str, seconds: float) -> None:
        """Count one call of NVML function ``name`` that took ``seconds``."""
        kind = kind_of(name)
        i = bisect.bisect_left(BUCKETS, seconds)
        with self._lock:
            counts = self._counts.get(kind)
            if counts is None:
                counts = self._counts[kind] = [0] * (len(BUCKETS) + 1)
                self._sums[kind] = 0.0
            counts[i] += 1
            self._sums[kind] += seconds
            self._version += 1

    def call(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, timed as a call of ``name`` (also when it raises)."""
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.observe(name, time.perf_counter() - t0)

    def snapshot(self) -> Mapping[str, CallHistogram]:
        """Every kind seen so far: cumulative bucket counts (+Inf last) and the sum; immutable.

        Every GpuSample holds one (a call comes between any two samples), so it is a RowMap: one object the
        cycle collector tracks per sample, not a mapping and a histogram per kind (exporter/samples/rows.py).
        """
        with self._lock:
            if self._snap[0] == self._version:
                return self._snap[1]
            out: dict[str, tuple[tuple[int, ...], float]] = {}
            for kind in KINDS:
                counts = self._counts.get(kind)
                if counts is None:
                    continue
                cum, total = [], 0
                for n in counts:
                    total += n
                    cum.append(total)
                out[kind] = (tuple(cum), self._sums[kind])
            snap = RowMap(CallHistogram, out)
            self._snap = (self._version, snap)
            return snap
