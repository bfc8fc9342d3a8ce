"""The JSON Schemas' vocabulary: the diagnose report's (``exporter/diagnose/report.schema.json``, shipped) and the
fleet report's (``docs/report.schema.json``) are hand-written, except for their verdict, cause, finding and
severity lists, which are written from exporter/vocabulary.py (through exporter.names).

    python3 -m exporter.schemas           # rewrite both schema files
    python3 -m exporter.schemas --check   # exit 1 when a committed schema drifts (CI)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exporter.fleet.stragglers import LATENCY_BOUND
from exporter.fleet.stragglers import UNKNOWN as STRAGGLER_UNKNOWN
from exporter.names import CAPTURE_LABELS, CAPTURE_TRIGGERS, FINDINGS, SEVERITIES, VERDICTS, WAITING_CAUSES
from exporter.regen import write_or_check

DIAGNOSE = Path(__file__).parent / "diagnose" / "report.schema.json"
FLEET = Path(__file__).parents[1] / "docs" / "report.schema.json"  # in a checkout, not in the package


def diagnose_vocabulary(schema: dict[str, Any]) -> dict[str, Any]:
    """The diagnose report's schema with its enums set from the vocabulary (changed in place, and returned)."""
    defs = schema["$defs"]
    defs["cause"]["enum"] = [*VERDICTS, None]  # null: no verdict reached
    defs["finding"]["properties"]["severity"]["enum"] = list(SEVERITIES)
    schema["properties"]["finding_events"]["items"]["properties"]["check"]["enum"] = list(FINDINGS)
    capture = defs["capture"]["properties"]
    capture["trigger"]["enum"] = list(CAPTURE_TRIGGERS)
    capture["label"]["enum"] = [*CAPTURE_LABELS, None]  # null: no dominant wait
    return schema


def fleet_vocabulary(schema: dict[str, Any]) -> dict[str, Any]:
    """The fleet report's schema with one property per waiting cause (hours, series) and its dominant-cause enum."""
    defs = schema["$defs"]
    for name, item in (("causes", "hours"), ("cause_series", "series")):
        defs[name]["required"] = list(WAITING_CAUSES)
        defs[name]["properties"] = {c: {"$ref": f"#/$defs/{item}"} for c in WAITING_CAUSES}
    for choice in defs["breakdown"]["properties"]["dominant_cause"]["oneOf"]:  # null, or one of the causes
        if "enum" in choice:
            choice["enum"] = list(WAITING_CAUSES)
    if "cause_loss" in defs:  # a straggler's cause (exporter/fleet/stragglers.py): latency_bound is never one
        defs["cause_loss"]["properties"]["cause"]["enum"] = [
            *(c for c in WAITING_CAUSES if c != LATENCY_BOUND), STRAGGLER_UNKNOWN]
    return schema


def text(path: Path, fill: Callable[[dict[str, Any]], dict[str, Any]]) -> str:
    """The schema file as it should be committed: ``path``'s schema with ``fill``'s vocabulary."""
    return json.dumps(fill(json.loads(path.read_text(encoding="utf-8"))), indent=1) + "\n"


def outputs() -> dict[Path, str]:
    """Each schema file of this checkout and its generated text (the fleet's only where docs/ is present)."""
    out = {DIAGNOSE: text(DIAGNOSE, diagnose_vocabulary)}
    if FLEET.exists():
        out[FLEET] = text(FLEET, fleet_vocabulary)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="exit 1 if a committed schema differs")
    ns = p.parse_args(argv)
    return write_or_check(outputs(), check=ns.check, what="JSON Schemas", command="python3 -m exporter.schemas")


if __name__ == "__main__":
    sys.exit(main())
