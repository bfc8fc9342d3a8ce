"""The scrape-latency fix: a Prometheus scrape (OpenMetrics) must not format the payload on the scrape path,
and the families are collected once per snapshot whatever the formats asked for."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path
from types import MappingProxyType

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter import exposition
from exporter.sampling import Collector, CollectorContext
from exporter.snapshot import Snapshot, Stamped


class Counted(Collector):
    name = "counted"
    help = "test"

    def __init__(self) -> None:
        super().__init__(CollectorContext(procfs=Path("/nonexistent"), sysfs=Path("/nonexistent")))
        self.collects = 0

    def update(self) -> float:
        return 1.0

    def metrics(self, snap: Snapshot) -> Iterable[Metric]:
        self.collects += 1
        g = GaugeMetricFamily("gpufeed_test_value", "A test value.")
        g.add_metric([], float(snap.value("counted") or 0.0))
        return [g]


def snap(version: int, value: float) -> Snapshot:
    return Snapshot(version=version, t=float(version),
                    latest=MappingProxyType({"counted": Stamped(float(version), value)}))


def test_openmetrics_scrapes_after_the_first_get_bytes_formatted_in_the_background() -> None:
    c = Counted()
    r = exposition.Renderer([c])
    r.render(snap(1, 1.0))
    first = r.openmetrics()  # first request: formatted on demand, from the families already collected
    assert b"gpufeed_test_value 1.0" in first.body
    assert c.collects == 1

    formatted: list[str] = []
    real_om, real_text = r._format_om, r._format_text

    def om(version: int) -> exposition.Payload:
        formatted.append("om")
        return real_om(version)

    def text(version: int) -> exposition.Payload:
        formatted.append("text")
        return real_text(version)

    r._format_om, r._format_text = om, text  # type: ignore[method-assign]
    r.render(snap(2, 2.0))
    assert formatted == ["text", "om"]  # both warm: text since start, OpenMetrics since it was asked for
    assert c.collects == 2  # collected once for both formats
    formatted.clear()
    body = r.openmetrics().body
    assert b"gpufeed_test_value 2.0" in body and body.endswith(b"# EOF\n")
    assert b"gpufeed_test_value 2.0" in r.text().body
    assert formatted == []  # the scrapes only copied bytes


def test_a_format_nobody_asked_for_recently_is_not_formatted_in_the_background() -> None:
    c = Counted()
    r = exposition.Renderer([c])
    r._text_asked -= exposition.WARM_SECONDS + 1  # text last asked for long ago
    r.openmetrics()
    r.render(snap(1, 1.0))
    assert r._text[0] != r.version  # text went cold
    assert b"gpufeed_test_value 1.0" in r.text().body  # and is still right when asked for again
    assert c.collects == 1


def test_a_scrape_from_the_http_thread_never_waits_for_a_render_in_progress() -> None:
    c = Counted()
    r = exposition.Renderer([c])
    r.render(snap(1, 1.0))
    r.openmetrics()
    got: list[bytes] = []
    with r._lock:  # a render holds the lock for as long as collecting and formatting take
        t = threading.Thread(target=lambda: got.extend([r.text().body, r.openmetrics().body]))
        t.start()
        t.join(5)
        assert not t.is_alive(), "the scrape waited for the render"
    assert b"gpufeed_test_value 1.0" in got[0] and b"gpufeed_test_value 1.0" in got[1]


class Still(Counted):
    """A stage whose samples do not change between renders (its chunk is reused)."""

    name = "still"

    def metrics(self, snap: Snapshot) -> Iterable[Metric]:
        self.collects += 1
        g = GaugeMetricFamily("gpufeed_still_value", "A value that does not change.")
        g.add_metric([], 7.0)
        return [g]


def test_a_chunks_families_are_released_once_both_formats_are_formatted_and_reuse_still_serves_both() -> None:
    still, c = Still(), Counted()
    r = exposition.Renderer([still, c])
    r._inputs = [(), ("counted",)]  # "still" reads no sampler: its chunk is reused at every render
    r.render(snap(1, 1.0))
    chunks = [ch for ch in r._chunks if ch is not None]
    assert all(ch.families is not None for ch in chunks)  # OpenMetrics not asked for yet: still needed
    first = r.openmetrics().body
    assert b"gpufeed_still_value 7.0" in first and b"gpufeed_test_value 1.0" in first
    assert all(ch.families is None and ch.om is not None for ch in chunks)  # nothing reads them any more
    r.render(snap(2, 2.0))
    assert still.collects == 1 and c.collects == 2  # the unchanged stage's chunk was reused
    for body in (r.openmetrics().body, r.text().body):
        assert b"gpufeed_still_value 7.0" in body and b"gpufeed_test_value 2.0" in body
    assert all(ch.families is None for ch in r._chunks if ch is not None)  # both formats warm: formatted at once
