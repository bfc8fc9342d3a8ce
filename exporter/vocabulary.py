"""The verdict and finding vocabulary: one record per name, and every table of it derived from here.

A verdict (DESIGN.md) says what a GPU is doing; a finding is a platform problem, independent of the verdict.
Each record carries what every consumer shows of the name: its human label, its colour (dashboards and
``gpufeed report`` alike), the next command ``gpufeed diagnose`` prints, the fix the fleet report and its
tickets give, and the heading of ``docs/runbooks.md`` that explains it. ``exporter.names`` (the name tuples),
``exporter.fleet.playbook`` (labels and fixes), the diagnose report's next checks, ``exporter.fleet.plots``
and ``deploy/grafana/generate.py`` (colours) and the diagnose JSON Schema's enums are built from these
tuples; ``tests/test_vocabulary.py`` fails when any of them disagrees.

Adding a verdict or a finding: docs/architecture.md, "Recipe: a new verdict / a new finding".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

State = Literal["working", "waiting", "idle"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """One verdict: what a GPU is doing over the classifier's window."""

    name: str
    label: str  # a few words for prose ("62% of the waiting was on <label>")
    state: State  # the GPU state the verdict belongs to: a "waiting" verdict is a cause of waiting seconds
    colour: str  # #rrggbb, the same on every dashboard panel and report plot
    next_check: str  # the command ``gpufeed diagnose`` suggests; {pid} and {bdf} are filled in
    fix: str  # the field playbook's fix, shortest first
    runbook: str  # the heading of docs/runbooks.md that explains it
    evidence: tuple[str, ...]  # the exported families a person checks to see why (docs/derived.md's rules)
    quiet: bool = False  # nothing to do: ``gpufeed diagnose`` exits 0 only when every GPU has a quiet verdict

    @property
    def waiting(self) -> bool:
        """The GPU waits on the host: gpufeed_gpu_waiting_seconds_total{cause} is split over these."""
        return self.state == "waiting"


@dataclass(frozen=True, slots=True)
class Finding:
    """One platform finding (gpufeed_finding{check})."""

    name: str
    label: str  # a few words for prose and the report's tables
    fix: str  # the field playbook's fix
    runbook: str  # the heading of docs/runbooks.md (the alert that fires on it, when ``alert``)
    evidence: tuple[str, ...]  # the exported families that show why it was raised
    # Whether an alert fires on it (alerts/generate.py): a finding that only explains a verdict already alerted
    # on (GpufeedGPUStarved) has none, and its runbook heading is a section of its own.
    alert: bool = True


VERDICT_LIST = (
    Verdict("healthy", "working well", "working", "#2e7d32",
            "nvidia-smi dmon -s pucvmt to watch it; nothing to fix on the host",
            "Nothing to fix on the host.", "healthy",
            evidence=("gpufeed_gpu_busy_seconds_total", "gpufeed_gpu_sm_active_seconds_total"), quiet=True),
    Verdict("idle", "no work submitted", "idle", "#b0b0b0",
            "nvidia-smi: is the job really using this GPU? (no work was submitted)",
            "No work was submitted: free the GPUs or schedule more work on them.", "idle",
            evidence=("gpufeed_gpu_busy_seconds_total", "gpufeed_gpu_idle_ratio", "gpufeed_gpu_state_seconds_total"),
            quiet=True),
    Verdict("launch_bound", "kernel launches", "waiting", "#7b1fa2",
            "top -H -p {pid} (which thread is hot), then nsys profile a few steps: count kernel launches and syncs; "
            "fuse kernels or use CUDA Graphs",
            "Cut the number of kernels: fuse operations and Python loops; more work per launch (bigger batches); "
            "remove synchronisation points from the hot path; CUDA Graphs or a compiled execution path.",
            "cause=launch_bound (CPU submission)",
            evidence=("gpufeed_process_cpu_seconds_total", "gpufeed_process_threads", "gpufeed_workload_cpu_cores",
                      "gpufeed_workload_cpu_capacity_cores", "gpufeed_gpu_idle_gap_seconds")),
    Verdict("input_bound", "input preprocessing", "waiting", "#1565c0",
            "mpstat -P ALL 1 and pidstat -t -p {pid} 1: are the data-loader workers' cores saturated? then time "
            "each stage (read, decode, transform)",
            "Time each stage (read, decode, transform, batch, copy); add data-loader workers until contention "
            "appears, then stop; vectorise; cache decoded data; move transforms to the GPU.",
            "cause=input_bound (CPU preprocessing)",
            evidence=("gpufeed_process_cpu_seconds_total", "gpufeed_process_threads", "gpufeed_workload_cpu_cores",
                      "gpufeed_workload_cpu_capacity_cores", "gpufeed_gpu_idle_gaps_periodic")),
    Verdict("io_bound", "storage I/O", "waiting", "#c62828",
            "iostat -xz 1 (await, small requests) and nfsstat -c on network filesystems",
            "Stage the dataset on local NVMe; pack small files into shards; prefetch and read sequentially in "
            "larger requests; watch metadata operations on network filesystems.",
            "cause=io_bound (storage / network file system)",
            evidence=("gpufeed_process_threads", "gpufeed_process_read_bytes_total",
                      "gpufeed_process_read_syscalls_total", "gpufeed_disk_io_time_seconds_total",
                      "gpufeed_disk_read_time_seconds_total", "gpufeed_disk_reads_completed_total",
                      "gpufeed_pressure_stalled_seconds_total", "gpufeed_nfs_rpc_retransmissions_total",
                      "gpufeed_nfs_operations_total")),
    Verdict("transfer_bound", "PCIe transfers", "waiting", "#f9a825",
            "lspci -vv -s {bdf} (LnkSta vs LnkCap) and nvidia-smi dmon -s t (PCIe throughput)",
            "Check the negotiated PCIe generation and width (LnkSta vs LnkCap) and fix slot, riser or BIOS first; "
            "then pinned memory where host-to-device copies are on the critical path, bigger batches, copies "
            "overlapped with compute.",
            "cause=transfer_bound (PCIe)",
            evidence=("gpufeed_gpu_pcie_rx_bytes_total", "gpufeed_gpu_pcie_tx_bytes_total",
                      "gpufeed_pcie_link_capacity_bytes_per_second")),
    Verdict("network_bound", "the interconnect (NVLink, network)", "waiting", "#ad1457",
            "nvidia-smi nvlink -gt d -i {bdf} (NVLink throughput) and ibstat / perfquery -x (the adapter beside the "
            "GPU): is the wire full at its current rate?",
            "The collective waits on the wire: overlap communication with compute (bucketed all-reduce, larger "
            "buckets), compress or shard gradients, keep the job's ranks on one NVSwitch domain or rail-aligned "
            "NICs; check first that the link runs at its full rate (nvlink_degraded, nic_link_degraded).",
            "cause=network_bound (NVLink / network)",
            evidence=("gpufeed_gpu_nvlink_bytes_total", "gpufeed_gpu_nvlink_capacity_bytes_per_second",
                      "gpufeed_nic_rate_bits_per_second", "gpufeed_nic_receive_bytes_total",
                      "gpufeed_nic_transmit_bytes_total")),
    Verdict("gpu_throttled", "GPU clocks held down", "working", "#4e342e",
            "nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER (clock-event reasons, temperature, power)",
            "Check power limits, cooling and chassis airflow (nvidia-smi -q -d PERFORMANCE,POWER).",
            "GpufeedGPUThrottled",
            evidence=("gpufeed_gpu_sm_clock_hertz", "gpufeed_gpu_sm_clock_max_hertz",
                      "gpufeed_gpu_clock_event_reason", "gpufeed_gpu_throttle_seconds_total",
                      "gpufeed_gpu_power_watts", "gpufeed_gpu_power_limit_watts", "gpufeed_gpu_temperature_celsius")),
    Verdict("gpu_inefficient", "inefficient kernels", "working", "#ff9830",
            "nsys profile / ncu a few steps: kernel efficiency, tensor-core use, precision, batch size",
            "Profile a timeline (memory stalls vs compute vs sync); use the optimised kernels and tensor cores; "
            "tune batch size and precision; fix memory layouts and access patterns.",
            "gpu_inefficient (GPU-side inefficiency)",
            evidence=("gpufeed_gpu_sm_active_seconds_total", "gpufeed_gpu_busy_seconds_total")),
    # One rank of a distributed job whose GPU spins in collectives (NCCL kernels resident, a few SMs) waiting
    # for a slower peer: the cause is on another rank's host (GpufeedJobStraggler names it), not here.
    Verdict("collective_wait", "waiting for a slower rank", "working", "#455a64",
            "the job's slowest rank: the GpufeedJobStraggler alert or the fleet dashboard's Jobs row names its host "
            "and cause; run gpufeed diagnose there",
            "Nothing to fix on this GPU: its collectives wait for a slower rank. Fix the straggler's cause on its "
            "host (GpufeedJobStraggler names it), then measure again.",
            "GpufeedJobStraggler",
            evidence=("gpufeed_gpu_sm_active_seconds_total", "gpufeed_gpu_busy_seconds_total",
                      "gpufeed_gpu_dram_active_ratio", "gpufeed_gpu_tensor_active_ratio", "gpufeed_workload_info")),
    Verdict("latency_bound", "too little parallel work", "waiting", "#00838f",
            "nvidia-smi dmon -s u: the load is small; batch requests, or accept it for a p99 SLA",
            "Batch or queue requests, or accept the low utilisation as the price of a p99 latency target: do not "
            "chase 100% for an SLA-bound service.",
            "cause=latency_bound (small work)",
            evidence=("gpufeed_gpu_busy_seconds_total", "gpufeed_gpu_burstiness_ratio",
                      "gpufeed_gpu_idle_gap_seconds")),
)

FINDING_LIST = (
    Finding("pcie_link_downgraded", "PCIe link below its maximum while busy",
            "A platform problem: fix BIOS settings, slot placement or the riser before touching code; no number "
            "of data-loader workers fixes a downgraded link.", "GpufeedPCIeLinkDowngraded",
            evidence=("gpufeed_pcie_link_downgraded", "gpufeed_pcie_link_current_speed_transfers_per_second",
                      "gpufeed_pcie_link_current_width", "gpufeed_pcie_device_info")),
    Finding("pcie_errors", "PCIe errors (AER, replays)",
            "A marginal link (riser, slot, cable): reseat or replace it; replays and AER errors cost bandwidth and "
            "precede lost GPUs.", "GpufeedPCIeErrorsRising",
            evidence=("gpufeed_pcie_aer_errors_total", "gpufeed_gpu_pcie_replays_total")),
    Finding("nvlink_degraded", "NVLink down or erroring while busy",
            "A platform problem: a down or erroring NVLink (GPU, NVSwitch tray, cable cartridge) halves the "
            "collectives' bandwidth; drain the node and have the link reseated or the part replaced.",
            "GpufeedNVLinkDegraded",
            evidence=("gpufeed_gpu_nvlink_links_up", "gpufeed_gpu_nvlink_errors_total")),
    Finding("nic_link_degraded", "network adapter below its rate or erroring while busy",
            "A platform problem: a port trained down or a cable with rising symbol errors makes every rank of a "
            "multi-host job wait; reseat or replace the cable or transceiver, check the switch port.",
            "GpufeedNICLinkDegraded",
            evidence=("gpufeed_nic_rate_bits_per_second", "gpufeed_nic_info", "gpufeed_nic_errors_total")),
    Finding("numa_mismatch", "GPU process on a remote NUMA node",
            "Pin the processes and their memory to the GPU's NUMA node (nvidia-smi topo -m, numactl), or move the "
            "job to a GPU on its node.", "GpufeedNUMAMismatch",
            evidence=("gpufeed_process_numa_local_cpu_ratio", "gpufeed_process_numa_mismatch", "gpufeed_gpu_info")),
    Finding("cpu_governor_powersave", "CPUs on the powersave governor",
            "Use the performance governor on dedicated training nodes and measure again.",
            "GpufeedCPUGovernorPowersave",
            evidence=("gpufeed_cpufreq_governor_cpus",)),
    Finding("gpu_clock_throttled", "GPU clocks throttled under load",
            "Check power limits, cooling and airflow while the GPU is busy.", "GpufeedGPUThrottled",
            evidence=("gpufeed_gpu_sm_clock_hertz", "gpufeed_gpu_sm_clock_max_hertz",
                      "gpufeed_gpu_clock_event_reason", "gpufeed_gpu_throttle_seconds_total")),
    Finding("memory_pressure", "host memory pressure",
            "Cap data-loader workers and pinned memory, avoid oversized caches, add RAM or isolate noisy "
            "neighbours.", "GpufeedMemoryPressure",
            evidence=("gpufeed_memory_total_bytes", "gpufeed_memory_available_bytes", "gpufeed_memory_dirty_bytes",
                      "gpufeed_memory_writeback_bytes", "gpufeed_pressure_stalled_seconds_total",
                      "gpufeed_oom_kills_total")),
    Finding("nfs_retransmissions", "NFS retransmissions",
            "Stage the data on local NVMe, reduce the number of files, raise the client cache where safe, or "
            "change the dataset format.", "GpufeedNFSRetransmissions",
            evidence=("gpufeed_nfs_rpc_calls_total", "gpufeed_nfs_rpc_retransmissions_total")),
    Finding("gpu_lost", "GPU fell off the bus",
            "Drain the host; the GPU needs a reset or a reboot, then check its slot and power.", "GpufeedGPULost",
            evidence=("gpufeed_gpu_lost",)),
    # GPU health (NVML events and ECC counters)
    Finding("gpu_xid_error", "GPU Xid errors (hardware)",
            "Drain the GPU and read the Xid in the kernel log (dmesg): 48/64/74/79/95/119/120 are memory, NVLink, "
            "bus or GSP faults that need a reset or an RMA (docs/runbooks.md).", "GpufeedGPUXidError",
            evidence=("gpufeed_gpu_xid_errors_total",)),
    Finding("gpu_memory_errors", "GPU memory errors (ECC, row remapping)",
            "Uncorrectable ECC or retired/remapped rows: drain the GPU, reset it to apply pending remaps, and open "
            "an RMA if the remap table is full or errors come back.", "GpufeedGPUMemoryErrors",
            evidence=("gpufeed_gpu_ecc_errors_total", "gpufeed_gpu_row_remap_pending",
                      "gpufeed_gpu_row_remap_failure")),
    # Workloads (DESIGN.md "Workloads"): the GPU's container or job is held back by its CPU quota, or its threads
    # wait for CPUs other jobs hold; the GPU's memory is (nearly) full while it is partly idle.
    Finding("cpu_quota_throttled", "workload CPU-throttled by its quota",
            "The workload's CFS quota (a pod's CPU limit, a job's cpu.max) starves the feeding threads: raise the "
            "limit or cut data-loader workers to fit it.", "GpufeedCPUQuotaThrottled",
            evidence=("gpufeed_workload_cpu_cores", "gpufeed_workload_cpu_capacity_cores", "gpufeed_workload_info")),
    Finding("cpu_contention", "GPU threads waiting for CPUs held by other work",
            "Other work holds the CPUs the GPU's threads need: pin the job to its NUMA node's cores, isolate noisy "
            "neighbours, or give the job more CPUs.", "GpufeedCPUContention",
            evidence=("gpufeed_process_cpu_seconds_total", "gpufeed_process_threads", "gpufeed_workload_info")),
    Finding("gpu_memory_full", "GPU memory full (batch limited by VRAM)",
            "Limited by VRAM (a hint: caching allocators hold memory): the batch is capped by memory, not by the "
            "CPU -- activation checkpointing or mixed precision raise it.", "GpufeedGPUMemoryFull",
            evidence=("gpufeed_gpu_memory_used_bytes", "gpufeed_gpu_memory_total_bytes",
                      "gpufeed_gpu_busy_seconds_total")),
    # Stack captures (--capture.enabled, ptrace granted): the loop feeding a latency_bound or launch_bound GPU
    # blocks in a host sync every step. Info only and no alert: GpufeedGPUStarved already fires on the wait;
    # this names where it comes from, and exists only where captures run.
    Finding("sync_bound", "a host sync every step (stacks)",
            "Take the sync out of the step: keep values on the GPU (no .item() / .cpu() / print of a tensor per "
            "step), log every N steps, make copies non-blocking from pinned memory; torch.cuda.set_sync_debug_mode"
            "('warn') names each sync.", "sync_bound (stack captures)",
            evidence=("gpufeed_gpu_idle_gap_seconds", "gpufeed_gpu_burstiness_ratio"),
            alert=False),
)

VERDICT = {v.name: v for v in VERDICT_LIST}
FINDING = {f.name: f for f in FINDING_LIST}
# The GPU states' colours: a state shares its colour with the verdict of its name (idle) or stands for its
# verdicts as a whole (working: healthy's green; waiting: one orange over the causes' own colours).
STATE_COLOURS = {"working": VERDICT["healthy"].colour, "waiting": "#ef6c00", "idle": VERDICT["idle"].colour}


def runbook_anchor(heading: str) -> str:
    """The fragment a rendered ``docs/runbooks.md`` gives ``heading`` (GitHub's rule: lower case, drop
    punctuation but ``-`` and ``_``, spaces to ``-``): an alert's ``#gpufeedgpulost``, a cause's
    ``#causeio_bound-storage--network-file-system``."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
