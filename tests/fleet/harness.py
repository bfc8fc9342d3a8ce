"""A real Prometheus over a backfilled week of a simulated fleet, and headless Chromium to look at the report.

``backfilled_fleet`` writes the fleet's series as OpenMetrics, turns them into TSDB blocks with ``promtool tsdb
create-blocks-from openmetrics``, and starts two Debian ``prometheus`` servers on 127.0.0.1:

- ``raw``: the raw series only, no rule files (the report must fall back to raw series and say so);
- ``rules``: the same blocks plus the history of the shipped recording rules the report reads, backfilled with
  ``promtool tsdb create-blocks-from rules`` in dependency order (promtool cannot backfill a rule that reads
  another rule in the same run: each level is evaluated against a server that already holds the previous
  one), and the shipped recording file loaded. (How the rules' history is built: ``backfill_rules``.)

Everything listens on 127.0.0.1, is bounded in time, and is stopped when the context exits. Used by
tests/fleet/test_integration.py, bench/fleet_report.py and tools/report_demo.py.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.fleet.fleetgen import LEAD_S, Fleet, HostPlan, write_file

REPO = Path(__file__).resolve().parents[2]
RECORDING = REPO / "alerts" / "gpufeed-recording.yml"
# The recording rules gpufeed report reads (exporter/fleet/collect.py) -- the only ones whose history is built.
REPORT_RULES = (
    "instance_gpu_state:gpufeed_gpu_state_seconds:rate5m",
    "instance_gpu_cause:gpufeed_gpu_waiting_seconds:rate5m",
    "namespace_state:gpufeed_gpu_state_seconds:rate5m",
    "namespace_cause:gpufeed_gpu_waiting_seconds:rate5m",
    "slurm_job_state:gpufeed_gpu_state_seconds:rate5m",
    "slurm_job_cause:gpufeed_gpu_waiting_seconds:rate5m",
    "instance_gpu_cause:gpufeed_gpu_waiting_joules:rate5m",
    "namespace_cause:gpufeed_gpu_waiting_joules:rate5m",
    "slurm_job_cause:gpufeed_gpu_waiting_joules:rate5m",
    "job:gpufeed_gpus_collective_wait:count",
)
EVAL_INTERVAL_S = 60
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")


class HarnessError(RuntimeError):
    """A tool of the harness failed; the message carries its output."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(argv: Sequence[str | Path], timeout: float) -> str:
    r = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, check=False)
    if r.returncode != 0:
        raise HarnessError(f"{Path(str(argv[0])).name} exited {r.returncode}: {(r.stdout + r.stderr)[-2000:]}")
    return r.stdout


@dataclass
class PromServer:
    """A running prometheus on 127.0.0.1."""

    url: str
    data: Path
    config: Path
    log: Path
    proc: subprocess.Popen[bytes]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:]) if self.log.exists() else ""


def start_prometheus(binary: str, data: Path, rule_files: Sequence[Path], workdir: Path, *, name: str,
                     port: int | None = None, eval_interval_s: int = EVAL_INTERVAL_S) -> PromServer:
    """Start prometheus over ``data`` with ``rule_files``; returns once /-/ready answers (30 s at most)."""
    port = port or free_port()
    config = workdir / f"{name}.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1m", "evaluation_interval": f"{eval_interval_s}s"},
        "rule_files": [str(f) for f in rule_files],
        "scrape_configs": [],
    }))
    log = workdir / f"{name}.log"
    with log.open("ab") as fh:
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={data}", f"--web.listen-address=127.0.0.1:{port}",
             "--storage.tsdb.retention.time=60d", "--log.level=warn"],
            stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir)
    server = PromServer(url=f"http://127.0.0.1:{port}", data=data, config=config, log=log, proc=proc)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise HarnessError(f"prometheus {name} exited {proc.returncode}: {server.tail()}")
        try:
            with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as r:
                if r.status == 200:
                    return server
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.2)
    server.stop()
    raise HarnessError(f"prometheus {name} not ready within 30 s: {server.tail()}")


def restart(binary: str, server: PromServer, rule_files: Sequence[Path], workdir: Path, name: str) -> PromServer:
    """Stop ``server`` and start it again on the same port and data (it loads new blocks at start)."""
    port = int(server.url.rsplit(":", 1)[1])
    server.stop()
    return start_prometheus(binary, server.data, rule_files, workdir, name=name, port=port)


def move_blocks(src: Path, dst: Path) -> int:
    """Move the TSDB blocks (ULID directories) of ``src`` into ``dst``; returns how many."""
    n = 0
    for block in sorted(src.iterdir()):
        if block.is_dir() and (block / "meta.json").exists():
            shutil.move(str(block), str(dst / block.name))
            n += 1
    return n


def rule_levels(recording: Path, names: Sequence[str]) -> list[list[dict[str, Any]]]:
    """The shipped rules ``names`` plus the rules they read, grouped by dependency level (level 0 reads only raw
    series), as they appear in ``recording``."""
    rules = {r["record"]: r for g in yaml.safe_load(recording.read_text())["groups"] for r in g["rules"]}
    level: dict[str, int] = {}

    def lvl(name: str) -> int:
        if name not in level:
            deps = [d for d in rules if d != name and re.search(rf"(?<![\w:]){re.escape(d)}(?![\w:])",
                                                                  rules[name]["expr"])]
            level[name] = 1 + max((lvl(d) for d in deps), default=-1)
        return level[name]

    for n in names:
        lvl(n)
    out: list[list[dict[str, Any]]] = [[] for _ in range(max(level.values()) + 1)]
    for name, lv in level.items():
        out[lv].append({"record": name, "expr": rules[name]["expr"]})
    return out


def _query_range(url: str, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    body = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"})
    req = urllib.request.Request(f"{url}/api/v1/query_range", data=body.encode(), method="POST",
                                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            doc = json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise HarnessError(f"query_range {expr!r}: {e.code} {e.read()[:500]!r}") from e
    result: list[dict[str, Any]] = doc["data"]["result"]
    return result


def backfill_rules(promtool: str, server: PromServer, rules: Sequence[dict[str, Any]], *, start: float, end: float,
                   workdir: Path, name: str) -> Path:
    """The history of ``rules`` over [start, end] as TSDB blocks under workdir/name (returned).

    What ``promtool tsdb create-blocks-from rules`` does -- each rule's expression as a range query at the
    evaluation interval, which is how the rule manager evaluates it -- but written as one block with
    ``create-blocks-from openmetrics``: promtool's rule backfiller writes one 2-hour block per rule (504
    blocks for six rules over a week, 18 s on two cores, and every later query opens all of them).
    """
    om = workdir / f"{name}.om"
    step = float(EVAL_INTERVAL_S)
    chunk = 10_000 * step  # Prometheus answers at most 11,000 points per series
    with om.open("w") as f:
        for rule in rules:
            f.write(f"# TYPE {rule['record']} unknown\n")
            series: dict[str, list[str]] = {}
            t = start
            while t <= end:
                for res in _query_range(server.url, rule["expr"], t, min(end, t + chunk - step), step):
                    labels = {k: v for k, v in res["metric"].items() if k != "__name__"}
                    key = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                    series.setdefault(key, []).extend(f"{v} {ts}" for ts, v in res["values"])
                t += chunk
            for key, points in series.items():
                f.writelines(f"{rule['record']}{{{key}}} {p}\n" for p in points)
        f.write("# EOF\n")
    out = workdir / name
    _run([promtool, "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=1000h", "--quiet", om, out],
         timeout=300)
    om.unlink()
    return out


@dataclass(frozen=True)
class _Part:
    plans: tuple[HostPlan, ...]
    start: float
    end: float
    scrape_s: int
    om: Path
    blocks: Path
    promtool: str


def _backfill_part(job: _Part) -> int:
    """Write the OpenMetrics of some hosts and turn it into one TSDB block; returns the number of samples."""
    n = write_file(Fleet(job.plans, job.start, job.end, scrape_s=job.scrape_s), job.om)
    # One block for the whole history: promtool reads the file once per block (2 h blocks: 84 passes a week).
    _run([job.promtool, "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=1000h", "--quiet", job.om,
          job.blocks], timeout=300)
    job.om.unlink()
    return n


@dataclass
class Backfilled:
    fleet: Fleet
    raw: PromServer
    rules: PromServer
    samples: int
    timings: dict[str, float]


def binary(name: str) -> str | None:
    return shutil.which(name)


@contextmanager
def backfilled_fleet(plans: Sequence[HostPlan], start: float, end: float, workdir: Path,
                     scrape_s: int = 60) -> Iterator[Backfilled]:
    """The fleet of ``plans`` over (start, end] in two running Prometheus servers (see the module doc)."""
    prometheus, promtool = binary("prometheus"), binary("promtool")
    if prometheus is None or promtool is None:
        raise HarnessError("prometheus and promtool are needed: Debian package prometheus (tools/ensure-test-deps.sh)")
    timings: dict[str, float] = {}
    t = time.monotonic()
    raw_data, rules_data = workdir / "raw-data", workdir / "rules-data"
    raw_data.mkdir()
    rules_data.mkdir()
    # The hosts in two halves, each written and converted by its own process (two cores: half the time).
    jobs = [_Part(tuple(plans[i::2]), start, end, scrape_s, workdir / f"part{i}.om", workdir / f"part{i}-blocks",
                  promtool) for i in range(2) if plans[i::2]]
    with ProcessPoolExecutor(max_workers=len(jobs)) as pool:
        pending = [pool.submit(_backfill_part, job) for job in jobs]
        fleet = Fleet(plans, start, end, scrape_s=scrape_s)  # the truth, meanwhile
        samples = sum(f.result() for f in pending)
    for job in jobs:
        shutil.copytree(job.blocks, rules_data, dirs_exist_ok=True)
        move_blocks(job.blocks, raw_data)
    timings["backfill_raw"] = time.monotonic() - t
    servers: list[PromServer] = []
    try:
        t = time.monotonic()
        raw = start_prometheus(prometheus, raw_data, [], workdir, name="prom-raw")
        servers.append(raw)
        levels = rule_levels(RECORDING, REPORT_RULES)
        source = raw
        lo, hi = start - LEAD_S, end + LEAD_S
        rules_srv: PromServer | None = None
        for i, level in enumerate(levels):
            out = backfill_rules(promtool, source, level, start=lo, end=hi, workdir=workdir, name=f"rules-level{i}")
            move_blocks(out, rules_data)
            if rules_srv is None:
                rules_srv = start_prometheus(prometheus, rules_data, [RECORDING], workdir, name="prom-rules")
                servers.append(rules_srv)
            else:
                servers.remove(rules_srv)
                rules_srv = restart(prometheus, rules_srv, [RECORDING], workdir, "prom-rules")
                servers.append(rules_srv)
            source = rules_srv
        assert rules_srv is not None
        timings["backfill_rules"] = time.monotonic() - t
        yield Backfilled(fleet=fleet, raw=raw, rules=rules_srv, samples=samples, timings=timings)
    finally:
        for s in servers:
            s.stop()


# --------------------------------------------------------------------------------------------------- chromium


def chromium_binary() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(html: Path, workdir: Path, *, screenshot: Path | None = None, size: tuple[int, int] = (1280, 1000),
             dump_dom: bool = False) -> str:
    """Open ``html`` in headless Chromium: take a screenshot, or print the DOM after load (returned)."""
    exe = chromium_binary()
    if exe is None:
        raise HarnessError("chromium not found: Debian package chromium (tools/ensure-test-deps.sh)")
    profile = workdir / f"chromium-profile-{time.monotonic_ns()}"
    profile.mkdir()
    argv = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
            "--hide-scrollbars"]
    if screenshot is not None:
        argv.append(f"--screenshot={screenshot}")
    if dump_dom:
        argv.append("--dump-dom")
    argv.append(html.resolve().as_uri())
    try:
        return _run(argv, timeout=90)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
