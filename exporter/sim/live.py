"""``gpufeed serve --simulate FILE``: a scenario played in real time by a child process the daemon only reads.

The daemon (:class:`LiveSimulation`) validates the scenario, makes a temporary directory (on /dev/shm when
there is one) and starts two ``python -m exporter.sim.live`` children on it: one renders ``<dir>/proc`` and
``<dir>/sys``, each group of files as often as the fastest sampler that reads it; the other publishes the fake
NVML's state (:mod:`exporter.sim.exchange`: ``<dir>/nvml.bin``, ``<dir>/nvml.json``) at twice the rate of the
fastest GPU sampler, never delayed by the trees
(two GPM reads 100 ms apart must see two states). Every file is replaced atomically; both use scenario time
``(now - start) x speed`` from one shared CLOCK_MONOTONIC start, looping the timeline, and so does the
daemon's engine (:attr:`LiveSimulation.clock`, :mod:`exporter.sim.timebase`): at any ``--simulate-speed``
its intervals, rates and verdict windows are scenario time. The daemon points ``--path.procfs`` /
``--path.sysfs`` at the trees and uses ``FakeNvml.from_exchange(<dir>)`` as its NVML module: it reads
the simulated host exactly as it reads a real one, and its own ``/proc/<pid>/stat`` counts the daemon alone
(the renderer's CPU is the child's).

The children die with the parent: their stdin is a pipe from the daemon, and end-of-file on it (the daemon
exited, however it exited) ends a child, which then removes the directory. They also check their parent
pid. The daemon removes the directory too, after stopping them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from exporter import log
from exporter.config import Settings
from exporter.sampling import KUBERNETES, Stage
from exporter.sim import exchange
from exporter.sim.kubelet import Kubelet
from exporter.sim.model import Model
from exporter.sim.player import kubelet_socket, scratch_dir
from exporter.sim.render import GROUPS, Renderer
from exporter.sim.scenario import ScenarioError, load
from exporter.sim.timebase import Playback, ScaledClock, group_intervals, render_periods

_log = log.get_logger(component="sim")
NVML_FILE = exchange.SHAPE_FILE
READY_TIMEOUT_S = 60.0
PARTS = ("trees", "nvml")
SUPERVISE_INTERVAL_S = 0.5  # how often the daemon checks that both children are alive
SUPERVISE_BACKOFF_MAX_S = 30.0


class SimulationError(Exception):
    """The simulation could not start (bad scenario, child failed); the message says why."""


class LiveSimulation:
    """The daemon's side: start the renderer child, hand out the paths and the fake NVML, stop it."""

    def __init__(self, scenario: str, speed: float, intervals: Mapping[str, float], settings: Settings) -> None:
        self.scenario = scenario
        self.speed = speed
        self.intervals = dict(intervals)  # scenario seconds between two reads of each file group
        self.origin = 0.0  # CLOCK_MONOTONIC time of scenario time 0, once started
        self.dir: Path | None = None
        self.procs: list[subprocess.Popen[bytes]] = []
        self.settings = settings  # the daemon's settings; pointed at the rendered trees once started
        self.nvml: Any = None  # the strict fake NVML reading the rendered state, once started
        self.kubelet: Kubelet | None = None  # the scenario's pod-resources server, when it has one
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None

    @classmethod
    def start(cls, settings: Settings, registry: Mapping[str, type[Stage]]) -> LiveSimulation:
        """Start the children; the simulation carries ``settings`` pointed at its trees and its fake NVML."""
        path = str(settings["simulate"])
        try:
            load(path)  # fail fast, in the daemon, with the file and key named
        except ScenarioError as e:
            raise SimulationError(str(e)) from e
        sim = cls(path, float(settings["simulate-speed"]), group_intervals(settings, registry), settings)
        sim._spawn()
        assert sim.dir is not None
        from exporter.sim.fakenvml import FakeNvml

        values = dict(settings.values)
        values["path.procfs"] = str(sim.dir / "proc")
        values["path.sysfs"] = str(sim.dir / "sys")
        # The calls of one sampling tick look at the exchange once: a tenth of the NVML child's publish period.
        sim.nvml = FakeNvml.from_exchange(sim.dir, min_poll_s=render_periods(
            {"nvml": sim.intervals.get("nvml", 1.0)}, sim.speed)["nvml"] / 10)
        # The simulated host's kubelet (SPEC v2 host.kubernetes) answers in the daemon's process, on a socket
        # in the simulated root; without one, that socket is absent -- never the real host's kubelet.
        sock = kubelet_socket(sim.dir)
        sc = load(path)
        if sc.host.kubernetes is not None:
            sim.kubelet = Kubelet(sc, sock)
        collector = dict(settings.collector)
        collector[KUBERNETES] = {**collector.get(KUBERNETES, {}), "socket": str(sock)}
        sim.settings = replace(settings, values=values, collector=collector)
        return sim

    @property
    def clock(self) -> ScaledClock:
        """The daemon's engine clock: scenario time, the renderers' (see exporter.sim.timebase)."""
        return ScaledClock(self.speed, self.origin)

    def _spawn(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="gpufeed-simulate-", dir=scratch_dir()))
        self.origin = time.monotonic()  # CLOCK_MONOTONIC is system-wide: all share scenario time
        self.procs = [self._child(part) for part in PARTS]
        for part, proc in zip(PARTS, self.procs, strict=True):
            if not self._ready(proc):
                code = proc.poll()
                self.stop()
                raise SimulationError(f"the scenario renderer ({part}) did not start (exit code {code})")
        _log.info("simulation_started", scenario=self.scenario, speed=self.speed, root=str(self.dir),
                  renderer_pids=",".join(str(p.pid) for p in self.procs))
        self._stopping.clear()
        self._supervisor = threading.Thread(target=self._supervise, name="sim-supervisor", daemon=True)
        self._supervisor.start()

    def _child(self, part: str) -> subprocess.Popen[bytes]:
        assert self.dir is not None
        argv = [sys.executable, "-m", "exporter.sim.live", "--scenario", self.scenario, "--root", str(self.dir),
                "--speed", repr(self.speed), "--parent", str(os.getpid()), "--start", repr(self.origin),
                "--only", part]
        for g, iv in sorted(self.intervals.items()):
            argv += ["--interval", f"{g}={iv!r}"]
        return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, close_fds=True)

    @staticmethod
    def _ready(proc: subprocess.Popen[bytes]) -> bool:
        assert proc.stdout is not None
        # selectors, not select.select: the daemon keeps many descriptors open (exporter/sources.py KeptFiles),
        # and select() refuses one numbered 1024 or more.
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            ready = sel.select(READY_TIMEOUT_S)
        return bool(ready) and proc.stdout.readline().strip() == b"ready"

    def _supervise(self) -> None:
        """Restart a child that died (SIGKILL, OOM, a crash): while one is gone its files stop changing and the
        daemon would serve a frozen host with every collector succeeding. Scenario time is shared (``--start``),
        so a restarted child renders where the timeline is now. Backoff doubles while restarts keep failing."""
        backoff = dict.fromkeys(PARTS, 0.0)
        while not self._stopping.wait(SUPERVISE_INTERVAL_S):
            for i, part in enumerate(PARTS):
                proc = self.procs[i] if i < len(self.procs) else None
                if proc is None or proc.poll() is None:
                    continue
                _log.error("simulation_renderer_exited", part=part, pid=proc.pid, code=proc.returncode,
                           restart_in=backoff[part])
                if backoff[part] and self._stopping.wait(backoff[part]):
                    return
                if proc.stdout is not None:
                    proc.stdout.close()
                new = self._child(part)
                if self._stopping.is_set():
                    new.kill()
                    new.wait()
                    return
                self.procs[i] = new
                if self._ready(new):
                    backoff[part] = 0.0
                    _log.info("simulation_renderer_restarted", part=part, pid=new.pid)
                else:
                    backoff[part] = min(SUPERVISE_BACKOFF_MAX_S, max(1.0, 2 * backoff[part]))

    def stop(self) -> None:
        """Stop the children (closing their stdin, then SIGTERM, then SIGKILL) and remove the directory."""
        self._stopping.set()
        if self._supervisor is not None and self._supervisor is not threading.current_thread():
            self._supervisor.join(READY_TIMEOUT_S)
            self._supervisor = None
        if self.kubelet is not None:
            self.kubelet.stop()
            self.kubelet = None
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(OSError):
                    if p.stdin is not None:
                        p.stdin.close()
        for p in self.procs:
            try:
                p.wait(2.0)
            except subprocess.TimeoutExpired:
                p.terminate()
                try:
                    p.wait(2.0)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            if p.stdout is not None:
                p.stdout.close()
        self.procs = []
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


# ---- the child -------------------------------------------------------------------------------------------------


def _parse_intervals(items: Sequence[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for it in items:
        g, _, v = it.partition("=")
        out[g] = float(v)
    return out


def _terminate(_sig: int, _frame: object) -> None:
    raise KeyboardInterrupt


def child_main(argv: Sequence[str] | None = None) -> int:
    """Render until the parent goes away."""
    ap = argparse.ArgumentParser(prog="python -m exporter.sim.live")
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--speed", type=float, default=1.0)
    ap.add_argument("--parent", type=int, default=0)
    ap.add_argument("--interval", action="append", default=[], metavar="GROUP=SECONDS",
                    help="scenario seconds between two reads of a file group")
    ap.add_argument("--start", type=float, default=None, help="CLOCK_MONOTONIC time of scenario time 0")
    ap.add_argument("--only", choices=("trees", "nvml", "all"), default="all")
    ns = ap.parse_args(argv)
    log.configure("info", "logfmt")
    from exporter.sim.fakenvml import normalize_state  # the child only: the writer validates, not the daemon
    root = Path(ns.root)
    try:
        sc = load(ns.scenario)
    except ScenarioError as e:
        print(f"gpufeed simulate: invalid scenario: {e}", file=sys.stderr)
        return 2
    model = Model(sc)
    renderer = Renderer(model, root)
    mine = {"trees": frozenset(GROUPS), "nvml": frozenset({"nvml"}), "all": frozenset({*GROUPS, "nvml"})}[ns.only]
    start = time.monotonic() if ns.start is None else ns.start
    playback = Playback(model, _parse_intervals(ns.interval), origin=start, speed=ns.speed, groups=mine)
    if playback.counter_bits == 64 and "nvml" in mine:
        _log.info("pcie_counters_widened", bits=64, speed=ns.speed, max_bytes_per_s=playback.max_rate,
                  reason="a 32-bit counter could wrap more than once between two reads at this speed")
    signal.signal(signal.SIGTERM, _terminate)
    try:
        # The first render is at the scenario time now, not 0: a child restarted by the daemon's supervisor must
        # not show counters from the start of the timeline (they would go backwards).
        t0 = max(0.0, playback.scenario_time(time.monotonic()))
        if "nvml" in mine:
            nvml_out = exchange.Writer(root)
            nvml_out.write(normalize_state(playback.nvml(t0)))
        if mine & set(GROUPS):
            renderer.setup()
            renderer.render(t0)
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        while True:
            now = time.monotonic()
            groups = playback.due(now)
            if groups:
                t = playback.scenario_time(now)
                trees = [g for g in groups if g in GROUPS]
                if trees:
                    renderer.render(t, trees)
                if "nvml" in groups:
                    nvml_out.write(normalize_state(playback.nvml(t)))
            wait = max(0.0, playback.next_due() - time.monotonic())
            # stdin readable means EOF (the parent never writes): the daemon is gone.
            r, _, _ = select.select([sys.stdin], [], [], wait)
            if r and not os.read(sys.stdin.fileno(), 1):
                break
            if ns.parent and os.getppid() != ns.parent:
                break
    except KeyboardInterrupt:
        pass
    finally:
        # One signal is enough: a second SIGTERM (timeout(1) signals the process group as well, the daemon its
        # children) while a large tree is removed raised KeyboardInterrupt out of here, a traceback in the log.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(child_main())
