"""collective_wait: one rank of a distributed job whose GPU spins in collectives waiting for a slower peer."""

from __future__ import annotations

from collections.abc import Sequence

from exporter import linkmath
from exporter.derived.gpuview import gpm_means, gpu_view
from exporter.derived.hostshape import cpu_shape, io_signals
from exporter.derived.verdict import Candidate, classify, collective_wait
from exporter.jobident import JobIdentity
from exporter.vocabulary import VERDICT
from tests.support.builders import GpuSpec, ThreadSpec, const, cpu_window, gpu_windows, proc_window

W = 15.0
RANK = JobIdentity(job_id="4242", rank=3, world_size=16)


def judge(gpu: GpuSpec, rank: JobIdentity | None, threads: Sequence[ThreadSpec] = (ThreadSpec(1, 0.08, 0.02),),
          ) -> Candidate:
    """classify + collective_wait, as evaluate_gpu calls them, on a quiet 32-CPU host."""
    fast, buf, slow = gpu_windows([gpu], 0.0, W)
    procs = proc_window(gpu.pids[0], threads, 5.0, W, cpus_allowed=frozenset(range(32)), total_threads=8)
    busy = {i: (min(1.0, t.user), t.system) for i, t in enumerate(threads)}
    view = gpu_view(gpu.index, fast, buf, slow)
    shape = cpu_shape(procs, procs, cpu_window(32, busy, 5.0, W), view.pids)
    cand = classify(view, shape, io_signals([], [], []), capacity=linkmath.capacity_bytes_per_second(5, 16),
                    link_name="Gen5 x16", window_s=W)
    dram, tensor = gpm_means(fast, gpu.index)
    return collective_wait(cand, view, rank, dram=dram, tensor=tensor)


SPINNING = GpuSpec(util=const(0.97), sm=const(0.18), dram=const(0.02), tensor=const(0.0))


def test_rank_of_a_multi_rank_job_spinning_on_a_few_sms_is_collective_wait() -> None:
    c = judge(SPINNING, RANK)
    assert c.cause == "collective_wait"
    assert VERDICT[c.cause].state == "working"
    assert any("rank 3 of 16 of job 4242" in e for e in c.evidence)
    assert any("another rank's host" in e for e in c.evidence)


def test_the_same_gpu_in_a_single_process_job_stays_gpu_inefficient() -> None:
    assert judge(SPINNING, None).cause == "gpu_inefficient"
    assert judge(SPINNING, JobIdentity(rank=0, world_size=1)).cause == "gpu_inefficient"


def test_a_rank_whose_gpu_does_real_work_keeps_its_verdict() -> None:
    assert judge(GpuSpec(util=const(0.97), sm=const(0.85), dram=const(0.4), tensor=const(0.5)), RANK).cause \
        == "healthy"


def test_a_rank_with_dram_or_tensor_activity_is_not_waiting_in_collectives() -> None:
    assert judge(GpuSpec(util=const(0.97), sm=const(0.18), dram=const(0.35), tensor=const(0.0)), RANK).cause \
        == "gpu_inefficient"
    assert judge(GpuSpec(util=const(0.97), sm=const(0.18), dram=const(0.02), tensor=const(0.2)), RANK).cause \
        == "gpu_inefficient"


def test_sms_busier_than_nccl_channels_use_are_not_collective_wait() -> None:
    assert judge(GpuSpec(util=const(0.97), sm=const(0.45), dram=const(0.02), tensor=const(0.0)), RANK).cause \
        == "gpu_inefficient"


def test_without_gpm_dram_and_tensor_nothing_is_claimed() -> None:
    assert judge(GpuSpec(util=const(0.97), sm=const(0.18)), RANK).cause == "gpu_inefficient"


def test_a_rank_whose_own_host_submits_tiny_kernels_is_launch_bound_not_collective_wait() -> None:
    c = judge(SPINNING, RANK, (ThreadSpec(1, 0.6, 0.38, "R"),))
    assert c.cause == "launch_bound"


def test_slurm_task_above_zero_without_environ_counts_as_multi_rank() -> None:
    assert judge(SPINNING, JobIdentity(job_id="9", slurm_step="0", local_task=1, readable=False)).cause \
        == "collective_wait"
