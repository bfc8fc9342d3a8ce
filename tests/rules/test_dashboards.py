"""Grafana dashboards: generated, well-formed, and querying only names gpufeed and its rules define."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.names import FINDINGS, VERDICTS
from exporter.vocabulary import FINDING_LIST, VERDICT_LIST
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


def test_fleet_and_host_dashboards_have_the_datasource_cluster_host_and_gpu_variables() -> None:
    by_uid = {json.loads(f.read_text())["uid"]: json.loads(f.read_text()) for f in DASHBOARDS}
    assert set(by_uid) == {"gpufeed-fleet", "gpufeed-host"}
    names = {uid: [v["name"] for v in d["templating"]["list"]] for uid, d in by_uid.items()}
    assert names["gpufeed-fleet"] == ["datasource", "cluster", "host"]
    assert names["gpufeed-host"] == ["datasource", "cluster", "host", "gpu"]


def test_every_query_and_variable_after_cluster_is_scoped_to_the_selected_cluster() -> None:
    # Two clusters behind one Thanos/Mimir with the same host names neither merge nor show each other's GPUs. The
    # "All" value .* also matches series without a cluster label: one Prometheus, one cluster.
    for f in DASHBOARDS:
        d = json.loads(f.read_text())
        variables = {v["name"]: v for v in d["templating"]["list"]}
        assert variables["cluster"]["query"]["query"] == "label_values(gpufeed_build_info, cluster)"
        assert variables["cluster"]["includeAll"] and variables["cluster"]["allValue"] == ".*"
        for name in ("host", "gpu"):
            if name in variables:
                assert 'cluster=~"$cluster"' in variables[name]["query"]["query"], (f.name, name)
        for expr in [a["expr"] for a in d["annotations"]["list"]] + [
                t["expr"] for p in d["panels"] for t in p.get("targets", [])]:
            for tok in _TOKEN.findall(expr):
                assert re.search(re.escape(tok) + r'\{[^}]*cluster=~"\$cluster"', expr), (f.name, tok, expr)


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


# ---- units and thresholds

GRAFANA_DEFAULT_STEPS = [{"color": "green", "value": None}, {"color": "red", "value": 80}]
# A gauge named _ratio that is not a 0-1 share: the coefficient of variation of GPU activity (0 steady, > 1 bursty).
NOT_SHARES = {"gpufeed_gpu_burstiness_ratio"}
_RATE_OF_SECONDS = re.compile(
    r"^\s*(?:sum by \([^)]*\) \()?rate\(gpufeed_[a-z0-9_]+_seconds_total\{[^}]*\}\[[^\]]+\]\)\)?\s*$")


def _unit_of(p: dict[str, Any], target: dict[str, Any]) -> str:
    """The unit a query's values are shown in: a per-query or per-column override, else the panel's."""
    unit: str = p["fieldConfig"]["defaults"]["unit"]
    for o in p["fieldConfig"]["overrides"]:
        m = o["matcher"]
        if (m["id"] == "byFrameRefID" and m["options"] == target["refId"]) or (
                m["id"] == "byName" and m["options"] == f"Value #{target['refId']}"):
            unit = next((q["value"] for q in o["properties"] if q["id"] == "unit"), unit)
    return unit


def _is_share(expr: str) -> bool:
    """A query of 0-1 shares only: ratio recording rules and _ratio gauges (nothing divided, nothing summed)."""
    toks = _TOKEN.findall(expr)
    return bool(toks) and not re.search(r"\bsum\b|/", expr) and all(
        (":" in t and re.search(r":\w*ratio", t)) or (t.endswith("_ratio") and t not in NOT_SHARES) for t in toks)


def test_every_panel_sets_its_unit_and_its_own_thresholds_never_grafanas_red_at_80() -> None:
    for name, p in panels():
        d = p["fieldConfig"]["defaults"]
        assert d.get("unit"), (name, p["title"], "no unit")
        th = d.get("thresholds")
        assert th and th["mode"] == "absolute" and th["steps"], (name, p["title"], "no explicit thresholds")
        steps = th["steps"]
        assert steps != GRAFANA_DEFAULT_STEPS, (name, p["title"], "Grafana's default red-at-80")
        assert steps[0]["value"] is None, (name, p["title"], "the first step is the base (value null)")
        values = [s["value"] for s in steps[1:]]
        assert values == sorted(values) and None not in values, (name, p["title"], steps)
        for o in p["fieldConfig"]["overrides"]:
            for prop in o["properties"]:
                if prop["id"] == "thresholds":
                    assert prop["value"]["steps"][0]["value"] is None, (name, p["title"], o)


def test_shares_are_percent_from_0_to_1_and_rates_of_seconds_are_never_plotted_in_seconds() -> None:
    for name, p in panels():
        d = p["fieldConfig"]["defaults"]
        if d["unit"] == "percentunit":
            assert (d.get("min"), d.get("max")) == (0, 1), (name, p["title"], "a 0-1 share needs min 0, max 1")
        for t in p["targets"]:
            unit = _unit_of(p, t)
            if _is_share(t["expr"]):
                assert unit == "percentunit", (name, p["title"], t["expr"], unit)
            if _RATE_OF_SECONDS.match(t["expr"]):
                # Seconds per second: a share of time, GPUs' worth or cores -- never a duration.
                assert unit in ("percentunit", "suffix: GPUs", "suffix: cores"), (name, p["title"], t["expr"], unit)


def test_per_gpu_shares_stacked_over_gpus_are_shown_in_gpus_worth_not_percent() -> None:
    for name, p in panels():
        d = p["fieldConfig"]["defaults"]
        if d["custom"].get("stacking", {}).get("mode") != "normal":
            continue
        for t in p["targets"]:
            by = re.match(r"\s*sum by \(([^)]*)\)", t["expr"])
            per_gpu = by is not None and "gpu" in [x.strip() for x in by.group(1).split(",")]
            if per_gpu and _RATE_OF_SECONDS.match(t["expr"]):
                assert _unit_of(p, t) == "suffix: GPUs", (name, p["title"], t["expr"])


# ---- links between the boards

def test_fleet_and_host_boards_link_to_each_other_carrying_time_datasource_and_host() -> None:
    by_uid = {json.loads(f.read_text())["uid"]: json.loads(f.read_text()) for f in DASHBOARDS}
    for uid, other in (("gpufeed-fleet", "gpufeed-host"), ("gpufeed-host", "gpufeed-fleet")):
        d = by_uid[uid]
        urls = [link["url"] for link in d["links"] if link["type"] == "link"]
        to_other = [u for u in urls if u.startswith(f"/d/{other}/")]
        assert to_other, (uid, urls)
        for u in to_other:
            for carried in ("${__url_time_range}", "${datasource:queryparam}", "${cluster:queryparam}",
                            "${host:queryparam}"):
                assert carried in u, (uid, u, carried)
        # var-host / var-datasource land in variables of those names on the other board.
        assert {"datasource", "host"} <= {v["name"] for v in by_uid[other]["templating"]["list"]}


def test_fleet_tables_with_an_instance_column_open_that_host_on_the_host_board() -> None:
    fleet = json.loads((GRAFANA / "dashboards" / "gpufeed-fleet.json").read_text())
    linked = set()
    for p in fleet["panels"]:
        if p["type"] != "table":
            continue
        for link in p["fieldConfig"]["defaults"].get("links", []):
            assert link["url"].startswith("/d/gpufeed-host/"), (p["title"], link)
            for carried in ("${__url_time_range}", "${datasource:queryparam}", "${cluster:queryparam}",
                            "var-host=${__data.fields.instance}"):
                assert carried in link["url"], (p["title"], carried)
            linked.add(p["title"])
    assert {"Worst hosts: waiting GPU-hours, last 24h", "Worst hosts now: share of GPU-time waiting",
            "Who owns each GPU now"} <= linked, linked


# ---- every family an alert, a recording rule, a verdict or a finding rests on is on a board

# The exported families that show the evidence each verdict and finding rests on (docs/derived.md's rules): the
# series a person checks to see why the GPU got that verdict, or why the finding was raised -- each record of
# exporter/vocabulary.py names them; gpufeed_gpu_bottleneck and gpufeed_finding carry them all.
EVIDENCE: dict[str, tuple[str, ...]] = {r.name: r.evidence for r in (*VERDICT_LIST, *FINDING_LIST)}


def _families(text: str) -> set[str]:
    """gpufeed families named in a PromQL expression or template (recording rules, with colons, are not)."""
    return {re.sub(r"_(bucket|sum|count)$", "", t) for t in _TOKEN.findall(text) if ":" not in t}


def rule_families() -> dict[str, set[str]]:
    """Family -> the rules (alert or record names) whose expression or annotations use it."""
    used: dict[str, set[str]] = {}
    for f in ("gpufeed-alerts.yml", "gpufeed-recording.yml"):
        for g in yaml.safe_load((ALERTS / f).read_text())["groups"]:
            for r in g["rules"]:
                texts = [r["expr"], *(r.get("annotations") or {}).values()]
                for fam in set().union(*(_families(t) for t in texts)):
                    used.setdefault(fam, set()).add(r.get("alert") or r["record"])
    return used


def board_families() -> set[str]:
    return {fam for _, p in panels() for t in p["targets"] for fam in _families(t["expr"])}


def test_every_verdict_and_finding_has_its_evidence_families_named() -> None:
    assert set(EVIDENCE) == set(VERDICTS) | set(FINDINGS), set(EVIDENCE) ^ (set(VERDICTS) | set(FINDINGS))
    for check, fams in EVIDENCE.items():
        for fam in fams:
            assert _in_catalogue(fam), (check, fam, "not in docs/metrics.md")


def test_every_family_an_alert_a_recording_rule_a_verdict_or_a_finding_uses_is_on_a_board() -> None:
    needed = {fam: {f"rule {r}" for r in rules} for fam, rules in rule_families().items()}
    for check, fams in EVIDENCE.items():
        for fam in fams:
            needed.setdefault(fam, set()).add(f"evidence of {check}")
    for fam in ("gpufeed_gpu_bottleneck", "gpufeed_gpu_bottleneck_confidence", "gpufeed_finding"):
        needed.setdefault(fam, set()).add("the verdicts and findings themselves")
    on_board = board_families()
    missing = {fam: sorted(why) for fam, why in needed.items() if fam not in on_board}
    assert not missing, "families no dashboard panel queries:\n" + "\n".join(
        f"  {fam} (used by {', '.join(why)})" for fam, why in sorted(missing.items()))


# ---- Grafana's published schema

SCHEMA = Path(__file__).resolve().parent / "grafana-schema"  # package.json pins @grafana/schema and typescript


def _tsc(boards: dict[str, dict[str, Any]], tmp: Path) -> dict[str, list[str]]:
    """Type-check each board as ``const board: Board = <its JSON>`` (grafana-schema/dashboard.ts); errors by board."""
    node = shutil.which("node")
    tsc = SCHEMA / "node_modules" / "typescript" / "bin" / "tsc"
    if node is None or not tsc.exists() or not (SCHEMA / "node_modules" / "@grafana" / "schema").is_dir():
        pytest.fail("Grafana's schema check needs node and tests/rules/grafana-schema/node_modules: run "
                    "tools/ensure-test-deps.sh (Debian's nodejs and npm, then npm ci there)")
    for name, board in boards.items():
        (tmp / f"{name}.ts").write_text(f'import type {{ Board }} from "{SCHEMA / "dashboard"}";\n'
                                        f"export const board: Board = {json.dumps(board, indent=1)};\n")
    r = subprocess.run([node, str(tsc), "--noEmit", "--strict", "--skipLibCheck", "--target", "es2022", "--module",
                        "esnext", "--moduleResolution", "bundler", *(str(tmp / f"{n}.ts") for n in boards)],
                       capture_output=True, text=True, timeout=300, check=False, cwd=SCHEMA)
    errors: dict[str, list[str]] = {name: [] for name in boards}
    for line in r.stdout.splitlines():
        m = re.match(r"(?:.*/)?([\w-]+)\.ts\(\d+,\d+\): error", line)
        if m and m.group(1) in errors:
            errors[m.group(1)].append(line)
    assert r.returncode == 0 or any(errors.values()), r.stdout + r.stderr  # tsc failed on something else
    return errors


def test_dashboards_type_check_against_grafanas_published_schema_and_a_typo_would_not(tmp_path: Path) -> None:
    boards = {f.stem: json.loads(f.read_text()) for f in DASHBOARDS}
    fleet = boards["gpufeed-fleet"]
    first = next(i for i, p in enumerate(fleet["panels"]) if p["type"] == "timeseries")
    broken: dict[str, dict[str, Any]] = {}
    mutations: dict[str, Callable[[dict[str, Any]], None]] = {
        "unti": lambda p: p["fieldConfig"]["defaults"].update(unti="s"),  # a misspelt key
        "tabel": lambda p: p["options"].update(legend={"displayMode": "tabel"}),  # a value outside an enum
        "absolut": lambda p: p["fieldConfig"]["defaults"]["thresholds"].update(mode="absolut"),
    }
    for what, mutate in mutations.items():
        b = copy.deepcopy(fleet)
        mutate(b["panels"][first])
        broken[f"broken-{what}"] = b
    errors = _tsc({**boards, **broken}, tmp_path)
    assert errors["gpufeed-fleet"] == [] and errors["gpufeed-host"] == [], errors
    for what in ("unti", "tabel", "absolut"):
        assert any(what in e for e in errors[f"broken-{what}"]), (what, errors[f"broken-{what}"])
