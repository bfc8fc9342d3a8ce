"""Workloads on real processes: a real trainer process with real data-loader child processes burning CPU,
read from this machine's /proc and /sys by the real collectors (only the GPU is simulated: the supported
``--simulate-gpu`` side, :mod:`exporter.sim.realgpu`, listing the trainer's pid), judged by the real derived
layer -- with and without real cgroups (CPU quota, memory limit) made and removed by the test.

Every process is started in its own session, stops by itself after DURATION_S, and is killed (by its group)
in teardown; the cgroup is removed afterwards. No assertion is on timing: the engine runs until the test's
condition holds on its derived state (checked every half second) or for RUN_S at most, and that last state is
what the test asserts on. The shapes are chosen so that the verdict rests on what the kernel counted
(throttled periods, run delay, reaped children's CPU), not on how much CPU a loaded 2-core machine gave.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from exporter import names, pipeline
from exporter.config import resolve
from exporter.engine import RealClock
from exporter.samples.derived import DerivedState
from exporter.sim import realgpu
from exporter.sim.fakenvml import FakeNvml
from exporter.yamlsafe import loads

DURATION_S = 45.0  # the processes stop by themselves after this, whatever the test does
RUN_S = 16.0  # engine time per test at most: two 6 s windows and the hysteresis
CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")

TRAINER = r"""
import os, sys, time
n, duration, cgroups, life = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], float(sys.argv[4])
for procs in filter(None, cgroups.split(",")):
    with open(procs, "w") as f:  # join the cgroup before forking: the workers inherit it
        f.write(str(os.getpid()))
with open("/proc/self/comm", "w") as f:
    f.write("trainer")
end = time.monotonic() + duration


def worker(until):
    with open("/proc/self/comm", "w") as f:
        f.write("pt_data_worker")
    x = 0
    while time.monotonic() < until:  # decode a batch: one core each
        x += 1
    os._exit(0)


def fork(until):
    pid = os.fork()
    if pid == 0:
        worker(until)
    return pid


print("ready", flush=True)
if life > 0:  # DataLoader(persistent_workers=False) and short epochs: workers re-forked, each living `life` s
    while time.monotonic() < end:
        kids = [fork(min(end, time.monotonic() + life)) for _ in range(n)]
        for k in kids:
            os.waitpid(k, 0)  # the epoch ends: the workers are reaped (their CPU goes to cutime)
    sys.exit(0)
kids = [fork(end) for _ in range(n)]
while time.monotonic() < end and (not kids or any(os.waitpid(k, os.WNOHANG) == (0, 0) for k in kids)):
    time.sleep(0.2)  # the trainer itself waits on its queue: quiet
"""

GPU_ONLY = """
phases:
  - name: waiting
    duration_s: 600
    gpus:
      0:
        gpu_util: {square: {high: 0.98, low: 0.0, period_s: 1.0, duty: 0.3}}
        sm_active: {square: {high: 0.8, low: 0.0, period_s: 1.0, duty: 0.3}}
        memory_used_bytes: 2.0e10
"""


@contextlib.contextmanager
def started(script: str, *args: str) -> Iterator[subprocess.Popen[str]]:
    """A helper process in its own session, killed with its group when the block ends."""
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@contextlib.contextmanager
def trainer(workers: int, cgroup_procs: Sequence[Path] = (), life: float = 0.0) -> Iterator[subprocess.Popen[str]]:
    """The trainer and its workers (re-forked every ``life`` seconds when given), joined to the cgroups whose
    ``cgroup.procs`` are given, stopped (SIGKILL to the whole group) when the block ends."""
    with started(TRAINER, str(workers), str(DURATION_S), ",".join(map(str, cgroup_procs)), str(life)) as proc:
        yield proc


def gpu_driver(fake: FakeNvml, pid: int) -> realgpu.GpuDriver:
    """A GPU waiting in real time (the scenario's GPU-only phases), with ``pid`` as GPU 0's process; start() it
    and stop() it."""
    return realgpu.GpuDriver(fake, realgpu.parse({**loads(GPU_ONLY), "processes": {0: [pid]}}))


def diagnose(pid: int, done: Callable[[DerivedState], bool]) -> DerivedState:
    """The whole pipeline on this host's /proc and /sys until ``done`` holds on its derived state, or for RUN_S
    seconds; the last evaluation."""
    fake = FakeNvml()
    gpu = gpu_driver(fake, pid)
    settings = resolve(pipeline.registry(), {}, {
        "path.procfs": "/proc", "path.sysfs": "/sys",
        "collector.derived.window": "6s", "collector.proc.threads-interval": "1s",
        "collector.workload.interval": "1s", "collector.gpu.slow-interval": "1s",
        "collector.kubernetes.socket": "/nonexistent/kubelet.sock",
        "collector.kubernetes": False,
    })
    pipe = pipeline.build(settings, clock=RealClock(), nvml=fake, history_seconds=60.0)

    async def run() -> None:
        pipe.engine.start()
        try:
            end = time.monotonic() + RUN_S
            while time.monotonic() < end:
                await asyncio.sleep(0.5)
                state = pipe.engine.snapshot.value(names.DERIVED)
                if isinstance(state, DerivedState) and done(state):
                    break
        finally:
            await pipe.engine.stop(timeout=2.0)

    gpu.start()
    try:
        asyncio.run(run())
    finally:
        gpu.stop()
        pipe.close()
    state = pipe.engine.snapshot.value(names.DERIVED)
    assert isinstance(state, DerivedState)
    return state


def _input_bound_on_the_workers(state: DerivedState, pid: int) -> bool:
    v = state.gpus.get(0)
    return (v is not None and v.cause == "input_bound" and 0 in state.workloads
            and any("pt_data_worker" in e and f"pid {pid}" in e for e in v.evidence))


def test_real_data_loader_worker_processes_make_the_waiting_gpu_input_bound() -> None:
    with trainer(2) as proc:
        state = diagnose(proc.pid, lambda st: _input_bound_on_the_workers(st, proc.pid)
                         and st.workloads[0].processes == 3)
    v = state.gpus[0]
    assert v.cause == "input_bound", v.evidence
    assert any("pt_data_worker" in e and f"pid {proc.pid}" in e for e in v.evidence), v.evidence
    assert state.workloads[0].processes == 3


@contextlib.contextmanager
def made_cgroup(path: str, *, cpu_quota: float | None = None, memory_max: int | None = None,
                read_iops: tuple[int, int] | None = None) -> Iterator[list[Path]]:
    """A cgroup at ``path`` (made by the test, parents included, and removed with them), v1 (in the cpu, cpuacct
    and memory hierarchies) or v2, with a CFS quota of ``cpu_quota`` cores and a memory limit; the
    ``cgroup.procs`` files a process writes its pid to; ``read_iops`` = (device number, IOs per second) throttles
    its reads from that device (v1 blkio, v2 io.max). Skips with the reason when this machine cannot make one.

    With a quota the group's weight is raised to the most (v1 cpu.shares 262144, v2 cpu.weight 10000): on a
    host the other work keeps busy, a default weight may keep the group below its quota -- the kernel then never
    throttles it, and a test of throttling would rest on how busy the machine is."""
    rel = [p for p in path.split("/") if p]
    made: list[Path] = []
    procs: list[Path] = []

    def mk(root: Path) -> Path:
        d = root
        for part in rel:
            d = d / part
            if not d.is_dir():
                d.mkdir()
                made.append(d)
        return d

    try:
        if (CGROUP_V1_CPU / "cpu.cfs_quota_us").exists():
            d = mk(CGROUP_V1_CPU)
            if cpu_quota is not None:
                for g in made:  # every level: a parent competes with its own weight
                    (g / "cpu.shares").write_text("262144")
                (d / "cpu.cfs_period_us").write_text("100000")
                (d / "cpu.cfs_quota_us").write_text(str(int(cpu_quota * 100000)))
            procs.append(d / "cgroup.procs")
            if read_iops is not None:
                b = mk(CGROUP_V2 / "blkio")
                dev, iops = read_iops
                (b / "blkio.throttle.read_iops_device").write_text(f"{os.major(dev)}:{os.minor(dev)} {iops}")
                procs.append(b / "cgroup.procs")
            for ctrl in ("cpuacct", "memory"):
                if (CGROUP_V2 / ctrl / "cgroup.procs").exists() and not (CGROUP_V2 / ctrl).is_symlink():
                    c = mk(CGROUP_V2 / ctrl)
                    if ctrl == "memory" and memory_max is not None:
                        (c / "memory.limit_in_bytes").write_text(str(memory_max))
                    procs.append(c / "cgroup.procs")
        elif (CGROUP_V2 / "cgroup.controllers").is_file():
            ctrls = (CGROUP_V2 / "cgroup.subtree_control").read_text().split()
            if "cpu" not in ctrls or (memory_max is not None and "memory" not in ctrls) or (
                    read_iops is not None and "io" not in ctrls):
                pytest.skip("cgroup v2 without the cpu/memory/io controllers enabled for children (subtree_control)")
            d = mk(CGROUP_V2)
            for parent in made[:-1]:
                (parent / "cgroup.subtree_control").write_text("+cpu +memory +io")
            if read_iops is not None:
                dev, iops = read_iops
                (d / "io.max").write_text(f"{os.major(dev)}:{os.minor(dev)} riops={iops}")
            if cpu_quota is not None:
                for g in made:
                    (g / "cpu.weight").write_text("10000")
                (d / "cpu.max").write_text(f"{int(cpu_quota * 100000)} 100000")
            if memory_max is not None:
                (d / "memory.max").write_text(str(memory_max))
            procs.append(d / "cgroup.procs")
        else:
            pytest.skip("no writable cgroup hierarchy at /sys/fs/cgroup")
    except OSError as e:
        _remove(made)
        pytest.skip(f"cannot create cgroup {path} here: {e}")
    try:
        yield procs
    finally:
        _remove(made)


def _remove(made: list[Path]) -> None:
    """Remove the cgroups made, deepest first (the killed processes leave them asynchronously)."""
    for d in reversed(made):
        for _ in range(50):
            with contextlib.suppress(FileNotFoundError):
                try:
                    d.rmdir()
                except OSError:
                    time.sleep(0.1)
                    continue
            break


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a cgroup needs root")
def test_real_cpu_quota_throttling_is_found_and_the_workers_are_still_the_verdict() -> None:
    with made_cgroup(f"gpufeed-test-{uuid.uuid4().hex[:8]}.scope", cpu_quota=0.4) as procs, \
            trainer(2, procs) as proc:
        state = diagnose(proc.pid, lambda st: _input_bound_on_the_workers(st, proc.pid)
                         and ("cpu_quota_throttled", 0) in {(f.check, f.gpu) for f in st.findings})
    v = state.gpus[0]
    assert v.cause == "input_bound", v.evidence
    found = {(f.check, f.gpu) for f in state.findings}
    assert ("cpu_quota_throttled", 0) in found, state.findings
    assert state.workloads[0].capacity_cores == pytest.approx(0.4)
    assert state.workloads[0].labels.get("unit", "").startswith("gpufeed-test-")


def _has(state: DerivedState, cause: str, *words: str) -> bool:
    v = state.gpus.get(0)
    return v is not None and v.cause == cause and all(any(w in e for e in v.evidence) for w in words)


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a cgroup needs root")
def test_real_short_lived_workers_reforked_every_epoch_are_counted_from_the_parents_reaped_cpu() -> None:
    # persistent_workers=False with short epochs: 2 workers live 0.3 s each, never sampled twice. Their CPU is
    # in the trainer's cutime once reaped and in the group's cpuacct usage; the quota (which the kernel
    # throttles) is what they fill.
    with made_cgroup(f"gpufeed-test-{uuid.uuid4().hex[:8]}.scope", cpu_quota=0.3) as procs, \
            trainer(2, procs, life=0.3) as proc:
        state = diagnose(proc.pid, lambda st: _has(st, "input_bound", "exited within the window"))
    v = state.gpus[0]
    assert v.cause == "input_bound", v.evidence
    assert any(f"children of pid {proc.pid} that exited within the window" in e for e in v.evidence), v.evidence
    assert ("cpu_quota_throttled", 0) in {(f.check, f.gpu) for f in state.findings}, state.findings


YARN = "hadoop-yarn/container_e17_1700000000000_0001_01_0000{:02d}"  # a path no orchestrator rule names


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a cgroup needs root")
def test_real_quota_of_an_unrecognised_cgroup_path_is_the_capacity_not_other_jobs() -> None:
    # YARN's layout: no container id, Slurm job or systemd unit in the path. The quota applies all the same,
    # and the run delay it causes is its own, not neighbours'.
    with made_cgroup(YARN.format(uuid.uuid4().int % 100), cpu_quota=0.3) as procs, trainer(2, procs) as proc:
        state = diagnose(proc.pid, lambda st: _input_bound_on_the_workers(st, proc.pid)
                         and ("cpu_quota_throttled", 0) in {(f.check, f.gpu) for f in st.findings})
    v = state.gpus[0]
    assert v.cause == "input_bound", v.evidence
    found = {f.check for f in state.findings}
    assert "cpu_quota_throttled" in found and "cpu_contention" not in found, state.findings
    assert state.workloads[0].capacity_cores == pytest.approx(0.3)
    assert any("hadoop-yarn/container_e17" in e for e in v.evidence), v.evidence


READER = r"""
import os, sys, time
path, duration, cgroups = sys.argv[1], float(sys.argv[2]), sys.argv[3]
for procs in filter(None, cgroups.split(",")):
    with open(procs, "w") as f:
        f.write(str(os.getpid()))
print("ready", flush=True)
end = time.monotonic() + duration
while time.monotonic() < end:  # re-read a shard larger than the group's memory limit: reclaim under the limit
    with open(path, "rb", buffering=0) as f:
        # Pages cached by another cgroup stay charged to it: drop them, so this group reads (and holds) them.
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        while f.read(1 << 20) and time.monotonic() < end:
            pass
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a cgroup needs root")
def test_real_memory_limit_of_an_unrecognised_cgroup_path_is_found(tmp_path: Path) -> None:
    shard = tmp_path / "shard.bin"
    with shard.open("wb") as f:
        for _ in range(96):
            f.write(os.urandom(1 << 20))
        f.flush()
        os.fsync(f.fileno())  # written back: the reader can drop it from the page cache
    with made_cgroup(YARN.format(uuid.uuid4().int % 100), memory_max=32 << 20) as procs:
        if not any(p.parent.parent.name == "memory" or "memory" in p.parts for p in procs):
            pytest.skip("no memory controller to limit")
        with started(READER, str(shard), str(DURATION_S), ",".join(map(str, procs))) as proc:
            state = diagnose(proc.pid, lambda st: ("memory_pressure", 0) in {(f.check, f.gpu) for f in st.findings})
    hit = [f for f in state.findings if f.check == "memory_pressure" and f.gpu == 0]
    assert hit and "hits of its memory limit" in hit[0].detail, state.findings
    assert "hadoop-yarn/container_e17" in hit[0].detail


COMPILE = r"""
import os, sys, time
duration, cgroups = float(sys.argv[1]), sys.argv[2]
for procs in filter(None, cgroups.split(",")):
    with open(procs, "w") as f:
        f.write(str(os.getpid()))
if os.fork():  # two compiler processes
    print("ready", flush=True)
with open("/proc/self/comm", "w") as f:
    f.write("cc1plus")
end = time.monotonic() + duration
while time.monotonic() < end:
    pass
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a cgroup needs root")
def test_real_unrelated_compile_in_the_same_login_session_is_not_the_input_pipeline() -> None:
    # A login session scope holds whatever the user started: a quiet trainer and a compile beside it. Only the
    # GPU process's own tree is its workload; the compile is no data loader.
    scope = f"user.slice/user-4242.slice/session-{uuid.uuid4().int % 10000}.scope"
    with made_cgroup(scope) as procs, trainer(0, procs) as proc, \
            started(COMPILE, str(DURATION_S), ",".join(map(str, procs))):
        state = diagnose(proc.pid, lambda st: False)  # the whole run: a verdict that never comes is the point
    v = state.gpus[0]
    assert v.cause not in ("input_bound", "launch_bound"), v.evidence
    assert not any("cc1plus" in e for e in v.evidence), v.evidence
    assert state.workloads[0].processes == 1
    assert state.workloads[0].labels.get("unit", "").startswith("session-")


def test_real_workers_outnumbering_the_cpus_are_the_jobs_own_run_queue_not_contention() -> None:
    # num_workers above the cores: each busy worker always wants a core (CPU used + run delay ~ 1, whatever
    # else runs), so 2 more workers than this machine's CPUs want more than it has by themselves.
    with trainer((os.cpu_count() or 1) + 2) as proc:
        state = diagnose(proc.pid, lambda st: _has(st, "input_bound", "own run queue"))
    v = state.gpus[0]
    assert v.cause == "input_bound", v.evidence
    assert any("the workload's own run queue" in e for e in v.evidence), v.evidence
    assert "cpu_contention" not in {f.check for f in state.findings}, state.findings


THREADS = r"""
import hashlib, os, sys, threading, time
n, duration, cgroups = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
for procs in filter(None, cgroups.split(",")):
    with open(procs, "w") as f:
        f.write(str(os.getpid()))
end = time.monotonic() + duration
block = b"x" * (1 << 20)


def decode():
    with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
        f.write("decode")
    while time.monotonic() < end:
        hashlib.sha256(block).digest()  # releases the GIL: the threads burn in parallel, as a C decoder does


for _ in range(n):
    threading.Thread(target=decode, daemon=True).start()
print("ready", flush=True)
while time.monotonic() < end:
    time.sleep(0.2)  # the main thread waits on the decoded batches: quiet
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a cgroup needs root")
def test_real_decode_thread_pool_under_a_quota_is_input_bound_not_launch_bound() -> None:
    # Four decode threads of the GPU process under a 0.3-CPU quota: each gets a sliver of a core and waits for
    # the rest (throttled time is run delay). They are a pool by what they want, and the quota binds them.
    with made_cgroup(f"gpufeed-test-{uuid.uuid4().hex[:8]}.scope", cpu_quota=0.3) as procs, \
            started(THREADS, "4", str(DURATION_S), ",".join(map(str, procs))) as proc:
        state = diagnose(proc.pid, lambda st: _has(st, "input_bound", "decode threads"))
    v = state.gpus[0]
    assert v.cause == "input_bound", v.evidence
    assert any(f"decode threads of pid {proc.pid}" in e for e in v.evidence), v.evidence


CACHED_READS = r"""
import os, sys, time
path, duration = sys.argv[1], float(sys.argv[2])
fd = os.open(path, os.O_RDONLY)
print("ready", flush=True)
end = time.monotonic() + duration
off = 0
while time.monotonic() < end:  # labels / an index / a tokenised shard: 4 KiB reads from the page cache
    for _ in range(40):
        os.pread(fd, 4096, off)
        off = (off + 4096) % (4 << 20)
    time.sleep(0.01)
"""

DIRECT_NEIGHBOUR = r"""
import mmap, os, random, sys, time
path, duration, cgroups = sys.argv[1], float(sys.argv[2]), sys.argv[3]
for procs in filter(None, cgroups.split(",")):
    with open(procs, "w") as f:
        f.write(str(os.getpid()))
for _ in range(3):
    os.fork()  # 8 readers, as fio --numjobs=8: one of them is nearly always stalled on IO (PSI io some)
fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
buf = mmap.mmap(-1, 4096)
blocks = os.fstat(fd).st_size // 4096
random.seed(os.getpid())
if os.getpgrp() == os.getpid():
    print("ready", flush=True)
end = time.monotonic() + duration
while time.monotonic() < end:  # fio --rw=randread --bs=4k --direct=1 --ioengine=psync: QD1, blocked in D state
    os.preadv(fd, [buf], random.randrange(blocks) * 4096)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a cgroup needs root")
def test_real_page_cache_reads_beside_a_neighbours_disk_storm_are_not_the_gpus_io(tmp_path: Path) -> None:
    # The GPU process reads 2,000 x 4 KiB per second from a file in the page cache (0 bytes reach storage);
    # a neighbour's direct reads keep the disk busy and the host's IO pressure up. The neighbour's IO is not
    # this GPU's, and cache hits corroborate nothing.
    small = tmp_path / "labels.bin"
    small.write_bytes(os.urandom(4 << 20))
    big = tmp_path / "shard.bin"
    with big.open("wb") as f:
        for _ in range(256):
            f.write(os.urandom(1 << 20))
        f.flush()
        os.fsync(f.fileno())
    # Its reads throttled to 40 IOs per second (the kernel's blk-throttle): its 8 readers always wait on the
    # disk, so the host's IO pressure (PSI io some) is high whatever the CPUs are doing.
    with made_cgroup(f"gpufeed-test-{uuid.uuid4().hex[:8]}", read_iops=(big.stat().st_dev, 40)) as procs, \
            started(DIRECT_NEIGHBOUR, str(big), str(DURATION_S), ",".join(map(str, procs))), \
            started(CACHED_READS, str(small), str(DURATION_S)) as proc:
        state = diagnose(proc.pid, lambda st: _has(st, "latency_bound", "page-cache hits"))
    v = state.gpus[0]
    assert v.cause != "io_bound", v.evidence
    assert any("page-cache hits" in e and "set aside" in e for e in v.evidence), v.evidence


SLOW_STORE = r"""
import socket, sys, threading, time
duration = float(sys.argv[1])
srv = socket.create_server(("127.0.0.1", 0))
print("ready", srv.getsockname()[1], sep="\n", flush=True)


def serve(conn):
    with conn:
        while conn.recv(4096):
            time.sleep(0.3)  # an object store 300 ms away
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 4096\r\n\r\n" + b"x" * 4096)


srv.settimeout(duration)
while True:
    conn, _ = srv.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""

HTTP_LOADER = r"""
import os, socket, sys, time
n, duration, port = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
end = time.monotonic() + duration
for _ in range(n):
    if os.fork() == 0:
        with open("/proc/self/comm", "w") as f:
            f.write("pt_data_worker")
        s = socket.create_connection(("127.0.0.1", port))
        while time.monotonic() < end:  # fetch the next sample: asleep in recv while the store answers
            s.sendall(b"GET /shard/0001 HTTP/1.1\r\nHost: store\r\n\r\n")
            got = 0
            while got < 4096:
                got += len(s.recv(65536))
        os._exit(0)
with open("/proc/self/comm", "w") as f:
    f.write("trainer")
print("ready", flush=True)
while time.monotonic() < end:
    time.sleep(0.2)
"""


def test_real_loader_workers_waiting_on_a_remote_store_are_io_bound_naming_it() -> None:
    # DataLoader workers fetching samples over HTTP from a store 300 ms away: asleep in recv (state S, no CPU,
    # no D state, no iowait, no IO pressure). The GPU waits on that remote, not on "small batches".
    with started(SLOW_STORE, str(DURATION_S)) as store:
        assert store.stdout is not None
        port = store.stdout.readline().strip()
        with started(HTTP_LOADER, "4", str(DURATION_S), port) as proc:
            state = diagnose(proc.pid, lambda st: _has(st, "io_bound", "remote store"))
    v = state.gpus[0]
    assert v.cause == "io_bound", v.evidence
    assert any(f"127.0.0.1:{port}" in e and "asleep receiving" in e for e in v.evidence), v.evidence


LAUNCHER = r"""
import os, sys, time
duration = float(sys.argv[1])
end = time.monotonic() + duration
r, w = os.pipe()  # multiprocessing.Queue: the launcher's pipe between the decode service and the trainer
pids = []
for role in ("trainer", "decode_svc"):
    pid = os.fork()
    if pid == 0:
        with open("/proc/self/comm", "w") as f:
            f.write(role)
        if role == "trainer":
            os.close(w)
            while time.monotonic() < end:
                os.read(r, 4096)  # takes the decoded batches: quiet
        os.close(r)
        x = 0
        while time.monotonic() < end:  # decodes at a full core, hands a batch over now and then
            x += 1
            if x % 200000 == 0:
                os.write(w, b"batch")
        os._exit(0)
    pids.append(pid)
print("ready", pids[0], sep="\n", flush=True)
for p in pids:
    os.waitpid(p, 0)
"""


def test_real_decode_service_beside_the_trainer_on_a_shared_pipe_is_the_input_pipeline() -> None:
    # A launcher starts the trainer and a decode service side by side (not a descendant of the GPU process, no
    # container): the pipe between them says the service feeds it.
    with started(LAUNCHER, str(DURATION_S)) as launcher:
        assert launcher.stdout is not None
        pid = int(launcher.stdout.readline())
        state = diagnose(pid, lambda st: _has(st, "input_bound", "decode_svc"))
    v = state.gpus[0]
    assert v.cause == "input_bound", v.evidence
    assert any("decode_svc" in e for e in v.evidence), v.evidence
    assert state.workloads[0].processes == 2
