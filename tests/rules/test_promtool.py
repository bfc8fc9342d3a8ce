"""The shipped Prometheus rules: generated, valid, documented, and unit-tested both ways by promtool."""

from __future__ import annotations

import collections
import concurrent.futures
import importlib.util
import re
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from exporter.names import SEVERITIES
from tests.rules.conftest import ALERTS, REPO

RULE_FILES = (ALERTS / "gpufeed-alerts.yml", ALERTS / "gpufeed-recording.yml")
TEST_FILES = sorted((ALERTS / "tests").glob("*.test.yml"))
RUNBOOKS = REPO / "docs" / "runbooks.md"


def _rules(kind: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for f in RULE_FILES:
        for group in yaml.safe_load(f.read_text())["groups"]:
            out.extend(r for r in group["rules"] if kind in r)
    return out


def _promtool(promtool: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *map(str, args)], capture_output=True, text=True, timeout=120, check=False)


def test_committed_rule_files_are_what_the_generator_emits() -> None:
    r = subprocess.run([sys.executable, str(ALERTS / "generate.py"), "--check"], capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 0, r.stderr


def test_shipped_rule_files_pass_promtool_check(promtool: str) -> None:
    r = _promtool(promtool, "check", "rules", *RULE_FILES)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout
    # Lint findings (duplicate rules) print FAILED and still exit 0: a newcomer's first check must be clean.
    assert "FAILED" not in r.stdout + r.stderr and "lint error" not in r.stdout + r.stderr, r.stdout + r.stderr


def test_promtool_unit_tests_of_every_rule_pass(promtool: str) -> None:
    assert TEST_FILES, "no promtool test files under alerts/tests"
    # One promtool per file, two at a time: promtool evaluates its files one after the other on one core.
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        runs = list(pool.map(lambda f: (f, _promtool(promtool, "test", "rules", f)), TEST_FILES))
    failed = [f"{f.name}:\n{r.stdout}{r.stderr}" for f, r in runs if r.returncode != 0]
    assert failed == [], "\n".join(failed)


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for f in TEST_FILES:
        for case in yaml.safe_load(f.read_text())["tests"]:
            for t in case.get("alert_rule_test", []):
                (firing if t.get("exp_alerts") else silent).add(t["alertname"])
    names = {r["alert"] for r in _rules("alert")}
    assert names - firing == set(), "alerts without a firing promtool test"
    assert names - silent == set(), "alerts without a not-firing promtool test"


def test_every_recording_rule_is_evaluated_by_a_promtool_test() -> None:
    exprs = " ".join(
        t["expr"] for f in TEST_FILES for case in yaml.safe_load(f.read_text())["tests"]
        for t in case.get("promql_expr_test", [])
    )
    untested = [r["record"] for r in _rules("record") if r["record"] not in exprs]
    assert untested == []


def test_every_alert_has_for_severity_summary_description_and_a_runbook_section() -> None:
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", line[3:].strip().lower()).replace(" ", "-")
        for line in RUNBOOKS.read_text().splitlines() if line.startswith("## ")
    }
    for rule in _rules("alert"):
        name = rule["alert"]
        assert re.fullmatch(r"[0-9]+[smh]", rule["for"]), name
        assert rule["labels"]["severity"] in SEVERITIES, name
        ann = rule["annotations"]
        assert ann["summary"] and "{{ $labels.instance }}" in ann["description"], name
        url = ann["runbook_url"]
        assert url.endswith("#" + name.lower()), name
        # The default: the alerting gpufeed's own /runbooks page (a down one's: another gpufeed of its job).
        host = "{{$labels.instance}}" if name != "GpufeedTargetDown" else (
            "{{ with printf `up{job=%q} == 1` $labels.job | query }}{{ . | first | label `instance` }}"
            "{{ else }}{{ $labels.instance }}{{ end }}")
        assert url == f"http://{host}/runbooks#{name.lower()}", name
        assert name.lower() in anchors, f"docs/runbooks.md has no section '## {name}'"


def test_every_alert_keeps_instance_and_its_runbook_url_renders_to_that_gpufeeds_page() -> None:
    """The default runbook_url is http://<instance>/runbooks: an alert whose expression dropped instance (an
    aggregation without it) would link nowhere. Each alert's firing promtool tests expect its instance label and
    the rendered link (promtool renders the annotation templates)."""
    checked: dict[str, int] = {}
    for f in TEST_FILES:
        for case in yaml.safe_load(f.read_text())["tests"]:
            for t in case.get("alert_rule_test", []):
                for exp in t.get("exp_alerts") or []:
                    name, instance = t["alertname"], exp["exp_labels"].get("instance")
                    assert instance, f"{f.name}: {name} fires without an instance label"
                    url = exp["exp_annotations"]["runbook_url"]
                    host = urllib.parse.urlsplit(url).netloc
                    assert url == f"http://{host}/runbooks#{name.lower()}", (f.name, name, url)
                    if name != "GpufeedTargetDown":
                        assert host == instance, (f.name, name, url)
                    checked[name] = checked.get(name, 0) + 1
    assert set(checked) == {r["alert"] for r in _rules("alert")}
    rules = collections.Counter(r["alert"] for r in _rules("alert"))
    assert [n for n, count in rules.items() if checked[n] < count] == [], "a rule of an alert never fires in a test"


def test_paging_alerts_wait_long_enough_to_ignore_idle_link_flaps_and_blips() -> None:
    minutes = {"s": 1 / 60, "m": 1, "h": 60}
    by_name = {r["alert"]: r for r in _rules("alert")}
    link = by_name["GpufeedPCIeLinkDowngraded"]
    assert int(link["for"][:-1]) * minutes[link["for"][-1]] >= 10
    # Load-aware: the rule itself requires the GPU to be in use, not only the exporter's gauge.
    assert 'state!="idle"' in link["expr"]


def test_a_changed_threshold_makes_the_promtool_tests_fail(promtool: str, tmp_path: Path) -> None:
    """The unit tests pin the shipped numbers: regenerating with other thresholds must break them."""
    override = tmp_path / "mine.yaml"
    override.write_text("gpu_starved: {min_waiting_ratio: 0.7}\npcie_link_downgraded: {min_in_use_ratio: 0.1}\n")
    out = tmp_path / "rules"
    r = subprocess.run([sys.executable, str(ALERTS / "generate.py"), "--thresholds", str(override), "--out",
                        str(out)], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    (out / "tests").mkdir()
    for f in TEST_FILES:
        shutil.copy(f, out / "tests" / f.name)
    res = _promtool(promtool, "test", "rules", out / "tests" / "gpu.test.yml", out / "tests" / "pcie.test.yml")
    assert res.returncode != 0
    report = res.stdout + res.stderr
    assert "GpufeedGPUStarved" in report and "GpufeedPCIeLinkDowngraded" in report


def test_unknown_or_malformed_threshold_override_is_rejected_naming_the_key(tmp_path: Path) -> None:
    for text, needle in (("gpu_starvd: {for: 5m}\n", "gpu_starvd"), ("gpu_starved: {for: soon}\n", "gpu_starved.for"),
                         ("gpu_lost: {severity: page}\n", "gpu_lost.severity")):
        f = tmp_path / "bad.yaml"
        f.write_text(text)
        r = subprocess.run([sys.executable, str(ALERTS / "generate.py"), "--thresholds", str(f), "--check"],
                           capture_output=True, text=True, timeout=60, check=False)
        assert r.returncode == 2 and needle in r.stderr, (text, r.stderr)


def _generate(tmp_path: Path, *args: str, thresholds: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(ALERTS / "generate.py"), "--out", str(tmp_path / "rules"), *args]
    if thresholds is not None:
        (tmp_path / "mine.yaml").write_text(thresholds)
        cmd += ["--thresholds", str(tmp_path / "mine.yaml")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def _generated(tmp_path: Path, kind: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for name in ("gpufeed-alerts.yml", "gpufeed-recording.yml"):
        for group in yaml.safe_load((tmp_path / "rules" / name).read_text())["groups"]:
            out.extend(r for r in group["rules"] if kind in r)
    return out


def test_runbook_base_url_is_configurable_and_every_alert_links_below_it(tmp_path: Path) -> None:
    base = "https://wiki.example.com/gpufeed/runbooks"
    r = _generate(tmp_path, "--runbook-base-url", base)
    assert r.returncode == 0 and "placeholder" not in r.stderr, r.stderr
    urls = {a["alert"]: a["annotations"]["runbook_url"] for a in _generated(tmp_path, "alert")}
    assert urls and all(u == f"{base}#{name.lower()}" for name, u in urls.items()), urls


def test_the_https_form_of_the_instance_runbook_url_is_accepted(tmp_path: Path) -> None:
    r = _generate(tmp_path, thresholds="runbook_base_url: 'https://{{$labels.instance}}/runbooks'\n")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    urls = {a["alert"]: a["annotations"]["runbook_url"] for a in _generated(tmp_path, "alert")}
    assert urls["GpufeedGPULost"] == "https://{{$labels.instance}}/runbooks#gpufeedgpulost"
    assert urls["GpufeedTargetDown"].startswith("https://{{ with printf `up{job=%q} == 1` $labels.job | query }}")


def test_relative_or_malformed_runbook_base_url_is_refused_naming_the_key(tmp_path: Path) -> None:
    for value, needle in (("docs/runbooks.md", "absolute"), ("ftp://host/runbooks", "absolute"),
                          ("https:///runbooks", "absolute"), ("https://wiki/runbooks#top", "fragment"),
                          ("https://wiki/run books", "spaces"), ("https://{{$labels.job}}/runbooks", "absolute"),
                          ("http://{{$labels.instance}}/docs", "absolute"),
                          ("http://{{ $labels.instance }}/runbooks", "spaces")):
        r = _generate(tmp_path, thresholds=f"runbook_base_url: '{value}'\n")
        assert r.returncode == 2 and "runbook_base_url" in r.stderr and needle in r.stderr, (value, r.stderr)
    r = _generate(tmp_path, "--runbook-base-url", "runbooks.md")
    assert r.returncode == 2 and "--runbook-base-url" in r.stderr, r.stderr


def test_aggregation_labels_go_into_every_recording_rule_and_keep_every_rule_name(tmp_path: Path) -> None:
    r = _generate(tmp_path, thresholds="aggregation_labels: [cluster, region]\n")
    assert r.returncode == 0, r.stderr
    records = _generated(tmp_path, "record")
    assert [x["record"] for x in records] == [x["record"] for x in _rules("record")]
    for rule in records:
        clauses = re.findall(r"\b(?:by|on) \(([^)]*)\)", rule["expr"])
        assert clauses and all(c.startswith("cluster, region, ") for c in clauses), rule
    r = _generate(tmp_path, thresholds="aggregation_labels: []\n")
    assert r.returncode == 0, r.stderr
    assert all("cluster" not in x["expr"] for x in _generated(tmp_path, "record"))


def test_bad_aggregation_labels_are_refused_naming_the_key(tmp_path: Path) -> None:
    for value, needle in (("[job]", "already kept"), ("[1cluster]", "not a label name"), ("cluster", "list"),
                          ("[__name__]", "not a label name"), ("[cluster, cluster]", "duplicate")):
        r = _generate(tmp_path, thresholds=f"aggregation_labels: {value}\n")
        assert r.returncode == 2 and "aggregation_labels" in r.stderr and needle in r.stderr, (value, r.stderr)


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpufeed_alerts_generate", ALERTS / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


S = 'cluster="a"'


@pytest.mark.parametrize(("expr", "want"), [
    ("gpufeed_gpu_lost == 1", f"gpufeed_gpu_lost{{{S}}} == 1"),
    ('gpufeed_finding{check="x"} == 1', f'gpufeed_finding{{{S}, check="x"}} == 1'),
    ("rate(gpufeed_busy_seconds_total[5m]) > 0.5", f"rate(gpufeed_busy_seconds_total{{{S}}}[5m]) > 0.5"),
    ('increase(m{xid=~"1|2"}[10m]) or (m unless m offset 10m)',
     f'increase(m{{{S}, xid=~"1|2"}}[10m]) or (m{{{S}}} unless m{{{S}}} offset 10m)'),
    ("sum by (cluster, job) (gpufeed_a) / on (job) group_left (pod, rank) topk by (job) (1, gpufeed_b)",
     f"sum by (cluster, job) (gpufeed_a{{{S}}}) / on (job) group_left (pod, rank) topk by (job) (1, gpufeed_b{{{S}}})"),
    ("a\n/ ignoring (cause) group_left\nsum without (state) (b)",
     f"a{{{S}}}\n/ ignoring (cause) group_left\nsum without (state) (b{{{S}}})"),
    ('label_replace(gpufeed_x, "dst", "$1", "src", "(.*)")',
     f'label_replace(gpufeed_x{{{S}}}, "dst", "$1", "src", "(.*)")'),
    # Recorded series (computed from selected ones), functions, numbers, the mixin's markers: untouched.
    ('instance:gpufeed_x:rate5m{cause!="y"} * 24 / scalar(count_over_time(vector(1)[1d:1m]))',
     'instance:gpufeed_x:rate5m{cause!="y"} * 24 / scalar(count_over_time(vector(1)[1d:1m]))'),
    ("time() - gpufeed_ts > @@num:samples_stale.max_age_seconds@@ / 3.6e6",
     f"time() - gpufeed_ts{{{S}}} > @@num:samples_stale.max_age_seconds@@ / 3.6e6"),
    ("up{@@gpufeedSelector@@} == 0", f"up{{{S}, @@gpufeedSelector@@}} == 0"),
])
def test_metrics_selector_goes_into_every_series_selector(expr: str, want: str) -> None:
    generate = _generator()
    assert generate.select(expr, S) == want
    assert generate.select(expr, "") == expr


def test_metrics_selector_reaches_every_generated_rule_and_a_bad_one_is_refused(promtool: str, tmp_path: Path) -> None:
    r = _generate(tmp_path, thresholds="metrics_selector: 'cluster=\"a\"'\n")
    assert r.returncode == 0, r.stderr
    assert _promtool(promtool, "check", "rules", *(tmp_path / "rules").glob("*.yml")).returncode == 0
    exprs = [x["expr"] for x in _generated(tmp_path, "alert") + _generated(tmp_path, "record")]
    series = [(e, m) for e in exprs for m in re.finditer(r"(?<![\w:])(gpufeed_[a-z0-9_]+|up)(?![\w:(])", e)]
    assert series and all(e[m.end():].startswith('{cluster="a"') for e, m in series)
    for value in ("'{cluster=\"a\"}'", "'cluster=a'", "'cluster=\"a\",'", "' cluster=\"a\"'", "[a]"):
        r = _generate(tmp_path, thresholds=f"metrics_selector: {value}\n")
        assert r.returncode == 2 and "metrics_selector" in r.stderr, (value, r.stderr)
