"""``gpufeed serve --simulate``: the real daemon serves the simulated host; the renderer child dies with it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
RISER = HERE.parent / "scenarios" / "transfer_bound_riser.yaml"


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        body: bytes = r.read()
    return body.decode()


def _value(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def _wait_port(proc: subprocess.Popen[str], log: Path, deadline: float) -> int:
    while time.monotonic() < deadline and proc.poll() is None:
        m = re.search(r"event=listening .*address=127\.0\.0\.1:(\d+)", log.read_text())
        if m:
            return int(m.group(1))
        time.sleep(0.1)
    raise AssertionError("daemon did not start listening:\n" + log.read_text())


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM, then SIGKILL if the daemon has not exited 15 s later."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def test_serve_simulate_serves_idle_gen1_then_the_degraded_riser_hop(tmp_path: Path) -> None:
    # 5x: the idle phase (0-30 s of scenario time) lasts 6 s, the copying phase starts after.
    log = tmp_path / "daemon.log"
    launched = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", "serve", "--simulate", str(RISER), "--simulate-speed", "5",
         "--web.listen-address", "127.0.0.1:0", "--log.level", "info", "--collector.pcie.interval", "0.5s",
         "--collector.pcie.chain"],  # every hop: this test follows the riser and the root port too
        stdout=subprocess.DEVNULL, stderr=log.open("w"), text=True,
    )
    kids: list[int] = []
    try:
        port = _wait_port(proc, log, time.monotonic() + 60)
        kids = _children(proc.pid)
        assert len(kids) == 2, "expected two renderer children (trees, NVML state)"
        text = _scrape(port)
        # While idle: the GPU's link sits at Gen1 (x8 in this scenario) -- normal, by design.
        gpu = {"bdf": "0000:82:00.0", "role": "gpu"}
        deadline = time.monotonic() + 30
        while _value(text, "gpufeed_pcie_link_current_speed_transfers_per_second", **gpu) is None:
            assert time.monotonic() < deadline, text[-3000:]
            time.sleep(0.2)
            text = _scrape(port)
        # The renderer's clock starts after the launch, so scenario time is below 5 x the time since launch.
        if time.monotonic() - launched < 5.5:
            assert _value(text, "gpufeed_pcie_link_current_speed_transfers_per_second", **gpu) == 2.5e9
            assert _value(text, "gpufeed_pcie_link_current_width", **gpu) == 8
        # Copying: Gen3 x8 at the GPU and at the riser port above it, Gen4 x16 at the root port.
        deadline = time.monotonic() + 40
        while True:
            text = _scrape(port)
            speed = _value(text, "gpufeed_pcie_link_current_speed_transfers_per_second", **gpu)
            gpu_info = _value(text, "gpufeed_gpu_info", gpu="0")
            if speed == 8e9 and gpu_info is not None:
                break
            assert time.monotonic() < deadline, text[-3000:]
            time.sleep(0.5)
        riser = {"bdf": "0000:81:00.0", "role": "bridge"}
        root = {"bdf": "0000:80:03.1", "role": "bridge"}
        assert _value(text, "gpufeed_pcie_link_current_width", **gpu) == 8
        assert 'max_width="16"' in next(ln for ln in text.splitlines()
                                        if ln.startswith("gpufeed_pcie_device_info{") and 'bdf="0000:82:00.0"' in ln)
        assert _value(text, "gpufeed_pcie_link_current_speed_transfers_per_second", **riser) == 8e9
        assert _value(text, "gpufeed_pcie_link_current_width", **riser) == 8
        assert _value(text, "gpufeed_pcie_link_current_speed_transfers_per_second", **root) == 16e9
        assert _value(text, "gpufeed_pcie_link_current_width", **root) == 16
    finally:
        _stop(proc)
    assert proc.returncode == 0
    for kid in kids:
        for _ in range(50):
            if not Path(f"/proc/{kid}").exists():
                break
            time.sleep(0.1)
        assert not Path(f"/proc/{kid}").exists(), "renderer child outlived the daemon"
    m = re.search(r"event=simulation_started .*root=(\S+)", log.read_text())
    assert m, log.read_text()
    assert not os.path.exists(m.group(1)), "simulation directory left behind"


def test_serve_simulate_with_an_invalid_scenario_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nname: x\nhost: {cpus: 4}\ngpus: []\nphases: []\n")
    r = subprocess.run([sys.executable, "-m", "exporter", "serve", "--simulate", str(bad),
                        "--web.listen-address", "127.0.0.1:0"], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2
    assert f"{bad}: phases: at least one phase is required" in r.stderr


def test_renderer_child_exits_and_cleans_up_when_the_daemon_is_killed(tmp_path: Path) -> None:
    log = tmp_path / "daemon.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", "serve", "--simulate", str(RISER), "--web.listen-address", "127.0.0.1:0"],
        stdout=subprocess.DEVNULL, stderr=log.open("w"), text=True,
    )
    try:
        _wait_port(proc, log, time.monotonic() + 60)
        kids = _children(proc.pid)
        assert len(kids) == 2
        m = re.search(r"event=simulation_started .*root=(\S+)", log.read_text())
        assert m and os.path.isdir(m.group(1))
    finally:
        proc.kill()  # no cleanup code runs in the daemon
        proc.wait()
    for kid in kids:
        for _ in range(50):
            if not Path(f"/proc/{kid}").exists():
                break
            time.sleep(0.1)
        assert not Path(f"/proc/{kid}").exists(), "renderer child outlived a killed daemon"
    assert not os.path.exists(m.group(1)), "the child did not remove the simulation directory"


def test_serve_simulate_at_speed_10_reads_the_riser_transfer_bound_with_most_time_waiting(tmp_path: Path) -> None:
    # Fast-forwarded, the daemon must measure in scenario time: on the wall clock its 15 s window spanned
    # 150 s of scenario and its rates were 10x, and the copying GPU read healthy with 0% waiting.
    log = tmp_path / "daemon.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", "serve", "--simulate", str(RISER), "--simulate-speed", "10",
         "--web.listen-address", "127.0.0.1:0", "--log.level", "info"],
        stdout=subprocess.DEVNULL, stderr=log.open("w"), text=True,
    )
    try:
        port = _wait_port(proc, log, time.monotonic() + 60)
        first: tuple[float, float] | None = None  # (waiting, working) seconds at the first transfer_bound scrape
        deadline = time.monotonic() + 60
        while True:
            text = _scrape(port)
            bound = _value(text, "gpufeed_gpu_bottleneck", gpu="0", cause="transfer_bound")
            waiting = _value(text, "gpufeed_gpu_state_seconds_total", gpu="0", state="waiting") or 0.0
            working = _value(text, "gpufeed_gpu_state_seconds_total", gpu="0", state="working") or 0.0
            if bound != 1:
                first = None
            elif first is None:
                first = (waiting, working)
            elif (waiting + working) - sum(first) >= 5.0:
                break
            assert time.monotonic() < deadline, f"never transfer_bound for 5 s at speed 10: {text[-2000:]}"
            time.sleep(0.3)
        # While transfer_bound, the GPU waited most of the time (~70% of the copying phase, as at speed 1).
        share = (waiting - first[0]) / ((waiting - first[0]) + (working - first[1]))
        assert share > 0.5, (first, waiting, working)
    finally:
        _stop(proc)
    assert proc.returncode == 0
