"""gpufeed report against a real Prometheus holding a backfilled week of a simulated fleet.

Five hosts, ten GPUs, three Kubernetes namespaces and two Slurm jobs, whose causes change over the week (the
shared scenarios' phases: input-bound loaders fixed on day 3, a riser at Gen3 x8 all week, an NFS-starved
Slurm job, a powersave governor, a throttled GPU, a NUMA-misplaced pod, an exporter down for six hours...)
are backfilled with promtool into two Debian ``prometheus`` servers on 127.0.0.1 (tests/fleet/harness.py):
one with the shipped recording rules and their history, one with raw series only. ``gpufeed report`` must
reproduce every figure of the truth the fleet was built from within 1%, say which source it used, fail
clearly where it must, and its page must render in headless Chromium with every section and plot.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from exporter.cli import main
from exporter.fleet.page import SECTIONS
from exporter.fleet.plots import CAUSE_COLORS, PLOTS, STATE_COLORS
from exporter.names import STATES, WAITING_CAUSES
from tests.fleet.fleetgen import Fleet, default_plans
from tests.fleet.harness import REPO, Backfilled, HarnessError, backfilled_fleet, chromium, chromium_binary

pytestmark = pytest.mark.integration

SCHEMA = json.loads((REPO / "docs" / "report.schema.json").read_text())
REL = 0.01  # the bar: every figure within 1% of the truth
ABS_H = 0.25  # and a quarter GPU-hour for figures near zero (a workload change is attributed at 5 m resolution)
# Per step, a rate5m rule carries up to 5 minutes of a change into the next step (each sample averages the
# 5 minutes before it): 0.1 GPU-hours is two GPUs changing state in the same step. The totals are exact.
STEP_ABS_H = 0.1


@dataclass
class Run:
    rc: int
    out: Path
    stdout: str
    stderr: str

    @property
    def json(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((self.out / "report.json").read_text())
        return doc


@pytest.fixture(scope="module")
def fleet_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backfilled]:
    end = (int(time.time()) // 3600 - 2) * 3600  # an hour boundary two hours ago
    work = tmp_path_factory.mktemp("fleet")
    try:
        with backfilled_fleet(default_plans(), end - 7 * 86400, end, work) as bf:
            yield bf
    except HarnessError as e:
        pytest.fail(str(e))


def report(bf: Backfilled, server: str, tmp: Path, capsys: pytest.CaptureFixture[str], *args: str) -> Run:
    url = bf.rules.url if server == "rules" else bf.raw.url
    out = tmp / f"report-{server}-{len(list(tmp.iterdir()))}"
    rc = main(["report", "--prometheus", url, "--end", str(int(bf.fleet.end)), "--out", str(out), *args])
    captured = capsys.readouterr()
    return Run(rc, out, captured.out, captured.err)


def close(got: float, want: float, what: str, abs_h: float = ABS_H) -> None:
    assert abs(got - want) <= max(REL * abs(want), abs_h), f"{what}: report {got:.3f} h, truth {want:.3f} h"


def _hours(fleet: Fleet, key: str, host: str | None = None) -> float:
    return fleet.truth_seconds(key, gpus=fleet.host_gpus(host) if host else None) / 3600


def check_figures(doc: dict[str, Any], fleet: Fleet) -> None:
    """Every GPU-hour figure of the JSON against the fleet's truth."""
    jsonschema.validate(doc, SCHEMA)
    f = doc["fleet"]
    assert f["gpus"] == sum(len(p.gpus) for p in fleet.plans) and f["hosts"] == len(fleet.plans)
    close(f["possible_gpu_hours"], f["gpus"] * 168, "possible GPU-hours", abs_h=1e-6)
    for s in STATES:
        close(f["breakdown"]["state_hours"][s], _hours(fleet, s), f"fleet {s}")
    for c in WAITING_CAUSES:
        close(f["breakdown"]["cause_hours"][c], _hours(fleet, c), f"fleet {c}")
    observed = sum(_hours(fleet, s) for s in STATES)
    close(f["breakdown"]["gpu_hours"], observed, "observed GPU-hours")
    assert abs(f["observed_share"] - observed / (f["gpus"] * 168)) < 0.001
    # The timeline, step by step.
    tl = doc["timeline"]
    assert len(tl["ends"]) == 168
    for i, end in enumerate(tl["ends"]):
        t1 = fleet.start + (i + 1) * 3600
        assert end == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t1))
        for s in STATES:
            close(tl["state_hours"][s][i], fleet.truth_seconds(s, t1 - 3600, t1) / 3600, f"{end} {s}", abs_h=STEP_ABS_H)
        for c in WAITING_CAUSES:
            close(tl["cause_hours"][c][i], fleet.truth_seconds(c, t1 - 3600, t1) / 3600, f"{end} {c}", abs_h=STEP_ABS_H)
    # Hosts, and the same hosts under their GPU model.
    for h in doc["hosts"]:
        name = h["instance"].split(":")[0]
        for s in STATES:
            close(h["breakdown"]["state_hours"][s], _hours(fleet, s, name), f"{name} {s}")
        for c in WAITING_CAUSES:
            close(h["breakdown"]["cause_hours"][c], _hours(fleet, c, name), f"{name} {c}")
    models = {p.name: p.model for p in fleet.plans}
    for m in doc["models"]:
        assert {h["instance"].split(":")[0] for h in m["per_host"]} == {n for n, mod in models.items()
                                                                        if mod == m["name"]}
        close(m["breakdown"]["state_hours"]["waiting"],
              sum(_hours(fleet, "waiting", n) for n, mod in models.items() if mod == m["name"]), m["name"])
    # Findings: how long each host had each one.
    truth = {k: v / 3600 for k, v in fleet.truth_findings().items()}
    got = {(x["instance"].split(":")[0], x["check"]): x["hours"] for x in doc["findings"]}
    assert set(got) == set(truth)
    for key, hours in truth.items():
        close(got[key], hours, f"finding {key}")
    # Idle gaps of the GPUs that waited most, bucket by bucket.
    for g in doc["idle_gaps"]:
        gpu = next(x for x in fleet.gpus if (fleet.instance(x.host), str(x.index)) == (g["instance"], g["gpu"]))
        for k, (got_n, want_n) in enumerate(zip(g["counts"], fleet.truth_gaps(gpu), strict=True)):
            assert abs(got_n - want_n) <= max(REL * want_n, 2.0), f"{g['instance']} GPU {g['gpu']} bucket {k}"
    # Energy spent waiting, per cause (the GPUs with an energy counter only), and its cost at the prices given.
    cost = doc["cost"]
    assert cost["energy_gpus"] == sum(len(p.gpus) for p in fleet.plans if p.energy) < f["gpus"]
    for row in cost["by_cause"]:
        close(row["waiting_kwh"], fleet.truth_joules(row["name"]) / 3.6e6, f"kWh {row['name']}", abs_h=0.01)
    close(cost["total"]["waiting_kwh"], sum(fleet.truth_joules(c) for c in WAITING_CAUSES) / 3.6e6, "kWh", abs_h=0.01)
    if cost["price_per_gpu_hour"] is not None:
        assert abs(cost["total"]["cost"] - (cost["total"]["waiting_hours"] * cost["price_per_gpu_hour"]
                                            + cost["total"]["waiting_kwh"] * cost["price_per_kwh"])) < 1e-6
    worst = sorted(fleet.gpus, key=lambda x: -fleet.truth_seconds("waiting", gpus=[x]))[:len(doc["idle_gaps"])]
    assert [(fleet.instance(x.host), str(x.index)) for x in worst] == [(g["instance"], g["gpu"])
                                                                       for g in doc["idle_gaps"]]


def check_groups(doc: dict[str, Any], fleet: Fleet, label: str) -> None:
    want_state = {s: fleet.truth_group(label, s) for s in STATES}
    want_cause = {c: fleet.truth_group(label, c) for c in WAITING_CAUSES}
    names = set(want_state["working"]) | set(want_state["waiting"]) | set(want_state["idle"])
    assert {g["name"] for g in doc["groups"]} == names
    for g in doc["groups"]:
        for s in STATES:
            close(g["breakdown"]["state_hours"][s], want_state[s].get(g["name"], 0.0) / 3600, f"{g['name']} {s}")
        for c in WAITING_CAUSES:
            close(g["breakdown"]["cause_hours"][c], want_cause[c].get(g["name"], 0.0) / 3600, f"{g['name']} {c}")
    waits = [g["breakdown"]["state_hours"]["waiting"] for g in doc["groups"]]
    assert waits == sorted(waits, reverse=True)
    want_kwh = {k: v / 3.6e6 for k, v in fleet.truth_group_joules(label).items()}
    for row in doc["cost"]["by_group"]:
        if not row["name"].startswith("(no "):
            close(row["waiting_kwh"], want_kwh.get(row["name"], 0.0), f"kWh {row['name']}", abs_h=0.01)
    rest = doc["unattributed"]
    total_state = {s: _hours(fleet, s) for s in STATES}
    for s in STATES:
        close(rest["state_hours"][s], total_state[s] - sum(want_state[s].values()) / 3600, f"no {label} {s}")


@pytest.fixture(scope="module")
def namespace_run(fleet_servers: Backfilled, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The real console entry point, as an operator runs it (a subprocess, stderr not a TTY)."""
    bf = fleet_servers
    out = tmp_path_factory.mktemp("namespace")
    r = subprocess.run([sys.executable, "-m", "exporter", "report", "--prometheus", bf.rules.url, "--range", "7d",
                        "--end", str(int(bf.fleet.end)), "--by", "namespace", "--out", str(out),
                        "--price-per-gpu-hour", "2.5", "--price-per-kwh", "0.3"],
                       capture_output=True, text=True, timeout=120, check=False)
    return Run(r.returncode, out, r.stdout, r.stderr)


def test_every_figure_by_namespace_matches_the_fleet_within_one_percent(namespace_run: Run,
                                                                      fleet_servers: Backfilled) -> None:
    assert namespace_run.rc == 0, namespace_run.stderr
    doc = namespace_run.json
    check_figures(doc, fleet_servers.fleet)
    check_groups(doc, fleet_servers.fleet, "namespace")
    assert {s["family"]: s["kind"] for s in doc["sources"]} == dict.fromkeys(
        ("gpu_state", "gpu_cause", "group_state", "group_cause"), "rules")
    assert "sources: gpu_state=rules, gpu_cause=rules, group_state=rules, group_cause=rules" in namespace_run.stdout
    assert "\r" not in namespace_run.stderr  # no progress line when stderr is not a terminal


def test_summary_names_the_figures_that_matter(namespace_run: Run, fleet_servers: Backfilled) -> None:
    doc = namespace_run.json
    fleet = fleet_servers.fleet
    waited = _hours(fleet, "waiting") / sum(_hours(fleet, s) for s in STATES)
    summary = doc["summary"]
    assert f"{waited * 100:.0f}% of GPU-hours waited" in summary
    top_cause = max(WAITING_CAUSES, key=lambda c: _hours(fleet, c))
    assert f"on storage I/O ({top_cause})" in summary if top_cause == "io_bound" else top_cause in summary
    assert "One host had a link at Gen3 x8 while busy (pcie_link_downgraded, 168 h in all)" in summary
    # gpu-d's Slurm jobs and the idle GPUs have no namespace: that bucket waited most, and is named as such.
    assert "was on GPUs no namespace held ((no namespace) in the tables)" in summary
    assert "of the namespaces, recsys waited most" in summary
    assert "The waiting drew " in summary and " kWh and cost " in summary
    assert "gpu-c:9842 worked 48% of its busy time against 96% on gpu-e:9842" in summary
    md = (namespace_run.out / "report.md").read_text()
    assert md.startswith("# GPU capacity review") and summary in md and "| recsys |" in md


def test_by_slurm_job_and_by_host(fleet_servers: Backfilled, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    bf = fleet_servers
    job = report(bf, "rules", tmp_path, capsys, "--by", "job")
    assert job.rc == 0, job.stderr
    check_groups(job.json, bf.fleet, "slurm_job_id")
    assert {g["name"] for g in job.json["groups"]} == {"4242", "4243"}
    assert job.json["groups"][0]["breakdown"]["dominant_cause"] == "io_bound"
    host = report(bf, "rules", tmp_path, capsys, "--by", "host")
    assert host.rc == 0, host.stderr
    doc = host.json
    assert doc["unattributed"] is None
    assert [g["name"] for g in doc["groups"]] == [h["instance"] for h in doc["hosts"]]
    assert [s["family"] for s in doc["sources"]] == ["gpu_state", "gpu_cause"]


def test_without_recording_rules_the_report_falls_back_to_raw_series_and_says_so(
        fleet_servers: Backfilled, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bf = fleet_servers
    run = report(bf, "raw", tmp_path, capsys, "--by", "namespace")
    assert run.rc == 0, run.stderr
    doc = run.json
    check_figures(doc, bf.fleet)
    check_groups(doc, bf.fleet, "namespace")
    assert {s["kind"] for s in doc["sources"]} == {"raw"}
    assert all("is not loaded on this Prometheus" in s["note"] for s in doc["sources"])
    assert "gpu_state=raw" in run.stdout and "is not loaded" in run.stdout
    html = (run.out / "report.html").read_text()
    assert "raw series" in html and "is not loaded on this Prometheus" in html


def test_compare_previous_gives_each_causes_change_against_the_period_before(
        fleet_servers: Backfilled, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bf = fleet_servers
    fleet = bf.fleet
    mid = fleet.start + 4 * 86400
    run = main(["report", "--prometheus", bf.rules.url, "--range", "2d", "--end", str(int(mid)), "--by", "namespace",
                "--compare", "previous", "--out", str(tmp_path / "cmp")])
    assert run == 0, capsys.readouterr().err
    doc = json.loads((tmp_path / "cmp" / "report.json").read_text())
    jsonschema.validate(doc, SCHEMA)
    c = doc["comparison"]
    assert c["previous_start"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(mid - 4 * 86400))
    assert c["previous_end"] == doc["range"]["start"]
    for d in c["by_cause"]:
        close(d["now"], fleet.truth_seconds(d["name"], mid - 2 * 86400, mid) / 3600, f"now {d['name']}")
        close(d["before"], fleet.truth_seconds(d["name"], mid - 4 * 86400, mid - 2 * 86400) / 3600,
              f"before {d['name']}")
    close(c["waiting_kwh"]["now"], sum(fleet.truth_joules(k, mid - 2 * 86400, mid) for k in WAITING_CAUSES) / 3.6e6,
          "kWh now", abs_h=0.01)
    assert "Against the period before" in doc["summary"]
    assert "Against the period before" in (tmp_path / "cmp" / "report.html").read_text()


def test_source_rules_without_rules_loaded_is_a_clear_error(fleet_servers: Backfilled, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    run = report(fleet_servers, "raw", tmp_path, capsys, "--source", "rules")
    assert run.rc == 6
    assert run.stderr.count("\n") == 1 and "instance_gpu_state:gpufeed_gpu_state_seconds:rate5m is not loaded" \
        in run.stderr and "alerts/gpufeed-recording.yml" in run.stderr
    assert not run.out.exists()


def test_a_range_with_no_gpufeed_data_is_a_clear_error(fleet_servers: Backfilled, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    bf = fleet_servers
    out = tmp_path / "empty"
    rc = main(["report", "--prometheus", bf.rules.url, "--end", str(int(bf.fleet.start - 86400)), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 5 and err.count("\n") == 1 and "no gpufeed data between" in err, err
    assert not out.exists()


def _png(path: Path) -> Any:
    from PIL import Image

    return Image.open(path).convert("RGB")


def _has_color(img: Any, hex_color: str, min_pixels: int = 200) -> bool:
    target = tuple(int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    hist = img.getcolors(maxcolors=1 << 20) or []
    found: int = sum(n for n, c in hist if all(abs(a - b) <= 6 for a, b in zip(c, target, strict=True)))
    return found >= min_pixels


def test_page_renders_in_headless_chromium_with_every_section_and_plot(namespace_run: Run, tmp_path: Path) -> None:
    if chromium_binary() is None:
        pytest.skip("Debian's chromium is not installed and could not be (tools/ensure-test-deps.sh needs root)")
    html = namespace_run.out / "report.html"
    text = html.read_text()
    # Self-contained: no script, no stylesheet, image, font or frame to fetch.
    for needle in ("<script", "<link", "<img", "<iframe", "@import", 'src="', 'href="http'):
        assert needle not in text, needle
    assert not re.search(r"url\(\s*['\"]?(?!#)", text), "a url() that is not a reference inside the page"
    dom = chromium(html, tmp_path, dump_dom=True)
    for section in SECTIONS:
        if section == "compare":  # only with --compare previous (tested on its own)
            assert namespace_run.json["comparison"] is None and f'<section id="{section}"' not in dom
            continue
        assert f'<section id="{section}"' in dom, section
    for key in PLOTS:
        start = dom.index(f'data-plot="{key}"')
        assert "<path" in dom[start:dom.index("</figure>", start)], f"plot {key} has no drawing"
    assert namespace_run.json["summary"][:120] in dom.replace("&amp;", "&")
    shot = tmp_path / "report.png"
    chromium(html, tmp_path, screenshot=shot, size=(1280, 7200))
    img = _png(shot)
    assert img.size == (1280, 7200)
    extrema = img.convert("L").getextrema()
    assert extrema[0] < 60 and extrema[1] > 240, "blank screenshot"
    for name, color in {**STATE_COLORS, **CAUSE_COLORS}.items():
        assert _has_color(img, color), f"no {name} ({color}) pixels: a plot did not paint"
    # The page is taller than one screen but not empty below the fold: its last section painted too.
    rows = [y for y in range(0, 7200, 40) if img.crop((0, y, 1280, y + 40)).convert("L").getextrema()[0] < 100]
    assert rows and rows[-1] > 4000


def _same(a: dict[str, Any], b: dict[str, Any], what: str, abs_h: float = 0.01) -> None:
    for part in ("state_hours", "cause_hours"):
        for k, v in b[part].items():
            close(a[part][k], v, f"{what} {k}", abs_h=abs_h)


def test_source_rules_reads_aggregates_and_gives_the_raw_paths_figures(fleet_servers: Backfilled, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--by", "namespace", "--price-per-gpu-hour", "2.5", "--price-per-kwh", "0.3")
    agg = report(fleet_servers, "rules", tmp_path, capsys, "--source", "rules", *args)
    raw = report(fleet_servers, "raw", tmp_path, capsys, "--source", "raw", *args)
    assert agg.rc == 0 and raw.rc == 0, agg.stderr + raw.stderr
    a, r = agg.json, raw.json
    check_figures(a, fleet_servers.fleet)
    check_groups(a, fleet_servers.fleet, "namespace")
    assert {s["kind"] for s in a["sources"]} == {"rules"} and {s["kind"] for s in r["sources"]} == {"raw"}
    _same(a["fleet"]["breakdown"], r["fleet"]["breakdown"], "fleet")
    assert (a["fleet"]["gpus"], a["fleet"]["hosts"]) == (r["fleet"]["gpus"], r["fleet"]["hosts"])
    assert [h["instance"] for h in a["hosts"]] == [h["instance"] for h in r["hosts"]]
    for ha, hr in zip(a["hosts"], r["hosts"], strict=True):
        _same(ha["breakdown"], hr["breakdown"], ha["instance"])
        assert ha["models"] == hr["models"] and ha["findings"] == hr["findings"]
    assert [g["name"] for g in a["groups"]] == [g["name"] for g in r["groups"]]
    for ga, gr in zip(a["groups"], r["groups"], strict=True):
        # The raw path joins owners on 5-minute increases, the rules on rate5m: a workload change lands in
        # either side's 5 minutes (both are checked against the truth above).
        _same(ga["breakdown"], gr["breakdown"], ga["name"], abs_h=ABS_H)
    assert [(f["instance"], f["check"], f["episodes"]) for f in a["findings"]] == [
        (f["instance"], f["check"], f["episodes"]) for f in r["findings"]]
    for fa, fr in zip(a["findings"], r["findings"], strict=True):
        close(fa["hours"], fr["hours"], f"finding {fa['instance']} {fa['check']}")
    assert [m["name"] for m in a["models"]] == [m["name"] for m in r["models"]]
    assert [(g["instance"], g["gpu"], g["counts"]) for g in a["idle_gaps"]] == [
        (g["instance"], g["gpu"], g["counts"]) for g in r["idle_gaps"]]
    close(a["cost"]["total"]["cost"], r["cost"]["total"]["cost"], "cost of waiting")


def test_source_rules_asks_for_aggregates_not_per_gpu_steps(fleet_servers: Backfilled) -> None:
    """Count what each query returns: the range queries (per step) return a series per state, cause or host with
    a finding, never one per GPU; per-GPU figures come from instant queries, one number per GPU and label."""
    from exporter.fleet.collect import CollectOptions, collect
    from exporter.fleet.model import Window
    from exporter.fleet.promapi import HttpOptions, PrometheusClient, Sample, Series

    asked: list[tuple[str, bool, int, int]] = []  # expr, ranged, series, points

    class Counting(PrometheusClient):
        def query(self, expr: str, at: float) -> list[Sample]:
            res = super().query(expr, at)
            asked.append((expr, False, len(res), len(res)))
            return res

        def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
            res = super().query_range(expr, start, end, step)
            asked.append((expr, True, len(res), sum(len(s.points) for s in res)))
            return res

    fleet = fleet_servers.fleet
    gpus = sum(len(p.gpus) for p in fleet.plans)
    window = Window(fleet.start, fleet.end, 3600)
    data = collect(Counting(fleet_servers.rules.url, HttpOptions()),
                   CollectOptions(window=window, by="namespace", source="rules"))
    assert len(data.state_s) == gpus and all(len(v) == 1 for per in data.state_s.values() for v in per.values())
    ranged = [(e, n) for e, is_range, n, _ in asked if is_range]
    finding_hosts = {tr.gpu.instance for tr in data.findings}
    for expr, n in ranged:
        if "gpufeed_finding" in expr or "instance=~" in expr:
            # Sparse: the findings, and the per-step weights of the hosts that had one only.
            assert "instance=~" not in expr or n <= sum(len(p.gpus) for p in fleet.plans
                                                        if fleet.instance(p) in finding_hosts)
        else:
            assert n <= max(len(STATES), len(WAITING_CAUSES)), expr
    assert any(not r and "sum by (job, instance, gpu, state)" in e for e, r, _, _ in asked)
    # The dense queries: fewer points than one per-GPU series of steps per state would be (the sparse ones above,
    # bounded by the hosts with a finding, and the stragglers' per-job series aside).
    dense = [p for e, r, _, p in asked if r and not ("gpufeed_finding" in e or "instance=~" in e or "job_id" in e)]
    assert sum(dense) < gpus * len(STATES) * window.steps
