"""One name per concept: sampler names and the verdict, state, finding and severity vocabulary (the verdicts'
and findings' names taken from their records in exporter/vocabulary.py).

Every string here is used verbatim in code, metric labels, alert rules (``alerts/generate.py``), dashboards
(``deploy/grafana/generate.py``), JSON output and docs; import it from here, never retype it.
"""

from __future__ import annotations

# ---- samplers: defined once with the stages' registration (exporter/sampling.py); re-exported for the readers
# of their samples (``X as X``: an explicit re-export, which mypy --strict needs)
# ruff: noqa: PLC0414
from exporter.sampling import CAPTURE as CAPTURE
from exporter.sampling import CPU as CPU
from exporter.sampling import CPUFREQ as CPUFREQ
from exporter.sampling import DERIVED as DERIVED
from exporter.sampling import DISK as DISK
from exporter.sampling import GPU_FAST as GPU_FAST
from exporter.sampling import GPU_SAMPLERS as GPU_SAMPLERS
from exporter.sampling import GPU_SAMPLES as GPU_SAMPLES
from exporter.sampling import GPU_SLOW as GPU_SLOW
from exporter.sampling import KUBERNETES as KUBERNETES
from exporter.sampling import MEMORY as MEMORY
from exporter.sampling import NFS as NFS
from exporter.sampling import NIC as NIC
from exporter.sampling import NUMA as NUMA
from exporter.sampling import PCIE as PCIE
from exporter.sampling import PRESSURE as PRESSURE
from exporter.sampling import PROC as PROC
from exporter.sampling import PROC_THREADS as PROC_THREADS
from exporter.sampling import SELF as SELF
from exporter.sampling import WORKLOAD as WORKLOAD
from exporter.vocabulary import FINDING_LIST, VERDICT_LIST

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
# What a capture (--capture.enabled, diagnose --stacks) says a workload thread does: capture-side words that
# confirm or question a verdict, not verdicts (exporter/capture/stacks.py); and what started a capture.
CAPTURE_INPUT, CAPTURE_SYNC, CAPTURE_LAUNCH, CAPTURE_BUSY = "input", "sync", "launch", "busy"
CAPTURE_LABELS = (CAPTURE_INPUT, CAPTURE_SYNC, CAPTURE_LAUNCH, CAPTURE_BUSY)
CAPTURE_TRIGGERS = ("verdict", "http", "diagnose")

# ---- GPU health ------------------------------------------------------------------------------------------------
# What the Xid codes gpufeed raises mean (NVIDIA's Xid catalogue, docs.nvidia.com/deploy/xid-errors, and its GPU
# memory error management guide, docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt); which of them are raised, and
# at which severity, is exporter/thresholds.yaml gpu_xid_error.
XID_MEANING = {
    48: "double-bit ECC error", 63: "row remapping / page retirement recorded", 64: "row remapping failed",
    74: "NVLink error", 79: "GPU has fallen off the bus", 92: "high single-bit ECC error rate",
    94: "contained ECC error", 95: "uncontained ECC error", 119: "GSP RPC timeout", 120: "GSP error",
}
