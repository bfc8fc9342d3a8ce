"""The derived layer's metric families, built from one published :class:`~exporter.samples.derived.DerivedState`.

No I/O and no state: the analyzer's ``metrics`` hands its newest state here, and the renderer formats what
comes back. Series appear only when they hold (the series budget, DESIGN.md): a waiting cause with its first
waiting second, the active verdict only, downgraded hops and raised findings only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.samples import Sample

from exporter.derived.workload import LABELS as WORKLOAD_LABELS
from exporter.names import STATES, VERDICTS, WAITING_CAUSES
from exporter.samples.derived import GAP_BUCKETS, DerivedState
from exporter.samples.gpu import GpuKey


def derived_families(d: DerivedState) -> Iterator[Metric]:
    """Every derived family of one published state, then the workload's (:func:`workload_families`)."""
    w = f"{d.window_s:.0f} s"
    state = CounterMetricFamily(
        "gpufeed_gpu_state_seconds",
        "Seconds each GPU spent working (a kernel resident), waiting (work submitted, GPU idle) or idle "
        "(no work submitted); rate() is exact over any range.", labels=["gpu", "state"])
    waiting = CounterMetricFamily(
        "gpufeed_gpu_waiting_seconds",
        "Seconds each GPU spent waiting, attributed to the cause the classifier saw at the time; a cause "
        "appears with its first waiting second.",
        labels=["gpu", "cause"])
    joules = CounterMetricFamily(
        "gpufeed_gpu_waiting_joules",
        "Energy each GPU spent waiting, by cause: its energy counter (NVML field 83) over the same evaluations "
        "as gpufeed_gpu_waiting_seconds, each interval's joules times the share of it the GPU was not working. "
        "A cause appears with its first waiting joule; absent on GPUs without an energy counter and on MIG "
        "instances (the counter is the whole GPU's).",
        labels=["gpu", "cause"])
    bottleneck = GaugeMetricFamily(
        "gpufeed_gpu_bottleneck", f"Current verdict per GPU (window {w}, hysteresis): one series, value 1, "
        "labelled with the current cause; the other causes are absent (not 0).", labels=["gpu", "cause"])
    confidence = GaugeMetricFamily(
        "gpufeed_gpu_bottleneck_confidence", "Confidence 0..1 in the current verdict.", labels=["gpu"])
    gaps = HistogramMetricFamily(
        "gpufeed_gpu_idle_gap_seconds",
        "Length of each completed idle stretch of a GPU between bursts of activity (SM activity with GPM, "
        "utilisation otherwise).", labels=["gpu"])
    burst = GaugeMetricFamily(
        "gpufeed_gpu_burstiness_ratio",
        f"Coefficient of variation of GPU activity over the last {w} (0 steady, above 1 bursty).",
        labels=["gpu"])
    idle = GaugeMetricFamily(
        "gpufeed_gpu_idle_ratio", f"Share of the last {w} the GPU was idle (activity below 5%).", labels=["gpu"])
    periodic = GaugeMetricFamily(
        "gpufeed_gpu_idle_gaps_periodic",
        f"1 when the GPU's idle gaps over the last {w} recur at a regular period (batch boundaries); absent "
        "otherwise.",
        labels=["gpu"])
    down = GaugeMetricFamily(
        "gpufeed_pcie_link_downgraded",
        f"1 while this hop of the GPU's PCIe chain runs below its maximum while the GPU is busy (last {w}); "
        "absent for the hops that do not.",
        labels=["gpu", "bdf"])
    finding = GaugeMetricFamily(
        "gpufeed_finding", "1 for each platform finding currently raised; gpu=\"\" for host-wide ones.",
        labels=["check", "gpu"])
    links_done: set[int] = set()
    acts = {GpuKey(i): a for i, a in d.activity.items()} | dict(d.mig_activity)
    for key, a in sorted(acts.items()):
        lab = key.labels()  # a MIG instance's series carry mig next to gpu
        for s in STATES:
            _sample(state, "_total", {**lab, "state": s}, a.state_seconds.get(s, 0.0))
        for c in WAITING_CAUSES:
            # A cause appears with its first waiting second (the series budget: five zeros a GPU otherwise);
            # rate() and increase() over it are exact from its second sample on.
            if (secs := a.waiting_seconds.get(c, 0.0)) > 0.0:
                _sample(waiting, "_total", {**lab, "cause": c}, secs)
            if (j := a.waiting_joules.get(c, 0.0)) > 0.0:
                _sample(joules, "_total", {**lab, "cause": c}, j)
        cum = 0
        for le, n in zip((*map(str, GAP_BUCKETS), "+Inf"), a.gap_buckets, strict=True):
            cum += n
            _sample(gaps, "_bucket", {**lab, "le": le}, float(cum))
        _sample(gaps, "_count", lab, float(cum))
        _sample(gaps, "_sum", lab, a.gap_seconds_sum)
        if a.burstiness is not None:
            _sample(burst, "", lab, a.burstiness)
        if a.idle_ratio is not None:
            _sample(idle, "", lab, a.idle_ratio)
            if a.periodic_gaps:  # a flag: 1 or absent (the series budget)
                _sample(periodic, "", lab, 1.0)
        if key.gpu not in links_done:  # the PCIe chain is the physical GPU's: once per GPU
            links_done.add(key.gpu)
            # Downgraded hops only (the series budget): every hop of the chain is judged, and `== 1`, the
            # alert and the fleet report read the ones that hold.
            for bdf, flag in sorted(a.links.items()):
                if flag:
                    down.add_metric([str(key.gpu), bdf], 1.0)
    for key, v in d.verdicts().items():
        # The active value only (DESIGN.md series budget): 1 series instead of one per verdict; a change of
        # verdict ends one series and starts another, which `== 1`, `count by (cause)` and `or` read alike.
        assert v.cause in VERDICTS, v.cause
        _sample(bottleneck, "", {**key.labels(), "cause": v.cause}, 1.0)
        _sample(confidence, "", key.labels(), v.confidence)
    for check_gpu in sorted({(f.check, "" if f.gpu is None else str(f.gpu)) for f in d.findings}):
        finding.add_metric(list(check_gpu), 1.0)
    yield from (state, waiting, joules, bottleneck, confidence, gaps, burst, idle, periodic, down, finding)
    yield from workload_families(d)


def workload_families(d: DerivedState) -> Iterator[Metric]:
    """gpufeed_workload_info (one series per GPU, labels only when known) and the workload's CPU."""
    info = Metric("gpufeed_workload_info",
                  "Who owns the GPU's workload (value 1), one series per GPU: container_id, slurm_job_id and unit from "
                  "the cgroup path; namespace, pod and container from the kubelet's pod-resources API. A label is "
                  "present only when known. Join: * on (job, instance, gpu) group_left(namespace) ...", "gauge")
    cores = GaugeMetricFamily("gpufeed_workload_cpu_cores",
                              "CPU the GPU's workload used over the CPU window (cores).", labels=["gpu"])
    cap = GaugeMetricFamily("gpufeed_workload_cpu_capacity_cores",
                            "CPU the GPU's workload may use: the smaller of its cpuset (allowed CPUs) and its CFS "
                            "quota (cores).", labels=["gpu"])
    for idx, wl in sorted(d.workloads.items()):
        g = str(idx)
        info.add_sample("gpufeed_workload_info",
                        {"gpu": g, **{k: wl.labels[k] for k in WORKLOAD_LABELS if k in wl.labels}}, 1.0)
        if wl.cpu_cores is not None:
            cores.add_metric([g], wl.cpu_cores)
        if wl.capacity_cores is not None:
            cap.add_metric([g], wl.capacity_cores)
    yield from (info, cores, cap)


def _sample(family: Metric, suffix: str, labels: Mapping[str, str], value: float) -> None:
    """Append one sample with its own label set (``mig`` only on a MIG instance's series)."""
    family.samples.append(Sample(family.name + suffix, dict(labels), float(value), None))
