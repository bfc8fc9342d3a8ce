"""Time ``gpufeed report`` over 7 days x 32 GPUs in a real Prometheus (the issue's budget: <= 10 s).

    python bench/fleet_report.py                  # 8 hosts x 4 GPUs, 60 s scrapes, 3 runs per case
    python bench/fleet_report.py --scrape 30 --runs 5

Builds the simulated fleet of tests/fleet (the shared scenarios' phases, causes changing over the week),
backfills it with promtool into two Debian prometheus servers on 127.0.0.1 (one with the shipped recording
rules and their history, one raw only: tests/fleet/harness.py), then runs the real ``gpufeed report`` command
for each case and prints the wall time of each run (process start to exit: Python start-up, queries,
figures, plots, files) and the query time gpufeed logs. Nothing is asserted; everything it starts is stopped.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fleet.fleetgen import scaled_plans
from tests.fleet.harness import backfilled_fleet

CASES = (("rules", "namespace"), ("rules", "host"), ("rules", "job"), ("raw", "namespace"), ("raw", "host"))


def _run(url: str, end: float, by: str, out: Path) -> tuple[float, float, str]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "exporter", "report", "--prometheus", url, "--range", "7d",
                        "--end", str(int(end)), "--by", by, "--out", str(out), "--log.level", "info"],
                       capture_output=True, text=True, timeout=300, check=False)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"gpufeed report failed ({r.returncode}): {r.stderr}")
    query = next(float(part.split("=")[1]) for line in r.stderr.splitlines() if "report_written" in line
                 for part in line.split() if part.startswith("query_seconds="))
    sources = ",".join(sorted({s["kind"] for s in json.loads((out / "report.json").read_text())["sources"]}))
    return wall, query, sources


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=8)
    p.add_argument("--gpus-per-host", type=int, default=4)
    p.add_argument("--scrape", type=int, default=60, help="scrape interval of the simulated fleet, seconds")
    p.add_argument("--runs", type=int, default=3)
    ns = p.parse_args(argv)
    end = (int(time.time()) // 3600 - 2) * 3600
    with tempfile.TemporaryDirectory(prefix="gpufeed-bench-report-") as tmp:
        work = Path(tmp)
        t0 = time.monotonic()
        with backfilled_fleet(scaled_plans(ns.hosts, ns.gpus_per_host), end - 7 * 86400, end, work,
                              scrape_s=ns.scrape) as bf:
            gpus = ns.hosts * ns.gpus_per_host
            print(f"fleet: {ns.hosts} hosts x {ns.gpus_per_host} GPUs = {gpus} GPUs, 7 days, {ns.scrape} s scrapes, "
                  f"{bf.samples:,} raw samples; backfilled in {time.monotonic() - t0:.0f} s "
                  f"({', '.join(f'{k} {v:.0f} s' for k, v in bf.timings.items())})")
            print(f"\n| server | --by | source | wall s (median of {ns.runs}) | min | max | queries s |")
            print("|---|---|---|---|---|---|---|")
            for server, by in CASES:
                url = bf.rules.url if server == "rules" else bf.raw.url
                runs = [_run(url, bf.fleet.end, by, work / f"out-{server}-{by}-{i}") for i in range(ns.runs)]
                walls = [r[0] for r in runs]
                print(f"| {server} | {by} | {runs[0][2]} | {statistics.median(walls):.1f} | {min(walls):.1f} | "
                      f"{max(walls):.1f} | {statistics.median(r[1] for r in runs):.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
