"""Time ``gpufeed report`` over 7 days x 32 GPUs in a real Prometheus (the issue's budget: <= 10 s), and at
fleet scale over the recording rules alone (4,096 GPUs x 30 days: <= 60 s, <= 1 GiB).

    python bench/fleet_report.py                  # 8 hosts x 4 GPUs, 60 s scrapes, 3 runs per case
    python bench/fleet_report.py --scrape 30 --runs 5
    python bench/fleet_report.py --scale 512,1024,2048 --days 30 --work /work/fleet-bench

``--scale``: the recording-rule series of 8-GPU hosts are written directly (bench/fleetscale.py: 5-minute rule
samples, known truth) in files of 16 hosts, each turned into blocks by ``promtool tsdb create-blocks-from
openmetrics`` and deleted, into one data folder that grows to each size in turn. At each size a prometheus
with the shipped recording file loaded (and no raw series) serves it, once its compaction of the overlapping
blocks is done; ``gpufeed report --source rules --range 30d`` runs against it (wall time and peak RSS of the
process, from wait4), and its fleet, per-state, per-cause and per-namespace totals are checked against the truth.

Builds the simulated fleet of tests/fleet (the shared scenarios' phases, causes changing over the week),
backfills it with promtool into two Debian prometheus servers on 127.0.0.1 (one with the shipped recording
rules and their history, one raw only: tests/fleet/harness.py), then runs the real ``gpufeed report`` command
for each case and prints the wall time of each run (process start to exit: Python start-up, queries,
figures, plots, files) and the query time gpufeed logs. Nothing is asserted; everything it starts is stopped.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fleetscale import BLOCK_S, GPUS_PER_HOST, PART_HOSTS, STEP_S, Truth, parts, write_part
from exporter.names import STATES, WAITING_CAUSES
from tests.fleet.fleetgen import scaled_plans
from tests.fleet.harness import RECORDING, backfilled_fleet, binary, start_prometheus

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


def _measured(argv: Sequence[str], log: Path) -> tuple[float, float]:
    """Run ``argv``; its wall seconds and peak RSS in MiB (wait4). Raises on a non-zero exit."""
    t0 = time.monotonic()
    with log.open("w") as fh:
        proc = subprocess.Popen(list(argv), stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{argv[0]} exited {proc.returncode}: {log.read_text()[-2000:]}")
    return time.monotonic() - t0, usage.ru_maxrss / 1024


def _overlapping(data: Path) -> bool:
    """Whether the data folder still holds blocks whose time ranges overlap (or a compaction in progress)."""
    metas = []
    for d in data.iterdir():
        if d.name.endswith(".tmp-for-creation") or d.name.endswith(".tmp-for-deletion"):
            return True
        if (d / "meta.json").exists():
            m = json.loads((d / "meta.json").read_text())
            metas.append((m["minTime"], m["maxTime"]))
    metas.sort()
    return any(b[0] < a[1] for a, b in itertools.pairwise(metas))


def _proc_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def _check(doc: dict[str, Any], truth: Truth) -> float:
    """The largest relative error of the report's totals against the truth (fleet, states, causes, namespaces)."""
    fb = doc["fleet"]["breakdown"]
    if (doc["fleet"]["gpus"], doc["fleet"]["hosts"]) != (truth.gpus, truth.hosts):
        raise SystemExit(f"GPUs/hosts: report {doc['fleet']['gpus']}/{doc['fleet']['hosts']}, "
                         f"truth {truth.gpus}/{truth.hosts}")
    pairs = [(fb["state_hours"][s], truth.total[s] / 3600) for s in STATES]
    pairs += [(fb["cause_hours"][c], truth.total[c] / 3600) for c in WAITING_CAUSES]
    groups = {g["name"]: g["breakdown"] for g in doc["groups"]}
    if set(groups) != set(truth.by_namespace):
        raise SystemExit(f"namespaces: report {len(groups)}, truth {len(truth.by_namespace)}")
    for ns, per in truth.by_namespace.items():
        pairs += [(groups[ns]["state_hours"][s], per[s] / 3600) for s in STATES]
        pairs += [(groups[ns]["cause_hours"][c], per[c] / 3600) for c in WAITING_CAUSES]
    rest = doc["unattributed"]["state_hours"]
    pairs += [(rest[s], (truth.total[s] - sum(p[s] for p in truth.by_namespace.values())) / 3600) for s in STATES]
    tl = doc["timeline"]["state_hours"]
    pairs += [(sum(tl[s]), truth.total[s] / 3600) for s in STATES]
    return float(max(abs(got - want) / want if want else abs(got) for got, want in pairs))


def scale(sizes: Sequence[int], days: int, work: Path, runs: int) -> None:
    prometheus, promtool = binary("prometheus"), binary("promtool")
    if prometheus is None or promtool is None:
        raise SystemExit("prometheus and promtool are needed (Debian package prometheus)")
    work.mkdir(parents=True, exist_ok=True)
    data = work / "data"
    data.mkdir(exist_ok=True)
    end = (int(time.time()) // BLOCK_S - 1) * BLOCK_S
    start = end - days * 86400
    truth, hosts_done, conv = Truth(), 0, {"write_s": 0.0, "promtool_s": 0.0, "promtool_mib": 0.0}
    print(f"range {days} days ending {end}; rule samples every {STEP_S} s; work folder {work}", flush=True)
    print("\n| GPUs | hosts | rule series | rule samples | blocks MiB | write s | promtool s (sum) | promtool peak MiB "
          "| compaction s | report wall s | report peak MiB | prometheus RSS MiB | max rel. error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for gpus in sizes:
        hosts = gpus // GPUS_PER_HOST
        for part in parts(hosts_done, hosts - hosts_done):
            om = work / "part.om"
            t0 = time.monotonic()
            truth.merge(write_part(om, part, start, end))
            conv["write_s"] += time.monotonic() - t0
            wall, rss = _measured([promtool, "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=1000h",
                                   "--quiet", str(om), str(data)], work / "promtool.log")
            conv["promtool_s"] += wall
            conv["promtool_mib"] = max(conv["promtool_mib"], rss)
            om.unlink()
        hosts_done = hosts
        blocks_mib = sum(f.stat().st_size for f in data.rglob("*") if f.is_file()) / 2**20
        t0 = time.monotonic()
        srv = start_prometheus(prometheus, data, [RECORDING], work, name=f"prom-{gpus}", eval_interval_s=STEP_S)
        try:
            while _overlapping(data) and time.monotonic() - t0 < 600:
                time.sleep(5)
            compaction = time.monotonic() - t0
            results = []
            for i in range(runs):
                out = work / f"report-{gpus}-{i}"
                results.append(_measured([sys.executable, "-m", "exporter", "report", "--prometheus", srv.url,
                                          "--range", f"{days}d", "--end", str(end), "--by", "namespace",
                                          "--source", "rules", "--out", str(out), "--log.level", "info"],
                                         work / f"report-{gpus}-{i}.log"))
            err = _check(json.loads((work / f"report-{gpus}-0" / "report.json").read_text()), truth)
            prom_rss = _proc_mib(srv.proc.pid, "VmHWM")
        finally:
            srv.stop()
        walls = sorted(r[0] for r in results)
        series = truth.gpus * (len(STATES) + len(WAITING_CAUSES)) + len(truth.by_namespace) * 8
        print(f"| {gpus:,} | {hosts:,} | {series:,} | {truth.samples:,} | {blocks_mib:,.0f} | {conv['write_s']:.0f} | "
              f"{conv['promtool_s']:.0f} | {conv['promtool_mib']:,.0f} | {compaction:.0f} | "
              f"{statistics.median(walls):.1f} (min {walls[0]:.1f}, max {walls[-1]:.1f}) | "
              f"{max(r[1] for r in results):,.0f} | {prom_rss:,.0f} | {err:.1e} |", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=8)
    p.add_argument("--gpus-per-host", type=int, default=4)
    p.add_argument("--scrape", type=int, default=60, help="scrape interval of the simulated fleet, seconds")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--scale", default="", metavar="GPUS,...",
                   help="fleet-scale mode: rule series only, these fleet sizes in turn (multiples of 128 GPUs)")
    p.add_argument("--days", type=int, default=30, help="--scale: days of history")
    p.add_argument("--work", type=Path, default=None, help="--scale: work folder (kept; needs the disk)")
    ns = p.parse_args(argv)
    if ns.scale:
        sizes = [int(x) for x in ns.scale.split(",")]
        if any(n % (GPUS_PER_HOST * PART_HOSTS) for n in sizes) or sizes != sorted(sizes):
            raise SystemExit("--scale: ascending multiples of 128 GPUs")
        scale(sizes, ns.days, ns.work or Path(tempfile.mkdtemp(prefix="gpufeed-bench-scale-")), ns.runs)
        return 0
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
