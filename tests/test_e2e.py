"""End to end: the real daemon (``python -m exporter serve``) on the large fixture, /metrics diffed against a golden.

Regenerate the golden after an intended change with ``pytest tests/test_e2e.py --update-golden`` and review
the diff of tests/fixtures/e2e-output.txt like code.
"""

from __future__ import annotations

import contextlib
import datetime
import difflib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter import names
from exporter.collectors import load_all
from exporter.derived.cadence import QUIET_INTERVALS
from tests.support.hosts import HOST_COLLECTORS, LARGE, REPO

GOLDEN = REPO / "tests" / "fixtures" / "e2e-output.txt"
# The golden covers the host collectors only: their families (docs/metrics.md, Host) and their self-metrics.
# Everything else -- other collectors, the derived layer -- belongs to the lead's whole-daemon golden.
HOST_FAMILIES = re.compile(
    r"gpufeed_(cpu_node_seconds_total|cpu_node_cpus|cpu_seconds_total|process_cpu_seconds_total|process_threads"
    r"|process_read_bytes_total|process_read_syscalls_total|cpufreq_governor_cpus|cpufreq_current_ratio_m(in|ax)"
    r"|memory_(total|available|dirty|writeback|mlocked)_bytes|oom_kills_total|pressure_stalled_seconds_total"
    r"|pressure_full_stalled_seconds_total|disk_\w+|nfs_\w+)"
)
SELF_FAMILIES = re.compile(r"gpufeed_(collector_success|collector_available|sampler_restarts_total)")
HOST_LABEL = re.compile(r'(collector|sampler)="(' + "|".join((*HOST_COLLECTORS, "proc_threads")) + r')"')
# Not compared: duration and overruns depend on the machine's speed, build_info on the Python version.
# Runnable threads per CPU past which a sampler's overrun says more about the test machine than the daemon.
OVERLOADED = 4


def _host_only_flags() -> list[str]:
    """Enable exactly the host collectors: other engineers' collectors must not change this golden."""
    flags = []
    for name in load_all():
        flags.append(f"--collector.{name}" if name in HOST_COLLECTORS else f"--no-collector.{name}")
    return flags


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen[str], str]]:
    cmd = [
        sys.executable, "-m", "exporter", "serve", "--web.listen-address", "127.0.0.1:0",
        "--path.procfs", str(LARGE / "proc"), "--path.sysfs", str(LARGE / "sys"),
        "--collector.proc.pids", "4242,4300", "--log.level", "debug", "--web.render-interval", "50ms",
        *_host_only_flags(),
    ]
    with _started(cmd, tmp_path_factory.mktemp("e2e") / "daemon.log") as started:
        yield started


@contextlib.contextmanager
def _started(cmd: list[str], log_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Start the daemon with its log in a file (a pipe nobody drains would block it) and find its port."""
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(cmd, cwd=REPO, stderr=log_file, stdout=subprocess.DEVNULL, text=True)
    try:
        url = ""
        deadline = time.monotonic() + 20
        while not url and time.monotonic() < deadline and proc.poll() is None:
            m = re.search(r"event=listening .*address=([\d.]+:\d+)", log_path.read_text())
            url = f"http://{m.group(1)}" if m else ""
            time.sleep(0.02)
        assert url, f"daemon did not report listening (rc={proc.poll()}):\n{log_path.read_text()}"
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _get(url: str, accept: str | None = None) -> bytes:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=5) as r:
        body: bytes = r.read()
        return body


def _settled_payload(url: str) -> str:
    """/metrics once every host sampler has run (proc_threads included)."""
    deadline = time.monotonic() + 15
    text = ""
    while time.monotonic() < deadline:
        text = _get(url + "/metrics").decode()
        ok = all(f'gpufeed_collector_success{{collector="{c}"}} 1.0' in text for c in HOST_COLLECTORS)
        if ok and "gpufeed_process_threads{" in text:
            return text
        time.sleep(0.05)
    raise AssertionError("host collectors did not all succeed on the fixture:\n" + text)


def normalise(text: str) -> str:
    """The host part of the payload, without machine- or moment-dependent samples; HELP/TYPE lines are kept so
    their wording is reviewed too."""
    out = []
    for line in text.splitlines():
        name = line.split(" ")[2] if line.startswith("#") else re.split(r"[{ ]", line, maxsplit=1)[0]
        host = HOST_FAMILIES.fullmatch(name)
        if host or (SELF_FAMILIES.fullmatch(name) and (line.startswith("#") or HOST_LABEL.search(line))):
            out.append(line)
    return "".join(x + "\n" for x in out)


def test_metrics_on_large_fixture_match_golden(
    daemon: tuple[subprocess.Popen[str], str], update_golden: bool
) -> None:
    _, url = daemon
    got = normalise(_settled_payload(url))
    if update_golden:
        GOLDEN.write_text(got)
        pytest.skip(f"golden rewritten: {GOLDEN}")
    assert GOLDEN.exists(), "no golden yet: run pytest tests/test_e2e.py --update-golden"
    want = GOLDEN.read_text()
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), str(GOLDEN), "daemon"))
        pytest.fail("/metrics differs from the golden (rerun with --update-golden if intended):\n" + diff)


def test_default_host_series_stay_well_under_the_budget(daemon: tuple[subprocess.Popen[str], str]) -> None:
    _, url = daemon
    samples = [x for x in _settled_payload(url).splitlines() if x and not x.startswith("#")]
    assert len(samples) < 200, len(samples)


def test_promtool_check_metrics_prints_nothing(daemon: tuple[subprocess.Popen[str], str]) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'); tools/ensure-test-deps.sh installs it")
    _, url = daemon
    payload = _settled_payload(url)
    r = subprocess.run([promtool, "check", "metrics"], input=payload, capture_output=True, text=True, timeout=30,
                       check=False)
    assert (r.returncode, r.stdout + r.stderr) == (0, "")


def test_openmetrics_is_served_when_negotiated(daemon: tuple[subprocess.Popen[str], str]) -> None:
    _, url = daemon
    _settled_payload(url)
    body = _get(url + "/metrics", accept="application/openmetrics-text; version=1.0.0").decode()
    assert body.rstrip().endswith("# EOF")
    assert 'gpufeed_nfs_operations_total{op="getattr"} 1.505e+06' in body


def test_sigterm_stops_the_daemon_cleanly(daemon: tuple[subprocess.Popen[str], str]) -> None:
    proc, url = daemon
    _settled_payload(url)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=5) == 0
    assert time.monotonic() - t0 < 3.0


def test_a_missing_procfs_root_is_refused_at_start() -> None:
    """A container started without the host's /proc mounted: one line and exit 3, not a 200 /healthz."""
    r = subprocess.run([sys.executable, "-m", "exporter", "serve", "--web.listen-address", "127.0.0.1:0",
                        "--path.procfs", "/nonexistent/proc"], capture_output=True, text=True, timeout=30,
                       check=False)
    assert r.returncode == 3
    assert r.stderr == "gpufeed serve: error: cannot see the host: --path.procfs /nonexistent/proc: no such directory\n"


def test_a_procfs_with_only_stat_still_serves_and_reports_failures(tmp_path: Path) -> None:
    """A procfs root with nothing but stat: the other host collectors fail or are unavailable, the daemon serves."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "stat").write_text("cpu  1 2 3 4 5 6 7 0 0 0\n")
    cmd = [sys.executable, "-m", "exporter", "serve", "--web.listen-address", "127.0.0.1:0",
           "--path.procfs", str(tmp_path / "proc"), "--path.sysfs", str(tmp_path), *_host_only_flags()]
    with _started(cmd, tmp_path / "daemon.log") as (_, url):
        deadline = time.monotonic() + 10
        text = ""
        while time.monotonic() < deadline:
            text = _get(url + "/metrics").decode()
            if 'gpufeed_collector_success{collector="memory"} 0.0' in text \
                    and 'gpufeed_collector_available{collector="nfs"} 0.0' in text:
                break
            time.sleep(0.05)
        assert 'gpufeed_collector_success{collector="memory"} 0.0' in text
        assert 'gpufeed_collector_available{collector="nfs"} 0.0' in text
        assert _get(url + "/healthz") == b"ok\n"


def test_a_gpu_that_starts_waiting_does_not_set_off_the_shipped_overrun_alert(tmp_path: Path) -> None:
    """The per-thread sampler's pace change at an onset (120 s quiet -> 0.5 s) is not an overrun: a real
    Prometheus scraping ``serve --simulate launch_bound`` at 10x across two onsets, with the shipped alert rules
    loaded unchanged, has no ``GpufeedSamplerOverruns`` for ``proc_threads`` (not even pending), and the shipped
    rule's expression is false for it. ~30 overruns per onset were counted before, 0.071/s on an unloaded
    daemon, above the rule's 0.05/s. Only the deep sampler is asserted: at 10x the host samplers tick every
    25 ms of real time and an overrun of theirs on these shared test cores would say nothing of the fix."""
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("prometheus not installed (tools/ensure-test-deps.sh installs it)")
    rules = Path(__file__).resolve().parents[1] / "alerts" / "gpufeed-alerts.yml"
    rule = next(r for g in yaml.safe_load(rules.read_text())["groups"] for r in g["rules"]
                if r.get("alert") == "GpufeedSamplerOverruns")
    cmd = [sys.executable, "-m", "exporter", "serve", "--web.listen-address", "127.0.0.1:0",
           "--simulate", "launch_bound", "--simulate-speed", "10", "--log.level", "debug"]
    with _started(cmd, tmp_path / "daemon.log") as (_, url):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            prom = f"127.0.0.1:{s.getsockname()[1]}"
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": "gpufeed", "static_configs": [{"targets": [url.split("//")[1]]}]}],
        }))
        with open(tmp_path / "prometheus.log", "w") as plog:
            p = subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                                  f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address={prom}"],
                                 stdout=plog, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            def query(expr: str) -> list[dict[str, Any]]:
                q = urllib.parse.urlencode({"query": expr})
                result: list[dict[str, Any]] = json.loads(_get(f"http://{prom}/api/v1/query?{q}"))["data"]["result"]
                return result

            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError, ValueError):
                    if query('up{job="gpufeed"} == 1'):
                        break
                time.sleep(0.5)
            # Two onsets after a quiet spell: the deep sampler back from its 120 s pace, held >= 20 s of scenario
            # time (2 s real), to 0.5 s (the GPU waits from 60 s to 150 s of each 150 s loop).
            end = time.monotonic() + 50
            while time.monotonic() < end and _onsets(tmp_path / "daemon.log", quiet=2.0) < 2:
                time.sleep(0.5)
            assert _onsets(tmp_path / "daemon.log", quiet=2.0) >= 2, "no two onsets in 50 s"
            time.sleep(3.0)  # scraped and evaluated
            overruns = query('gpufeed_sampler_overruns_total{sampler="proc_threads"}')
            fired = query('ALERTS{alertname="GpufeedSamplerOverruns",sampler="proc_threads"}')
            if fired and os.getloadavg()[0] > OVERLOADED * (os.cpu_count() or 1):
                # At 10x a deep pass has 50 ms of real time: on cores this oversubscribed its overruns are real.
                pytest.skip(f"load average {os.getloadavg()[0]:.0f}: overruns here are the test machine's")
            assert fired == [], (fired, overruns)
            assert [r for r in query(rule["expr"]) if r["metric"].get("sampler") == "proc_threads"] == []
            assert "sampling_gap" not in (tmp_path / "daemon.log").read_text()
        finally:
            p.terminate()
            p.wait(timeout=10)


def _onsets(log_path: Path, quiet: float) -> int:
    """Changes of the deep sampler's interval to 0.5 s after it held its quiet pace for ``quiet`` real seconds."""
    n, since = 0, None
    for m in re.finditer(r"ts=(\S+) .*event=deep_sampling_changed .*sampler=proc_threads interval=([\d.]+)",
                         log_path.read_text()):
        t = datetime.datetime.fromisoformat(m.group(1).rstrip("Z")).timestamp()
        if float(m.group(2)) == QUIET_INTERVALS[names.PROC_THREADS]:
            since = t
        elif m.group(2) == "0.5" and since is not None:
            n += t - since >= quiet
            since = None
    return n
