"""Hotplug: synthetic udev events through the asyncio loop re-enumerate devices without a restart;
without udev the collector falls back to periodic re-enumeration and says so once."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from structlog.testing import capture_logs

from exporter import hotplug, log
from exporter.collectors.pcie import PcieCollector
from tests.support.hosts import box, context, snapshot_of
from tests.support.hosts import family_series as series

GPU = "0000:19:00.0"
GPU_PATH = "devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:19:00.0"


class FakeMonitor:
    """A udev monitor double: a real pipe fd for loop.add_reader, events queued by the test."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)
        self.queue: deque[Any] = deque()
        self.closed = False

    def fileno(self) -> int:
        return self.r

    def emit(self, action: str, subsystem: str = "pci", sys_name: str = GPU) -> None:
        self.queue.append(SimpleNamespace(action=action, subsystem=subsystem, sys_name=sys_name))
        os.write(self.w, b"x")

    def poll(self, timeout: float | None = None) -> Any:
        if not self.queue:
            return None
        os.read(self.r, 1)
        return self.queue.popleft()

    def stop(self) -> None:
        self.closed = True
        os.close(self.r)
        os.close(self.w)


def udev_dir(tmp_path: Path) -> Path:
    d = tmp_path / "run-udev"
    d.mkdir()
    (d / "control").touch()
    return d


def gpus(c: PcieCollector) -> set[str]:
    return {b for b, d in c.update().devices.items() if d.role == "gpu"}


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0.01)


def remove_gpu(root: Path) -> None:
    """What the kernel does on removal: the device directory and its bus link go away."""
    (root / "sys/bus/pci/devices" / GPU).unlink()
    shutil.rmtree(root / "sys" / GPU_PATH)


def add_gpu(root: Path) -> None:
    shutil.copytree(box("dgx") / "sys" / GPU_PATH, root / "sys" / GPU_PATH, symlinks=True)
    os.symlink("../../../" + GPU_PATH, root / "sys/bus/pci/devices" / GPU)


async def test_udev_remove_event_drops_the_gpu_its_bridge_and_its_series(copy_box: Any, tmp_path: Path) -> None:
    root = copy_box("dgx")
    c = PcieCollector(context(root))
    mon = FakeMonitor()
    w = hotplug.HotplugWatcher([c], udev_dir=udev_dir(tmp_path), monitor_factory=lambda _s: mon)
    assert w.start() and w.active
    assert len(gpus(c)) == 8
    remove_gpu(root)
    mon.emit("remove")
    await settle()
    assert w.events == 1
    s = c.update()
    assert GPU not in s.devices and GPU not in s.chains
    assert "0000:17:01.0" not in s.devices  # its switch port no longer leads to a GPU
    fams = list(c.metrics(snapshot_of("pcie", s)))
    assert not [k for k in series(fams, "gpufeed_pcie_device_info") if ("bdf", GPU) in k]
    assert c.scans == 2
    w.stop()
    assert mon.closed and not w.active


async def test_udev_add_event_makes_a_new_gpu_appear_without_restart(copy_box: Any, tmp_path: Path) -> None:
    root = copy_box("dgx")
    remove_gpu(root)
    c = PcieCollector(context(root))
    mon = FakeMonitor()
    w = hotplug.HotplugWatcher([c], udev_dir=udev_dir(tmp_path), monitor_factory=lambda _s: mon)
    w.start()
    assert GPU not in gpus(c)
    add_gpu(root)
    assert GPU not in gpus(c)  # no event yet: enumeration is not repeated every cycle
    mon.emit("add")
    await settle()
    s = c.update()
    assert GPU in s.devices and s.chains[GPU][-2] == "0000:17:01.0"
    assert s.devices[GPU].link_changes == 0
    w.stop()


async def test_block_events_and_event_storms_are_drained(tmp_path: Path) -> None:
    c = PcieCollector(context("dgx"))
    c.update()
    mon = FakeMonitor()
    w = hotplug.HotplugWatcher([c], udev_dir=udev_dir(tmp_path), monitor_factory=lambda _s: mon)
    w.start()
    for i in range(hotplug.MAX_EVENTS_PER_WAKEUP * 2 + 10):
        mon.emit("change", "block", f"nvme{i}n1")
    mon.emit("add", "net", "eth9")  # not a watched subsystem
    mon.emit("frobnicate", "pci")  # not a device event
    await settle()
    assert w.events == hotplug.MAX_EVENTS_PER_WAKEUP * 2 + 10
    assert not mon.queue
    before = c.scans
    c.update()
    assert c.scans == before + 1
    w.stop()


async def test_without_udev_the_collector_rescans_every_60s_and_it_is_logged_once(
    copy_box: Any, tmp_path: Path,
) -> None:
    root = copy_box("dgx")
    remove_gpu(root)
    c = PcieCollector(context(root, options={"interval": 5.0, "rescan-interval": 60.0}))
    log.forget(("hotplug_unavailable",))
    with capture_logs() as logs:
        w = hotplug.HotplugWatcher([c], udev_dir=tmp_path / "nowhere")
        assert not w.start()
        assert not hotplug.HotplugWatcher([c], udev_dir=tmp_path / "nowhere").start()
    unavailable = [e for e in logs if e["event"] == "hotplug_unavailable"]
    assert len(unavailable) == 1 and unavailable[0]["every_seconds"] == "60"
    assert GPU not in gpus(c)  # cycle 1: first enumeration
    add_gpu(root)
    seen_at = next(n for n in range(2, 30) if GPU in gpus(c))
    assert seen_at == 13  # 12 cycles x 5 s = 60 s after the first enumeration


async def test_monitor_that_cannot_open_falls_back_to_periodic(tmp_path: Path) -> None:
    c = PcieCollector(context("dgx"))

    def broken(_s: Sequence[str]) -> hotplug.Monitor:
        raise PermissionError(1, "Operation not permitted")

    log.forget(("hotplug_unavailable",))
    with capture_logs() as logs:
        assert not hotplug.HotplugWatcher([c], udev_dir=udev_dir(tmp_path), monitor_factory=broken).start()
    assert "Operation not permitted" in next(e for e in logs if e["event"] == "hotplug_unavailable")["reason"]
    assert not c._hotplug_active


async def test_failing_monitor_mid_run_falls_back_instead_of_crashing_the_loop(tmp_path: Path) -> None:
    c = PcieCollector(context("dgx"))
    mon = FakeMonitor()

    def boom(timeout: float | None = None) -> Any:
        raise OSError(105, "No buffer space available")

    w = hotplug.HotplugWatcher([c], udev_dir=udev_dir(tmp_path), monitor_factory=lambda _s: mon)
    w.start()
    assert c._hotplug_active
    mon.poll = boom  # type: ignore[method-assign]
    os.write(mon.w, b"x")
    await settle()
    assert not w.active and not c._hotplug_active


async def test_real_pyudev_monitor_is_watched_on_the_loop(tmp_path: Path) -> None:
    """The real pyudev path (netlink socket + add_reader), with a stand-in /run/udev/control."""
    c = PcieCollector(context("dgx"))
    w = hotplug.HotplugWatcher([c], udev_dir=udev_dir(tmp_path))
    try:
        started = w.start()
    finally:
        w.stop()
    if not started:
        pytest.skip("netlink udev monitor not permitted in this sandbox")
    assert c._hotplug_active


async def test_daemon_attach_finds_the_pcie_collector(tmp_path: Path) -> None:
    from exporter.collectors.numa import NumaCollector

    c = PcieCollector(context("dgx"))
    w = hotplug.attach([NumaCollector(context("dgx")), c])
    assert w is not None and w.targets == [c]
    w.stop()
    assert hotplug.attach([NumaCollector(context("dgx"))]) is None
