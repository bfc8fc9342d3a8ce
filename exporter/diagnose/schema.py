"""The diagnose report's JSON Schema, ``report.schema.json`` beside this file: hand-written, except for its
verdict, finding and severity enums, which are written from exporter/vocabulary.py (through exporter.names).

    python3 -m exporter.diagnose.schema           # rewrite exporter/diagnose/report.schema.json
    python3 -m exporter.diagnose.schema --check   # exit 1 when the committed schema drifts (CI)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from exporter.names import FINDINGS, SEVERITIES, VERDICTS
from exporter.regen import write_or_check

PATH = Path(__file__).with_name("report.schema.json")


def with_vocabulary(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with its enums set from the vocabulary (changed in place, and returned)."""
    defs = schema["$defs"]
    defs["cause"]["enum"] = [*VERDICTS, None]  # null: no verdict reached
    defs["finding"]["properties"]["severity"]["enum"] = list(SEVERITIES)
    schema["properties"]["finding_events"]["items"]["properties"]["check"]["enum"] = list(FINDINGS)
    return schema


def text(path: Path = PATH) -> str:
    """The schema file as it should be committed: ``path``'s schema with the vocabulary's enums."""
    return json.dumps(with_vocabulary(json.loads(path.read_text(encoding="utf-8"))), indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="exit 1 if the committed schema differs")
    ns = p.parse_args(argv)
    return write_or_check({PATH: text()}, check=ns.check, what="the diagnose report's JSON Schema",
                          command="python3 -m exporter.diagnose.schema")


if __name__ == "__main__":
    sys.exit(main())
