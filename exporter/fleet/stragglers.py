"""GPU-hours distributed jobs lost to stragglers, per job and per cause (pure: no I/O, no clock, no globals).

While one rank of a synchronous job is slow, every other rank spins in its collectives (collective_wait): the job
loses N ranks x the time they waited. Each step's lost GPU-seconds are charged to the straggler's cause: the cause
its ranks waited on most in that step on their own hosts (``model.JobWaits.own_cause_s``; the straggler is the
rank that waits there, the others sit in collective_wait). A step where no rank waited on its own host is charged
to ``UNKNOWN``: the straggler is slow for a reason gpufeed cannot see on its host (its network, its code).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from exporter.fleet.model import FleetData, JobWaits
from exporter.names import WAITING_CAUSES

UNKNOWN = "unknown"
# Not a host's cause (too little work): never a straggler's, as the straggler rules count (alerts/generate.py).
LATENCY_BOUND = "latency_bound"
assert LATENCY_BOUND in WAITING_CAUSES


@dataclass(frozen=True, slots=True)
class CauseLoss:
    """GPU-hours lost waiting for a straggler slowed by ``cause`` (a waiting cause, or ``unknown``)."""

    cause: str
    gpu_hours: float


@dataclass(frozen=True, slots=True)
class JobLoss:
    """One distributed job: the GPU-hours its ranks lost waiting for a slower rank, by the straggler's cause."""

    namespace: str
    job_id: str
    lost_gpu_hours: float
    peak_ranks_waiting: float  # the most of its GPUs in collective_wait over one step, on average over that step
    by_cause: tuple[CauseLoss, ...]  # largest first


@dataclass(frozen=True, slots=True)
class Stragglers:
    """Every job's loss over the range (the ``top`` largest listed), and the fleet's by cause."""

    source: str  # the series counted: the recording rule, or the raw bottleneck series
    lost_gpu_hours: float
    by_cause: tuple[CauseLoss, ...]
    jobs: tuple[JobLoss, ...]


def _causes(per: dict[str, float]) -> tuple[CauseLoss, ...]:
    return tuple(CauseLoss(cause=c, gpu_hours=h) for c, h in sorted(per.items(), key=lambda x: (-x[1], x[0])) if h > 0)


def job_loss(job: JobWaits, step_s: float) -> JobLoss:
    """GPU-hours ``job`` lost: per step its GPU-seconds in collective_wait, charged to that step's straggler cause."""
    per: dict[str, float] = defaultdict(float)
    for i, lost in enumerate(job.collective_s):
        if lost <= 0:
            continue
        waits = {c: s[i] for c, s in job.own_cause_s.items() if i < len(s) and s[i] > 0}
        cause = max(sorted(waits), key=lambda c: waits[c]) if waits else UNKNOWN
        per[cause] += lost / 3600
    peak = max(job.collective_s, default=0.0) / step_s if step_s > 0 else 0.0
    return JobLoss(namespace=job.namespace, job_id=job.job_id, lost_gpu_hours=sum(per.values()),
                   peak_ranks_waiting=peak, by_cause=_causes(per))


def stragglers(data: FleetData, top: int) -> Stragglers:
    """The loss of every job of ``data``, the ``top`` largest listed, and the fleet's total by cause."""
    jobs = sorted((job_loss(j, data.window.step) for j in data.jobs),
                  key=lambda x: (-x.lost_gpu_hours, x.namespace, x.job_id))
    fleet: dict[str, float] = defaultdict(float)
    for j in jobs:
        for c in j.by_cause:
            fleet[c.cause] += c.gpu_hours
    return Stragglers(source=data.jobs_source, lost_gpu_hours=sum(j.lost_gpu_hours for j in jobs),
                      by_cause=_causes(fleet), jobs=tuple(jobs[:top]))
