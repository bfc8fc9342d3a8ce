"""Every table of the verdict and finding vocabulary agrees with exporter/vocabulary.py: the names, the fleet
playbook, diagnose's next checks, the colours of the dashboards and of ``gpufeed report``, the JSON Schemas,
the runbooks; and no product text cites a document the project does not ship."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from exporter import names, schemas
from exporter.diagnose import report
from exporter.fleet import playbook, plots
from exporter.vocabulary import FINDING, FINDING_LIST, STATE_COLOURS, VERDICT, VERDICT_LIST, runbook_anchor

REPO = Path(__file__).resolve().parents[1]
DASHBOARDS = REPO / "deploy" / "grafana" / "dashboards"
RECORDS = (*VERDICT_LIST, *FINDING_LIST)


def _colours() -> dict[str, str]:
    return {**STATE_COLOURS, **{v.name: v.colour for v in VERDICT_LIST}}


def test_names_are_the_records_names_in_order() -> None:
    assert tuple(VERDICT) == names.VERDICTS and tuple(FINDING) == names.FINDINGS
    assert names.WAITING_CAUSES == ("launch_bound", "input_bound", "io_bound", "transfer_bound", "network_bound",
                                    "latency_bound")
    assert names.QUIET_VERDICTS == ("healthy", "idle")
    assert set(STATE_COLOURS) == set(names.STATES)
    assert {v.state for v in VERDICT_LIST} == set(names.STATES)
    assert all(re.fullmatch(r"[a-z]+(_[a-z]+)*", r.name) for r in RECORDS)
    assert all(r.label and r.fix and r.evidence for r in RECORDS)


def test_the_fleet_playbook_and_the_next_checks_come_from_the_records() -> None:
    assert {c: VERDICT[c].label for c in names.WAITING_CAUSES} == playbook.CAUSE_LABELS
    assert {v.name: v.fix for v in VERDICT_LIST} == playbook.FIXES
    assert {f.name: f.fix for f in FINDING_LIST} == playbook.FINDING_FIXES
    assert {f.name: f.label for f in FINDING_LIST} == playbook.FINDING_LABELS
    assert {v.name: v.next_check for v in VERDICT_LIST} == report.NEXT_CHECK
    assert report.next_check("transfer_bound", (42,), "0000:3b:00.0").startswith("lspci -vv -s 0000:3b:00.0")


def test_one_colour_per_state_and_verdict_and_each_verdict_its_own() -> None:
    colours = _colours()
    assert all(re.fullmatch(r"#[0-9a-f]{6}", c) for c in colours.values()), colours
    assert len({v.colour for v in VERDICT_LIST}) == len(VERDICT_LIST), "two verdicts share a colour"
    assert plots.STATE_COLORS == STATE_COLOURS
    assert {c: VERDICT[c].colour for c in names.WAITING_CAUSES} == plots.CAUSE_COLORS


def _dashboard_colours(node: Any, out: list[tuple[str, str]]) -> None:
    """(name, colour) of every by-name colour override and every value mapping of the committed dashboards."""
    if isinstance(node, dict):
        matcher = node.get("matcher") or {}
        if matcher.get("id") == "byName":
            for prop in node.get("properties", []):
                if prop.get("id") == "color":
                    out.append((matcher["options"], prop["value"]["fixedColor"]))
        if "text" in node and "color" in node and "index" in node:
            out.append((node["text"], node["color"]))
        for v in node.values():
            _dashboard_colours(v, out)
    elif isinstance(node, list):
        for v in node:
            _dashboard_colours(v, out)


def test_the_committed_dashboards_paint_each_state_and_verdict_in_its_colour() -> None:
    colours = _colours()
    seen: list[tuple[str, str]] = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        _dashboard_colours(json.loads(path.read_text()), seen)
    named = [(n, c) for n, c in seen if n in colours]
    assert {n for n, _ in named} >= set(names.VERDICTS), "a verdict is never painted on a dashboard"
    assert [(n, c) for n, c in named if c != colours[n]] == []


def test_the_schemas_enums_are_the_vocabulary_and_the_committed_files_are_generated() -> None:
    for path, text in schemas.outputs().items():
        assert path.read_text(encoding="utf-8") == text, "run python3 -m exporter.schemas"
    assert schemas.FLEET in schemas.outputs()
    assert schemas.main(["--check"]) == 0
    doc = report.schema()
    assert doc["$defs"]["cause"]["enum"] == [*names.VERDICTS, None]
    assert doc["properties"]["finding_events"]["items"]["properties"]["check"]["enum"] == list(names.FINDINGS)
    fleet = json.loads(schemas.FLEET.read_text())
    causes = [e["enum"] for e in _enums(fleet) if "launch_bound" in e["enum"]]
    # Every waiting cause; a straggler's cause (exporter/fleet/stragglers.py): every one but latency_bound, or unknown.
    assert causes == [list(names.WAITING_CAUSES),
                      [*(c for c in names.WAITING_CAUSES if c != "latency_bound"), "unknown"]]
    assert fleet["$defs"]["cause_series"]["required"] == list(names.WAITING_CAUSES)


def test_a_stale_enum_in_a_schema_is_caught(tmp_path: Path) -> None:
    doc = json.loads(schemas.DIAGNOSE.read_text(encoding="utf-8"))
    doc["$defs"]["cause"]["enum"].remove("io_bound")
    stale = tmp_path / "report.schema.json"
    stale.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    assert schemas.text(stale, schemas.diagnose_vocabulary) != stale.read_text(encoding="utf-8")
    assert json.loads(schemas.text(stale, schemas.diagnose_vocabulary))["$defs"]["cause"]["enum"] == [
        *names.VERDICTS, None]


def _enums(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        return ([node] if "enum" in node else []) + [e for v in node.values() for e in _enums(v)]
    if isinstance(node, list):
        return [e for v in node for e in _enums(v)]
    return []


def test_every_verdict_and_finding_has_its_runbook_section() -> None:
    headings = {re.sub(r"^#+\s*", "", line).strip()
                for line in (REPO / "docs" / "runbooks.md").read_text().splitlines() if line.startswith("#")}
    missing = [(r.name, r.runbook) for r in RECORDS if r.runbook not in headings]
    assert missing == [], "docs/runbooks.md lacks these headings"
    assert runbook_anchor("cause=io_bound (storage / network file system)") == (
        "causeio_bound-storage--network-file-system")
    assert runbook_anchor("GpufeedGPULost") == "gpufeedgpulost"


def test_a_finding_s_runbook_is_an_alert_the_rules_ship() -> None:
    alerts = {r["alert"] for g in yaml.safe_load((REPO / "alerts" / "gpufeed-alerts.yml").read_text())["groups"]
              for r in g["rules"] if "alert" in r}
    assert [f.name for f in FINDING_LIST if f.alert and f.runbook not in alerts] == []
    # A finding without an alert is one on purpose (vocabulary.Finding.alert), and no rule names it.
    assert [f.name for f in FINDING_LIST if not f.alert] == ["sync_bound"]
    rules = (REPO / "alerts" / "gpufeed-alerts.yml").read_text()
    assert [f.name for f in FINDING_LIST if not f.alert and f'check="{f.name}"' in rules] == []


# A playbook task, checklist or common mistake by its number or letter: the playbook is not shipped.
UNSHIPPED = re.compile(r"\b[Tt]asks? \d|\b[Cc]hecklists? [A-E]\b|\b[Cc]ommon mistakes? \d|playbook\.es\.txt")


def test_no_product_text_cites_the_unshipped_playbook() -> None:
    files = subprocess.run(["git", "ls-files", "exporter", "docs", "alerts", "deploy", "mixin", "README.md"],
                           cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    texts = {f: (REPO / f).read_text(errors="replace") for f in files
             if (REPO / f).is_file() and not f.endswith((".png", ".pb", "_pb2.py", "_pb2_grpc.py"))}
    texts.update({f"exporter.fleet.playbook {k}": v for k, v in {**playbook.FIXES, **playbook.FINDING_FIXES}.items()})
    hits = [f"{f}: {m.group(0)}" for f, t in texts.items() for m in UNSHIPPED.finditer(t)]
    assert hits == []
    assert UNSHIPPED.search("fix the riser (tasks 3-4)") and UNSHIPPED.search("(checklist C)")
