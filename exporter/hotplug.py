"""Hotplug: udev ``pci`` and ``block`` events re-enumerate PCI devices without a restart.

The pyudev netlink monitor's socket is watched by the asyncio loop (``loop.add_reader``); every event is
drained without blocking and turned into a rescan request for the collectors that enumerate devices (the
pcie collector), which then re-enumerate on their next cycle: a removed GPU's series disappear, a new one
appears. Without udev -- containers, minimal hosts, no ``/run/udev/control`` -- events never arrive, so the
collectors fall back to periodic re-enumeration (``--collector.pcie.rescan-interval``, 60 s) and this is
logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from exporter import log

_log = log.get_logger(component="hotplug")

SUBSYSTEMS = ("pci", "block")
ACTIONS = frozenset({"add", "remove", "change", "move", "bind", "unbind", "online", "offline"})
UDEV_DIR = Path("/run/udev")
MAX_EVENTS_PER_WAKEUP = 1024  # a storm of events is drained in slices so the loop stays responsive


@runtime_checkable
class Rescannable(Protocol):
    """A collector that enumerates devices and can be told to do it again."""

    def request_rescan(self, reason: str = "") -> None: ...

    def set_hotplug(self, active: bool) -> None: ...


class Monitor(Protocol):
    """What the watcher needs of a udev monitor (``pyudev.Monitor`` or a test double)."""

    def fileno(self) -> int: ...

    def poll(self, timeout: float | None = None) -> Any: ...


def pyudev_monitor(subsystems: Sequence[str]) -> Monitor:
    """A started pyudev netlink monitor filtered to ``subsystems`` (raises if libudev or netlink is missing)."""
    import pyudev

    context = pyudev.Context()
    monitor = pyudev.Monitor.from_netlink(context, source="udev")
    for s in subsystems:
        monitor.filter_by(s)
    monitor.start()
    return monitor  # type: ignore[no-any-return]


class HotplugWatcher:
    """Forwards udev device events to :class:`Rescannable` targets through the running event loop."""

    def __init__(
        self,
        targets: Sequence[Rescannable],
        *,
        subsystems: Sequence[str] = SUBSYSTEMS,
        udev_dir: Path = UDEV_DIR,
        monitor_factory: Callable[[Sequence[str]], Monitor] = pyudev_monitor,
    ) -> None:
        self.targets = list(targets)
        self.subsystems = tuple(subsystems)
        self.udev_dir = udev_dir
        self._factory = monitor_factory
        self._monitor: Monitor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd: int | None = None
        self.events = 0

    @property
    def active(self) -> bool:
        """True while udev events are being watched."""
        return self._fd is not None

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> bool:
        """Watch udev on ``loop`` (default: the running one); False (and periodic fallback) without udev."""
        loop = loop or asyncio.get_running_loop()
        if not (self.udev_dir / "control").exists():
            self._fallback(f"{self.udev_dir / 'control'} not present (no udev daemon, e.g. a container)")
            return False
        try:
            monitor = self._factory(self.subsystems)
            fd = monitor.fileno()
            loop.add_reader(fd, self._on_readable)
        except Exception as e:  # ImportError (no pyudev/libudev), OSError (netlink denied), pyudev errors
            self._fallback(f"cannot open a udev monitor: {type(e).__name__}: {e}")
            return False
        self._monitor, self._loop, self._fd = monitor, loop, fd
        for t in self.targets:
            t.set_hotplug(True)
        log.forget(("hotplug_unavailable",))
        _log.info("hotplug_watching", subsystems=",".join(self.subsystems))
        return True

    def _fallback(self, reason: str) -> None:
        for t in self.targets:
            t.set_hotplug(False)
        if log.once(("hotplug_unavailable",)):
            every = sorted({float(getattr(t, "rescan_interval", 60.0)) for t in self.targets})
            _log.info("hotplug_unavailable", reason=reason, fallback="periodic re-enumeration",
                      every_seconds=",".join(f"{s:g}" for s in every))

    def _on_readable(self) -> None:
        """Drain the monitor without blocking; one rescan request per relevant event."""
        monitor = self._monitor
        if monitor is None:
            return
        for _ in range(MAX_EVENTS_PER_WAKEUP):
            try:
                device = monitor.poll(timeout=0)
            except Exception as e:
                _log.error("hotplug_failed", error=f"{type(e).__name__}: {e}")
                self.stop()
                self._fallback("udev monitor failed")
                return
            if device is None:
                return
            self.handle(device)

    def handle(self, device: Any) -> None:
        """React to one udev event (a ``pyudev.Device`` with ``action``, ``subsystem``, ``sys_name``)."""
        action = str(getattr(device, "action", "") or "")
        subsystem = str(getattr(device, "subsystem", "") or "")
        if action not in ACTIONS or (self.subsystems and subsystem not in self.subsystems):
            return
        self.events += 1
        name = str(getattr(device, "sys_name", "") or "")
        _log.debug("hotplug_event", action=action, subsystem=subsystem, device=name)
        for t in self.targets:
            t.request_rescan(f"{action} {subsystem} {name}")

    def stop(self) -> None:
        """Stop watching and release the monitor."""
        if self._loop is not None and self._fd is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._fd)
        monitor, self._monitor, self._fd = self._monitor, None, None
        close = getattr(monitor, "stop", None) or getattr(monitor, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                close()


def attach(collectors: Iterable[object], loop: asyncio.AbstractEventLoop | None = None) -> HotplugWatcher | None:
    """Start a watcher for the collectors that enumerate devices; None when there are none."""
    targets = [c for c in collectors if isinstance(c, Rescannable)]
    if not targets:
        return None
    watcher = HotplugWatcher(targets)
    watcher.start(loop)
    return watcher
