"""Xid errors from NVML events: one event set, one waiter, counts per GPU and Xid code.

NVML reports Xid errors (the driver's GPU error codes, also printed to the kernel log as ``NVRM: Xid``) as
events of type ``nvmlEventTypeXidCriticalError`` on an event set the GPUs are registered with
(``nvmlEventSetCreate``, ``nvmlDeviceRegisterEvents``); ``nvmlEventSetWait_v2(set, timeout_ms)`` returns the
next one (``eventData`` is the Xid) or raises ``NVML_ERROR_TIMEOUT``.

:class:`XidWatcher` owns that set. In the daemon it runs ONE thread of its own that waits with a timeout
(``wait_ms``), so it never blocks a sampler and stops within ``wait_ms`` at shutdown. Under an inline,
virtual-time engine (``diagnose --scenario``, tests) it starts no thread: the slow sampler drains the set
with :meth:`poll` (a zero timeout), so a scenario plays the same way every time.

The backend re-arms the watcher (:meth:`arm`) with the current handles whenever the GPUs it can reach change:
after start, after a lost GPU comes back, after NVML was initialised again. A wait that fails (a registered
GPU fell off the bus: ``GPU_IS_LOST``) drops the set; it is rebuilt from the handles of the last ``arm``, each
GPU registered on its own so a lost one does not keep the others from reporting, at most once per
``wait_ms``. Before NVML is shut down the backend calls :meth:`disarm`, which frees the set.

Memory is bounded: per GPU at most :data:`MAX_CODES` distinct Xid codes are counted on their own; later new
codes count under code -1 (exported as ``xid="other"``).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from exporter import log
from exporter.gpu.binding import ERR_NOT_SUPPORTED, ERR_TIMEOUT, code, errname

MAX_CODES = 32  # distinct Xid codes counted per GPU; the driver documents about 150
OTHER = -1
MAX_EVENTS_PER_POLL = 1024  # a storm is drained in slices: the slow sampler's run stays bounded
WAIT_MS = 500


@dataclass
class _Counts:
    """One GPU's Xid counts and when each code was seen last (the backend's clock)."""

    n: dict[int, int] = field(default_factory=dict)
    last: dict[int, float] = field(default_factory=dict)


def _untimed(_name: str, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def _address(handle: object) -> int | None:
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value  # type: ignore[arg-type]
    except (TypeError, ctypes.ArgumentError):
        return None


class XidWatcher:
    """Counts the Xid events of the GPUs it is armed with; see the module docstring."""

    def __init__(self, clock: Callable[[], float], *, threaded: bool, wait_ms: int = WAIT_MS,
                 tag: str = "", timed: Callable[..., Any] | None = None) -> None:
        self._clock = clock
        # ``timed(name, fn, *args)`` calls NVML and times it (exporter/gpu/calls.py); the waits are not timed:
        # they block by design until an event or the timeout.
        self._timed: Callable[..., Any] = timed if timed is not None else _untimed
        self._threaded = threaded
        self._wait_ms = wait_ms
        self._tag = tag
        self._log = log.get_logger(component="gpu_events")
        self._lock = threading.Lock()  # counts and the arm request; never held across an NVML call
        self._counts: dict[int, _Counts] = {}
        self._nvml: Any = None
        self._handles: dict[int, Any] = {}
        self._generation = 0  # bumped by arm(); the set is rebuilt when it differs from the built one
        self._built = -1
        self._set: Any = None
        self._by_address: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.events = 0
        self.rebuilds = 0

    # ---- the backend's side -----------------------------------------------------------------------------

    def arm(self, nvml: Any, handles: Mapping[int, Any]) -> None:
        """Watch exactly these GPUs (index -> handle) from now on."""
        with self._lock:
            self._nvml, self._handles = nvml, dict(handles)
            self._generation += 1
        if not self._threaded:
            self._rebuild_if_needed()
            return
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="gpufeed-xid-events", daemon=True)
            self._thread.start()

    def disarm(self) -> None:
        """Stop watching and free the event set (before nvmlShutdown); returns once the waiter has stopped."""
        thread = self._thread
        if thread is not None:
            self._stop.set()
            thread.join(timeout=4 * self._wait_ms / 1000.0 + 1.0)
            if thread.is_alive():
                self._log.warning("gpu_event_thread_stuck", wait_ms=self._wait_ms)
            self._thread = None
        else:
            self._free()
        with self._lock:
            self._handles = {}
            self._generation += 1

    def poll(self) -> None:
        """Without a thread: take every event already pending, without waiting."""
        if self._threaded:
            return
        self._rebuild_if_needed()
        for _ in range(MAX_EVENTS_PER_POLL):
            if not self._wait_once(0):
                return

    def counts(self, index: int) -> tuple[Mapping[int, int], Mapping[int, float]]:
        """(count per Xid code, newest time per code) of GPU ``index`` since the watcher started."""
        with self._lock:
            c = self._counts.get(index)
            if c is None:
                return MappingProxyType({}), MappingProxyType({})
            return MappingProxyType(dict(c.n)), MappingProxyType(dict(c.last))

    # ---- the waiter -------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._rebuild_if_needed()
                if self._set is None:
                    self._stop.wait(self._wait_ms / 1000.0)
                    continue
                self._wait_once(self._wait_ms)
        finally:
            self._free()

    def _wait_once(self, timeout_ms: int) -> bool:
        """One wait on the set; True when it returned an event."""
        nvml, es = self._nvml, self._set
        if es is None:
            return False
        try:
            data = nvml.nvmlEventSetWait_v2(es, timeout_ms)
        except nvml.NVMLError as e:
            if code(e) == ERR_TIMEOUT:
                return False
            # A registered GPU fell off the bus (or NVML went away): drop the set; it is rebuilt from the
            # GPUs that still register, after a pause so a failing driver is not hammered.
            if log.once(("gpu_event_wait_failed", self._tag, str(code(e)))):
                self._log.warning("gpu_event_wait_failed", error=errname(e))
            self._free()
            with self._lock:
                self._generation += 1
            if self._threaded:
                self._stop.wait(self._wait_ms / 1000.0)
            return False
        self._record(data)
        return True

    def _record(self, data: Any) -> None:
        nvml = self._nvml
        if not int(data.eventType) & int(nvml.nvmlEventTypeXidCriticalError):
            return
        index = self._by_address.get(_address(data.device) or -1)
        if index is None:
            self._log.debug("gpu_event_unknown_device", xid=int(data.eventData))
            return
        xid = int(data.eventData)
        now = self._clock()
        with self._lock:
            c = self._counts.setdefault(index, _Counts())
            key = xid if xid in c.n or len(c.n) < MAX_CODES else OTHER
            c.n[key] = c.n.get(key, 0) + 1
            c.last[key] = now
            self.events += 1
        gi = int(data.gpuInstanceId)
        self._log.warning("gpu_xid_error", gpu=index, xid=xid, **({} if gi == 0xFFFFFFFF else {"mig": gi}))

    # ---- the set --------------------------------------------------------------------------------------------

    def _rebuild_if_needed(self) -> None:
        with self._lock:
            if self._generation == self._built:
                return
            generation, nvml, handles = self._generation, self._nvml, dict(self._handles)
        self._free()
        self._built = generation
        if nvml is None or not handles:
            return
        try:
            es = self._timed("nvmlEventSetCreate", nvml.nvmlEventSetCreate)
        except nvml.NVMLError as e:
            if log.once(("gpu_event_set_failed", self._tag, str(code(e)))):
                self._log.warning("gpu_event_set_failed", error=errname(e))
            return
        by_address: dict[int, int] = {}
        for index, handle in sorted(handles.items()):
            try:
                supported = int(self._timed("nvmlDeviceGetSupportedEventTypes", nvml.nvmlDeviceGetSupportedEventTypes,
                                            handle))
                want = supported & int(nvml.nvmlEventTypeXidCriticalError)
                if not want:
                    raise nvml.NVMLError(ERR_NOT_SUPPORTED)
                self._timed("nvmlDeviceRegisterEvents", nvml.nvmlDeviceRegisterEvents, handle, want, es)
            except nvml.NVMLError as e:
                if log.once(("gpu_events_unavailable", self._tag, str(index), str(code(e)))):
                    self._log.info("gpu_events_unavailable", gpu=index, error=errname(e),
                                   hint="Xid errors of this GPU are not counted")
                continue
            addr = _address(handle)
            if addr is not None:
                by_address[addr] = index
        self._set, self._by_address = es, by_address
        self.rebuilds += 1

    def _free(self) -> None:
        es, self._set = self._set, None
        self._by_address = {}
        if es is None:
            return
        try:
            self._timed("nvmlEventSetFree", self._nvml.nvmlEventSetFree, es)
        except self._nvml.NVMLError as e:
            self._log.debug("gpu_event_set_free_failed", error=errname(e))
