"""Workloads on real processes: a real trainer process with real data-loader child processes burning CPU,
read from this machine's /proc and /sys by the real collectors (only the GPU is the strict fake NVML, told
the trainer's pid), judged by the real derived layer -- with and without a real cgroup CPU quota.

Every process is started in its own session, stops by itself after DURATION_S, and is killed (by its group)
in teardown; the cgroup is removed afterwards. No assertion is on timing: the engine runs until the test's
condition holds on its derived state (checked every half second) or for RUN_S at most, and that last state is
what the test asserts on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter import names, pipeline
from exporter.config import resolve
from exporter.engine import RealClock
from exporter.samples.derived import DerivedState
from exporter.sim.fakenvml import FakeNvml
from exporter.sim.model import Model
from exporter.sim.render import nvml_state
from exporter.sim.scenario import loads

DURATION_S = 45.0  # the processes stop by themselves after this, whatever the test does
RUN_S = 16.0  # engine time per test at most: two 6 s windows and the hysteresis
CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")

TRAINER = r"""
import os, sys, time
n, duration, cgroup = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
if cgroup:
    with open(cgroup, "w") as f:  # join the cgroup before forking: the workers inherit it
        f.write(str(os.getpid()))
with open("/proc/self/comm", "w") as f:
    f.write("trainer")
end = time.monotonic() + duration
kids = []
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        with open("/proc/self/comm", "w") as f:
            f.write("pt_data_worker")
        x = 0
        while time.monotonic() < end:  # decode a batch, forever: one core each
            x += 1
        os._exit(0)
    kids.append(pid)
print("ready", flush=True)
while time.monotonic() < end and any(os.waitpid(k, os.WNOHANG) == (0, 0) for k in kids):
    time.sleep(0.2)  # the trainer itself waits on its queue: quiet
"""

GPU_ONLY = """
version: 2
name: real-host-gpu
host: {cpus: 1}
gpus: [{index: 0, pci_bus_id: "0000:41:00.0"}]
phases:
  - name: waiting
    duration_s: 600
    gpus:
      0:
        gpu_util: {square: {high: 0.98, low: 0.0, period_s: 1.0, duty: 0.3}}
        sm_active: {square: {high: 0.8, low: 0.0, period_s: 1.0, duty: 0.3}}
        memory_used_bytes: 2.0e10
"""


@contextlib.contextmanager
def trainer(workers: int, cgroup_procs: Path | None = None) -> Iterator[subprocess.Popen[str]]:
    """The trainer and its workers, stopped (SIGKILL to the whole group) when the block ends."""
    proc = subprocess.Popen([sys.executable, "-c", TRAINER, str(workers), str(DURATION_S), str(cgroup_procs or "")],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


class _Gpu(threading.Thread):
    """Drives the fake NVML's state in real time from the scenario, listing the trainer as GPU 0's process."""

    def __init__(self, fake: FakeNvml, pid: int) -> None:
        super().__init__(daemon=True)
        self.fake, self.pid, self.model = fake, pid, Model(loads(GPU_ONLY))
        self.t0 = time.monotonic()
        self.stop = threading.Event()
        self.fake.set_state(self.state())

    def state(self) -> dict[str, Any]:
        s = nvml_state(self.model, time.monotonic() - self.t0)
        dev = s["devices"][0]
        dev["processes"] = [{"pid": self.pid, "used_memory_bytes": 2 << 30}]
        dev["process_util"] = [{"pid": self.pid, "ts_us": round(s["t"] * 1e6), "sm_pct": 30, "mem_pct": 10}]
        return s

    def run(self) -> None:
        while not self.stop.wait(0.05):
            self.fake.set_state(self.state())


def diagnose(pid: int, done: Callable[[DerivedState], bool]) -> DerivedState:
    """The whole pipeline on this host's /proc and /sys until ``done`` holds on its derived state, or for RUN_S
    seconds; the last evaluation."""
    fake = FakeNvml()
    gpu = _Gpu(fake, pid)
    settings = resolve(pipeline.registry(), {}, {
        "path.procfs": "/proc", "path.sysfs": "/sys",
        "collector.derived.window": "6s", "collector.proc.threads-interval": "1s",
        "collector.workload.interval": "1s", "collector.gpu.slow-interval": "1s",
        "collector.kubernetes.socket": "/nonexistent/kubelet.sock",
        "collector.kubernetes": False,
    })
    pipe = pipeline.build(settings, clock=RealClock(), nvml=fake, history_seconds=60.0)

    async def run() -> None:
        pipe.engine.start()
        try:
            end = time.monotonic() + RUN_S
            while time.monotonic() < end:
                await asyncio.sleep(0.5)
                state = pipe.engine.snapshot.value(names.DERIVED)
                if isinstance(state, DerivedState) and done(state):
                    break
        finally:
            await pipe.engine.stop(timeout=2.0)

    gpu.start()
    try:
        asyncio.run(run())
    finally:
        gpu.stop.set()
        gpu.join(5)
        pipe.close()
    state = pipe.engine.snapshot.value(names.DERIVED)
    assert isinstance(state, DerivedState)
    return state


def _input_bound_on_the_workers(state: DerivedState, pid: int) -> bool:
    v = state.gpus.get(0)
    return (v is not None and v.cause == "input_bound" and 0 in state.workloads
            and any("pt_data_worker" in e and f"pid {pid}" in e for e in v.evidence))


def test_real_data_loader_worker_processes_make_the_waiting_gpu_input_bound() -> None:
    with trainer(2) as proc:
        state = diagnose(proc.pid, lambda st: _input_bound_on_the_workers(st, proc.pid)
                         and st.workloads[0].processes == 3)
    v = state.gpus[0]
    assert v.cause == "input_bound", v.evidence
    assert any("pt_data_worker" in e and f"pid {proc.pid}" in e for e in v.evidence), v.evidence
    assert state.workloads[0].processes == 3


@contextlib.contextmanager
def quota_cgroup(cores: float) -> Iterator[Path]:
    """A cgroup with a CFS quota of ``cores``, v1 (cpu hierarchy) or v2; its cgroup.procs. Skips with the reason
    when this machine cannot make one."""
    name = f"gpufeed-test-{uuid.uuid4().hex[:8]}.scope"
    if CGROUP_V1_CPU.is_dir() and (CGROUP_V1_CPU / "cpu.cfs_quota_us").exists():
        d = CGROUP_V1_CPU / name
        try:
            d.mkdir()
            (d / "cpu.cfs_period_us").write_text("100000")
            (d / "cpu.cfs_quota_us").write_text(str(int(cores * 100000)))
        except OSError as e:
            with contextlib.suppress(OSError):
                d.rmdir()
            pytest.skip(f"cannot create a cgroup v1 with a CPU quota here: {e}")
    elif (CGROUP_V2 / "cgroup.controllers").is_file():
        d = CGROUP_V2 / name
        try:
            if "cpu" not in (CGROUP_V2 / "cgroup.subtree_control").read_text().split():
                pytest.skip("cgroup v2 without the cpu controller enabled for children (cgroup.subtree_control)")
            d.mkdir()
            (d / "cpu.max").write_text(f"{int(cores * 100000)} 100000")
        except OSError as e:
            with contextlib.suppress(OSError):
                d.rmdir()
            pytest.skip(f"cannot create a cgroup v2 with cpu.max here: {e}")
    else:
        pytest.skip("no writable cgroup hierarchy at /sys/fs/cgroup")
    try:
        yield d / "cgroup.procs"
    finally:
        for _ in range(50):  # the killed processes leave the cgroup asynchronously
            with contextlib.suppress(OSError):
                d.rmdir()
                break
            time.sleep(0.1)


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a cgroup needs root")
def test_real_cpu_quota_throttling_is_found_and_the_workers_are_still_the_verdict() -> None:
    with quota_cgroup(0.4) as procs, trainer(2, procs) as proc:
        state = diagnose(proc.pid, lambda st: _input_bound_on_the_workers(st, proc.pid)
                         and ("cpu_quota_throttled", 0) in {(f.check, f.gpu) for f in st.findings})
    v = state.gpus[0]
    assert v.cause == "input_bound", v.evidence
    found = {(f.check, f.gpu) for f in state.findings}
    assert ("cpu_quota_throttled", 0) in found, state.findings
    assert state.workloads[0].capacity_cores == pytest.approx(0.4)
    assert state.workloads[0].labels.get("unit", "").startswith("gpufeed-test-")
