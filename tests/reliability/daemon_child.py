"""A real ``gpufeed serve`` process with test collectors, for the lifecycle tests (run as a subprocess).

Usage: python -m tests.reliability.daemon_child [--blocking] [--crashing] -- <serve flags>
``--blocking`` adds a collector whose read never returns (a hung NFS mount behind /proc);
``--crashing`` adds one whose sampler task crashes on its second run.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter.config import resolve
from exporter.daemon import run_daemon
from exporter.sampling import Collector
from exporter.snapshot import Snapshot


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


def main(argv: list[str]) -> int:
    registry: dict[str, type[Collector]] = {"ticks": Ticks}
    if "--blocking" in argv:
        registry["hung"] = Hung
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    values = {}
    for f in flags:
        k, _, v = f.lstrip("-").partition("=")
        values[k] = v
    settings = resolve(registry, {}, values, source="flags")
    return run_daemon(settings, stages=registry)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
