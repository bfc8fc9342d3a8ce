"""When a GPU's wait deserves a capture (pure: verdicts and times in, captures due out).

A GPU that has waited on one cause (a verdict in :data:`exporter.names.WAITING_CAUSES`) for ``after`` seconds is
due, unless its workload was captured less than ``interval`` seconds ago. The workload is who owns the GPU's
processes (its owner labels: pod, container, Slurm job) when known, else the GPU's processes themselves: a
multi-GPU job waiting on all its GPUs is captured once per interval, not once per GPU. The verdict history
(each change of a GPU's verdict, bounded) goes into the bundle.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from exporter.names import WAITING_CAUSES
from exporter.samples.derived import GpuVerdict

HISTORY_CHANGES = 32  # verdict changes kept per GPU for the bundle


@dataclass(frozen=True, slots=True)
class VerdictChange:
    """A GPU's verdict from time ``t`` (the engine's clock) on."""

    t: float
    cause: str
    confidence: float
    evidence: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Due:
    """A capture to take: the GPU, the cause it has waited on since ``since``, and its workload's key."""

    gpu: int
    cause: str
    since: float
    workload: tuple[str, ...]


class Trigger:
    """Tracks each GPU's current cause and each workload's last capture."""

    def __init__(self, after: float, interval: float) -> None:
        self.after = after
        self.interval = interval
        self._history: dict[int, deque[VerdictChange]] = {}
        self._captured: dict[tuple[str, ...], float] = {}

    def history(self, gpu: int) -> tuple[VerdictChange, ...]:
        """The GPU's verdict changes, oldest first."""
        return tuple(self._history.get(gpu, ()))

    def observe(self, t: float, verdicts: Mapping[int, GpuVerdict],
                workloads: Mapping[int, tuple[str, ...]]) -> list[Due]:
        """Record the verdicts at ``t``; the GPUs due for a capture now (one per workload), lowest index first."""
        for gone in set(self._history) - set(verdicts):
            del self._history[gone]
        due: list[Due] = []
        taken: set[tuple[str, ...]] = set()
        for gpu, v in sorted(verdicts.items()):
            hist = self._history.setdefault(gpu, deque(maxlen=HISTORY_CHANGES))
            if not hist or hist[-1].cause != v.cause:
                hist.append(VerdictChange(t, v.cause, v.confidence, v.evidence))
            since = hist[-1].t
            if v.cause not in WAITING_CAUSES or t - since < self.after:
                continue
            key = workloads.get(gpu) or (f"gpu={gpu}",)
            last = self._captured.get(key)
            if key in taken or (last is not None and t - last < self.interval):
                continue
            taken.add(key)
            due.append(Due(gpu, v.cause, since, key))
        return due

    def captured(self, workload: tuple[str, ...], t: float) -> None:
        """A capture of ``workload`` started at ``t``: none again before ``t + interval``."""
        self._captured[workload] = t
        for key in [k for k, at in self._captured.items() if t - at >= self.interval]:
            del self._captured[key]
