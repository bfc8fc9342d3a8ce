"""A week of gpufeed history for a small simulated fleet, as OpenMetrics text for ``promtool tsdb
create-blocks-from openmetrics``, and the truth it was built from.

What each GPU does comes from the shared scenarios: a *profile* is one phase of one scenario file
(tests/scenarios, mirrored from shared/scenarios), with its mean utilisation, its expected verdict and its
expected findings. A GPU's week is a list of segments (hours from the start of the range), each a profile
and a workload (a Kubernetes pod or a Slurm job). The series are those gpufeed exports (docs/metrics.md, and
gpufeed_workload_info from the workloads contract), scraped every ``scrape_s`` seconds with a per-host offset,
so range boundaries never line up with samples. A host can be down for a while: no scrapes, and its counters
restart from zero (a daemon restart: Prometheus sees a counter reset).

The truth is computed from the same piecewise-constant rates, exactly, for any interval: the report must
match it within 1%.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, TextIO

import yaml

from exporter.names import STATES, WAITING_CAUSES
from exporter.samples.derived import GAP_BUCKETS

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
JOB = "gpufeed"
LEAD_S = 900  # history before the range starts (the first step's increase needs samples before it)


# -------------------------------------------------------------------------------------------------- profiles


@dataclass(frozen=True)
class Profile:
    """GPU-seconds per second in each state, the waiting cause, idle gaps and findings while it runs."""

    name: str
    working: float
    waiting: float
    idle: float
    cause: str | None
    gap_s: float  # length of each idle gap between bursts
    gaps_per_s: float
    gpu_findings: tuple[str, ...]
    host_findings: tuple[str, ...]
    link: tuple[int, int] | None  # (gen, width) while busy; None = the slot's maximum
    verdict: str = ""  # gpufeed_gpu_bottleneck's cause (written for the ranks of distributed jobs)


def _mean(value: Any) -> tuple[float, float | None, float | None]:
    """Mean of a scenario value, and the period and duty of a square pattern (None otherwise)."""
    if isinstance(value, (int, float)):
        return float(value), None, None
    if "square" in value:
        sq = value["square"]
        return (sq["high"] * sq["duty"] + sq.get("low", 0.0) * (1 - sq["duty"]), float(sq["period_s"]),
                float(sq["duty"]))
    return float(value["noise"]["mean"]), None, None


@cache
def scenario_profile(file: str, phase: str) -> Profile:
    """The profile of ``phase`` of scenario ``file``: what gpufeed measured there, as steady rates."""
    doc = yaml.safe_load((SCENARIOS / file).read_text())
    state: dict[str, Any] = {}
    for ph in doc["phases"]:
        state.update(ph.get("gpus", {}).get(0, {}))
        if ph["name"] == phase:
            break
    expect = next(e for e in doc.get("expect", []) if e["phase"] == phase)
    verdict = expect["gpus"][0]
    util, period, duty = _mean(state.get("gpu_util", 0.0))
    link = state.get("link")
    gpu_f = tuple(sorted(f["check"] for f in expect.get("findings", []) if "gpu" in f))
    host_f = tuple(sorted(f["check"] for f in expect.get("findings", []) if "gpu" not in f))
    if verdict == "idle":
        return Profile(f"{file}:{phase}", 0.0, 0.0, 1.0, None, 0.0, 0.0, gpu_f, host_f, (1, link["width"]) if link
                       else (1, 16), verdict)
    # Waiting is the rest of the time while work is submitted; a working verdict's small rest is latency_bound
    # (DESIGN.md: the cause the host evidence best supports, "other wait" when the host is quiet).
    cause = verdict if verdict in WAITING_CAUSES else "latency_bound"
    if period is not None and duty is not None:
        gap_s, rate = period * (1 - duty), 1 / period
    else:
        gap_s, rate = max(0.02, 1 - util), 1.0
    return Profile(f"{file}:{phase}", util, 1 - util, 0.0, cause, gap_s, rate, gpu_f, host_f,
                   (int(link["gen"]), int(link["width"])) if link else None, verdict)


# A rank of a distributed job waiting in its collectives for a slower rank: its GPU spins in NCCL kernels (busy,
# booked as working), its verdict collective_wait (exporter/vocabulary.py); no scenario file has this phase.
COLLECTIVE_WAIT = Profile("collective_wait", 1.0, 0.0, 0.0, None, 0.0, 0.0, (), (), None, "collective_wait")


PROFILES = {
    "input_bound": ("input_bound.yaml", "starved"),
    "healthy": ("healthy_training.yaml", "training"),
    "idle": ("healthy_training.yaml", "idle"),
    "launch_bound": ("launch_bound.yaml", "starved"),
    "transfer_bound": ("transfer_bound_riser.yaml", "copying"),
    "io_bound": ("io_bound_nfs.yaml", "starved"),
    "latency_bound": ("latency_bound_inference.yaml", "serving"),
    "throttled": ("thermal_throttled.yaml", "hot"),
    "numa": ("numa_mismatch.yaml", "running"),
    "powersave": ("memory_pressure_powersave.yaml", "pressured"),
    "inefficient": ("gpu_inefficient.yaml", "running"),
}


def profile(key: str) -> Profile:
    return COLLECTIVE_WAIT if key == COLLECTIVE_WAIT.name else scenario_profile(*PROFILES[key])


# --------------------------------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class Segment:
    """From ``start_h`` to ``end_h`` (hours from the range start) the GPU runs ``profile`` for ``workload``."""

    start_h: float
    end_h: float
    profile: str
    workload: Mapping[str, str] = field(default_factory=dict)


def pod(namespace: str, name: str) -> dict[str, str]:
    return {"namespace": namespace, "pod": name, "container": "trainer",
            "container_id": f"containerd://{zlib.crc32(f'{namespace}/{name}'.encode()):08x}"}


def slurm(job_id: str) -> dict[str, str]:
    return {"slurm_job_id": job_id, "unit": "slurmstepd.scope"}


def rank(namespace: str, job_id: str, r: int) -> dict[str, str]:
    """Rank ``r`` of a distributed job (gpufeed_workload_info's job identity, docs/metrics.md)."""
    return {**pod(namespace, f"{job_id}-worker-{r}"), "job_id": job_id, "rank": str(r)}


@dataclass(frozen=True)
class HostPlan:
    name: str
    model: str
    max_link: tuple[int, int]
    gpus: tuple[tuple[Segment, ...], ...]
    downtime_h: tuple[tuple[float, float], ...] = ()
    energy: bool = True  # its GPUs export gpufeed_gpu_waiting_joules_total (an energy counter, NVML field 83)


D = 24.0


def default_plans() -> list[HostPlan]:
    """Five hosts, two GPUs each: vision/nlp/recsys namespaces and two Slurm jobs, causes changing over the week.

    gpu-c and gpu-e are identical A100 PCIe servers running the same recsys workloads; gpu-c's GPU 0 sits
    behind a riser at Gen3 x8 ("two identical servers differ").
    """
    vision, nlp, recsys = pod("vision", "resnet-trainer-0"), pod("nlp", "bert-pretrain-0"), pod("recsys", "dlrm-0")
    return [
        HostPlan("gpu-a", "NVIDIA H100 80GB HBM3", (5, 16), (
            (Segment(0, 3 * D, "input_bound", vision), Segment(3 * D, 7 * D, "healthy", vision)),
            (Segment(0, 2 * D, "input_bound", vision), Segment(2 * D, 2.5 * D, "idle"),
             Segment(2.5 * D, 7 * D, "healthy", pod("vision", "resnet-trainer-1"))),
        )),
        HostPlan("gpu-b", "NVIDIA H100 80GB HBM3", (5, 16), (
            (Segment(0, 2 * D, "launch_bound", nlp), Segment(2 * D, 4 * D, "powersave", nlp),
             Segment(4 * D, 7 * D, "healthy", nlp)),
            (Segment(0, 1 * D, "idle"), Segment(1 * D, 5 * D, "launch_bound", pod("nlp", "bert-pretrain-1")),
             Segment(5 * D, 6 * D, "throttled", pod("nlp", "bert-pretrain-1")), Segment(6 * D, 7 * D, "idle")),
        )),
        HostPlan("gpu-c", "NVIDIA A100 80GB PCIe", (4, 16), (
            (Segment(0, 7 * D, "transfer_bound", recsys),),
            (Segment(0, 4 * D, "healthy", recsys), Segment(4 * D, 7 * D, "latency_bound", pod("recsys", "ranker-0"))),
        )),
        HostPlan("gpu-d", "NVIDIA A100-SXM4-80GB", (4, 16), (
            (Segment(0, 4 * D, "io_bound", slurm("4242")), Segment(4 * D, 7 * D, "latency_bound", slurm("4243"))),
            (Segment(0, 4 * D, "io_bound", slurm("4242")), Segment(4 * D, 6 * D, "inefficient", slurm("4243")),
             Segment(6 * D, 7 * D, "idle")),
        ), downtime_h=((50.0, 56.0),)),
        HostPlan("gpu-e", "NVIDIA A100 80GB PCIe", (4, 16), (
            (Segment(0, 7 * D, "healthy", pod("recsys", "dlrm-1")),),
            (Segment(0, 5 * D, "healthy", pod("recsys", "ranker-1")), Segment(5 * D, 7 * D, "numa", recsys)),
        ), energy=False),
    ]


# The straggler episodes of straggler_plans(), hours from the range start: (start, end, the slow rank, its cause).
STRAGGLER_EPISODES = ((4.5, 34.5, 0, "transfer_bound"), (40.0, 60.25, 3, "io_bound"))


def straggler_plans() -> list[HostPlan]:
    """One distributed job of four ranks on two hosts (ranks 0-1 on gpu-f, 2-3 on gpu-g), healthy but for the
    STRAGGLER_EPISODES: then the slow rank waits on its host's cause and the three others in collective_wait, so
    the job loses 3 x the episode's length. The episodes are long against the 5 minutes a backfilled series stays
    visible after its last sample (no staleness marker: a few GPU-minutes per episode, well within 1%)."""
    ranks = [rank("llm", "llm-pretrain", r) for r in range(4)]
    per_rank = []
    for r in range(4):
        segs, t = [], 0.0
        for a, b, slow, cause in STRAGGLER_EPISODES:
            segs += [Segment(t, a, "healthy", ranks[r]), Segment(a, b, cause if r == slow else "collective_wait",
                                                                 ranks[r])]
            t = b
        per_rank.append((*segs, Segment(t, 3 * D, "healthy", ranks[r])))
    return [HostPlan("gpu-f", "NVIDIA H100 80GB HBM3", (5, 16), tuple(per_rank[:2])),
            HostPlan("gpu-g", "NVIDIA H100 80GB HBM3", (5, 16), tuple(per_rank[2:]))]


def scaled_plans(hosts: int, gpus_per_host: int) -> list[HostPlan]:
    """``hosts`` hosts of ``gpus_per_host`` GPUs, cycling through the default plans (for the benchmark)."""
    base = default_plans()
    out = []
    for h in range(hosts):
        p = base[h % len(base)]
        name = p.name if h < len(base) else f"{p.name}{h // len(base) + 1}"
        out.append(HostPlan(name, p.model, p.max_link, tuple(p.gpus[g % len(p.gpus)] for g in range(gpus_per_host)),
                            p.downtime_h, p.energy))
    return out


# --------------------------------------------------------------------------------------------------- fleet


@dataclass
class _Gpu:
    host: HostPlan
    index: int
    profiles: list[Profile]  # per minute
    workloads: list[Mapping[str, str]]  # per minute
    up: list[bool]  # per minute: the host's exporter was running
    restart_minute: list[int]  # per minute: the minute the exporter last started (counters count from there)


class Fleet:
    """The simulated fleet over ``(start, end]``, minute by minute from ``start - LEAD_S`` to ``end + LEAD_S``."""

    def __init__(self, plans: Sequence[HostPlan], start: float, end: float, scrape_s: int = 60) -> None:
        assert start % 60 == 0 and end % 60 == 0 and 60 % scrape_s == 0
        self.plans, self.start, self.end, self.scrape_s = list(plans), start, end, scrape_s
        self.origin = start - LEAD_S
        self.minutes = int((end + LEAD_S - self.origin) // 60)
        self.gpus: list[_Gpu] = []
        for plan in self.plans:
            up = [not any(a * 3600 <= self._rel(m) < b * 3600 for a, b in plan.downtime_h) for m in range(self.minutes)]
            restart, last = [], 0
            for m in range(self.minutes):
                if m and up[m] and not up[m - 1]:
                    last = m
                restart.append(last)
            for i, segs in enumerate(plan.gpus):
                profs, loads = [], []
                for m in range(self.minutes):
                    seg = self._segment(segs, self._rel(m) / 3600)
                    profs.append(profile(seg.profile) if seg else profile("idle"))
                    loads.append(seg.workload if seg else {})
                self.gpus.append(_Gpu(plan, i, profs, loads, up, restart))

    def _rel(self, m: int) -> float:
        """Seconds from the range start to the start of minute ``m``."""
        return self.origin + 60 * m - self.start

    @staticmethod
    def _segment(segs: Sequence[Segment], h: float) -> Segment | None:
        if h < segs[0].start_h:
            return segs[0]
        for s in segs:
            if s.start_h <= h < s.end_h:
                return s
        return segs[-1] if h >= segs[-1].end_h else None

    def instance(self, plan: HostPlan) -> str:
        return f"{plan.name}:9842"

    def offset(self, plan: HostPlan) -> int:
        """Seconds after each minute at which Prometheus scrapes this host (never on a step boundary)."""
        return (7 + zlib.crc32(plan.name.encode())) % self.scrape_s or 1

    # ---- rates

    @staticmethod
    def _rate(p: Profile, key: str) -> float:
        if key in STATES:
            return float(getattr(p, key))
        return p.waiting if key == p.cause else 0.0

    def _host_findings(self, plan: HostPlan, m: int) -> set[str]:
        """Host-wide findings raised in minute m: those of the profiles its GPUs run."""
        return {c for g in self.gpus if g.host is plan for c in g.profiles[m].host_findings}

    def waiting_watts(self, g: _Gpu) -> float:
        """What GPU ``g`` draws while it waits: a known constant per GPU, from its host's name and its index (not
        from the host's place in the plans: the backfill writes the hosts in parts)."""
        return 90.0 + 15.0 * (zlib.crc32(g.host.name.encode()) % 8) + 5.0 * g.index

    def _joules_rate(self, g: _Gpu, p: Profile, cause: str) -> float:
        return self._rate(p, cause) * self.waiting_watts(g)

    # ---- OpenMetrics

    def _scrapes(self, g: _Gpu) -> Iterator[tuple[int, int, float]]:
        """(minute, unix time, seconds into the minute) of every scrape of ``g``'s host."""
        off = self.offset(g.host)
        for m in range(self.minutes):
            if not g.up[m]:
                continue
            for k in range(0, 60, self.scrape_s):
                yield m, int(self.origin + 60 * m + off + k), float(off + k)

    def _counter(self, g: _Gpu, rate_of: Any) -> Iterator[tuple[int, float]]:
        """(time, value) of a counter whose per-second rate in minute m is ``rate_of(m)``, counted from the
        exporter's last start (a restart resets it to zero)."""
        prefix = [0.0]
        for m in range(self.minutes):
            prefix.append(prefix[-1] + (rate_of(m) * 60 if g.up[m] else 0.0))
        for m, t, into in self._scrapes(g):
            yield t, prefix[m] - prefix[g.restart_minute[m]] + rate_of(m) * into

    def write_openmetrics(self, out: TextIO) -> int:
        """Write every series; returns the number of samples."""
        n = 0

        def lab(g: _Gpu, gpu: str | None = None, **extra: str) -> str:
            labels = {"instance": self.instance(g.host), "job": JOB, "gpu": str(g.index) if gpu is None else gpu,
                      **extra}
            return ",".join(f'{k}="{v}"' for k, v in labels.items())

        for family, label, keys in (("gpufeed_gpu_state_seconds", "state", STATES),
                                    ("gpufeed_gpu_waiting_seconds", "cause", WAITING_CAUSES)):
            out.write(f"# TYPE {family} counter\n")
            for g in self.gpus:
                for key in keys:
                    ls = lab(g, **{label: key})
                    for t, v in self._counter(g, lambda m, g=g, key=key: self._rate(g.profiles[m], key)):
                        out.write(f"{family}_total{{{ls}}} {v:.4f} {t}\n")
                        n += 1
        out.write("# TYPE gpufeed_gpu_waiting_joules counter\n")
        for g in (x for x in self.gpus if x.host.energy):
            for key in WAITING_CAUSES:
                ls = lab(g, cause=key)
                for t, v in self._counter(g, lambda m, g=g, key=key: self._joules_rate(g, g.profiles[m], key)):
                    out.write(f"gpufeed_gpu_waiting_joules_total{{{ls}}} {v:.3f} {t}\n")
                    n += 1
        out.write("# TYPE gpufeed_gpu_idle_gap_seconds histogram\n")
        for g in self.gpus:
            for k, le in enumerate((*GAP_BUCKETS, math.inf)):
                ls = lab(g, le="+Inf" if math.isinf(le) else f"{le:g}")
                for t, v in self._counter(g, lambda m, g=g, k=k: self._gaps_rate(g.profiles[m], k)):
                    out.write(f"gpufeed_gpu_idle_gap_seconds_bucket{{{ls}}} {math.floor(v)} {t}\n")
                    n += 1
            for suffix, rate in (("count", lambda p: p.gaps_per_s), ("sum", lambda p: p.gaps_per_s * p.gap_s)):
                ls = lab(g)
                for t, v in self._counter(g, lambda m, g=g, rate=rate: rate(g.profiles[m])):
                    out.write(f"gpufeed_gpu_idle_gap_seconds_{suffix}{{{ls}}} {v:.4f} {t}\n")
                    n += 1
        for metric in ("generation", "width"):
            out.write(f"# TYPE gpufeed_gpu_pcie_link_{metric} gauge\n")
            for g in self.gpus:
                ls = lab(g, kind="current")
                for m, t, _ in self._scrapes(g):
                    v = self._link(g, m, "current")[0 if metric == "generation" else 1]
                    out.write(f"gpufeed_gpu_pcie_link_{metric}{{{ls}}} {v} {t}\n")
                    n += 1
        out.write("# TYPE gpufeed_gpu_pcie_link_info gauge\n")
        for g in self.gpus:
            max_gen, max_width = self._link(g, 0, "max")
            ls = lab(g, max_generation=str(max_gen), gpu_max_generation=str(max_gen), max_width=str(max_width))
            for _m, t, _ in self._scrapes(g):
                out.write(f"gpufeed_gpu_pcie_link_info{{{ls}}} 1 {t}\n")
                n += 1
        out.write("# TYPE gpufeed_pcie_link_downgraded gauge\n")
        for g in self.gpus:
            ls = lab(g, bdf=self.bdf(g))
            for m, t, _ in self._scrapes(g):
                v = 1 if "pcie_link_downgraded" in g.profiles[m].gpu_findings else 0
                out.write(f"gpufeed_pcie_link_downgraded{{{ls}}} {v} {t}\n")
                n += 1
        out.write("# TYPE gpufeed_gpu_info gauge\n")
        for g in self.gpus:
            ls = lab(g, uuid=f"GPU-{zlib.crc32(f'{g.host.name}/{g.index}'.encode()):08x}", name=g.host.model,
                     pci_bus_id=self.bdf(g), numa_node=str(g.index // 4))
            for _, t, _ in self._scrapes(g):
                out.write(f"gpufeed_gpu_info{{{ls}}} 1 {t}\n")
                n += 1
        out.write("# TYPE gpufeed_workload_info gauge\n")
        for g in self.gpus:
            series: dict[str, list[int]] = {}
            for m, t, _ in self._scrapes(g):
                if g.workloads[m]:
                    series.setdefault(lab(g, **g.workloads[m]), []).append(t)
            for ls, times in series.items():
                out.writelines(f"gpufeed_workload_info{{{ls}}} 1 {t}\n" for t in times)
                n += len(times)
        out.write("# TYPE gpufeed_gpu_bottleneck gauge\n")
        for g in self.gpus:
            series = {}
            for m, t, _ in self._scrapes(g):
                if g.workloads[m].get("job_id"):
                    series.setdefault(lab(g, cause=g.profiles[m].verdict), []).append(t)
            for ls, times in series.items():
                out.writelines(f"gpufeed_gpu_bottleneck{{{ls}}} 1 {t}\n" for t in times)
                n += len(times)
        out.write("# TYPE gpufeed_finding gauge\n")
        for plan in self.plans:
            host_gpu = next(g for g in self.gpus if g.host is plan)
            series = {}
            for m, t, _ in self._scrapes(host_gpu):
                for c in sorted(self._host_findings(plan, m)):
                    series.setdefault(lab(host_gpu, gpu="", check=c), []).append(t)
            for g in (x for x in self.gpus if x.host is plan):
                for m, t, _ in self._scrapes(g):
                    for c in g.profiles[m].gpu_findings:
                        series.setdefault(lab(g, check=c), []).append(t)
            for ls, times in series.items():
                out.writelines(f"gpufeed_finding{{{ls}}} 1 {t}\n" for t in times)
                n += len(times)
        out.write("# EOF\n")
        return n

    @staticmethod
    def _gaps_rate(p: Profile, k: int) -> float:
        """Rate of the cumulative bucket k (le = GAP_BUCKETS[k], or +Inf)."""
        bounds = (*GAP_BUCKETS, math.inf)
        return p.gaps_per_s if p.gaps_per_s > 0 and p.gap_s <= bounds[k] else 0.0

    def _link(self, g: _Gpu, m: int, kind: str) -> tuple[int, int]:
        if kind == "max":
            return g.host.max_link
        p = g.profiles[m]
        if p.idle >= 1.0:
            return 1, g.host.max_link[1]  # idle GPUs drop to Gen1 by design
        return p.link or g.host.max_link

    def bdf(self, g: _Gpu) -> str:
        return f"0000:{0x18 + 0x40 * g.index:02x}:00.0"

    # ---- truth

    def _overlap(self, m: int, a: float, b: float) -> float:
        lo, hi = self.origin + 60 * m, self.origin + 60 * (m + 1)
        return max(0.0, min(hi, b) - max(lo, a))

    def _integrate(self, g: _Gpu, rate_of: Any, a: float, b: float) -> float:
        m0, m1 = max(0, int((a - self.origin) // 60)), min(self.minutes, math.ceil((b - self.origin) / 60))
        return float(sum(rate_of(m) * self._overlap(m, a, b) for m in range(m0, m1) if g.up[m]))

    def gpu_key(self, g: _Gpu) -> tuple[str, str, str]:
        return JOB, self.instance(g.host), str(g.index)

    def truth_seconds(self, key: str, a: float | None = None, b: float | None = None,
                      gpus: Sequence[_Gpu] | None = None) -> float:
        """GPU-seconds in state or waiting cause ``key`` over (a, b] (default: the range) on ``gpus``."""
        lo, hi = self.start if a is None else a, self.end if b is None else b
        return sum(self._integrate(g, lambda m, g=g: self._rate(g.profiles[m], key), lo, hi)
                   for g in (self.gpus if gpus is None else gpus))

    def truth_joules(self, cause: str, a: float | None = None, b: float | None = None) -> float:
        """Joules spent waiting on ``cause`` over (a, b] (default: the range), on the GPUs with an energy counter."""
        lo, hi = self.start if a is None else a, self.end if b is None else b
        return sum(self._integrate(g, lambda m, g=g: self._joules_rate(g, g.profiles[m], cause), lo, hi)
                   for g in self.gpus if g.host.energy)

    def truth_group_joules(self, label: str) -> dict[str, float]:
        """Joules spent waiting (every cause) per value of workload label ``label``, over the range."""
        out: dict[str, float] = {}
        for g in (x for x in self.gpus if x.host.energy):
            for m in range(self.minutes):
                name = g.workloads[m].get(label)
                if name and g.up[m]:
                    w = sum(self._joules_rate(g, g.profiles[m], c) for c in WAITING_CAUSES)
                    out[name] = out.get(name, 0.0) + w * self._overlap(m, self.start, self.end)
        return out

    def host_gpus(self, host: str) -> list[_Gpu]:
        return [g for g in self.gpus if g.host.name == host]

    def truth_group(self, label: str, key: str) -> dict[str, float]:
        """GPU-seconds in ``key`` per value of workload label ``label`` (namespace, slurm_job_id)."""
        out: dict[str, float] = {}
        for g in self.gpus:
            for m in range(self.minutes):
                name = g.workloads[m].get(label)
                if name and g.up[m]:
                    out[name] = out.get(name, 0.0) + self._rate(g.profiles[m], key) * self._overlap(
                        m, self.start, self.end)
        return out

    def truth_findings(self) -> dict[tuple[str, str], float]:
        """Seconds each (host, check) had the finding raised on any of its GPUs or host-wide, over the range."""
        out: dict[tuple[str, str], float] = {}
        for plan in self.plans:
            gpus = [g for g in self.gpus if g.host is plan]
            for m in range(self.minutes):
                if not gpus[0].up[m]:
                    continue
                checks = self._host_findings(plan, m) | {c for g in gpus for c in g.profiles[m].gpu_findings}
                for c in checks:
                    out[(plan.name, c)] = out.get((plan.name, c), 0.0) + self._overlap(m, self.start, self.end)
        return {k: v for k, v in out.items() if v > 0}

    def truth_straggler_loss(self) -> dict[tuple[str, str], dict[str, float]]:
        """GPU-seconds each distributed job (namespace, job_id) lost over the range to a slower rank, by its cause:
        minute by minute, its ranks in collective_wait x the minute, charged to the waiting cause its ranks spent
        most on (every cause but latency_bound)."""
        out: dict[tuple[str, str], dict[str, float]] = {}
        jobs: dict[tuple[str, str], list[_Gpu]] = {}
        for g in self.gpus:
            for w in {(x["namespace"], x["job_id"]) for x in g.workloads if x.get("job_id")}:
                jobs.setdefault(w, []).append(g)
        for job, gpus in jobs.items():
            for m in range(self.minutes):
                ranks = [g for g in gpus if g.up[m] and (g.workloads[m].get("namespace"),
                                                           g.workloads[m].get("job_id")) == job]
                waiting = sum(g.profiles[m].verdict == "collective_wait" for g in ranks)
                own = {c: sum(self._rate(g.profiles[m], c) for g in ranks) for c in WAITING_CAUSES
                       if c != "latency_bound"}
                if not waiting or max(own.values()) <= 0:
                    continue
                cause = max(sorted(own), key=lambda c: own[c])
                per = out.setdefault(job, {})
                per[cause] = per.get(cause, 0.0) + waiting * self._overlap(m, self.start, self.end)
        return out

    def truth_gaps(self, g: _Gpu) -> list[float]:
        """Idle gaps completed over the range per bucket (non-cumulative; the last is > the largest bound)."""
        bounds = (*GAP_BUCKETS, math.inf)
        counts = [0.0] * len(bounds)
        for m in range(self.minutes):
            p = g.profiles[m]
            if g.up[m] and p.gaps_per_s > 0:
                k = next(i for i, b in enumerate(bounds) if p.gap_s <= b)
                counts[k] += p.gaps_per_s * self._overlap(m, self.start, self.end)
        return counts


def write_file(fleet: Fleet, path: Path) -> int:
    with path.open("w") as f:
        return fleet.write_openmetrics(f)
