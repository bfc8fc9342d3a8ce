"""``serve --simulate`` supervises its renderer children: one killed with SIGKILL is restarted, so the daemon never
serves a frozen host with every collector succeeding (round 2 found exactly that)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from structlog.testing import capture_logs

from exporter import pipeline
from exporter.config import resolve
from exporter.sim import exchange
from exporter.sim.live import LiveSimulation

RISER = Path(__file__).resolve().parents[1] / "scenarios" / "transfer_bound_riser.yaml"


def _written(directory: Path) -> int:
    """The fake NVML state's sequence number: moves at every state the simulator publishes."""
    try:
        return exchange.sequence(directory)
    except FileNotFoundError:
        return -1


def test_a_renderer_child_killed_with_sigkill_is_restarted_and_the_host_moves_again() -> None:
    registry = pipeline.registry()
    settings = resolve(registry, {}, {"simulate": str(RISER), "web.listen-address": "127.0.0.1:0"})
    with capture_logs() as logs:
        sim = LiveSimulation.start(settings, registry)
        try:
            assert sim.dir is not None
            old = sim.procs[1]
            os.kill(old.pid, signal.SIGKILL)  # the OOM killer's way
            old.wait(10)
            deadline = time.monotonic() + 20
            while sim.procs[1] is old or sim.procs[1].poll() is not None:
                assert time.monotonic() < deadline, "the killed child was not restarted"
                time.sleep(0.1)
            before = _written(sim.dir)
            while _written(sim.dir) == before:  # written again: the fake NVML no longer reads a frozen state
                assert time.monotonic() < deadline, "the restarted child does not render"
                time.sleep(0.05)
            assert sim.procs[0].poll() is None  # the other child was left alone
        finally:
            sim.stop()
    events = [e["event"] for e in logs]
    assert events.count("simulation_renderer_exited") == 1 and events.count("simulation_renderer_restarted") == 1


def test_a_renderer_child_signalled_again_while_it_cleans_up_prints_no_keyboardinterrupt(tmp_path: Path) -> None:
    # N10: timeout(1) signals the daemon and then its process group, and the daemon terminates its children: a
    # child removing its tree (400,000 files took seconds) got a second SIGTERM and logged a KeyboardInterrupt
    # traceback as uncaught_exception.
    import subprocess
    import sys

    scenario = Path(__file__).resolve().parents[2] / "bench" / "scenarios" / "host8x192_workloads.yaml"
    for attempt in range(3):
        root = tmp_path / f"root{attempt}"
        proc = subprocess.Popen([sys.executable, "-m", "exporter.sim.live", "--scenario", str(scenario), "--root",
                                 str(root), "--only", "trees"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        deadline = time.monotonic() + 20
        while proc.poll() is None and time.monotonic() < deadline:
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.0005)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err[-2000:]
        assert "KeyboardInterrupt" not in err and "Traceback" not in err, err[-2000:]
        assert not root.exists()
