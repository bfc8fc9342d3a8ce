"""Write generated files, or check that the committed copies match: the one loop every generator runs
(``alerts/generate.py``, ``deploy/grafana/generate.py``, :mod:`exporter.schemas`)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path


def write_or_check(files: Mapping[Path, str], *, check: bool, what: str, command: str) -> int:
    """Write each file's text (creating its folder), or with ``check`` write nothing and exit 1 naming the
    files that differ from it (``what`` they are, the ``command`` that regenerates them); 0 otherwise."""
    drift = []
    for path, text in files.items():
        if check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                drift.append(str(path))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    if drift:
        print(f"{what} differ from the committed files (run {command}): " + ", ".join(drift), file=sys.stderr)
        return 1
    return 0
