"""Engine on real threads: a sampler stuck in a read (hung NFS, slow driver) stalls neither other samplers nor
the HTTP server, and its overrun is counted."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from prometheus_client.core import Metric

from exporter.engine import Engine, RealClock
from exporter.exposition import Renderer
from exporter.sampling import Collector, CollectorContext
from exporter.snapshot import Snapshot
from exporter.web import WebServer, WebSettings


class Stuck(Collector):
    name = "stuck"
    help = "blocks in update until released"
    default_interval = 0.05

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self.release = threading.Event()
        self.calls = 0

    def update(self) -> int:
        self.calls += 1
        self.release.wait(10)
        return self.calls

    def metrics(self, snap: Snapshot) -> Iterable[Metric]:
        return ()


class Fast(Collector):
    name = "fast"
    help = "returns at once"
    default_interval = 0.05

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self.calls = 0

    def update(self) -> int:
        self.calls += 1
        return self.calls

    def metrics(self, snap: Snapshot) -> Iterable[Metric]:
        return ()


def _ctx() -> CollectorContext:
    return CollectorContext(procfs=Path("/nonexistent"), sysfs=Path("/nonexistent"))


async def _scrape(port: int) -> float:
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert data.startswith(b"HTTP/1.1 200")
    return time.perf_counter() - t0


async def test_blocked_sampler_stalls_neither_other_samplers_nor_scrapes() -> None:
    stuck, fast = Stuck(_ctx()), Fast(_ctx())
    renderer = Renderer([stuck, fast])
    eng = Engine([stuck, fast], RealClock(), on_publish=renderer.render)
    web = WebServer(renderer, WebSettings(host="127.0.0.1", port=0), eng.alive)
    await web.start()
    eng.start()
    try:
        await asyncio.sleep(0.6)
        latencies = [await _scrape(web.port) for _ in range(5)]
        assert stuck.calls == 1  # still inside its first read
        assert fast.calls >= 5, fast.calls  # kept its 50 ms rhythm meanwhile (loosely: the machine is shared)
        assert eng.snapshot.value("fast") >= 5  # and its samples were published while the other was stuck
        assert max(latencies) < 0.5, latencies
        assert renderer.version > 1
        stuck.release.set()
        for _ in range(100):
            if eng.snapshot.status["stuck"].runs >= 1:
                break
            await asyncio.sleep(0.01)
        st = eng.snapshot.status["stuck"]
        assert st.success and st.overruns >= 5  # ~0.6 s run on a 50 ms interval
    finally:
        stuck.release.set()
        await eng.stop()
        await web.stop()
