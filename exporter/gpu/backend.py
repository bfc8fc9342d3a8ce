"""The NVML backend: the only code in gpufeed that calls NVML, with the modules it is built from.

It receives the NVML module through injection (``pynvml``, imported lazily by the caller, or the fake in
``exporter.sim.fakenvml``) and a clock, and offers three sampling paths, each returning a
:class:`~exporter.samples.gpu.GpuSample`:

- :meth:`NvmlBackend.fast` (default every 100 ms, exporter/gpu/fast.py): GPM sample pairs >= 100 ms apart on
  Hopper and newer; one ``nvmlDeviceGetFieldValues`` call per GPU for the PCIe byte counters (197/198), the
  replay counter (94), instantaneous power (186) and the throttle-time counters; the current SM clock.
- :meth:`NvmlBackend.buffered` (default every 1 s, exporter/gpu/buffered.py): ``nvmlDeviceGetSamples`` for GPU
  and memory utilisation, carrying ``lastSeenTimeStamp`` from the returned samples (driver clock, not ours).
- :meth:`NvmlBackend.slow` (default every 5 s, exporter/gpu/slow.py): PCIe link state, clock-event reasons,
  temperature, memory, power limit, max SM clock, compute processes and their utilisation, the slow fields of
  the table (ECC and row-remapping counters, one batched call), MIG mode, and the Xid counts of the event
  watcher (:mod:`exporter.gpu.events`).

The session they share -- init, shutdown, enumeration, handles, MIG discovery, lost GPUs, errors -- is
:class:`~exporter.gpu.session.NvmlSession` (its docstring says how each NVML error is handled).
``nvmlDeviceGetPcieThroughput`` is never called: it blocks ~20 ms per call.

Every NVML name used in exporter/gpu/ exists in the installed binding with the arity used
(``tests/gpu/test_binding_conformance.py`` reads these modules' calls).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import MappingProxyType

from exporter.gpu.buffered import BufferedPath
from exporter.gpu.fast import FastPath
from exporter.gpu.session import GpuInitError, GpuUnavailableError, NvmlProvider
from exporter.gpu.slow import PROCESS_INTERVAL_S, SlowPath
from exporter.gpu.state import GpuLostError, GpuState
from exporter.samples.gpu import GpuSample

__all__ = ["PID_MAX_LIMIT", "GpuInitError", "GpuUnavailableError", "NvmlBackend", "NvmlProvider"]

# Linux's PID_MAX_LIMIT on 64-bit (include/linux/threads.h): the fallback bound when pid_max is unreadable.
PID_MAX_LIMIT = 1 << 22


class NvmlBackend(FastPath, BufferedPath, SlowPath):
    """One NVML session for every GPU of the host and its three sampling paths; thread-safe (one lock around
    each sampling path)."""

    def __init__(
        self,
        provider: NvmlProvider,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        pid_max: int = PID_MAX_LIMIT,
        numa_of: Callable[[str], int | None] | None = None,
        gpu_hardware: Callable[[], bool | None] | None = None,
        retry_unavailable_s: float = 60.0,
        lost_backoff_s: tuple[float, float] = (5.0, 300.0),
        profile: bool = False,
        event_thread: bool = False,
        process_interval: float = PROCESS_INTERVAL_S,
        fast_interval: float = 0.1,
        steady_interval: float | None = None,
    ) -> None:
        super().__init__(provider, clock=clock, numa_of=numa_of, gpu_hardware=gpu_hardware,
                         retry_unavailable_s=retry_unavailable_s, lost_backoff_s=lost_backoff_s, profile=profile,
                         event_thread=event_thread)
        self._sleep = sleep
        self._pid_max = pid_max
        self._sets: dict[str, frozenset[int]] = {}  # the sets the previous sample held (see _kept)
        self._process_s = process_interval
        # The fast path's two rates: ``fast_interval`` (its sampler's) and, when longer, the steady rate of a GPU
        # whose activity shows no dip (None or not longer: every GPU at the fast rate, every tick).
        self._fast_s = fast_interval
        self._steady_s = steady_interval if steady_interval is not None and steady_interval > fast_interval else None
        self._tick_s = fast_interval  # the fast sampler's interval now (tick_interval)

    # ---- public sampling paths ---------------------------------------------------------------------------

    def fast(self) -> GpuSample:
        """GPM, field values (PCIe bytes, replays, power, throttle time) and SM clock of every GPU due now: all
        of them, except a steady GPU between its steady-rate reads, which appears as its newest read (HeldFast).
        ``steady`` names the GPUs at the steady rate."""
        return self._run(self._fast_tick)

    def buffered(self) -> GpuSample:
        """The driver's buffered utilisation samples since the previous call, integrated."""
        return self._run(self._buffered_one)

    def slow(self) -> GpuSample:
        """Link state, clock-event reasons, temperature, memory, limits, processes, ECC, MIG, Xid counts."""
        return self._run(self._slow_one, before=self.events.poll)

    def tick_interval(self) -> float:
        """The fast sampler's interval wanted now: the steady interval while every GPU is read at the steady
        rate (a tick in between would read none of them), else the fast one; the steady one with no GPU to
        read. Called by the engine after each run of the collector's samplers (a dip the buffered path saw
        makes the next fast tick come at the fast rate again); lock-free, so a sampler wedged in the driver
        with the session lock held cannot stall the caller."""
        if self._steady_s is None:
            return self._fast_s
        self._tick_s = self._steady_s if self.all_steady() else self._fast_s
        return self._tick_s

    def all_steady(self) -> bool:
        """Whether every GPU is read at the steady rate now (True with no GPU to read; False without a steady
        rate). Lock-free, as :meth:`tick_interval`."""
        if self._steady_s is None:
            return False
        now = self._clock()
        return all(g.pace.steady_now and g.pace.steady(now) for g in list(self._gpus.values())
                   if not g.lost and g.unavailable is None)

    def _run(self, one: Callable[[GpuState, float], object], before: Callable[[], None] | None = None) -> GpuSample:
        with self._lock:
            now = self._clock()
            if self._next_reinit is None:
                self._ensure_init()
            elif now >= self._next_reinit:
                self._reinit(now)
            if before is not None:
                before()
            out: dict[int, object] = {}
            for idx, g in sorted(self._gpus.items()):
                if g.lost or g.unavailable is not None:
                    continue
                try:
                    out[idx] = one(g, self._clock())
                except GpuLostError:
                    self._mark_lost(g, self._clock())
            return GpuSample(
                identities=self._identities(),
                gpus=MappingProxyType(out),
                lost=self._kept("lost", frozenset(i for i, g in self._gpus.items() if g.lost)),
                calls=self.calls.snapshot(),
                steady=self._kept("steady", frozenset(
                    i for i, g in self._gpus.items() if not g.lost and g.pace.steady_now)),
                unavailable=self._unavailable_now(),
                dropped=self._dropped_now(),
            )

    def _kept(self, name: str, value: frozenset[int]) -> frozenset[int]:  # under self._lock
        """``value``, or the equal set a previous sample holds: the cycle collector tracks every set, so a new one
        per sample would be one more object per sample in the ring buffers."""
        old = self._sets.get(name)
        if old == value:
            return old
        self._sets[name] = value
        return value
