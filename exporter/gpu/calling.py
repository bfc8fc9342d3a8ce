"""The conventions every NVML call of the backend goes through: timing (:meth:`NvmlCalls._timed`), a call that
may be unsupported for one GPU (``_opt``), what each error means for the GPU (``_failed``), and the values NVML
returned that cannot be true (``_drop``). :class:`~exporter.gpu.session.NvmlSession` builds on it."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from exporter import log
from exporter.gpu.binding import (
    DISABLING,
    ERR_GPU_IS_LOST,
    ERR_INVALID_ARGUMENT,
    ERR_NOT_FOUND,
    ERR_UNKNOWN,
    CallStats,
    code,
    describe,
    errname,
)
from exporter.gpu.calls import CallTimes
from exporter.gpu.state import GpuLostError, GpuState

UNKNOWN_STREAK_LOST = 3


class NvmlCalls:
    """Calling NVML for one GPU: timed, disabled where unsupported, errors turned into GPU state."""

    _nvml: Any
    _profile: bool
    _tag: str
    _log: Any
    calls: CallTimes
    stats: dict[str, CallStats]

    def __init__(self) -> None:
        self._dropped: dict[str, int] = {}
        self._dropped_map: Mapping[str, int] = MappingProxyType({})

    def _drop(self, g: GpuState, why: str, n: int = 1, **detail: object) -> None:
        """Count ``n`` values NVML returned for GPU ``g`` that cannot be true (``why``); log the first per GPU."""
        self._count_dropped(why, n)
        if log.once(("nvml_value_dropped", self._tag, str(g.index), why)):
            self._log.warning("nvml_value_dropped", gpu=g.index, reason=why, **detail)

    def _count_dropped(self, why: str, n: int = 1) -> None:
        self._dropped[why] = self._dropped.get(why, 0) + n

    def _dropped_now(self) -> Mapping[str, int]:  # under self._lock
        """The dropped values so far by reason (the previous mapping while no count changed)."""
        if dict(self._dropped_map) != self._dropped:
            self._dropped_map = MappingProxyType(dict(self._dropped))
        return self._dropped_map

    def _timed(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call NVML, timing the call for gpufeed_nvml_call_duration_seconds (and, profiling, CallStats)."""
        t0 = time.perf_counter()
        if not self._profile:
            try:
                return fn(*args)
            finally:
                self.calls.observe(name, time.perf_counter() - t0)
        st = self.stats.setdefault(name, CallStats())
        try:
            out = fn(*args)
        except Exception as e:
            st.errors[errname(e)] = st.errors.get(errname(e), 0) + 1
            raise
        finally:
            took = time.perf_counter() - t0
            self.calls.observe(name, took)
            st.calls += 1
            st.total_us += took * 1e6
            st.max_us = max(st.max_us, took * 1e6)
        st.last = describe(out)
        return out

    def _opt(self, g: GpuState, name: str, fn: Callable[..., Any], *args: Any, raising: bool = False) -> Any:
        """Call an NVML function for GPU ``g``: None when unsupported (disabled from now on) or failing.

        ``raising`` (MIG instance calls): NOT_FOUND and INVALID_ARGUMENT -- the instance is gone -- are raised
        to the caller instead, which re-enumerates the GPU's instances.
        """
        if name in g.disabled:
            return None
        try:
            out = self._timed(name, fn, *args)
        except self._nvml.NVMLError as e:
            if raising and code(e) in (ERR_NOT_FOUND, ERR_INVALID_ARGUMENT):
                raise
            return self._failed(g, name, e)
        g.unknown_streak = 0
        return out

    def _failed(self, g: GpuState, name: str, e: BaseException) -> None:
        rc = code(e)
        if rc == ERR_GPU_IS_LOST:
            raise GpuLostError() from e
        if rc == ERR_UNKNOWN:
            g.unknown_streak += 1
            if g.unknown_streak >= UNKNOWN_STREAK_LOST:
                raise GpuLostError() from e
        if rc in DISABLING:
            g.disabled.add(name)
            if log.once(("gpu_call_disabled", self._tag, str(g.index), name)):
                self._log.info("gpu_call_disabled", gpu=g.index, call=name, reason=DISABLING[rc])
            return None
        if rc != ERR_NOT_FOUND and log.once(("gpu_call_failed", self._tag, str(g.index), name, str(rc))):
            self._log.warning("gpu_call_failed", gpu=g.index, call=name, error=errname(e))
        return None
