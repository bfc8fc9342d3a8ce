"""The cost of one capture (issue 45): py-spy's CPU, the capture's wall time, and the target's slowdown.

The target is a real Python loop (pure-Python work, the host side of a training step) that counts its
iterations and reports the count every 100 ms on a pipe; a second, identical loop runs beside it as the control,
never captured. Each round measures both rates over ``--seconds`` without a capture, then during a capture of
the target (exporter.capture.take: py-spy for ``--seconds`` at 100 Hz, the summary and the bundle), then without
again. The slowdown is 1 - (target / control during) / (target / control around it): the control sees the same
machine at the same time, so a loaded, shared machine's drift cancels (on the 2-core development VM shared with
other jobs the target's own rate moved 20-50% between 5 s windows without any capture). Both loops are pinned to
CPU 0 and this process (so py-spy) to CPU 1 (``--no-pin`` to leave them to the scheduler, which then moves them
against each other and the figure is noise). The rate per CPU second of the target (its iterations over its
own utime + stime, in 10 ms ticks) is printed beside it. Modes: ``nonblocking`` (the
default: py-spy reads the target's memory while it runs) and ``native`` (``--capture.native``: py-spy pauses
the target at each sample to unwind native frames).

    python bench/capture.py                 # 3 rounds per mode, 5 s captures, pinned
    python bench/capture.py --rounds 1 --seconds 2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from exporter.capture.options import CaptureConfig  # noqa: E402
from exporter.capture.take import CaptureContext, take  # noqa: E402

TARGET = r"""
import os, sys, time
count = 0
next_report = time.monotonic() + 0.1
def step(x):
    return sum(i * i for i in range(x))
while True:
    step(200)
    count += 1
    now = time.monotonic()
    if now >= next_report:
        t = os.times()
        os.write(1, f"{now:.6f} {count} {t.user + t.system:.3f}\n".encode())
        next_report = now + 0.1
"""


class Target:
    """The looping child and its reports (time, iterations so far)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", TARGET], stdout=subprocess.PIPE, text=True)
        self.reports: list[tuple[float, int, float]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            t, n, cpu = line.split()
            self.reports.append((float(t), int(n), float(cpu)))

    def rate(self, start: float, end: float, *, per_cpu: bool = False) -> float:
        """Iterations per second of wall time (or of the target's own CPU time) between two monotonic times."""
        inside = [r for r in self.reports if start <= r[0] <= end]
        if len(inside) < 2:
            return float("nan")
        (t0, n0, c0), (t1, n1, c1) = inside[0], inside[-1]
        span = (c1 - c0) if per_cpu else (t1 - t0)
        return (n1 - n0) / span if span > 0 else float("nan")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def one_round(target: Target, control: Target, seconds: float, native: bool, folder: Path) -> dict[str, Any]:
    """Rates before, during and after one capture; the capture's own figures."""
    t0 = time.monotonic()
    time.sleep(seconds)
    before = target.rate(t0, time.monotonic()) / control.rate(t0, time.monotonic())
    before_cpu = target.rate(t0, time.monotonic(), per_cpu=True)
    config = CaptureConfig(enabled=True, duration=seconds, native=native, dir=folder)
    ctx = CaptureContext(gpu=0, trigger="bench", pids=(target.proc.pid,))
    t1 = time.monotonic()
    cpu0 = time.process_time()
    outcome = take(ctx, config)
    process_cpu = time.process_time() - cpu0
    t2 = time.monotonic()
    during = target.rate(t1, t2) / control.rate(t1, t2)
    during_cpu = target.rate(t1, t2, per_cpu=True)
    t3 = time.monotonic()
    time.sleep(seconds)
    after = target.rate(t3, time.monotonic()) / control.rate(t3, time.monotonic())
    after_cpu = target.rate(t3, time.monotonic(), per_cpu=True)
    base = (before + after) / 2
    base_cpu = (before_cpu + after_cpu) / 2
    return {
        "native": native, "ratio_before": before, "ratio_during": during, "ratio_after": after,
        "slowdown": 1 - during / base if base else float("nan"),
        # Per iteration of the target's own CPU: what the capture costs its work, whatever the scheduler did.
        "slowdown_per_cpu": 1 - during_cpu / base_cpu if base_cpu else float("nan"),
        "cpu_seconds": outcome.cpu_seconds, "bench_process_cpu_seconds": process_cpu,
        "wall_seconds": t2 - t1, "pyspy_wall_seconds": outcome.wall_seconds,
        "unavailable": outcome.unavailable, "problems": list(outcome.problems),
        "bundle_bytes": sum(p.stat().st_size for p in outcome.path.iterdir()) if outcome.path else 0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--modes", default="nonblocking,native")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--no-pin", dest="pin", action="store_false", help="do not pin: by default target and control "
                    "share CPU 0 and this process and py-spy run on CPU 1, so the two loops see the same core "
                    "whatever else the machine runs")
    args = ap.parse_args()
    results: list[dict[str, Any]] = []
    target, control = Target(), Target()
    if args.pin and len(os.sched_getaffinity(0)) >= 2:
        for t in (target, control):
            os.sched_setaffinity(t.proc.pid, {0})
        os.sched_setaffinity(0, {1})  # py-spy, a child of this process, inherits it
    try:
        time.sleep(1.0)
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.rounds):
                for mode in args.modes.split(","):
                    r = one_round(target, control, args.seconds, mode == "native", Path(tmp))
                    results.append(r)
                    print(f"{mode:<12} slowdown {100 * r['slowdown']:6.1f}% (per CPU s "
                          f"{100 * r['slowdown_per_cpu']:5.1f}%)  py-spy+thread CPU "
                          f"{r['cpu_seconds']:.3f} s  wall {r['wall_seconds']:.2f} s  bundle {r['bundle_bytes']} B"
                          f"{'  ' + r['unavailable'] if r['unavailable'] else ''}", flush=True)
    finally:
        target.stop()
        control.stop()
    for mode in args.modes.split(","):
        rows = [r for r in results if r["native"] == (mode == "native")]
        print(f"{mode:<12} median slowdown {100 * statistics.median(r['slowdown'] for r in rows):.1f}% "
              f"(per CPU s {100 * statistics.median(r['slowdown_per_cpu'] for r in rows):.1f}%), "
              f"CPU {statistics.median(r['cpu_seconds'] for r in rows):.3f} s, "
              f"wall {statistics.median(r['wall_seconds'] for r in rows):.2f} s over {len(rows)} rounds")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
