"""``gpufeed diagnose``: a one-shot report per GPU."""

from __future__ import annotations

import argparse
import sys


def run_diagnose(ns: argparse.Namespace) -> int:
    """Not built yet: say so plainly instead of printing a made-up report."""
    print(
        "gpufeed diagnose: not available yet in this build -- the verdict classifier and the scenario "
        "player have not landed. Use `gpufeed serve` and read /metrics meanwhile.",
        file=sys.stderr,
    )
    return 3
