"""Grafana dashboards: generated, well-formed, and querying only names gpufeed and its rules define."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import yaml

from tests.rules.conftest import ALERTS, GRAFANA, REPO

DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
CATALOGUE = (REPO / "docs" / "metrics.md").read_text()
_TOKEN = re.compile(r"\b[a-zA-Z_][a-zA-Z0-9_]*(?::[a-zA-Z0-9_]*)+\b|\bgpufeed_[a-z0-9_]+\b")


def panels() -> Iterator[tuple[str, dict[str, Any]]]:
    for f in DASHBOARDS:
        for p in json.loads(f.read_text())["panels"]:
            if p["type"] != "row":
                yield f.name, p


def _in_catalogue(name: str) -> bool:
    """The catalogue abbreviates sibling names (`gpufeed_memory_total_bytes`, `_available_bytes`)."""
    if f"`{name}`" in CATALOGUE:
        return True
    for cut in range(len("gpufeed_"), len(name)):
        head, tail = name[:cut], name[cut:]
        if tail.startswith("_") and f"`{tail}`" in CATALOGUE and f"`{head}_" in CATALOGUE:
            return True
    return False


def test_committed_dashboards_are_what_the_generator_emits() -> None:
    r = subprocess.run([sys.executable, str(GRAFANA / "generate.py"), "--check"], capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 0, r.stderr


def test_fleet_and_host_dashboards_have_the_datasource_host_and_gpu_variables() -> None:
    by_uid = {json.loads(f.read_text())["uid"]: json.loads(f.read_text()) for f in DASHBOARDS}
    assert set(by_uid) == {"gpufeed-fleet", "gpufeed-host"}
    names = {uid: [v["name"] for v in d["templating"]["list"]] for uid, d in by_uid.items()}
    assert names["gpufeed-fleet"] == ["datasource", "host"]
    assert names["gpufeed-host"] == ["datasource", "host", "gpu"]


def test_every_panel_has_a_unique_id_a_query_on_the_datasource_variable_and_fits_the_grid() -> None:
    for f in DASHBOARDS:
        d = json.loads(f.read_text())
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids)), f.name
        cells: set[tuple[int, int]] = set()
        for p in d["panels"]:
            g = p["gridPos"]
            assert g["x"] >= 0 and g["x"] + g["w"] <= 24, (f.name, p["title"])
            mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
            assert not cells & mine, f"{f.name}: panel {p['title']!r} overlaps another"
            cells |= mine
    for name, p in panels():
        assert p["targets"], (name, p["title"])
        assert p["datasource"]["uid"] == "${datasource}", (name, p["title"])
        assert p["description"], (name, p["title"])
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}" and t["expr"].strip(), (name, p["title"])


def test_queries_use_only_catalogue_metrics_and_shipped_recording_rules() -> None:
    records = {r["record"] for g in yaml.safe_load((ALERTS / "gpufeed-recording.yml").read_text())["groups"]
               for r in g["rules"]}
    for name, p in panels():
        for t in p["targets"]:
            for tok in _TOKEN.findall(t["expr"]):
                if ":" in tok:
                    assert tok in records, (name, p["title"], tok)
                else:
                    metric = re.sub(r"_bucket$", "", tok)
                    assert _in_catalogue(metric), (name, p["title"], tok)


def test_host_queries_are_scoped_to_the_selected_host() -> None:
    for name, p in panels():
        if name != "gpufeed-host.json":
            continue
        for t in p["targets"]:
            for tok in _TOKEN.findall(t["expr"]):
                assert re.search(re.escape(tok) + r'\{[^}]*instance=~"\$host"', t["expr"]), (p["title"], tok)


def test_provisioning_files_point_grafana_at_the_dashboards() -> None:
    prov = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "gpufeed.yaml").read_text())
    assert prov["apiVersion"] == 1 and prov["providers"][0]["type"] == "file"
    assert prov["providers"][0]["options"]["path"]
    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    assert ds["datasources"][0]["type"] == "prometheus"
