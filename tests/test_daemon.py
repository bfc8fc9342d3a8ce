"""End to end: ``gpufeed serve`` on the riser box shows the degraded hop with its capacity and the
remote-pinned process as a NUMA mismatch with its reason (the issue's "done when")."""

from __future__ import annotations

import asyncio
import gc
from collections import deque

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter import linkmath
from exporter.cli import build_parser, settings_from_args
from exporter.collectors import load_all
from exporter.daemon import GC_THRESHOLDS, Daemon, tuned_gc
from tests.support.hosts import box


async def scrape(port: int, path: str = "/metrics") -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return data.decode().partition("\r\n\r\n")[2]


async def test_serve_on_riser_box_shows_degraded_hop_and_remote_pinned_process() -> None:
    registry = load_all()
    root = box("riser")
    ns = build_parser(registry).parse_args([
        "serve", "--web.listen-address", "127.0.0.1:0", "--path.sysfs", str(root / "sys"),
        "--path.procfs", str(root / "proc"), "--web.render-interval", "50ms",
        "--collector.numa.pids", "0000:01:00.0=4242,0000:41:00.0=4243",
    ])
    settings = settings_from_args(ns, registry)
    settings.enabled = {n: n in ("pcie", "numa") for n in registry}
    daemon = Daemon(settings)
    await daemon.start()
    assert daemon._hotplug is not None and daemon._hotplug.targets  # the pcie collector is hotplug-driven
    try:
        body = ""
        for _ in range(100):
            body = await scrape(daemon.web.port)
            if "gpufeed_process_numa_mismatch" in body and "gpufeed_pcie_link_capacity" in body:
                break
            await asyncio.sleep(0.05)
    finally:
        await daemon.stop()
    got = {(smp.name, tuple(sorted(smp.labels.items()))): smp.value
           for fam in text_string_to_metric_families(body) for smp in fam.samples}

    def at(name: str, **labels: str) -> float | None:
        return got.get((name, tuple(sorted(labels.items()))))

    # Both ends of the degraded link run Gen3 x8: by default the GPU's end is the chain's exported hop.
    gpu = {"bdf": "0000:41:00.0", "gpu_bdf": "0000:41:00.0", "role": "gpu"}
    cap = at("gpufeed_pcie_link_capacity_bytes_per_second", **gpu)
    assert cap == pytest.approx(linkmath.capacity_bytes_per_second(3, 8))
    assert at("gpufeed_pcie_link_current_speed_transfers_per_second", **gpu) == 8e9
    assert at("gpufeed_pcie_link_current_width", **gpu) == 8
    info = next(dict(k) for (name, k) in got if name == "gpufeed_pcie_device_info" and ("bdf", gpu["bdf"]) in k)
    assert (info["limit_speed"], info["limit_width"]) == ("16.0 GT/s", "16")
    for reason in ("cpus_remote", "memory_remote"):
        far = {"comm": "python3", "gpu": "0000:01:00.0", "pid": "4242", "reason": reason}
        near = {"comm": "python3", "gpu": "0000:41:00.0", "pid": "4243", "reason": reason}
        assert at("gpufeed_process_numa_mismatch", **far) == 1
        assert at("gpufeed_process_numa_mismatch", **near) is None  # well placed: no series
    assert at("gpufeed_collector_success", collector="pcie") == 1
    assert at("gpufeed_collector_success", collector="numa") == 1


@pytest.mark.parametrize("name", ["dgx", "riser", "switch_riser", "workstation", "vm", "garbage"])
def test_every_fixture_box_renders_valid_exposition(name: str) -> None:
    """The families render through prometheus_client without duplicate or malformed series."""
    from prometheus_client import CollectorRegistry, generate_latest

    from exporter.collectors.pcie import PcieCollector
    from tests.support.hosts import context, snapshot_of

    c = PcieCollector(context(name))
    snap = snapshot_of("pcie", c.update())

    class Adapter:
        def collect(self) -> object:
            return c.metrics(snap)

    reg = CollectorRegistry()
    reg.register(Adapter())  # type: ignore[arg-type]
    text = generate_latest(reg).decode()
    seen = set()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in seen, key
            seen.add(key)


async def test_each_listen_address_gets_a_listener_as_node_exporter_does() -> None:
    registry = load_all()
    root = box("riser")
    ns = build_parser(registry).parse_args([
        "serve", "--web.listen-address", "127.0.0.1:0", "--web.listen-address", "127.0.0.1:0",
        "--path.sysfs", str(root / "sys"), "--path.procfs", str(root / "proc"),
    ])
    settings = settings_from_args(ns, registry)
    settings.enabled = {n: n == "pcie" for n in registry}
    daemon = Daemon(settings)
    await daemon.start()
    try:
        ports = daemon.web.ports
        assert len(ports) == 2 and ports[0] != ports[1]
        for port in ports:
            assert "gpufeed_build_info" in await scrape(port)
    finally:
        await daemon.stop()


async def test_a_listener_that_cannot_bind_stops_the_start_and_releases_the_others() -> None:
    registry = load_all()
    root = box("riser")
    blocker = await asyncio.start_server(lambda _r, w: w.close(), "127.0.0.1", 0)
    taken = blocker.sockets[0].getsockname()[1]
    try:
        ns = build_parser(registry).parse_args([
            "serve", "--web.listen-address", "127.0.0.1:0", "--web.listen-address", f"127.0.0.1:{taken}",
            "--path.sysfs", str(root / "sys"), "--path.procfs", str(root / "proc"),
        ])
        settings = settings_from_args(ns, registry)
        settings.enabled = {n: n == "pcie" for n in registry}
        daemon = Daemon(settings)
        with pytest.raises(OSError):
            await daemon.start()
        assert daemon.web.ports == []  # the first listener was closed again
        await daemon.engine.stop()  # what `gpufeed serve` does then, before exit 1
    finally:
        blocker.close()
        await blocker.wait_closed()


def test_the_garbage_collector_is_tuned_while_the_daemon_serves_and_restored_after() -> None:
    thresholds, frozen = gc.get_threshold(), gc.get_freeze_count()
    with tuned_gc():
        # What was alive at start-up is out of every full collection's way; young and middle collections are
        # smaller (each pause shorter), and full ones wait for at least as many middle ones as by default.
        assert gc.get_freeze_count() > frozen
        assert gc.get_threshold() == GC_THRESHOLDS
        assert GC_THRESHOLDS[0] < thresholds[0] and GC_THRESHOLDS[1] < thresholds[1] <= GC_THRESHOLDS[2]
    assert gc.get_threshold() == thresholds and gc.get_freeze_count() == frozen


class _Reading:
    """A sampled object of the kind a sample holds besides its rows (tuples come from CPython's free lists,
    which the young threshold does not count; these are counted)."""

    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        self.value = value


def test_young_collections_keep_coming_while_ring_buffers_churn_so_row_tuples_get_untracked() -> None:
    # Steady state: each sample appended evicts one as big, so allocations minus deallocations -- what the young
    # threshold counts -- climbs only by one sample's worth before falling back. The threshold must be below a
    # sample's worth so that young collections keep coming: at 20,000 none came once the buffer was full, every
    # row buffered since stayed tracked and the first collection to come traversed them all.
    buffer: deque[tuple[tuple[tuple[int, ...], ...], list[_Reading]]] = deque(maxlen=20)

    def sample(n: int) -> tuple[tuple[tuple[int, ...], ...], list[_Reading]]:
        return tuple(tuple(range(n, n + 8)) for _ in range(1_500)), [_Reading(n) for _ in range(1_200)]

    with tuned_gc():
        for n in range(20):
            buffer.append(sample(n))
        collected = gc.get_stats()[0]["collections"]
        for n in range(40):  # the buffer is full: each sample evicts one
            buffer.append(sample(n))
        assert gc.get_stats()[0]["collections"] > collected
        rows = [row for rows_, _ in list(buffer)[:-2] for row in rows_]
        assert sum(gc.is_tracked(r) for r in rows) < len(rows) // 10
