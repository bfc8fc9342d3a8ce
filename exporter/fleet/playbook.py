"""The field playbook's fix for each waiting cause and each platform finding (shared/reference/playbook.es.txt).

The playbook is in Spanish; these are its "Arreglos típicos", checklists B-E, common mistakes 1-8 and tasks
3-14, in English, shortest first. One entry per name of the vocabulary in exporter.samples.derived, so a
report never shows a cause or finding without its fix.
"""

from __future__ import annotations

# What each waiting cause is, in a few words (for prose: "62% of the waiting was on input preprocessing").
CAUSE_LABELS = {
    "launch_bound": "kernel launches",
    "input_bound": "input preprocessing",
    "io_bound": "storage I/O",
    "transfer_bound": "PCIe transfers",
    "latency_bound": "too little parallel work",
}

FIXES = {
    # Checklist B (CPU submission).
    "launch_bound": "Cut the number of kernels: fuse operations and Python loops; more work per launch (bigger "
                    "batches); remove synchronisation points from the hot path; CUDA Graphs or a compiled "
                    "execution path.",
    # Checklist C (CPU preprocessing).
    "input_bound": "Time each stage (read, decode, transform, batch, copy); add data-loader workers until "
                   "contention appears, then stop; vectorise; cache decoded data; move transforms to the GPU.",
    # Checklist D (I/O and storage).
    "io_bound": "Stage the dataset on local NVMe; pack small files into shards; prefetch and read sequentially "
                "in larger requests; watch metadata operations on network filesystems.",
    # Common mistake 4, tasks 3-4 (PCIe).
    "transfer_bound": "Check the negotiated PCIe generation and width (LnkSta vs LnkCap) and fix slot, riser or "
                      "BIOS first; then pinned memory where host-to-device copies are on the critical path, "
                      "bigger batches, copies overlapped with compute.",
    # Common mistake 8 (small batches).
    "latency_bound": "Batch or queue requests, or accept the low utilisation as the price of a p99 latency "
                     "target: do not chase 100% for an SLA-bound service.",
    # Common mistake 5, task 11.
    "gpu_throttled": "Check power limits, cooling and chassis airflow (nvidia-smi -q -d PERFORMANCE,POWER).",
    # Checklist E (GPU-side inefficiency).
    "gpu_inefficient": "Profile a timeline (memory stalls vs compute vs sync); use the optimised kernels and "
                       "tensor cores; tune batch size and precision; fix memory layouts and access patterns.",
    "healthy": "Nothing to fix on the host.",
    "idle": "No work was submitted: free the GPUs or schedule more work on them.",
}

FINDING_FIXES = {
    "pcie_link_downgraded": "A platform problem: fix BIOS settings, slot placement or the riser before touching "
                            "code; no number of data-loader workers fixes a downgraded link (tasks 3-4).",
    "pcie_errors": "A marginal link (riser, slot, cable): reseat or replace it; replays and AER errors cost "
                   "bandwidth and precede lost GPUs.",
    "numa_mismatch": "Pin the processes and their memory to the GPU's NUMA node (nvidia-smi topo -m, numactl), "
                     "or move the job to a GPU on its node (task 10).",
    "cpu_governor_powersave": "Use the performance governor on dedicated training nodes and measure again "
                              "(task 9).",
    "gpu_clock_throttled": "Check power limits, cooling and airflow while the GPU is busy (task 11).",
    "memory_pressure": "Cap data-loader workers and pinned memory, avoid oversized caches, add RAM or isolate "
                       "noisy neighbours (task 14).",
    "nfs_retransmissions": "Stage the data on local NVMe, reduce the number of files, raise the client cache "
                           "where safe, or change the dataset format (task 13).",
    "gpu_lost": "Drain the host; the GPU needs a reset or a reboot, then check its slot and power.",
    "gpu_xid_error": "Drain the GPU and read the Xid in the kernel log (dmesg): 48/64/74/79/95/119/120 are "
                     "memory, NVLink, bus or GSP faults that need a reset or an RMA (docs/runbooks.md).",
    "gpu_memory_errors": "Uncorrectable ECC or retired/remapped rows: drain the GPU, reset it to apply pending "
                         "remaps, and open an RMA if the remap table is full or errors come back.",
    "cpu_quota_throttled": "The workload's CFS quota (a pod's CPU limit, a job's cpu.max) starves the feeding "
                           "threads: raise the limit or cut data-loader workers to fit it (checklist C).",
    "cpu_contention": "Other work holds the CPUs the GPU's threads need: pin the job to its NUMA node's cores, "
                      "isolate noisy neighbours, or give the job more CPUs (checklist B).",
    "gpu_memory_full": "Limited by VRAM (a hint: caching allocators hold memory): the batch is capped by memory, "
                       "not by the CPU -- activation checkpointing or mixed precision raise it.",
}

FINDING_LABELS = {
    "pcie_link_downgraded": "PCIe link below its maximum while busy",
    "pcie_errors": "PCIe errors (AER, replays)",
    "numa_mismatch": "GPU process on a remote NUMA node",
    "cpu_governor_powersave": "CPUs on the powersave governor",
    "gpu_clock_throttled": "GPU clocks throttled under load",
    "memory_pressure": "host memory pressure",
    "nfs_retransmissions": "NFS retransmissions",
    "gpu_lost": "GPU fell off the bus",
    "gpu_xid_error": "GPU Xid errors (hardware)",
    "gpu_memory_errors": "GPU memory errors (ECC, row remapping)",
    "cpu_quota_throttled": "workload CPU-throttled by its quota",
    "cpu_contention": "GPU threads waiting for CPUs held by other work",
    "gpu_memory_full": "GPU memory full (batch limited by VRAM)",
}

def fix_for(cause: str | None) -> str:
    """The playbook's fix for a verdict or waiting cause ("" for None or an unknown name)."""
    return FIXES.get(cause or "", "")


def finding_fix(check: str) -> str:
    """The playbook's fix for a finding ("" for a check this version does not know)."""
    return FINDING_FIXES.get(check, "")
