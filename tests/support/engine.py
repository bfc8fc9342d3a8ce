"""A stand-in for the engine's read side (exporter.derived.analyzer.EngineReader) over precomputed streams."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import pytest

from exporter.derived.analyzer import Analyzer
from exporter.engine import Engine
from exporter.sampling import Targets
from exporter.snapshot import Snapshot, Stamped


def crash_records(monkeypatch: pytest.MonkeyPatch, eng: Engine, times: int, what: str) -> None:
    """Make ``eng``'s next ``times`` recordings raise (a bug in the engine's own code around a call), and its
    crash backoff start at 50 ms."""
    real = eng._record
    left = [times]

    def record(*a: object) -> None:
        if left[0]:
            left[0] -= 1
            raise RuntimeError(what)
        real(*a)  # type: ignore[arg-type]

    monkeypatch.setattr(eng, "_record", record)
    monkeypatch.setattr("exporter.engine.BACKOFF_START", 0.05)
    for s in eng.samplers.values():
        monkeypatch.setattr(s, "backoff", 0.05)


@dataclass
class FakeEngine:
    """The engine as the analyzer reads it: sample streams revealed as ``t`` advances, sampler intervals."""

    streams: dict[str, list[Stamped[Any]]]
    t: float = 0.0
    intervals: dict[str, float] = field(default_factory=lambda: {"proc_threads": 5.0})
    changes: list[tuple[str, float]] = field(default_factory=list)

    def now(self) -> float:
        return self.t

    def history(self, name: str) -> Sequence[Stamped[Any]]:
        return tuple(s for s in self.streams.get(name, ()) if s.t <= self.t)

    def window(self, name: str, seconds: float, now: float | None = None) -> Sequence[Stamped[Any]]:
        now = self.t if now is None else now
        return tuple(s for s in self.history(name) if s.t >= now - seconds)

    @property
    def snapshot(self) -> Snapshot:
        latest = {n: h[-1] for n in self.streams if (h := self.history(n))}
        return Snapshot(version=1, t=self.t, latest=MappingProxyType(latest))

    def interval(self, name: str) -> float | None:
        return self.intervals.get(name)

    def set_interval(self, name: str, interval: float) -> None:
        self.intervals[name] = interval
        self.changes.append((name, interval))


def analyzer(eng: FakeEngine, *, targets: Targets | None = None, options: Mapping[str, Any] | None = None) -> Analyzer:
    """An analyzer bound to ``eng``, with default options (plus ``options``)."""
    an = Analyzer(dict(options or {}), targets or Targets())
    an.bind(eng)
    return an
