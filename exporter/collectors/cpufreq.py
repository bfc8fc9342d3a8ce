"""CPU frequency scaling from /sys/devices/system/cpu/cpu*/cpufreq: governor, current and maximum frequency."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter.collectors import register
from exporter.samples.host import CpufreqCpu, CpufreqSample
from exporter.samples.rows import RowMap
from exporter.sampling import CPUFREQ, Collector, CollectorContext, CollectorError, NoDataError
from exporter.snapshot import Snapshot
from exporter.sources import KeptFiles

# cpufreq sysfs frequencies are in kHz ("All frequencies ... are in kHz", Documentation/admin-guide/pm/cpufreq.rst,
# "Policy Interface in sysfs").
HZ_PER_KHZ = 1000.0
MAX_REFRESH_RUNS = 12


@register
class CpufreqCollector(Collector):
    """Summarised frequency scaling: how many CPUs run each governor and how far below max they clock."""

    name = CPUFREQ
    help = "CPU frequency scaling from /sys/devices/system/cpu/cpu*/cpufreq (absent in most VMs)."
    default_interval = 5.0

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self._max: dict[int, float | None] = {}
        self._runs = 0
        # The attributes are read through descriptors kept open (~400 files a pass on a 192-CPU host): sysfs
        # runs the attribute's show() again for a read at offset 0.
        self._kept = KeptFiles()
        self._listing: list[str] | None = None
        self._dirs: dict[int, str] = {}  # cpu -> its cpufreq directory, for the CPUs that have one

    def close(self) -> None:
        self._kept.close()

    def update(self) -> CpufreqSample:
        base = self.ctx.sys("devices", "system", "cpu")
        try:
            entries = os.listdir(base)
        except FileNotFoundError as e:
            raise NoDataError(f"{base} not present") from e
        except OSError as e:
            raise CollectorError(f"{base}: {e.strerror or e}") from e
        out: dict[int, CpufreqCpu] = {}
        # cpuinfo_max_freq is the hardware limit; it changes only when boost is toggled, so it is re-read every
        # MAX_REFRESH_RUNS runs instead of every run -- as is which CPUs have a cpufreq directory, unless the
        # listing changed (hotplug).
        refresh_max = self._runs % MAX_REFRESH_RUNS == 0
        if refresh_max or entries != self._listing:
            self._listing = entries
            dirs = {int(e[3:]): os.path.join(base, e, "cpufreq")
                    for e in entries if e.startswith("cpu") and e[3:].isdigit()}
            self._dirs = {cpu: d for cpu, d in dirs.items() if os.path.isdir(d)}
            self._kept.close()
        for cpu, d in sorted(self._dirs.items()):
            gov = self._read(d + "/scaling_governor")
            cur = self._khz(d + "/scaling_cur_freq")
            mx = None if refresh_max else self._max.get(cpu)
            if mx is None:
                mx = self._max[cpu] = self._khz(d + "/cpuinfo_max_freq")
            out[cpu] = CpufreqCpu(governor=gov, cur_hz=cur, max_hz=mx)
        self._runs += 1
        self._kept.sweep()
        if not out:
            raise NoDataError(f"no cpufreq directory under {base}/cpu* (no cpufreq driver, typical of VMs)")
        return CpufreqSample(cpus=RowMap(CpufreqCpu, sorted(out.items())))

    def _read(self, path: str) -> str | None:
        """One cpufreq attribute, stripped; None when the driver does not provide it."""
        try:
            text = self._kept.read(path).decode("utf-8", "replace").strip()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise CollectorError(f"{path}: {e.strerror or e}") from e
        if not text:
            raise CollectorError(f"{path}: empty")
        return text

    def _khz(self, path: str) -> float | None:
        """A kHz attribute (scaling_cur_freq, cpuinfo_max_freq) in Hz; None when absent or '<unknown>'."""
        text = self._read(path)
        if text is None or text == "<unknown>":
            return None
        try:
            return int(text) * HZ_PER_KHZ
        except ValueError as e:
            raise CollectorError(f"{path}: not a frequency: {text[:40]!r}") from e

    def metrics(self, snap: Snapshot) -> Iterator[Metric]:
        sample: CpufreqSample | None = snap.value(self.name)
        if sample is None:
            return
        governors = GaugeMetricFamily(
            "gpufeed_cpufreq_governor_cpus",
            "CPUs running each cpufreq scaling governor (powersave on a GPU host starves the launch thread).",
            labels=["governor"],
        )
        for gov, n in sorted(Counter(c.governor for c in sample.cpus.values() if c.governor).items()):
            governors.add_metric([gov], float(n))
        yield governors
        ratios = [
            c.cur_hz / c.max_hz for c in sample.cpus.values()
            if c.cur_hz is not None and c.max_hz is not None and c.max_hz > 0
        ]
        if not ratios:
            return
        lo = GaugeMetricFamily(
            "gpufeed_cpufreq_current_ratio_min",
            "Lowest ratio of current to maximum frequency over all CPUs (scaling_cur_freq / cpuinfo_max_freq).",
        )
        lo.add_metric([], min(ratios))
        hi = GaugeMetricFamily(
            "gpufeed_cpufreq_current_ratio_max",
            "Highest ratio of current to maximum frequency over all CPUs (scaling_cur_freq / cpuinfo_max_freq).",
        )
        hi.add_metric([], max(ratios))
        yield lo
        yield hi
