"""CI smoke of every benchmark: each runs for a second or two against the real daemon (and node_exporter,
stress-ng where installed) and must produce a well-formed result and leave no process behind.

Never asserts a measured number against a budget: CI machines are not benchmark machines.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import procs, procstat
from bench.common import Context, Options
from bench.report import Section
from bench.run import BENCHMARKS

REPO = Path(__file__).resolve().parent.parent.parent
needs_node_exporter = pytest.mark.skipif(procs.node_exporter_binary() is None, reason="node_exporter not installed")


@pytest.fixture(scope="module")
def ctx() -> Context:
    return Context()


@pytest.fixture
def opts() -> Options:
    # The harness's smoke sizes (what `bench/run.py --smoke` runs, below), shortened where a test needs each code
    # path once: half-second warm-ups and one-second windows still scrape, sample and fit several times.
    return dataclasses.replace(Options.smoke_options(), warmup=0.5, deep_warmup=0.5, overhead_seconds=1.0,
                               fidelity_seconds=1.0, samework_seconds=1.0, soak_seconds=3.0, series_settle=0.5)


@pytest.fixture(autouse=True)
def no_leftover_processes() -> Iterator[None]:
    before = set(procstat.children(os.getpid()))
    yield
    left = set(procstat.children(os.getpid())) - before
    assert not left, f"benchmark left processes running: {sorted(left)}"


def well_formed(sec: Section) -> None:
    assert sec.error is None, sec.error
    assert sec.rows, "no figures"
    for row in sec.rows:
        assert row.measure.strip() and row.value.strip()
        assert "nan" not in row.value.lower().split(), row
        if row.budget:
            assert isinstance(row.met, bool), row


def test_overhead_smoke_measures_the_daemon_pid_in_each_configuration(ctx: Context, opts: Options) -> None:
    sec = BENCHMARKS["overhead"](ctx, opts)
    well_formed(sec)
    configs = [v for v in sec.raw.values() if isinstance(v, dict) and "cpu_pct" in v]
    assert len(configs) == 2
    (breakdown,) = [v for k, v in sec.raw.items() if k.startswith("breakdown")]
    assert breakdown["parts"], "no sampler was charged any CPU"
    assert all(v >= 0 for v in breakdown["parts"].values())
    assert breakdown["total_s"] >= 0 and breakdown["wall_s"] > 0
    if shutil.which("cc") or shutil.which("gcc"):  # the simulation-only share, against the real binding's floor
        costs = sec.raw["nvml_per_call_s"]
        assert costs["fake"]["nvmlDeviceGetFieldValues"] > 0 and costs["real"]["nvmlDeviceGetFieldValues"] > 0
        assert breakdown["nvml_calls"]["nvmlDeviceGetFieldValues"] > 0
        share = breakdown["simulation_share_s"]
        assert share["reload"] > 0, "the probe charged the fake's state exchange"
    for r in configs:
        assert r["cpu_pct"] >= 0 and r["wall_s"] > 0
        assert r["rss_end"] > 1_000_000  # a Python daemon is never under 1 MB
        assert r["series"] > 0
        assert r["scrapes"] >= 1


@needs_node_exporter
def test_latency_smoke_times_both_exporters_at_every_level(ctx: Context, opts: Options) -> None:
    sec = BENCHMARKS["latency"](ctx, opts)
    well_formed(sec)
    for level in opts.latency_levels:
        for mode in ("prometheus", "text"):
            pair = sec.raw[f"{mode}/{level}"]
            for name in ("gpufeed", "node_exporter"):
                assert pair[name]["n"] > 0, (mode, level, name)
                assert pair[name]["p50"] <= pair[name]["p99"]
                assert pair[name]["bytes_per_req"] > 0
    # Where the CPUs were kept awake, the one-scraper levels were measured once more with them free to halt.
    assert isinstance(sec.raw["cpus_awake"], bool)
    for mode in ("prometheus", "text"):
        assert (f"{mode}/1, idle CPUs halting" in sec.raw) == sec.raw["cpus_awake"]


def test_fidelity_smoke_reads_sample_timestamps_from_the_real_daemon(ctx: Context, opts: Options) -> None:
    sec = BENCHMARKS["fidelity"](ctx, opts)
    well_formed(sec)
    idle = sec.raw["no burner"]
    assert idle["samples"] > 0, "no sampler intervals in the window"
    assert idle["per_sampler"], "no fast samplers dumped"
    assert 0.5 < idle["ratio_p50"] < 2.0  # an interval of the right order, not a unit error
    if shutil.which("stress-ng"):
        assert any(k != "no burner" for k in sec.raw if k != "elapsed_s"), sec.notes


@needs_node_exporter
def test_samework_smoke_measures_both_processes_over_one_window(ctx: Context, opts: Options) -> None:
    sec = BENCHMARKS["samework"](ctx, opts)
    well_formed(sec)
    assert sec.raw["gpufeed_scrapes"] > 0 and sec.raw["node_exporter_scrapes"] > 0
    assert sec.raw["gpufeed_series"] > 0 and sec.raw["node_exporter_series"] > 0
    assert sec.raw["gpufeed_cpu_pct"] >= 0 and sec.raw["node_exporter_cpu_pct"] >= 0


def test_series_smoke_counts_a_scenario(ctx: Context, opts: Options) -> None:
    sec = BENCHMARKS["series"](ctx, opts)
    well_formed(sec)
    if ctx.simulate:
        (counts,) = [v for k, v in sec.raw.items() if k != "elapsed_s"]
        assert counts["total"] == counts["host"] + sum(counts["per_gpu"].values())
        assert len(counts["per_gpu"]) == counts["gpus"]


def test_soak_smoke_samples_rss_over_time(ctx: Context, opts: Options) -> None:
    sec = BENCHMARKS["soak"](ctx, opts)
    well_formed(sec)
    samples = sec.raw["samples"]
    assert len(samples) >= 3
    assert all(rss > 0 for _, rss in samples)
    assert [t for t, _ in samples] == sorted(t for t, _ in samples)
    assert not math.isnan(sec.raw["slope_bytes_per_s"])
    # The daemon ran under the probe: its collections were timed from the warm-up's end, and the end's own full one.
    assert len(sec.raw["gc_full_now"]) == 1 and sec.raw["gc_full_now"][0][0] > 0
    assert sec.raw["gc_all"]["count"] == sum(v["count"] for v in sec.raw["gc"].values())


def test_verdicts_smoke_plays_a_shared_scenario_and_times_each_expected_verdict(ctx: Context, opts: Options) -> None:
    sec = BENCHMARKS["verdicts"](ctx, opts)
    well_formed(sec)
    found = sec.raw["latencies"]
    assert found and {x["scenario"] for x in found} == {"launch_bound"}
    assert all(x["seconds"] is not None and 0 < x["seconds"] <= 15 for x in found), found  # each settled


@needs_node_exporter
def test_run_py_prints_the_table_and_writes_raw_json_without_touching_the_docs(tmp_path: Path) -> None:
    doc = REPO / "docs" / "benchmarks.md"
    before = doc.read_bytes() if doc.exists() else None
    out = tmp_path / "raw.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), "--smoke", "--only", "samework", "--json", str(out)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "### Same work as node_exporter" in proc.stdout
    assert "| logical CPUs |" in proc.stdout
    raw = json.loads(out.read_text())
    assert raw["sections"]["samework"]["rows"]
    assert (doc.read_bytes() if doc.exists() else None) == before, "a smoke run must not rewrite the figures"


def test_run_py_rejects_unknown_benchmarks_and_unbounded_soaks() -> None:
    for args in (["--only", "nope"], ["--soak-minutes", "120"], ["--soak-speed", "0.5"]):
        proc = subprocess.run([sys.executable, str(REPO / "bench" / "run.py"), *args],
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode != 0
        assert proc.stderr.strip()
