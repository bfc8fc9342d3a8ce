"""gpufeed's own formatters write exactly what prometheus_client's write: on every family of every fixture host's
payload, on the edge cases of values, label values and help texts, and -- through the library itself -- on what
they do not write (units, exemplars, timestamps, ``_created``, other types, names outside the legacy set)."""

from __future__ import annotations

import math

import pytest
from prometheus_client import generate_latest as library_text
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
    SummaryMetricFamily,
    UnknownMetricFamily,
)
from prometheus_client.openmetrics.exposition import generate_latest as library_openmetrics
from prometheus_client.samples import Exemplar, Sample

from exporter import expfmt
from exporter.exposition import self_metrics
from tests.support import golden


class _Fams:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def assert_same(families: list[Metric]) -> None:
    want_text = library_text(_Fams(families))
    want_om = library_openmetrics(_Fams(families))  # type: ignore[no-untyped-call]
    assert expfmt.text(families).decode() == want_text.decode()
    assert (expfmt.openmetrics(families) + b"# EOF\n").decode() == want_om.decode()
    assert expfmt.both(families) == (want_text, want_om.removesuffix(b"# EOF\n"))  # the renderer's usual call


@pytest.mark.parametrize("host", golden.hosts())
def test_every_family_of_a_fixture_host_is_formatted_as_the_library_formats_it(host: str) -> None:
    pipe = golden.after_run(host)
    try:
        snap = pipe.engine.snapshot
        families = list(self_metrics(snap))
        for stage in pipe.stages:
            families.extend(stage.metrics(snap))
    finally:
        pipe.close()
    assert len(families) > 20 and sum(len(f.samples) for f in families) > 50
    assert_same(families)


def test_values_label_values_and_help_texts_at_their_edges() -> None:
    odd = CounterMetricFamily("odd_things", 'Help with a backslash \\, a "quote"\nand a new line.', labels=["a", "b"])
    for a, b, v in [("back\\slash", "x", 1), ('say "hi"', "y", 2.5), ("two\nlines", "", 0),
                    ("ünïcödé ✓", "z", 1e21), ("", "w", -0.0)]:
        odd.add_metric([a, b], v)
    values = GaugeMetricFamily("edge_values", "Values Go formats differently.", labels=["case"])
    for i, v in enumerate([0.0, -0.0, 1.0, -1.0, 1234567.0, 12345678.9, 1e-7, 0.1 + 0.2, 2**53, -1e300,
                           math.inf, -math.inf, math.nan, 42]):
        values.add_metric([str(i)], v)
    plain = GaugeMetricFamily("no_labels_at_all", "")
    plain.add_metric([], 3)
    empty = GaugeMetricFamily("no_samples_at_all", "A family with no sample yet.", labels=["gpu"])
    hist = HistogramMetricFamily("call_seconds", "A histogram.", labels=["kind"])
    hist.add_metric(["fast"], [("0.001", 3.0), ("0.01", 5.0), ("+Inf", 6.0)], sum_value=0.0123)
    summary = SummaryMetricFamily("request_seconds", "A summary.", count_value=4, sum_value=1.5)
    unknown = UnknownMetricFamily("mystery", "An unknown.", value=7)
    assert_same([odd, values, plain, empty, hist, summary, unknown])


def test_what_it_does_not_write_goes_to_the_library() -> None:
    created = CounterMetricFamily("with_created", "A counter with its creation time.", labels=["x"])
    created.add_metric(["1"], 5, created=1700000000.5)
    unit = GaugeMetricFamily("temperature_celsius", "With a unit.", unit="celsius")
    unit.add_metric([], 40)
    stamped = GaugeMetricFamily("stamped", "With a timestamp.", labels=["x"])
    stamped.add_metric(["1"], 1, timestamp=1700000000.25)
    exemplar = Metric("hits", "With an exemplar.", "counter")
    exemplar.samples = [Sample("hits_total", {"a": "b"}, 1.0, None, Exemplar({"trace_id": "abc"}, 1.0))]
    colon = GaugeMetricFamily("job:rate5m", "A recording-rule name.")
    colon.add_metric([], 1)
    odd_label = Metric("odd_label", "A label name outside the legacy set.", "gauge")
    odd_label.samples = [Sample("odd_label", {"a.b": "c"}, 1.0)]
    info = InfoMetricFamily("build", "Build information.", value={"version": "1"})
    states = StateSetMetricFamily("mode", "A state set.", value={"on": True, "off": False})
    gauge_hist = GaugeHistogramMetricFamily("queue", "A gauge histogram.", buckets=[("1", 2.0), ("+Inf", 3.0)],
                                            gsum_value=4.0)
    families = [created, unit, stamped, exemplar, colon, odd_label, info, states, gauge_hist]
    assert_same(families)
    plain = GaugeMetricFamily("plain_after_them", "Formatted here again.", labels=["x"])
    plain.add_metric(["1"], 1)
    assert_same([*families, plain])  # a family after a library-formatted one: in order, nothing lost
