"""Job and rank identity on real processes: a launcher with N child ranks, as torchrun starts them (the children
carry RANK / LOCAL_RANK / WORLD_SIZE / TORCHELASTIC_RUN_ID and a few variables the reader must not keep), read
from this machine's /proc by the real workload collector -- as root, and unprivileged, where another uid's
environ cannot be read."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.collectors.workload import WorkloadCollector
from exporter.sampling import CollectorContext, Targets

RANKS = 3
LAUNCHER = f"""
import os, subprocess, sys, time
kids = []
for r in range({RANKS}):
    env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="{RANKS}", TORCHELASTIC_RUN_ID="job-real",
               MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", SECRET_TOKEN="never-kept")
    kids.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env))
print(" ".join(str(k.pid) for k in kids), flush=True)
time.sleep(60)
"""
READER = """
import json, sys
from pathlib import Path
from exporter.collectors.workload import WorkloadCollector
from exporter.sampling import CollectorContext, Targets
t = Targets()
t.publish({"0": [int(p) for p in sys.argv[1:]]})
col = WorkloadCollector(CollectorContext(procfs=Path("/proc"), sysfs=Path("/sys"), targets=t, options={}))
s = col.update()
print("RANKS " + json.dumps({str(p): [r.rank, r.world_size, r.job_id, r.readable] for p, r in s.ranks.items()}))
"""


@pytest.fixture
def job() -> Iterator[list[int]]:
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == RANKS
        yield pids
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _collector(pids: list[int]) -> WorkloadCollector:
    t = Targets()
    t.publish({"0": pids})
    return WorkloadCollector(CollectorContext(procfs=Path("/proc"), sysfs=Path("/sys"), targets=t, options={}))


def test_each_child_of_a_torchrun_style_launcher_reads_as_its_rank(job: list[int]) -> None:
    if not os.access(f"/proc/{job[0]}/environ", os.R_OK):
        pytest.skip("this user cannot read its own children's environ")
    s = _collector(job).update()
    got = {p: (r.rank, r.world_size, r.job_id, r.readable) for p, r in s.ranks.items()}
    assert got == {p: (i, RANKS, "job-real", True) for i, p in enumerate(job)}
    assert all(r.multi_rank for r in s.ranks.values())
    assert "never-kept" not in repr(s) and "127.0.0.1" not in repr(s)


def test_identity_is_read_once_per_process(job: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    col = _collector(job)
    col.update()
    reads: list[int] = []
    monkeypatch.setattr(col, "_environ", reads.append)
    col.update()
    assert reads == []


def test_an_unreadable_environ_leaves_the_rank_unknown(job: list[int]) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to run the reader as another uid (setpriv)")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                          READER, *map(str, job)], capture_output=True, text=True, timeout=60, env=env, check=True)
    got = json.loads(next(x for x in out.stdout.splitlines() if x.startswith("RANKS "))[6:])
    # The children are root's: nobody may not read their environ. The cgroup path names no Slurm job here,
    # so nothing is known and nothing is guessed.
    assert got == {}
