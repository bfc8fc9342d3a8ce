"""``gpufeed serve``: the pipeline (exporter/pipeline.py), renderer and web server, run until signalled."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from exporter import hotplug, log, pipeline
from exporter.capture.http import routes as capture_routes
from exporter.config import Settings
from exporter.engine import Clock, VirtualClock
from exporter.exposition import Renderer, unix_offset
from exporter.pacing import RenderPacer
from exporter.sampling import Stage
from exporter.web import WebServer, WebSettings, parse_address
from exporter.webconfig import WebConfigError, WebConfigManager

_log = log.get_logger(component="daemon")

# The collector's thresholds once the daemon runs (CPython's default is 700, 10, 10). Every collection is a
# pause that can stall a 100 ms GPU tick or a scrape (#14: p99 <= 10 ms), so young and middle collections are
# kept small rather than rare: a young collection traverses what was allocated since the last (at 20,000 one
# came once or twice a minute and took 10-17 ms), a middle one the survivors of the young collections since
# its last (at 1,000, 10 it examined ~13k objects, 4-10 ms of CPU with two GPUs waiting on this VM). At 500, 4
# on the 8-GPU benchmark host, two waiting: a young collection about every 1.5 s at 0.4 ms (max 0.9), a middle
# one every 6 s at 1.7 ms (max 3.4) -- ~0.01% of a core more in all. Each object is still examined once per
# generation it passes through. A full collection traverses what lives in the buffers: 5-9 ms of CPU on that host
# (bench/overhead.py times one at its window's end), the longest pause there is. At a threshold2 of 20 one came
# every ~100 s, 3 of 328 collections in the cycling scenario's 5 minutes -- ~1%, the p99 itself; at 50 one comes
# at most every 200 young ones (about every 4 minutes), and cyclic garbage that reached the oldest generation
# waits that long (1,800 objects in that scenario's 5 minutes).
GC_THRESHOLDS = (500, 4, 50)


@contextlib.contextmanager
def tuned_gc() -> Iterator[None]:
    """Move every object alive after start-up (modules, the pipeline, collectors, caches) to the permanent
    generation (``gc.freeze``), which full collections do not traverse, and keep each collection small
    (``GC_THRESHOLDS``). A full collection then traverses only what was allocated since -- mostly the samples
    in the ring buffers (bench/overhead.py reports the pauses). Frozen objects are still freed by
    reference counting; only cycles among them would stay, and start-up builds long-lived objects only.
    Undone on exit (tests run the daemon in-process)."""
    old = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


def listen_addresses(settings: Settings) -> tuple[str, ...]:
    """--web.listen-address: one or more (a string when the settings were built by hand)."""
    value = settings["web.listen-address"]
    return (value,) if isinstance(value, str) else tuple(value)


class Daemon:
    """The running exporter: engine + renderer + web server, with graceful start and stop."""

    def __init__(
        self, settings: Settings, *, clock: Clock | None = None, nvml: Any = None,
        stages: Mapping[str, type[Stage]] | None = None,
    ) -> None:
        self.settings = settings
        web_config = settings["web.config.file"]
        # Raises WebConfigError for a bad file: the caller exits 2 (at start nothing is served insecurely).
        self.webconfig = WebConfigManager(Path(web_config)) if web_config else None
        self.pipeline = pipeline.build(settings, stages=stages, clock=clock, nvml=nvml, on_publish=self._published)
        self.engine = self.pipeline.engine
        self.collectors = self.pipeline.collectors
        # Unix timestamps (gpufeed_sampler_last_success_timestamp_seconds) need the wall-clock offset of the
        # engine's clock (the monotonic clock, or scenario time under --simulate-speed); a test's virtual clock
        # has none and exports its own seconds.
        clock = self.engine.clock
        offset = None if isinstance(clock, VirtualClock) else (
            lambda: unix_offset() + time.monotonic() - clock.now())
        self.renderer = Renderer(self.pipeline.stages, offset=offset,
                                 extra=self.webconfig.metrics if self.webconfig is not None else None)
        # About one render per scrape, shortly before it (exporter/pacing.py), in real time even when the engine
        # runs on scenario time: scrapers keep wall-clock intervals.
        self.pacer = RenderPacer(
            lambda: self.renderer.render(self.engine.snapshot), interval=float(settings["web.render-interval"]),
            version=lambda: self.engine.version, rendered=lambda: self.renderer.version)
        (host, port), *also = [parse_address(a) for a in listen_addresses(settings)]
        self.web = WebServer(
            self.renderer,
            WebSettings(
                host=host, port=port, also=tuple(also), telemetry_path=settings["web.telemetry-path"],
                max_requests=settings["web.max-requests"], max_connections=settings["web.max-connections"],
                read_timeout=settings["web.read-timeout"], idle_timeout=settings["web.idle-timeout"],
            ),
            healthy=self.engine.alive,
            policy=self.webconfig,
            on_scrape=self.pacer.scraped,
            routes=capture_routes(self.pipeline.capture) if self.pipeline.capture is not None else None,
        )
        self._stop = asyncio.Event()
        self._render_task: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._reloads: set[asyncio.Task[bool]] = set()
        self._hotplug: hotplug.HotplugWatcher | None = None

    def _published(self) -> None:
        self.pacer.changed()

    async def start(self) -> None:
        """Bind the listener, then start sampling and rendering."""
        # Never serve the renderer's initial empty payload: a scrape in the first milliseconds would be a
        # 200 with no series at all (not even gpufeed_build_info).
        self.renderer.render(self.engine.snapshot)
        await self.web.start_in_thread()
        self.engine.start()
        # udev pci/block events re-enumerate PCI devices; without udev, periodic rescans (logged once).
        self._hotplug = hotplug.attach(self.collectors)
        self.renderer.render(self.engine.snapshot)
        self._render_task = asyncio.get_running_loop().create_task(self.pacer.run(), name="render")
        if self.webconfig is not None:
            self._watch_task = asyncio.get_running_loop().create_task(self.webconfig.watch(), name="webconfig")

    def reload(self) -> None:
        """SIGHUP: re-read --web.config.file (TLS, auth, headers); a bad file keeps the old config.

        The reload (file reads, certificate loading) runs in a worker thread, never on the loop that schedules
        the samplers. Other settings (collectors, intervals, listen address) need a restart: changing them
        under a running engine would silently break the counters' continuity.
        """
        if self.webconfig is None:
            _log.info("reload_requested", note="no --web.config.file; other settings need a restart")
            return
        task = asyncio.get_running_loop().create_task(
            asyncio.to_thread(self.webconfig.reload, "sighup"), name="webconfig-reload")
        self._reloads.add(task)
        task.add_done_callback(self._reloads.discard)

    def request_stop(self) -> None:
        """Ask the daemon to shut down (signal handler)."""
        self._stop.set()

    async def wait(self) -> None:
        """Until a stop is requested."""
        await self._stop.wait()

    async def stop(self) -> None:
        """Drain: stop accepting, stop samplers, close collectors -- within about 2 s."""
        for task in (self._render_task, self._watch_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.web.stop_in_thread()  # in-flight responses get web.DRAIN_GRACE to finish
        if self.webconfig is not None:
            self.webconfig.close()
        if self._hotplug is not None:
            self._hotplug.stop()
        await self.engine.stop(timeout=0.5)


async def _amain(settings: Settings, nvml: Any = None, stages: Mapping[str, type[Stage]] | None = None,
                 clock: Clock | None = None) -> int:
    try:
        daemon = Daemon(settings, nvml=nvml, stages=stages, clock=clock)
    except WebConfigError as e:
        _log.error("web_config_invalid", error=str(e))
        return 2
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(log.loop_exception_handler)  # structured, rate-limited; never a bare traceback
    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.request_stop)
    loop.add_signal_handler(signal.SIGHUP, daemon.reload)
    try:
        try:
            await daemon.start()
        except OSError as e:
            _log.error("listen_failed", address=",".join(listen_addresses(settings)), error=str(e))
            await daemon.engine.stop()
            return 1
        _log.info("started", collectors=",".join(c.name for c in daemon.pipeline.stages))
        with tuned_gc():
            await daemon.wait()
        _log.info("stopping")
        await daemon.stop()
        _log.info("stopped")
        return 0
    finally:
        # Remove our handlers while the loop's self-pipe is still open. Left to loop.close(), CPython closes
        # the self-pipe first and removes the handlers after, so a signal landing in between (timeout(1)
        # and systemd send SIGTERM, then SIGCONT/SIGKILL; a second Ctrl-C) makes the C handler write to a
        # closed socket: "Exception ignored when trying to write to the signal wakeup fd: BrokenPipeError".
        # After this a further SIGTERM/SIGINT gets the default action, which is what a second signal means.
        for sig in signals:
            loop.remove_signal_handler(sig)


def run_daemon(
    settings: Settings, *, nvml: Any = None, cleanup: Callable[[], None] | None = None,
    stages: Mapping[str, type[Stage]] | None = None, clock: Clock | None = None,
) -> int:
    """Run ``gpufeed serve`` until SIGTERM/SIGINT; returns the exit code.

    ``nvml``: the NVML module to use instead of ``pynvml`` (``serve --simulate`` passes the simulation's strict
    fake); ``cleanup`` runs once the daemon has stopped, before the process may exit hard (below); ``stages``
    replaces the registry (tests); ``clock`` is the engine's (``serve --simulate``: the scenario's time).
    """
    log.configure(settings["log.level"], settings["log.format"])
    try:
        code = asyncio.run(_amain(settings, nvml, stages, clock))
    finally:
        if cleanup is not None:
            cleanup()
    # A sampler thread stuck in a read (hung NFS behind /proc, a wedged driver call) cannot be interrupted,
    # and the interpreter would join it at exit forever: exit without waiting for it once the daemon has
    # drained (everything that matters was flushed and closed above).
    deadline = time.monotonic() + 0.5
    for t in threading.enumerate():
        if t is not threading.main_thread() and not t.daemon:
            t.join(max(0.0, deadline - time.monotonic()))  # an idle sampler thread exits at once
    stuck = [t.name for t in threading.enumerate()
             if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if stuck:
        _log.warning("exit_with_blocked_threads", threads=",".join(stuck))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
