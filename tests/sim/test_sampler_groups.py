"""The simulator's sampler -> file-group table is built from the stages' registration: every registered sampler
has a row, a sampler without one is refused, and the registration names exactly the samplers the stages run."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

import pytest
from prometheus_client.core import Metric

from exporter import pipeline
from exporter.sampling import SELF, Collector
from exporter.sim.player import READS, SAMPLER_GROUPS, play, sampler_groups
from exporter.sim.scenario import load
from exporter.snapshot import Snapshot

SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "healthy_training.yaml"


def _registered() -> set[str]:
    return {s for cls in pipeline.registry().values() for s in cls.sampler_names()}


def test_every_registered_sampler_has_file_groups_and_no_row_is_stale() -> None:
    assert set(SAMPLER_GROUPS) == _registered()
    assert set(READS) == _registered()


def test_a_sampler_without_file_groups_is_refused() -> None:
    class Unlisted(Collector):
        name = "unlisted"
        help = "a collector the simulator does not know"
        sampler_intervals = MappingProxyType({"unlisted": "interval", "unlisted_deep": "deep-interval"})

        def update(self) -> None:
            return None

        def metrics(self, snap: Snapshot) -> list[Metric]:
            return []

    with pytest.raises(LookupError, match="unlisted"):
        sampler_groups({**pipeline.registry(), "unlisted": Unlisted})


def test_the_registration_names_the_samplers_the_stages_run() -> None:
    assert set(play(load(SCENARIO)).sampler_runs) == _registered()


def test_the_self_sampler_reads_no_rendered_file() -> None:
    # It reads the daemon's own /proc/self: redrawing the whole tree for it cost ~20 full renders per play.
    assert SAMPLER_GROUPS[SELF] == frozenset()
