"""A whole simulated host for fault injection: every registered collector (host, PCIe/NUMA topology and the
GPU collector over the strict fake NVML) in one virtual-time engine, over a private, writable copy of the
fixture trees, rendered through the real exposition."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from exporter import pipeline
from exporter.config import resolve
from exporter.engine import Clock, RealClock, VirtualClock
from exporter.exposition import Renderer
from exporter.sim.fakenvml import FakeNvml

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
GPU0, GPU1 = "0000:01:00.0", "0000:41:00.0"  # the riser box's GPUs
GPU_PID, OTHER_GPU_PID = 4242, 4300  # both have stat, status and task/ in the merged tree


# Fault roots are thousands of small files and directories: on tmpfs they cost a tenth of a disk's time.
SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
_TEMPLATE: list[Path] = []


def scratch_dir() -> Path:
    """A fresh directory on the same filesystem as the template (hard links), removed at exit."""
    d = Path(tempfile.mkdtemp(prefix="gpufeed-fault-", dir=SCRATCH))
    atexit.register(shutil.rmtree, d, ignore_errors=True)
    return d


def _template() -> Path:
    """The large host fixture with the riser box's PCIe tree and GPU processes merged in (built once)."""
    if not _TEMPLATE:
        root = Path(tempfile.mkdtemp(prefix="gpufeed-faults-", dir=SCRATCH))
        shutil.copytree(FIXTURES / "hosts" / "large", root, symlinks=True, dirs_exist_ok=True)
        shutil.copytree(FIXTURES / "hosts" / "riser", root, symlinks=True, dirs_exist_ok=True)
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        _TEMPLATE.append(root)
    return _TEMPLATE[0]


def nvml_state(**top: Any) -> dict[str, Any]:
    """Two GPUs on the riser box's bus addresses, one process each (pids present in the proc fixture)."""
    devices = [
        {"pci_bus_id": GPU0, "uuid": "GPU-fault-0", "processes": [{"pid": GPU_PID, "used_memory_bytes": 1 << 30}]},
        {"pci_bus_id": GPU1, "uuid": "GPU-fault-1",
         "processes": [{"pid": OTHER_GPU_PID, "used_memory_bytes": 1 << 30}]},
    ]
    return {"devices": devices, **top}


class Host:
    """The simulated host. ``run(dt)`` advances virtual time; ``series()`` is what a scrape would return."""

    def __init__(self, root: Path, *, nvml: Mapping[str, Any] | None = None,
                 options: Mapping[str, Any] | None = None, live: bool = False) -> None:
        """``live``: real time and worker threads (the daemon's engine, started with ``engine.start()`` on a
        running loop) instead of virtual time run inline by :meth:`run`."""
        self.root = root
        # Hard links to a merged template: cheap per test. Faults therefore never write a file in place:
        # see replace() (a new inode) and unlink(); permission faults are injected, not chmod-ed.
        shutil.copytree(_template(), root, symlinks=True, dirs_exist_ok=True, copy_function=os.link)
        self.clock: Clock = RealClock() if live else VirtualClock(0.0)
        self.fake = FakeNvml(nvml_state() if nvml is None else nvml)
        flags = {"path.procfs": str(root / "proc"), "path.sysfs": str(root / "sys"), **(options or {})}
        self.settings = resolve(pipeline.registry(), {}, flags)
        self.pipeline = pipeline.build(self.settings, clock=self.clock, nvml=self.fake, inline=not live)
        self.targets = self.pipeline.targets
        self.collectors = self.pipeline.collectors
        self.engine = self.pipeline.engine
        self.renderer = Renderer(self.pipeline.stages)

    @property
    def proc(self) -> Path:
        return self.root / "proc"

    @property
    def sys(self) -> Path:
        return self.root / "sys"

    def replace(self, rel: str, data: bytes | str) -> bytes:
        """Give ``rel`` new content as a new file (the template's inode is shared); returns the old content."""
        path = self.root / rel
        old = path.read_bytes() if path.exists() else b""
        tmp = path.with_name(path.name + ".new")
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
        return old

    def run(self, dt: float) -> None:
        self.engine.run_until(self.clock.now() + dt)

    def nvml(self, edit: Any) -> None:
        """Apply ``edit(state)`` to the fake NVML's state."""
        st = self.fake.state
        edit(st)
        self.fake.set_state(st)

    def series(self) -> dict[str, float]:
        """``name{labels}`` -> value of a scrape right now."""
        self.renderer.render(self.engine.snapshot)
        out: dict[str, float] = {}
        for line in self.renderer.text().body.decode().splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def success(self) -> dict[str, float]:
        """collector -> gpufeed_collector_success (absent when not available)."""
        pre = 'gpufeed_collector_success{collector="'
        return {k[len(pre):-2]: v for k, v in self.series().items() if k.startswith(pre)}

    def available(self) -> dict[str, float]:
        pre = 'gpufeed_collector_available{collector="'
        return {k[len(pre):-2]: v for k, v in self.series().items() if k.startswith(pre)}
