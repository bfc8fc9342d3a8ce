"""Pressure stall information (PSI) from /proc/pressure/{cpu,io,memory}."""

from __future__ import annotations

import errno
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from exporter.collectors import register
from exporter.samples.host import PressureSample, PressureTotals
from exporter.samples.rows import RowMap
from exporter.sampling import PRESSURE, Collector, CollectorError, NoDataError
from exporter.snapshot import Snapshot
from exporter.sources import read_text

RESOURCES = ("cpu", "io", "memory")
# PSI totals are in microseconds (Documentation/accounting/psi.rst, "total= ... in us"). Divided, not
# multiplied by 1e-6, so 876543210 us prints as 876.54321 rather than 876.5432099999999.
US_PER_SECOND = 1e6


def parse_psi(res: str, text: str) -> PressureTotals:
    """Parse one PSI file (/proc/pressure/<res>, a cgroup's <res>.pressure): lines
    ``some|full avg10=.. avg60=.. avg300=.. total=N``. Shared by this collector and the workload collector."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind not in ("some", "full"):
            continue
        for field in rest.split():
            key, _, value = field.partition("=")
            if key == "total":
                try:
                    totals[kind] = int(value) / US_PER_SECOND
                except ValueError as e:
                    raise CollectorError(f"pressure/{res}: bad total {value!r}") from e
    if "some" not in totals:
        raise CollectorError(f"pressure/{res}: no 'some ... total=' line")
    return PressureTotals(some=totals["some"], full=totals.get("full"))


@register
class PressureCollector(Collector):
    """Stall time per resource: the share of wall time tasks waited on CPU, IO or memory."""

    name = PRESSURE
    help = "Pressure stall information from /proc/pressure (kernel >= 4.20 with psi enabled)."
    default_interval = 0.25

    def update(self) -> PressureSample:
        out: dict[str, PressureTotals] = {}
        for res in RESOURCES:
            path = self.ctx.proc("pressure", res)
            try:
                text = read_text(path)
            except FileNotFoundError:
                continue
            except OSError as e:
                # psi=0 on the kernel command line: the files exist but reading gives EOPNOTSUPP.
                if e.errno == errno.EOPNOTSUPP:
                    raise NoDataError("PSI disabled; boot with psi=1 to enable it") from e
                raise CollectorError(f"{path}: {e.strerror or e}") from e
            out[res] = parse_psi(path.name, text)
        if not out:
            raise NoDataError(f"{self.ctx.proc('pressure')} not present (kernel without PSI)")
        return PressureSample(resources=RowMap(PressureTotals, out))

    def metrics(self, snap: Snapshot) -> Iterator[Metric]:
        sample: PressureSample | None = snap.value(self.name)
        if sample is None:
            return
        some = CounterMetricFamily(
            "gpufeed_pressure_stalled_seconds",
            "Total time at least some tasks stalled on the resource (PSI 'some'), from /proc/pressure.",
            labels=["resource"],
        )
        full = CounterMetricFamily(
            "gpufeed_pressure_full_stalled_seconds",
            "Total time all non-idle tasks stalled on the resource at once (PSI 'full'), from /proc/pressure.",
            labels=["resource"],
        )
        for res, tot in sorted(sample.resources.items()):
            some.add_metric([res], tot.some)
            if tot.full is not None:
                full.add_metric([res], tot.full)
        yield some
        yield full
