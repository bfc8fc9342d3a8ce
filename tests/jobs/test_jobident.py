"""Job and rank identity: the launchers' variables (an allow-list), Slurm's cgroup paths, pod-name stems."""

from __future__ import annotations

import pytest

from exporter import jobident as ji


def _env(**kv: str) -> bytes:
    return b"".join(f"{k}={v}".encode() + b"\0" for k, v in kv.items())


def test_torchrun_rank_reads_rank_world_size_and_run_id_and_nothing_else() -> None:
    raw = _env(PATH="/bin", RANK="5", LOCAL_RANK="1", WORLD_SIZE="16", TORCHELASTIC_RUN_ID="llm-7",
               MASTER_ADDR="10.0.0.1", AWS_SECRET_ACCESS_KEY="s3cr3t", PET_NPROC_PER_NODE="4")
    env = ji.allowed_environ(raw)
    assert set(env) == {"RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID"}
    ident = ji.from_environ(env)
    assert (ident.job_id, ident.rank, ident.world_size, ident.local_rank) == ("llm-7", 5, 16, 1)
    assert ident.multi_rank and ident.labels() == {"job_id": "llm-7", "rank": "5", "world_size": "16"}


def test_torchrun_without_rdzv_id_names_no_job() -> None:
    ident = ji.from_environ(ji.allowed_environ(_env(RANK="0", WORLD_SIZE="2", TORCHELASTIC_RUN_ID="none")))
    assert ident.job_id is None and ident.multi_rank


def test_srun_task_uses_slurm_variables() -> None:
    ident = ji.from_environ(ji.allowed_environ(_env(SLURM_JOB_ID="4242", SLURM_STEP_ID="0", SLURM_PROCID="3",
                                                    SLURM_NTASKS="8")))
    assert ident.labels() == {"job_id": "4242", "rank": "3", "world_size": "8", "slurm_step": "0"}


def test_jobset_pod_names_the_jobset() -> None:
    ident = ji.from_environ(ji.allowed_environ(_env(JOBSET_NAME="pretrain", REPLICATED_JOB_NAME="workers",
                                                    JOB_INDEX="2", JOB_GLOBAL_INDEX="2", RANK="2",
                                                    WORLD_SIZE="4")))
    assert (ident.job_id, ident.rank, ident.world_size) == ("pretrain", 2, 4)


def test_single_process_is_not_multi_rank() -> None:
    assert not ji.from_environ(ji.allowed_environ(_env(RANK="0", WORLD_SIZE="1"))).multi_rank
    assert not ji.from_environ({}).multi_rank


@pytest.mark.parametrize("value", ["../../etc", "x" * 80, "a b", ""])
def test_an_unbounded_or_odd_job_name_is_not_a_label(value: str) -> None:
    assert ji.from_environ({"TORCHELASTIC_RUN_ID": value, "RANK": "1"}).job_id is None


def test_a_huge_rank_is_not_a_rank() -> None:
    assert ji.from_environ({"RANK": str(10**9), "WORLD_SIZE": "x"}).labels() == {}


@pytest.mark.parametrize("path,want", [
    ("/system.slice/slurmstepd.scope/job_4242/step_0/user/task_3", ("4242", "0", 3)),
    ("/slurm/uid_1000/job_77/step_batch/task_0", ("77", "batch", 0)),
    ("/slurm/uid_1000/job_77/step_1", ("77", "1", None)),
    ("/system.slice/trainer.service", (None, None, None)),
    ("/home/job_5/step_0/task_2", (None, None, None)),  # not under a slurm directory
])
def test_slurm_job_step_and_task_from_the_cgroup_path(path: str, want: tuple[object, ...]) -> None:
    ident = ji.from_cgroup_path(path)
    assert (ident.job_id, ident.slurm_step, ident.local_task) == want


def test_unreadable_environ_keeps_what_the_cgroup_path_says() -> None:
    ident = ji.merge(None, ji.from_cgroup_path("/system.slice/slurmstepd.scope/job_9/step_2/user/task_1"))
    assert not ident.readable and ident.multi_rank  # task_1 exists: the step has several tasks
    assert ident.labels() == {"job_id": "9", "slurm_step": "2"}


@pytest.mark.parametrize("pod,stem", [
    ("train-worker-3", "train"), ("train-master-0", "train"), ("bert-ft-2-x7k9q", "bert-ft"),
    ("pretrain-workers-1-0-b6m2z", "pretrain-workers"), ("solo", "solo"), ("team-chief-0", "team"),
])
def test_pod_name_stem_is_the_job(pod: str, stem: str) -> None:
    assert ji.pod_stem(pod) == stem


def test_pod_stem_only_for_a_process_that_says_it_is_a_rank() -> None:
    assert ji.with_pod(ji.JobIdentity(), "web-7d9f8-x7k9q").job_id is None
    assert ji.with_pod(ji.JobIdentity(rank=1, world_size=2), "train-worker-1").job_id == "train"
    assert ji.with_pod(ji.JobIdentity(job_id="j", rank=1), "train-worker-1").job_id == "j"
