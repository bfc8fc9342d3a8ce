"""The monitoring mixin (mixin/): evaluated with jsonnet, it is the shipped rules and dashboards, and its
_config changes them exactly as the generator's own settings do."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.rules.conftest import ALERTS, GRAFANA, REPO

jsonnet = pytest.importorskip("_jsonnet", reason="pip install jsonnet (the test extra has it)")

MIXIN = REPO / "mixin"


def _evaluate(config: str = "") -> dict[str, Any]:
    snippet = (f"local m = (import 'mixin.libsonnet') + {{ _config+:: {{ {config} }} }};\n"
               "{alerts: m.prometheusAlerts, rules: m.prometheusRules, dashboards: m.grafanaDashboards}")
    out: dict[str, Any] = json.loads(jsonnet.evaluate_snippet("test", snippet, jpathdir=[str(MIXIN)]))
    return out


def _generated(tmp_path: Path, thresholds: str) -> tuple[dict[str, Any], dict[str, Any]]:
    (tmp_path / "mine.yaml").write_text(thresholds)
    out = tmp_path / "rules"
    r = subprocess.run([sys.executable, str(ALERTS / "generate.py"), "--thresholds", str(tmp_path / "mine.yaml"),
                        "--out", str(out)], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    return (yaml.safe_load((out / "gpufeed-alerts.yml").read_text()),
            yaml.safe_load((out / "gpufeed-recording.yml").read_text()))


def test_mixin_evaluates_to_the_shipped_alerts_rules_and_dashboards() -> None:
    m = _evaluate()
    assert m["alerts"] == yaml.safe_load((ALERTS / "gpufeed-alerts.yml").read_text())
    assert m["rules"] == yaml.safe_load((ALERTS / "gpufeed-recording.yml").read_text())
    shipped = {p.name: json.loads(p.read_text()) for p in sorted((GRAFANA / "dashboards").glob("*.json"))}
    assert m["dashboards"] == shipped


def test_mixin_config_changes_the_rules_as_the_generator_settings_do(tmp_path: Path) -> None:
    m = _evaluate("runbookBaseUrl: 'https://wiki.example.com/gpufeed/runbooks', "
                  "aggregationLabels: ['region', 'cluster'], gpufeedSelector: 'job=\"gpu-exporter\"'")
    alerts, rules = _generated(tmp_path, "runbook_base_url: https://wiki.example.com/gpufeed/runbooks\n"
                                         "aggregation_labels: [region, cluster]\n"
                                         "job_selector: 'job=\"gpu-exporter\"'\n")
    assert m["alerts"] == alerts and m["rules"] == rules
    m = _evaluate("aggregationLabels: []")
    alerts, rules = _generated(tmp_path, "aggregation_labels: []\n")
    assert m["alerts"] == alerts and m["rules"] == rules


def test_mixin_output_passes_promtool_check_rules(promtool: str, tmp_path: Path) -> None:
    m = _evaluate("aggregationLabels: ['region']")
    for name in ("alerts", "rules"):
        (tmp_path / f"{name}.yml").write_text(yaml.safe_dump(m[name]))
    r = subprocess.run([promtool, "check", "rules", str(tmp_path / "alerts.yml"), str(tmp_path / "rules.yml")],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FAILED" not in r.stdout + r.stderr, r.stdout + r.stderr


@pytest.mark.parametrize("url", ["docs/runbooks.md", "ftp://host/x", "https:///x", "https://wiki/x#top",
                                 "https://{{$labels.job}}/runbooks", "http://{{$labels.instance}}/docs"])
def test_mixin_refuses_a_runbook_base_url_that_is_not_an_absolute_link_or_a_gpufeeds_page(url: str) -> None:
    with pytest.raises(RuntimeError, match=re.escape("runbookBaseUrl must be http://{{$labels.instance}}/runbooks or")):
        _evaluate(f"runbookBaseUrl: '{url}'")


def test_mixin_https_instance_runbook_url_is_the_generators(tmp_path: Path) -> None:
    # The down target's link is rebuilt from the base in jsonnet (runbookBaseUrlLive): the same as the generator's.
    m = _evaluate("runbookBaseUrl: 'https://{{$labels.instance}}/runbooks'")
    alerts, _ = _generated(tmp_path, "runbook_base_url: 'https://{{$labels.instance}}/runbooks'\n")
    assert m["alerts"] == alerts
    urls = {r["alert"]: r["annotations"]["runbook_url"] for g in m["alerts"]["groups"] for r in g["rules"]}
    assert urls["GpufeedTargetDown"].startswith("https://{{ with printf `up{job=%q} == 1` $labels.job | query }}")


# A series a rule reads: gpufeed's own (not a recorded level:metric:operation name) or up; not a function.
_SERIES = re.compile(r"(?<![\w:])(gpufeed_[a-z0-9_]+|up)(?![\w:(])")


def _exprs(doc: dict[str, Any]) -> list[str]:
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


def test_mixin_metrics_selector_goes_into_every_series_of_every_rule_as_the_generator_puts_it(
        promtool: str, tmp_path: Path) -> None:
    selector = 'cluster="a", env=~"prod|staging"'
    m = _evaluate(f"gpufeedMetricsSelector: '{selector}'")
    alerts, rules = _generated(tmp_path, f"metrics_selector: '{selector}'\n")
    assert m["alerts"] == alerts and m["rules"] == rules
    exprs = _exprs(m["alerts"]) + _exprs(m["rules"])
    series = [(e, s) for e in exprs for s in _SERIES.finditer(e)]
    assert len(series) > 70
    bare = [(s.group(), e) for e, s in series if not e[s.end():].startswith("{" + selector)]
    assert bare == []
    # Nothing else changed: without the selector the expressions are the shipped ones.
    shipped = (_exprs(yaml.safe_load((ALERTS / "gpufeed-alerts.yml").read_text()))
               + _exprs(yaml.safe_load((ALERTS / "gpufeed-recording.yml").read_text())))
    assert [e.replace("{" + selector + "}", "").replace(selector + ", ", "") for e in exprs] == shipped
    for name in ("alerts", "rules"):
        (tmp_path / f"{name}.yml").write_text(yaml.safe_dump(m[name]))
    r = subprocess.run([promtool, "check", "rules", str(tmp_path / "alerts.yml"), str(tmp_path / "rules.yml")],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and "FAILED" not in r.stdout + r.stderr, r.stdout + r.stderr


def test_mixin_metrics_selector_is_empty_by_default_and_then_changes_no_rule() -> None:
    assert _evaluate_config()["gpufeedMetricsSelector"] == ""
    m = _evaluate("gpufeedMetricsSelector: ''")
    assert m["alerts"] == yaml.safe_load((ALERTS / "gpufeed-alerts.yml").read_text())
    assert m["rules"] == yaml.safe_load((ALERTS / "gpufeed-recording.yml").read_text())


def test_mixin_is_self_contained_for_jsonnet_bundler() -> None:
    """jb vendors only mixin/: nothing may import from outside it."""
    for f in MIXIN.rglob("*.libsonnet"):
        assert "import '../" not in f.read_text() and 'import "../' not in f.read_text(), f
    assert json.loads((MIXIN / "jsonnetfile.json").read_text())["dependencies"] == []


def test_every_alert_threshold_window_for_and_severity_is_a_mixin_config_knob() -> None:
    # Each key of exporter/thresholds.yaml's alert sections (but the Xid code lists) is read from
    # _config.thresholds in the generated alerts, never baked in.
    text = (MIXIN / "alerts.libsonnet").read_text()
    thresholds = _evaluate_config()["thresholds"]
    unwired = [f"{section}.{key}" for section, keys in thresholds.items() for key in keys
               if not any(f"%({kind}_{section}_{key})" in text for kind in ("str", "num", "pct"))]
    assert thresholds and unwired == []


def test_mixin_thresholds_change_the_rules_as_the_generator_settings_do(tmp_path: Path) -> None:
    m = _evaluate("thresholds+: {gpu_starved+: {min_waiting_ratio: 0.45, window: '20m', 'for': '30m', "
                  "severity: 'critical'}, memory_pressure+: {max_available_ratio: 0.07}}")
    alerts, rules = _generated(tmp_path, "gpu_starved: {min_waiting_ratio: 0.45, window: 20m, for: 30m, "
                                         "severity: critical}\nmemory_pressure: {max_available_ratio: 0.07}\n")
    assert m["alerts"] != yaml.safe_load((ALERTS / "gpufeed-alerts.yml").read_text())
    assert m["alerts"] == alerts and m["rules"] == rules


def _evaluate_config() -> dict[str, Any]:
    snippet = "(import 'mixin.libsonnet')._config"
    out: dict[str, Any] = json.loads(jsonnet.evaluate_snippet("test", snippet, jpathdir=[str(MIXIN)]))
    return out
