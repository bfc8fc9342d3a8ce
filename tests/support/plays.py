"""Each scenario played once per test session, shared by every test that asserts on that play.

A play (:func:`exporter.sim.player.play`) runs the real collectors, engine and derived layer over the whole
scenario in virtual time: seconds each, and the same contract scenario was played by the expectation tests,
the report tests and the no-GPM tests alike. ``played`` keys the result by file, GPM and flags, and always
records the timeline (recording it reads the engine's snapshot and changes nothing the phases see), so a test
that wants the timeline and one that does not share one play.

The result is shared: treat it as read-only (``dataclasses.replace`` for a changed copy).
"""

from __future__ import annotations

import dataclasses
from functools import cache
from pathlib import Path

from exporter.sim.player import PlayResult, play
from exporter.sim.scenario import Scenario, load


def without_gpm(sc: Scenario) -> Scenario:
    """The scenario on GPUs without GPM (Ampere and before, consumer boards): every GPU's ``gpm`` false."""
    return dataclasses.replace(sc, gpus=tuple(dataclasses.replace(g, gpm=False) for g in sc.gpus))


def played(path: Path, *, gpm: bool = True, flags: tuple[tuple[str, str | bool], ...] = ()) -> PlayResult:
    """The play of the scenario file ``path`` (with its GPUs' GPM forced off unless ``gpm``), timeline kept."""
    return _played(str(Path(path).resolve()), gpm, flags)


@cache
def _played(path: str, gpm: bool, flags: tuple[tuple[str, str | bool], ...]) -> PlayResult:
    sc = load(Path(path))
    return play(sc if gpm else without_gpm(sc), timeline=True, flags=dict(flags) or None)
