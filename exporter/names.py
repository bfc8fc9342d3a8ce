"""One name per concept: sampler names and the verdict, state, finding and severity vocabulary (the verdicts'
and findings' names taken from their records in exporter/vocabulary.py).

Every string here is used verbatim in code, metric labels, alert rules (``alerts/generate.py``), dashboards
(``deploy/grafana/generate.py``), JSON output and docs; import it from here, never retype it.
"""

from __future__ import annotations

from exporter.vocabulary import FINDING_LIST, VERDICT_LIST

# ---- samplers (a collector may have several; each runs at its own interval) ---------------------------------
GPU_FAST = "gpu"  # GPM pairs, field values, SM clock (100 ms)
GPU_SAMPLES = "gpu_samples"  # the driver's buffered utilisation samples (1 s)
GPU_SLOW = "gpu_slow"  # link state, clock-event reasons, temperature, memory, processes (5 s)
GPU_SAMPLERS = (GPU_FAST, GPU_SAMPLES, GPU_SLOW)
PROC = "proc"  # process-level /proc/<pid> files of the inspected processes
PROC_THREADS = "proc_threads"  # per-thread /proc/<pid>/task/<tid>/stat (deep, on demand)
CPU = "cpu"
CPUFREQ = "cpufreq"
MEMORY = "memory"
PRESSURE = "pressure"
DISK = "disk"
NFS = "nfs"
PCIE = "pcie"
NUMA = "numa"
DERIVED = "derived"  # the analyzer: verdicts, findings, state seconds
WORKLOAD = "workload"  # process trees and cgroups of the GPU processes
KUBERNETES = "kubernetes"  # the kubelet's pod-resources API: which pod holds which GPU

# ---- the verdict and the findings (DESIGN.md): the records are exporter/vocabulary.py's --------------------------
VERDICTS = tuple(v.name for v in VERDICT_LIST)
# The verdicts that mean the GPU is waiting; gpufeed_gpu_waiting_seconds_total{cause} is split over them.
WAITING_CAUSES = tuple(v.name for v in VERDICT_LIST if v.waiting)
# A verdict that needs nothing done: diagnose exits 0 only when every GPU has one of these.
QUIET_VERDICTS = tuple(v.name for v in VERDICT_LIST if v.quiet)
STATES = ("working", "waiting", "idle")
# Platform findings, independent of the verdict.
FINDINGS = tuple(f.name for f in FINDING_LIST)
SEVERITIES = ("critical", "warning", "info")

# ---- GPU health ------------------------------------------------------------------------------------------------
# What the Xid codes gpufeed raises mean (NVIDIA's Xid catalogue, docs.nvidia.com/deploy/xid-errors, and its GPU
# memory error management guide, docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt); which of them are raised, and
# at which severity, is exporter/thresholds.yaml gpu_xid_error.
XID_MEANING = {
    48: "double-bit ECC error", 63: "row remapping / page retirement recorded", 64: "row remapping failed",
    74: "NVLink error", 79: "GPU has fallen off the bus", 92: "high single-bit ECC error rate",
    94: "contained ECC error", 95: "uncontained ECC error", 119: "GSP RPC timeout", 120: "GSP error",
}
