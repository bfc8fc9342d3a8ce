"""A simulated GPU on a real host (``gpufeed serve --simulate-gpu FILE``): the real daemon reads this machine's
``/proc`` and ``/sys`` -- processes, cgroups, CPUs, disks -- and only the GPU side comes from a small file,
served through the strict fake NVML. What a field report needs to be reproduced on a laptop, and what every
real-process test uses (``tests/test_workload_real.py``).

The file (YAML, read by :mod:`exporter.yamlsafe`; an example in docs/simulator.md) has ``phases`` (SPEC
phases, GPU state only; the timeline loops), optionally ``gpus`` (SPEC ``gpus[]``; default one GPU 0) and
``processes``: NVML's compute processes per GPU index, each a pid, ``{pid, used_memory_bytes}`` or
``{pid_file, used_memory_bytes}``.

A ``pid_file`` entry is re-read every half second (a job that restarts under a new pid is followed); a pid
that does not exist is listed anyway, as the driver lists a process of another pid namespace. The GPU keys
are the scenario format's (``../shared/scenarios/SPEC.md``), validated by its loader; nothing else of a
scenario (host, processes' CPU, expect) is allowed: the host is the real one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter import yamlsafe
from exporter.sim.model import Model
from exporter.sim.render import nvml_state
from exporter.sim.scenario import ScenarioError, from_dict

PID_FILE_EVERY = 0.5  # seconds between re-reads of a pid_file
STATE_EVERY = 0.05  # seconds between states handed to the fake NVML (its fastest sampler reads every 0.1 s)
DEFAULT_MEMORY = 2 << 30


@dataclass(frozen=True, slots=True)
class Listed:
    """One NVML process of a GPU: a pid, or a file holding one."""

    pid: int | None
    pid_file: str | None
    used_memory_bytes: int


@dataclass(frozen=True, slots=True)
class GpuSide:
    """The GPU side of a real host: the scenario model of its GPUs and their processes."""

    model: Model
    processes: Mapping[int, tuple[Listed, ...]]


def _listed(raw: object, where: str) -> Listed:
    if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0:
        return Listed(raw, None, DEFAULT_MEMORY)
    if not isinstance(raw, dict) or not raw.keys() <= {"pid", "pid_file", "used_memory_bytes"} or (
            ("pid" in raw) == ("pid_file" in raw)):
        raise ScenarioError(f"{where}: a pid, or {{pid | pid_file, used_memory_bytes}}")
    pid, pid_file, mem = raw.get("pid"), raw.get("pid_file"), raw.get("used_memory_bytes", DEFAULT_MEMORY)
    if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0):
        raise ScenarioError(f"{where}.pid: a positive integer, not {pid!r}")
    if pid_file is not None and not isinstance(pid_file, str):
        raise ScenarioError(f"{where}.pid_file: a path, not {pid_file!r}")
    if not isinstance(mem, (int, float)) or isinstance(mem, bool) or not 0 <= mem < 1 << 50:
        raise ScenarioError(f"{where}.used_memory_bytes: bytes, not {mem!r}")
    return Listed(pid, pid_file, int(mem))


def parse(data: object, file: str = "<gpu file>") -> GpuSide:
    """Validate a parsed GPU file (module docstring); ScenarioError naming the file and key."""
    if not isinstance(data, dict):
        raise ScenarioError(f"{file}: a mapping with phases and processes")
    unknown = sorted(set(data) - {"gpus", "phases", "processes"})
    if unknown:
        raise ScenarioError(f"{file}: unknown key {unknown[0]!r} (known: gpus, phases, processes)")
    if "phases" not in data:
        raise ScenarioError(f"{file}: phases is required")
    gpus = data.get("gpus", [{"index": 0, "pci_bus_id": "0000:41:00.0"}])
    sc = from_dict({"version": 1, "name": Path(file).stem or "simulated-gpu", "host": {"cpus": 1}, "gpus": gpus,
                    "phases": data["phases"]}, file)
    raw = data.get("processes", {})
    if not isinstance(raw, dict):
        raise ScenarioError(f"{file}: processes: a mapping GPU index -> list of pids")
    known = {g.index for g in sc.gpus}
    procs: dict[int, tuple[Listed, ...]] = {}
    for idx, lst in raw.items():
        if not isinstance(idx, int) or idx not in known:
            raise ScenarioError(f"{file}: processes.{idx}: no such GPU (known: {sorted(known)})")
        if not isinstance(lst, list):
            raise ScenarioError(f"{file}: processes.{idx}: a list")
        procs[idx] = tuple(_listed(x, f"{file}: processes.{idx}[{i}]") for i, x in enumerate(lst))
    return GpuSide(Model(sc), procs)


def load(path: str | Path) -> GpuSide:
    """Read and validate a GPU file; ScenarioError (file and key named) on any problem."""
    try:
        data = yamlsafe.load(path)
    except (yamlsafe.YamlError, OSError) as e:
        raise ScenarioError(f"{path}: {e}") from e
    return parse(data, str(path))


def _read_pid(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and int(text) > 0 else None


class GpuDriver(threading.Thread):
    """Hands the fake NVML the GPU side's state every STATE_EVERY seconds of ``clock`` (monotonic wall time by
    default), with each GPU's process list the real pids named."""

    def __init__(self, fake: Any, side: GpuSide, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(name="gpufeed-simulated-gpu", daemon=True)
        self.fake, self.side, self.clock = fake, side, clock
        self.t0 = clock()
        self._halt = threading.Event()
        self._pids: dict[str, tuple[float, int | None]] = {}
        self.fake.set_state(self.state())

    def pids(self, idx: int) -> list[tuple[int, int]]:
        """(pid, memory) of GPU ``idx``'s processes now."""
        out: list[tuple[int, int]] = []
        now = time.monotonic()
        for x in self.side.processes.get(idx, ()):
            pid = x.pid
            if x.pid_file is not None:
                hit = self._pids.get(x.pid_file)
                if hit is None or now - hit[0] >= PID_FILE_EVERY:
                    hit = (now, _read_pid(x.pid_file))
                    self._pids[x.pid_file] = hit
                pid = hit[1]
            if pid is not None:
                out.append((pid, x.used_memory_bytes))
        return out

    def state(self) -> dict[str, Any]:
        """The fake NVML's state now: the scenario's GPU state with the real processes listed."""
        s = nvml_state(self.side.model, self.clock() - self.t0)
        for dev in s["devices"]:
            procs = self.pids(dev["index"])
            dev["processes"] = [{"pid": p, "used_memory_bytes": m} for p, m in procs]
            dev["process_util"] = [{"pid": p, "ts_us": round(s["t"] * 1e6), "sm_pct": 30, "mem_pct": 10}
                                   for p, _ in procs]
        return s

    def run(self) -> None:
        while not self._halt.wait(STATE_EVERY):
            self.fake.set_state(self.state())

    def stop(self) -> None:
        """Stop handing states (idempotent); the fake keeps the last one."""
        self._halt.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(5)


def start(path: str | Path) -> tuple[Any, GpuDriver]:
    """The fake NVML module and its running driver for ``serve --simulate-gpu``."""
    from exporter.sim.fakenvml import FakeNvml

    side = load(path)
    fake = FakeNvml()
    driver = GpuDriver(fake, side)
    driver.start()
    return fake, driver

