"""Smoke of bench/attack.py (the side-by-side attack in docs/reliability.md): a tiny run, two seconds a phase,
against gpufeed (and node_exporter where installed) must give a report of the documented shape and leave no
daemon behind. Never asserts a measured number: CI machines are not benchmark machines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench import load

REPO = Path(__file__).resolve().parent.parent.parent


def test_a_tiny_attack_run_reports_every_phase_for_every_daemon_and_leaves_none_running(tmp_path: Path) -> None:
    out = tmp_path / "attack.json"
    r = subprocess.run(
        [sys.executable, "-m", "bench.attack", "--seconds", "2", "--small", "--phases", "baseline,burst,empty_config",
         "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(out.read_text())
    targets = ["gpufeed"] + (["node_exporter"] if load.peer_binary() else [])
    assert report["targets"] == targets
    assert report["seconds"] == 2 and report["small"] is True
    assert report["machine"]["cpus"] >= 1 and len(report["machine"]["loadavg_start"]) == 3
    assert list(report["phases"]) == ["baseline", "burst", "empty_config"]
    for phase in ("baseline", "burst"):
        for name in targets:
            got = report["phases"][phase][name]
            probe, res = got["probe"], got["resources"]
            # at least the first request (a starved probe may manage only a few in 2 s: a result, not a fault)
            assert probe["total"] >= 1 and 0 <= probe["failed"] <= probe["total"], (phase, name, probe)
            if probe["status"].get("200"):  # latencies are of the 200s (NaN when there were none)
                assert probe["p50_ms"] <= probe["p99_ms"] <= probe["max_ms"], (phase, name, probe)
            assert 0 < res["rss_start_mib"] <= res["rss_peak_mib"] and res["fds_peak"] > 0, (phase, name, res)
            assert res["cpu_pct"] >= 0 and res["wall_s"] >= 1.5, (phase, name, res)
    for name in targets:
        outcome = report["phases"]["burst"][name]["load"]["outcome"]
        assert sum(outcome.values()) == 200, (name, outcome)  # every connection accounted for
    # gpufeed refuses an empty web config at start (exit 2, never listens); node_exporter 1.5.0 serves HTTP.
    assert report["phases"]["empty_config"]["gpufeed"] == {"exit_code": 2, "listening": False, "plain_http": None}
    if "node_exporter" in targets:
        assert report["phases"]["empty_config"]["node_exporter"]["listening"] is True
    assert len(report["daemon_pids"]) == 2 * len(targets)  # one plain daemon and one empty-config start each
    assert [pid for pid in report["daemon_pids"] if Path(f"/proc/{pid}").exists()] == []
