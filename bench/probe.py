"""Run the real ``gpufeed`` command line and, when it exits, dump every sampler's sample timestamps.

Usage: ``python bench/probe.py OUT.json serve [gpufeed serve flags...]``

The daemon is the unmodified one (``exporter.cli.main``, same flags, same collectors, same engine);
the probe only keeps a reference to the :class:`exporter.daemon.Daemon` it builds so that, after
SIGTERM, the engine's bounded history buffers -- which carry the monotonic time each sample was
taken -- can be written out. The sampling-fidelity benchmark computes jitter from them.

It also charges CPU to its parts: the calling thread's CPU time (``time.thread_time``, about a
microsecond per call) around every sampler run and every payload render, so the overhead benchmark can
say which sampler costs what; the rest of the process's CPU is the event loop, scheduling and serving.
And it times every garbage collection (``gc.callbacks``), per generation.
"""

from __future__ import annotations

import gc
import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import exporter.daemon as daemon_mod
import exporter.engine as engine_mod
import exporter.exposition as exposition_mod
from bench.gcpause import PauseBins
from bench.simcost import count_delta, snapshot_calls
from exporter.cli import main

_captured: list[daemon_mod.Daemon] = []
# part -> [calls, thread CPU seconds]; written from sampler threads and the loop: list ops under the GIL.
_cpu: dict[str, list[float]] = {}


# process CPU, monotonic time and main-thread (event loop) CPU when the accounts were last reset
_reset_at = [0.0, time.monotonic(), 0.0]


# Garbage-collector pauses in the window, per generation (bench/gcpause.py: fixed bins, so that an hour's recording
# holds no more memory than a minute's), and the pauses of the full collection the end of the window runs.
_gc_pauses: dict[int, PauseBins] = {0: PauseBins(), 1: PauseBins(), 2: PauseBins()}
_gc_started = [0.0, 0.0]
_full_now: list[list[float]] = []  # the pauses of _freeze's own collection
_freezer_ident: list[int | None] = [None]  # the thread that runs _freeze's collection, while it runs it
_freezer: list[threading.Thread] = []
FULL_COLLECTION_WAIT_S = 5.0  # how long the end's full collection may wait for one in progress to finish


def _gc_callback(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _gc_started[:] = [time.perf_counter(), time.thread_time()]
        return
    wall, cpu = time.perf_counter() - _gc_started[0], time.thread_time() - _gc_started[1]
    if threading.get_ident() == _freezer_ident[0] and info["generation"] == 2:
        _full_now.append([wall, cpu])
    else:
        _gc_pauses[int(info["generation"])].add(wall, cpu)


SIM_RELOAD = ("simulation only: fake NVML state exchange (FakeNvml._maybe_reload and the exchange's per-device and "
              "sample-buffer applies, inside the GPU samplers)")

# The fake NVML instances the daemon built (serve --simulate), and their per-function call counts at the window's
# start: bench/simcost.py weighs the fake's per-call cost beyond the real binding's with the calls in the window.
_fakes: list[Any] = []
_fake_calls0: list[dict[str, int]] = []


def _reset(signum: int, frame: FrameType | None) -> None:
    """SIGUSR1: start the CPU accounts afresh (the benchmark's window starts after warm-up)."""
    _fake_calls0[:] = [snapshot_calls(f.calls) for f in _fakes]
    _cpu.clear()
    for gen in _gc_pauses:
        _gc_pauses[gen] = PauseBins()
    _on_loop[0] = 0.0
    _reset_at[:] = [time.process_time(), time.monotonic(), time.thread_time()]  # handlers run on the main thread


_frozen: list[dict[str, Any]] = []


def _freeze(signum: int, frame: FrameType | None) -> None:
    """SIGUSR2: end of the benchmark's window; the dump reports the accounts as they are now, and one full
    collection run then (its pause is what any gen-2 collection of the daemon costs at that heap size).

    The collection runs on a thread of its own, not in this handler: a signal handler can run in the middle of a
    collection (in a GC callback, a finalizer, a weakref callback), and ``gc.collect()`` inside a collection does
    nothing and calls no callback -- the dump had no full collection then. The thread retries until the one in
    progress has finished; the dump waits for it (:func:`_await_full_collection`)."""
    _frozen[:] = [_accounts()]
    _full_now.clear()
    frozen = _frozen[0]
    frozen["gc_full_now"] = []
    thread = threading.Thread(target=_full_collection, args=(frozen,), name="probe-full-gc", daemon=True)
    _freezer[:] = [thread]
    thread.start()


def _full_collection(frozen: dict[str, Any]) -> None:
    deadline = time.monotonic() + FULL_COLLECTION_WAIT_S
    _freezer_ident[0] = threading.get_ident()
    try:
        while True:
            gc.collect()  # a no-op while another collection is in progress
            if _full_now or time.monotonic() >= deadline:
                break
            time.sleep(0.005)
    finally:
        _freezer_ident[0] = None
    frozen["gc_full_now"] = list(_full_now)


def _await_full_collection() -> None:
    for thread in _freezer:
        thread.join(FULL_COLLECTION_WAIT_S + 1.0)


def _nvml_calls() -> dict[str, int]:
    """Calls of each fake NVML function since the window started (all fakes together)."""
    total: dict[str, int] = {}
    for i, f in enumerate(_fakes):
        before = _fake_calls0[i] if i < len(_fake_calls0) else {}
        for name, n in count_delta(snapshot_calls(f.calls), before).items():
            total[name] = total.get(name, 0) + n
    return total


def _accounts() -> dict[str, Any]:
    return {
        "nvml_calls": _nvml_calls(),
        "charge_cost_s": _charge_cost[0],
        "cpu": {part: {"calls": int(v[0]), "cpu_s": v[1]} for part, v in _cpu.items()},
        "window": {"process_cpu_s": time.process_time() - _reset_at[0], "wall_s": time.monotonic() - _reset_at[1],
                   "loop_thread_cpu_s": time.thread_time() - _reset_at[2], "loop_charged_s": _on_loop[0]},
        "gc": {str(gen): pauses.dump() for gen, pauses in _gc_pauses.items()},
    }


_on_loop = [0.0]  # charged CPU that ran on the main (event-loop) thread


def _charge(part: str, seconds: float) -> None:
    acc = _cpu.setdefault(part, [0, 0.0])
    acc[0] += 1
    acc[1] += seconds
    if part != SIM_RELOAD and threading.current_thread() is threading.main_thread():
        _on_loop[0] += seconds


_real_call = engine_mod.Engine._call
_real_render = exposition_mod.Renderer.render


def _timed_call(fn: Callable[[], Any]) -> tuple[Any, BaseException | None, float]:
    c0 = time.thread_time()
    try:
        return _real_call(fn)
    finally:
        _charge("sampler " + getattr(fn, "__qualname__", repr(fn)), time.thread_time() - c0)


def _timed_render(self: exposition_mod.Renderer, snap: Any) -> None:
    c0 = time.thread_time()
    try:
        _real_render(self, snap)
    finally:
        _charge("render (Renderer.render)", time.thread_time() - c0)


class _ProbedDaemon(daemon_mod.Daemon):
    """The real Daemon, remembered for the dump at exit."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _captured.append(self)


def dump(out: Path) -> None:
    """Write {sampler: {interval, runs, overruns, failures, t: [monotonic seconds]}} for every daemon built.

    Under ``--simulate`` the engine runs on scenario time (exporter/sim/timebase.py ScaledClock); sample
    times and intervals are mapped back to the monotonic clock, on which the benchmark measures its window.
    """
    _await_full_collection()
    samplers: dict[str, Any] = {}
    for d in _captured:
        clock = d.engine.clock
        to_base: Callable[[float], float] = getattr(clock, "to_base", lambda t: t)
        speed = float(getattr(clock, "speed", 1.0))
        for name, s in d.engine.samplers.items():
            samplers[name] = {
                "collector": s.collector,
                "interval": s.interval / speed,
                "runs": s.runs,
                "overruns": s.overruns,
                "failures": s.failures,
                "t": [to_base(x.t) for x in d.engine.history(name)],
            }
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"samplers": samplers, **(_frozen[0] if _frozen else _accounts())}))
    tmp.replace(out)


_exchange_depth = threading.local()


def _exchange_work(fn: Callable[..., Any], part: str = SIM_RELOAD) -> Callable[..., Any]:
    """``fn`` charged to ``part``, unless it runs inside another such call (one charge for nested ones)."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        depth = getattr(_exchange_depth, "n", 0)
        _exchange_depth.n = depth + 1
        c0 = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            _exchange_depth.n = depth
            if depth == 0:
                _charge(part, time.thread_time() - c0)

    return timed


_CALIBRATION = "probe calibration"
_charge_cost = [0.0]  # CPU seconds one wrapped call charges beyond the call itself (the wrapper's own)


def _calibrate(n: int = 20000) -> None:
    """Measure what the exchange wrapper charges per call around nothing: it charges ~13,000 calls in a 45 s
    window with two GPUs waiting, so its own clock reads would be a tenth of the line it reports. Hot-loop
    figure: a cold call's wrapper costs more, so subtracting this leaves the line an upper bound."""
    noop = _exchange_work(lambda: None, _CALIBRATION)
    for _ in range(n):
        noop()
    calls, seconds = _cpu.pop(_CALIBRATION)
    _charge_cost[0] = seconds / calls


def _account_fake_nvml() -> None:
    """Charge the fake NVML's pick-up of the simulator's state separately -- the poll of the exchange at each call
    and the numbers it applies (per device, per sample buffer) when a call reads them: a real driver has no such
    cost. What the fake's calls cost beyond the real binding's is bench/simcost.py's."""
    try:
        from exporter.sim import exchange, fakenvml
    except ImportError:
        return
    if getattr(fakenvml.FakeNvml, "_maybe_reload", None) is None:
        return
    init = fakenvml.FakeNvml.__init__

    def remembered(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        _fakes.append(self)

    fakenvml.FakeNvml.__init__ = remembered  # type: ignore[method-assign]
    fakenvml.FakeNvml._maybe_reload = _exchange_work(fakenvml.FakeNvml._maybe_reload)  # type: ignore[method-assign]
    # Where the exchange works, not its cheap "anything to do?" checks (a dict lookup at each call on a device):
    # the wrapper's own cost (two thread-clock reads) would otherwise be most of what it charges.
    for name in ("_settle", "_apply"):
        setattr(exchange.Reader, name, _exchange_work(getattr(exchange.Reader, name)))


def run(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: probe.py OUT.json serve [flags...]", file=sys.stderr)
        return 2
    out = Path(argv[0])
    daemon_mod.Daemon = _ProbedDaemon  # type: ignore[misc]
    engine_mod.Engine._call = staticmethod(_timed_call)  # type: ignore[method-assign]
    exposition_mod.Renderer.render = _timed_render  # type: ignore[method-assign]
    signal.signal(signal.SIGUSR1, _reset)
    signal.signal(signal.SIGUSR2, _freeze)
    _account_fake_nvml()
    _calibrate()  # before the daemon starts: outside the benchmark's window, on a quiet interpreter
    gc.callbacks.append(_gc_callback)
    try:
        return main(argv[1:])
    finally:
        dump(out)


if __name__ == "__main__":
    raise SystemExit(run(sys.argv[1:]))
