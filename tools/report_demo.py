#!/usr/bin/env python3
"""Try ``gpufeed report`` without a fleet: a simulated week of ten GPUs in a real Prometheus, the report, a picture.

    python tools/report_demo.py                                  # report in /tmp/gpufeed-report-demo
    python tools/report_demo.py --screenshot docs/report.png     # also the README's picture (headless Chromium)
    python tools/report_demo.py --serve 30                       # keep both Prometheus servers up for 30 min

Run it with the Python gpufeed's report is installed in (``pip install '.[report]'`` in this clone); started
with another one, it re-runs itself with the clone's ``.venv`` when there is one, and otherwise says how to make
one.

Builds the fleet of tests/fleet (five hosts, three namespaces, two Slurm jobs, causes changing over the week),
backfills it into two Debian prometheus servers on 127.0.0.1 (with the shipped recording rules, and raw only:
tests/fleet/harness.py), runs ``gpufeed report --by namespace`` against the first, and stops everything at
the end (or after --serve minutes, or on Ctrl-C). Needs Debian's prometheus (promtool) and, for
--screenshot, chromium (tools/ensure-test-deps.sh installs both).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NEEDED = ("structlog", "yaml", "prometheus_client", "matplotlib")  # gpufeed with its report extra


def _python_with_gpufeed() -> None:
    """Return when this Python has what the report needs; else re-run in the clone's .venv, or say how."""
    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if not missing:
        return
    venv = REPO / ".venv" / "bin" / "python"
    if venv.is_file() and Path(sys.prefix).resolve() != (REPO / ".venv").resolve():
        os.execv(venv, [str(venv), str(Path(__file__).resolve()), *sys.argv[1:]])
    sys.exit(f"tools/report_demo.py: this Python ({sys.executable}) lacks {', '.join(missing)}. From the clone:\n"
             "  python3 -m venv .venv && .venv/bin/pip install '.[report]' && .venv/bin/python tools/report_demo.py")


_python_with_gpufeed()
sys.path.insert(0, str(REPO))

from tests.fleet.fleetgen import default_plans  # noqa: E402 -- after the check above
from tests.fleet.harness import backfilled_fleet, chromium  # noqa: E402

MAX_SERVE_MINUTES = 120


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "gpufeed-report-demo")
    p.add_argument("--by", default="namespace", choices=("namespace", "job", "host"))
    p.add_argument("--screenshot", type=Path, help="write a PNG of the top of the page here")
    p.add_argument("--height", type=int, default=1900, help="height of the screenshot in pixels")
    p.add_argument("--width", type=int, default=1400, help="width of the screenshot in pixels")
    p.add_argument("--serve", type=float, default=0.0, metavar="MINUTES",
                   help=f"keep the Prometheus servers running this long (at most {MAX_SERVE_MINUTES})")
    ns = p.parse_args(argv)
    end = (int(time.time()) // 3600 - 2) * 3600
    with tempfile.TemporaryDirectory(prefix="gpufeed-report-demo-") as tmp, \
            backfilled_fleet(default_plans(), end - 7 * 86400, end, Path(tmp)) as bf:
        print(f"Prometheus with the recording rules: {bf.rules.url}\nPrometheus with raw series only:    {bf.raw.url}")
        r = subprocess.run([sys.executable, "-m", "exporter", "report", "--prometheus", bf.rules.url, "--range", "7d",
                            "--end", str(end), "--by", ns.by, "--out", str(ns.out), "--price-per-gpu-hour", "2.5",
                            "--price-per-kwh", "0.3"], check=False, timeout=300)
        if r.returncode != 0:
            return r.returncode
        if ns.screenshot is not None:
            chromium(ns.out / "report.html", Path(tmp), screenshot=ns.screenshot, size=(ns.width, ns.height))
            print(f"screenshot: {ns.screenshot}")
        if ns.serve > 0:
            minutes = min(ns.serve, MAX_SERVE_MINUTES)
            print(f"serving for {minutes:g} min (Ctrl-C stops): gpufeed report --prometheus {bf.rules.url} "
                  f"--end {end} --by job")
            with contextlib.suppress(KeyboardInterrupt):
                time.sleep(minutes * 60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
