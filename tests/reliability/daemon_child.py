"""A real ``gpufeed serve`` process with test collectors, for the lifecycle tests (run as a subprocess).

Usage: python -m tests.reliability.daemon_child [--blocking] [--flaky] [--files] [--big|--medium] -- <flags>
``--blocking`` adds a collector whose read never returns (a hung NFS mount behind /proc);
``--flaky`` one that fails every third run, so it logs on two runs in three (collector_failed / collector_recovered);
``--files`` one that reads /proc/self/stat through exporter.sources every tick (fails when fds run out);
``--big`` one that exports ~6 MB of series (a response that takes a while to send), ``--medium`` ~200 KB.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter import log
from exporter.config import resolve
from exporter.daemon import run_daemon
from exporter.sampling import Collector, CollectorError
from exporter.snapshot import Snapshot
from exporter.sources import read_text


class Ticks(Collector):
    """Counts its own runs; exports them as a gauge."""

    name = "ticks"
    help = "test"
    default_interval = 0.05

    def update(self) -> int:
        return 1

    def metrics(self, snap: Snapshot) -> Iterable[Metric]:
        g = GaugeMetricFamily("test_ticks", "test")
        st = snap.status.get(self.name)
        g.add_metric([], float(st.runs if st else 0))
        yield g


class Hung(Collector):
    """A read that never returns."""

    name = "hung"
    help = "test"
    default_interval = 0.1

    def update(self) -> int:
        threading.Event().wait()
        return 0

    def metrics(self, snap: Snapshot) -> Iterable[Metric]:
        return ()


class Flaky(Collector):
    """Fails every third run: its state changes twice in three runs, and each change is logged.

    Not every other run: the payload is re-rendered once a second (20 runs), so a renderer locked to that phase
    would only ever see the failing half. ``metrics`` reads the snapshot, as every collector must (the renderer
    formats a stage again only when its sampler has a new sample).
    """

    name = "flaky"
    help = "test"
    default_interval = 0.05
    runs = 0

    def update(self) -> int:
        Flaky.runs += 1
        if Flaky.runs % 3 == 1:
            raise CollectorError("every third run")
        log.forget(("sampler_failed", self.name))  # log every failure, not only the first
        return Flaky.runs

    def metrics(self, snap: Snapshot) -> Iterable[Metric]:
        g = GaugeMetricFamily("test_flaky_runs", "test")
        last = snap.latest.get(self.name)
        g.add_metric([], float(last.value) if last is not None else 0.0)
        yield g


class Files(Collector):
    """Reads a procfs file every tick through the one door (exporter.sources)."""

    name = "files"
    help = "test"
    default_interval = 0.1

    def update(self) -> int:
        return len(read_text("/proc/self/stat"))

    def metrics(self, snap: Snapshot) -> Iterable[Metric]:
        return ()


class Big(Collector):
    """About 6 MB of exposition (``--big``: more than the kernel's largest socket buffer, 4 MB), or 200 KB, a
    large node_exporter's (``--medium``)."""

    name = "big"
    help = "test"
    default_interval = 60.0
    series = 28000

    def update(self) -> int:
        return 1

    def metrics(self, snap: Snapshot) -> Iterable[Metric]:
        g = GaugeMetricFamily("test_big", "test", labels=["i", "pad"])
        pad = "x" * 200
        for i in range(self.series):
            g.add_metric([str(i), pad], float(i))
        yield g


def main(argv: list[str]) -> int:
    registry: dict[str, type[Collector]] = {"ticks": Ticks}
    if "--blocking" in argv:
        registry["hung"] = Hung
    if "--flaky" in argv:
        registry["flaky"] = Flaky
    if "--files" in argv:
        registry["files"] = Files
    if "--big" in argv:
        registry["big"] = Big
    if "--medium" in argv:
        Big.series = 900
        registry["big"] = Big
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    values = {}
    for f in flags:
        k, _, v = f.lstrip("-").partition("=")
        values[k] = v
    settings = resolve(registry, {}, values, source="flags")
    return run_daemon(settings, stages=registry)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
