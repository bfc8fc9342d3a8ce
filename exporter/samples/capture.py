"""What the capture stage (exporter/capture/stage.py, ``--capture.enabled``) publishes: its counters and, per GPU,
the newest capture that saw stacks. The derived layer reads the latter: the capture's first evidence line joins
the GPU's verdict evidence while the verdict it was taken for holds (docs/derived.md, "Stack captures")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class CaptureNote:
    """The newest capture of one GPU whose stacks were seen."""

    gpu: int
    name: str  # the bundle's name (--capture.dir/<name>)
    cause: str  # the verdict it was taken for: the note stands only while that verdict holds
    label: str | None  # what the GPU process's main thread does most (exporter.names.CAPTURE_LABELS), or None
    evidence: str  # the capture's first evidence line


def _no_notes() -> Mapping[int, CaptureNote]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class CaptureStats:
    """The capture stage's sample: its counters at one instant and each GPU's newest capture."""

    total: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (gpu, trigger) -> captures
    last_wall: float | None = None  # unix time of the newest capture's start
    cpu_seconds: float = 0.0
    running: bool = False
    newest: Mapping[int, CaptureNote] = field(default_factory=_no_notes)
