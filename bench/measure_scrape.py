"""Measure the daemon on this machine: time to first /metrics, scrape latency p50/p99 while sampling runs at
default intervals, default series count, and the daemon's own CPU use. Reports numbers; asserts nothing.

    python -m bench.measure_scrape [--scrapes 2000] [--procfs /proc --sysfs /sys] [-- extra serve flags]
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` from /proc/<pid>/stat."""
    rest = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(rest[11]) + int(rest[12])) / TICK


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scrapes", type=int, default=2000)
    ap.add_argument("--procfs", default="/proc")
    ap.add_argument("--sysfs", default="/sys")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of unscraped sampling for the CPU figure")
    ap.add_argument("extra", nargs="*", help="extra flags for gpufeed serve")
    args = ap.parse_args()
    log = Path(tempfile.mkdtemp()) / "daemon.log"
    cmd = [sys.executable, "-m", "exporter", "serve", "--web.listen-address", "127.0.0.1:0",
           "--path.procfs", args.procfs, "--path.sysfs", args.sysfs, *args.extra]
    t_start = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, stderr=f, stdout=subprocess.DEVNULL)
    try:
        port = 0
        while not port:
            m = re.search(r"event=listening .*address=[\d.]+:(\d+)", log.read_text())
            port = int(m.group(1)) if m else 0
            if proc.poll() is not None:
                print(log.read_text(), file=sys.stderr)
                return 1
            time.sleep(0.005)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        body = b""
        while b"gpufeed_collector_success" not in body:
            conn.request("GET", "/metrics")
            body = conn.getresponse().read()
        ready = time.monotonic() - t_start
        time.sleep(2.0)  # let every sampler (cpufreq: 5 s) settle into its rhythm
        cpu0, t0 = _cpu_seconds(proc.pid), time.monotonic()
        time.sleep(args.idle)
        idle_cpu = (_cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - t0)
        keep: list[float] = []
        for _ in range(args.scrapes):
            s = time.perf_counter()
            conn.request("GET", "/metrics")
            body = conn.getresponse().read()
            keep.append(time.perf_counter() - s)
        fresh: list[float] = []
        for _ in range(min(500, args.scrapes)):
            s = time.perf_counter()
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/metrics", headers={"Connection": "close"})
            c.getresponse().read()
            c.close()
            fresh.append(time.perf_counter() - s)
        lines = [x for x in body.decode().splitlines() if x and not x.startswith("#")]
        print(f"time to first /metrics after exec: {ready * 1000:.0f} ms")
        print(f"series: {len(lines)} ({len(body)} bytes)")
        print(f"daemon CPU while sampling, unscraped: {idle_cpu * 100:.2f}% of one core")
        for name, xs in (("keep-alive", keep), ("new connection", fresh)):
            print(f"scrape {name}: n={len(xs)} p50={statistics.median(xs) * 1e3:.3f} ms "
                  f"p99={_pct(xs, 0.99) * 1e3:.3f} ms max={max(xs) * 1e3:.3f} ms")
        return 0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


if __name__ == "__main__":
    raise SystemExit(main())
