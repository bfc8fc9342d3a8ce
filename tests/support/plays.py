"""Each scenario played once per test session, shared by every test that asserts on that play.

A play (:func:`exporter.sim.player.play`) runs the real collectors, engine and derived layer over the whole
scenario in virtual time: seconds each, and the same contract scenario was played by the expectation tests,
the report tests, the no-GPM tests and ``gpufeed diagnose --scenario`` runs alike. :func:`play` has the
player's signature and keeps one result per scenario and flags; it always records the timeline (recording it
reads the engine's snapshot and changes nothing the phases see), so a test that wants the timeline and one
that does not share one play. :func:`played` is the same for a scenario file. A test module of the CLI
patches ``exporter.sim.player.play`` with :func:`play` so its ``gpufeed diagnose --scenario`` runs share too
(the command imports the player's ``play`` when it runs).

A scenario is plain frozen data whose ``repr`` spells every field (its mappings are read-only proxies, so it
cannot be hashed): the repr is the cache key, and an edited copy (``dataclasses.replace``) is its own entry.
The result is shared: treat it as read-only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from exporter.sim.player import PlayResult
from exporter.sim.player import play as _play_once
from exporter.sim.scenario import Scenario, load

_plays: dict[tuple[str, str], PlayResult] = {}


def play(sc: Scenario, *, timeline: bool = False, flags: Mapping[str, Any] | None = None,
         workdir: Path | None = None) -> PlayResult:
    """:func:`exporter.sim.player.play`, once per scenario and flags in this session (``timeline`` is always on)."""
    key = (repr(sc), repr(sorted((flags or {}).items())))
    if key not in _plays:
        _plays[key] = _play_once(sc, timeline=True, flags=flags, workdir=workdir)
    return _plays[key]


def without_gpm(sc: Scenario) -> Scenario:
    """The scenario on GPUs without GPM (Ampere and before, consumer boards): every GPU's ``gpm`` false."""
    return dataclasses.replace(sc, gpus=tuple(dataclasses.replace(g, gpm=False) for g in sc.gpus))


def played(path: Path, *, gpm: bool = True, flags: Mapping[str, Any] | None = None) -> PlayResult:
    """The play of the scenario file ``path`` (with its GPUs' GPM forced off unless ``gpm``), timeline kept."""
    sc = load(path)
    return play(sc if gpm else without_gpm(sc), flags=flags)
