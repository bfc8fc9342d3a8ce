"""Job and rank identity of a GPU process: which distributed job it is one rank of, from what the node sees.

Pure parsing; the I/O (``/proc/<pid>/environ``, ``/proc/<pid>/cgroup``) is the workload collector's
(:mod:`exporter.collectors.workload`), the labels are the derived layer's (:mod:`exporter.derived.workload`).

Three sources, the first that names a value wins:

1. **The process's environment**, where the daemon may read ``/proc/<pid>/environ`` (root, or the same uid):
   only the variables of :data:`ALLOWED` are looked at and only their parsed values kept -- never a secret, a
   path or an address (``MASTER_ADDR`` says where the rendezvous is, not which job this is). The launchers
   that set them: torchrun / torch.distributed.elastic (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
   ``TORCHELASTIC_RUN_ID``: its ``--rdzv-id``, ``none`` when not given), Slurm ``srun`` (``SLURM_JOB_ID``,
   ``SLURM_STEP_ID``, ``SLURM_PROCID``, ``SLURM_NTASKS``), the Kubeflow training operator's PyTorchJob
   (``RANK``, ``WORLD_SIZE``; its ``PET_*`` variables feed torchrun), Kubernetes Indexed Jobs
   (``JOB_COMPLETION_INDEX``) and JobSet (``JOBSET_NAME``, ``REPLICATED_JOB_NAME``, ``JOB_INDEX``,
   ``JOB_GLOBAL_INDEX``).
2. **The cgroup path**: Slurm's cgroup/v2 plugin puts each task in
   ``/system.slice/slurmstepd.scope/job_<id>/step_<step>/user/task_<n>`` (cgroup/v1:
   ``/slurm/uid_<u>/job_<id>/step_<step>/task_<n>``): the job, the step and the task's index on this node.
   A ``task_<n>`` with n >= 1 proves the step has several tasks even when the environment is unreadable.
3. **The pod name** (Kubernetes, from the kubelet's pod-resources API) of a process that says it is a rank but names
   no job: the name's stem -- the pod name without its trailing random suffix (``-`` and five of the API server's
   consonants and digits), replica index (``-<n>``) and PyTorchJob role (``-master`` / ``-worker`` / ``-launcher``):
   ``train-worker-3`` and ``train-master-0`` are job ``train`` within their namespace. Where it is wrong: two
   unrelated pods whose names differ only in such a suffix (a StatefulSet ``db-0`` next to a Deployment
   ``db-<hash>-<rand>`` in the same namespace) share a stem; a job whose pods are named by hand with no common stem
   gets one job per pod. The rule runs only for a process that says it is a rank (``RANK`` / ``WORLD_SIZE``), never
   for a plain pod.

Bounded labels: ``job_id`` takes one value per job, ``rank`` / ``world_size`` / ``slurm_step`` at most one
per GPU process -- ``gpufeed_workload_info`` stays one series per GPU (a new rank replaces the old series).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The variables read from /proc/<pid>/environ; every other one is skipped unparsed.
ALLOWED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID",
           "SLURM_PROCID", "SLURM_NTASKS", "JOB_COMPLETION_INDEX", "JOBSET_NAME", "REPLICATED_JOB_NAME",
           "JOB_INDEX", "JOB_GLOBAL_INDEX")
_ALLOWED_PREFIXES = tuple(f"{k}=".encode() for k in ALLOWED)
# A job name as a label value: printable, short (a Kubernetes name is at most 63 characters, a Slurm id digits).
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,62}$")
_INT_MAX = 1 << 20  # a rank or a world size beyond a million is not a rank
_SLURM_STEP = re.compile(r"^step_(\d+|batch|extern|interactive)$")
_SLURM_TASK = re.compile(r"^task_(\d+)$")
_SLURM_JOB = re.compile(r"^job_(\d+)$")
# The random suffix the API server appends (k8s.io/apimachinery utilrand: consonants and digits, no vowels).
_POD_SUFFIX = re.compile(r"-[bcdfghjklmnpqrstvwxz2456789]{5}$")
_POD_INDEX = re.compile(r"-\d+$")
_POD_ROLE = re.compile(r"-(master|worker|launcher|chief|ps|evaluator)$")
LABELS = ("job_id", "rank", "world_size", "slurm_step")


@dataclass(frozen=True, slots=True)
class JobIdentity:
    """One GPU process's place in a distributed job; None where nothing says.

    ``job_id`` is the key every rank of the job shares on every host (a Slurm job id, torchrun's run id, a
    JobSet's name); ``rank`` the global rank; ``world_size`` the number of ranks; ``slurm_step`` the Slurm
    step; ``local_task`` the Slurm task's index on this node (cgroup path); ``readable`` False when the
    environment could not be read (another uid, hidepid): then only the cgroup path spoke."""

    job_id: str | None = None
    rank: int | None = None
    world_size: int | None = None
    local_rank: int | None = None
    slurm_step: str | None = None
    local_task: int | None = None
    readable: bool = True

    @property
    def multi_rank(self) -> bool:
        """One rank of several: WORLD_SIZE / SLURM_NTASKS above 1, or a Slurm task index above 0."""
        return (self.world_size or 0) > 1 or (self.local_task or 0) > 0 or (self.rank or 0) > 0

    def labels(self) -> dict[str, str]:
        """The labels of gpufeed_workload_info this identity adds (only those known)."""
        out: dict[str, str] = {}
        if self.job_id:
            out["job_id"] = self.job_id
        if self.rank is not None:
            out["rank"] = str(self.rank)
        if self.world_size is not None:
            out["world_size"] = str(self.world_size)
        if self.slurm_step:
            out["slurm_step"] = self.slurm_step
        return out

    def describe(self) -> str:
        """For evidence: ``rank 3 of 16 of job 4242``, ``a rank of job train``."""
        who = f"rank {self.rank}" if self.rank is not None else "a rank"
        size = f" of {self.world_size}" if self.world_size else ""
        job = f" of job {self.job_id}" if self.job_id else ""
        return f"{who}{size}{job}"


def allowed_environ(environ: bytes) -> dict[str, str]:
    """The allow-listed variables of a NUL-separated environment; nothing else is decoded or kept."""
    out: dict[str, str] = {}
    for entry in environ.split(b"\0"):
        if entry.startswith(_ALLOWED_PREFIXES):
            key, _, value = entry.partition(b"=")
            out[key.decode("ascii")] = value.decode("ascii", "replace").strip()
    return out


def _int(value: str | None) -> int | None:
    if value is None or not value.isdigit():
        return None
    n = int(value)
    return n if n < _INT_MAX else None


def _name(value: str | None) -> str | None:
    return value if value and value != "none" and _NAME.match(value) else None


def from_environ(env: dict[str, str]) -> JobIdentity:
    """The identity the launcher's variables give (see the module docstring)."""
    jobset = _name(env.get("JOBSET_NAME"))
    job_id = (_name(env.get("SLURM_JOB_ID")) if _int(env.get("SLURM_JOB_ID")) is not None else None) \
        or _name(env.get("TORCHELASTIC_RUN_ID")) or jobset
    rank = _int(env.get("RANK"))
    if rank is None:
        rank = _int(env.get("SLURM_PROCID"))
    world = _int(env.get("WORLD_SIZE"))
    if world is None:
        world = _int(env.get("SLURM_NTASKS"))
    if rank is None and world is None and jobset is not None:
        rank = _int(env.get("JOB_GLOBAL_INDEX"))
    if rank is None and world is None:
        rank = _int(env.get("JOB_COMPLETION_INDEX"))
    step = env.get("SLURM_STEP_ID")
    return JobIdentity(job_id=job_id, rank=rank, world_size=world, local_rank=_int(env.get("LOCAL_RANK")),
                       slurm_step=step if step and _int(step) is not None else None)


def from_cgroup_path(path: str) -> JobIdentity:
    """Slurm's job, step and task from a process's cgroup path (nothing for any other path)."""
    parts = [p for p in path.split("/") if p]
    job: str | None = None
    step: str | None = None
    task: int | None = None
    for i, part in enumerate(parts):
        jm = _SLURM_JOB.match(part)
        if jm is not None and any("slurm" in q for q in parts[:i]):
            job = jm.group(1)
            continue
        if job is None:
            continue
        sm = _SLURM_STEP.match(part)
        if sm is not None and step is None:
            step = sm.group(1)
        tm = _SLURM_TASK.match(part)
        if tm is not None and step is not None:
            task = _int(tm.group(1))
    return JobIdentity(job_id=job, slurm_step=step, local_task=task)


def merge(env: JobIdentity | None, cgroup: JobIdentity) -> JobIdentity:
    """The environment's values, the cgroup path's where the environment says nothing (or was unreadable)."""
    if env is None:
        return JobIdentity(job_id=cgroup.job_id, slurm_step=cgroup.slurm_step, local_task=cgroup.local_task,
                           readable=False)
    return JobIdentity(job_id=env.job_id or cgroup.job_id, rank=env.rank, world_size=env.world_size,
                       local_rank=env.local_rank, slurm_step=env.slurm_step or cgroup.slurm_step,
                       local_task=cgroup.local_task, readable=True)


def pod_stem(pod: str) -> str:
    """The job a pod belongs to by its name (the module docstring's rule): ``train-worker-3`` -> ``train``."""
    stem = pod
    stem = _POD_SUFFIX.sub("", stem)
    stem = _POD_INDEX.sub("", stem)
    stem = _POD_ROLE.sub("", stem)
    stem = _POD_INDEX.sub("", stem)
    return stem or pod


def with_pod(ident: JobIdentity, pod: str | None) -> JobIdentity:
    """A rank that names no job takes its pod's stem as the job (within the pod's namespace label)."""
    if ident.job_id or not pod or (ident.rank is None and ident.world_size is None):
        return ident
    stem = _name(pod_stem(pod))
    return JobIdentity(job_id=stem, rank=ident.rank, world_size=ident.world_size, local_rank=ident.local_rank,
                       slurm_step=ident.slurm_step, local_task=ident.local_task, readable=ident.readable)
