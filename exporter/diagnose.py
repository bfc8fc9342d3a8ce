"""``gpufeed diagnose``: a one-shot report per GPU."""

from __future__ import annotations

import argparse
import sys


def run_diagnose(ns: argparse.Namespace) -> int:
    """``--scenario``: play it in virtual time (exporter.sim.report). The live host: not built yet."""
    if getattr(ns, "scenario", None):
        from exporter.sim.report import run_scenario

        return run_scenario(ns)
    print(
        "gpufeed diagnose: live-host diagnosis is not available yet in this build -- the verdict classifier "
        "has not landed. Use `gpufeed serve` and read /metrics meanwhile, or `--scenario FILE`.",
        file=sys.stderr,
    )
    return 3
