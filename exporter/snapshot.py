"""Immutable values that flow from the engine to the derived layer and the exposition."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Stamped(Generic[T]):
    """One sample and the (monotonic) time it was taken."""

    t: float
    value: T


@dataclass(frozen=True, slots=True)
class SamplerStatus:
    """How a sampler's latest run went."""

    name: str
    collector: str
    interval: float
    success: bool
    available: bool
    duration: float
    runs: int
    overruns: int
    failures: int
    restarts: int
    last_run: float | None
    last_success: float | None = None  # engine-clock time of the newest successful sample
    error: str | None = None
    cpu_seconds: float = 0.0  # CPU time its runs took, all runs (the thread's clock: waits are not counted)


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the exposition needs, frozen at one instant.

    ``latest`` maps a sampler name to its newest successful sample (the derived layer's included, under
    ``derived``); ``status`` maps a sampler name to how its latest run went.
    """

    version: int
    t: float
    latest: Mapping[str, Stamped[Any]] = field(default_factory=_empty)
    status: Mapping[str, SamplerStatus] = field(default_factory=_empty)
    abandoned_threads: int = 0  # sampler threads stuck in calls past their deadline (exporter.engine)

    def value(self, sampler: str) -> Any:
        """The newest sample value of ``sampler``, or None."""
        s = self.latest.get(sampler)
        return None if s is None else s.value
