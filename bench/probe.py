"""Run the real ``gpufeed`` command line and, when it exits, dump every sampler's sample timestamps.

Usage: ``python bench/probe.py OUT.json serve [gpufeed serve flags...]``

The daemon is the unmodified one (``exporter.cli.main``, same flags, same collectors, same engine);
the probe only keeps a reference to the :class:`exporter.daemon.Daemon` it builds so that, after
SIGTERM, the engine's bounded history buffers -- which carry the monotonic time each sample was
taken -- can be written out. The sampling-fidelity benchmark computes jitter from them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import exporter.daemon as daemon_mod
from exporter.cli import main

_captured: list[daemon_mod.Daemon] = []


class _ProbedDaemon(daemon_mod.Daemon):
    """The real Daemon, remembered for the dump at exit."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _captured.append(self)


def dump(out: Path) -> None:
    """Write {sampler: {interval, runs, overruns, failures, t: [monotonic seconds]}} for every daemon built."""
    samplers: dict[str, Any] = {}
    for d in _captured:
        for name, s in d.engine.samplers.items():
            samplers[name] = {
                "collector": s.collector,
                "interval": s.interval,
                "runs": s.runs,
                "overruns": s.overruns,
                "failures": s.failures,
                "t": [x.t for x in d.engine.history(name)],
            }
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"samplers": samplers}))
    tmp.replace(out)


def run(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: probe.py OUT.json serve [flags...]", file=sys.stderr)
        return 2
    out = Path(argv[0])
    daemon_mod.Daemon = _ProbedDaemon  # type: ignore[misc]
    try:
        return main(argv[1:])
    finally:
        dump(out)


if __name__ == "__main__":
    raise SystemExit(run(sys.argv[1:]))
