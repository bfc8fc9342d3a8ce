"""Per-CPU times from /proc/stat and the NUMA node of each CPU from /sys/devices/system/node."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from types import MappingProxyType

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.collectors import register
from exporter.collectors.base import Collector, CollectorContext, CollectorError, Option
from exporter.cpulist import CpulistError, parse_cpulist
from exporter.samples.host import CpuSample, CpuTimes
from exporter.snapshot import Snapshot

# /proc/stat times are in USER_HZ ticks: "units of USER_HZ (1/100ths of a second on most architectures,
# use sysconf(_SC_CLK_TCK) to obtain the right value)" -- proc(5), /proc/stat.
USER_HZ = float(os.sysconf("SC_CLK_TCK"))
MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
# node_exporter's cpu collector (cpu_linux.go, jumpBackSeconds): idle going back by this much is not a
# counter glitch but a CPU that went offline and came back (its counters restarted), so the CPU is reset.
JUMP_BACK_SECONDS = 3.0

Ticks = tuple[int, ...]  # one CPU's 8 counters in USER_HZ ticks, in MODES order (integers: sums stay exact)
IDLE = MODES.index("idle")


def parse_stat(text: str) -> dict[int, Ticks]:
    """Parse the ``cpuN`` lines of /proc/stat into ticks per mode (the aggregate ``cpu`` line is skipped)."""
    out: dict[int, Ticks] = {}
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        parts = line.split()
        try:
            cpu = int(parts[0][3:])
        except ValueError as e:
            raise CollectorError(f"/proc/stat: bad cpu line {line[:60]!r}") from e
        if len(parts) < 9:
            # Kernels since 2.6.11 print at least 8 times (steal); fewer means a truncated read.
            raise CollectorError(f"/proc/stat: cpu{cpu} has {len(parts) - 1} fields, expected at least 8")
        try:
            out[cpu] = tuple(int(v) for v in parts[1:9])
        except ValueError as e:
            raise CollectorError(f"/proc/stat: cpu{cpu}: non-numeric field in {line[:80]!r}") from e
    if not out:
        raise CollectorError("/proc/stat: no cpuN lines")
    return out


def to_times(ticks: Ticks) -> CpuTimes:
    """Ticks -> seconds per mode."""
    return CpuTimes(*(t / USER_HZ for t in ticks))


class CpuState:
    """Counter hygiene across samples: cleaned per-CPU counters and monotonic per-node sums (in ticks).

    Pure bookkeeping (no I/O) so hotplug and counter resets can be tested with plain tables.
    """

    def __init__(self) -> None:
        self.cpus: dict[int, Ticks] = {}
        self.nodes: dict[int, Ticks] = {}
        self.started = False

    def update(self, raw: Mapping[int, Ticks], node_of: Mapping[int, int]) -> tuple[int, ...]:
        """Fold one /proc/stat reading in; returns the CPUs treated as hotplugged (reset)."""
        reset: list[int] = []
        cleaned: dict[int, Ticks] = {}
        for cpu, new in raw.items():
            node = node_of.get(cpu, 0)
            prev = self.cpus.get(cpu)
            inc: Ticks | None
            if prev is None:
                cleaned[cpu] = new
                # The first reading seeds node sums with lifetime counters; a CPU that appears later (onlined)
                # contributes only what it does from now on, so node counters never jump.
                inc = None if self.started else new
            elif (prev[IDLE] - new[IDLE]) / USER_HZ >= JUMP_BACK_SECONDS:
                reset.append(cpu)
                cleaned[cpu] = new
                inc = None
            else:
                # node_exporter's hygiene: a field that went backwards keeps its previous value.
                cleaned[cpu] = tuple(max(a, b) for a, b in zip(prev, new, strict=True))
                inc = tuple(c - a for a, c in zip(prev, cleaned[cpu], strict=True))
            base = self.nodes.get(node, (0,) * len(MODES))
            self.nodes[node] = base if inc is None else tuple(a + b for a, b in zip(base, inc, strict=True))
        # CPUs missing from this reading went offline: dropped from per-CPU, their past stays in node sums.
        self.cpus = cleaned
        self.started = True
        return tuple(reset)


@register
class CpuCollector(Collector):
    """Per-core CPU times at high rate, kept for the derived layer; exported as per-NUMA-node sums."""

    name = "cpu"
    help = "Per-CPU times from /proc/stat with NUMA nodes from sysfs; per-node sums by default."
    default_interval = 0.25
    options = (
        Option("per-core", "bool", False, "Also export per-core series gpufeed_cpu_seconds_total{cpu,mode}."),
    )

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self.per_core = bool(ctx.options.get("per-core", False))
        self._state = CpuState()
        self._cpu_set: frozenset[int] = frozenset()
        self._node_of: Mapping[int, int] = MappingProxyType({})

    def update(self) -> CpuSample:
        path = self.ctx.proc("stat")
        try:
            text = path.read_text(errors="replace")
        except OSError as e:
            raise CollectorError(f"{path}: {e.strerror or e}") from e
        raw = parse_stat(text)
        cpus = frozenset(raw)
        if cpus != self._cpu_set:
            # NUMA layout is read at start and again only when CPUs come or go (hotplug).
            self._node_of = self._read_nodes()
            if self._cpu_set:
                self.log.info("cpu_set_changed", cpus=len(cpus), previous=len(self._cpu_set))
            self._cpu_set = cpus
        reset = self._state.update(raw, self._node_of)
        if reset:
            self.log.info("cpu_counters_reset", cpus=",".join(map(str, reset)), reason="idle jumped back (hotplug)")
        return CpuSample(
            cpus=MappingProxyType({c: to_times(t) for c, t in self._state.cpus.items()}),
            node_of=self._node_of,
            node_totals=MappingProxyType({n: to_times(t) for n, t in self._state.nodes.items()}),
        )

    def _read_nodes(self) -> Mapping[int, int]:
        """CPU -> NUMA node from /sys/devices/system/node/node*/cpulist (empty when the host has no NUMA info)."""
        base = self.ctx.sys("devices", "system", "node")
        out: dict[int, int] = {}
        try:
            entries = sorted(os.listdir(base))
        except FileNotFoundError:
            self.log.debug("numa_info_absent", path=str(base), hint="all CPUs counted in node 0")
            return MappingProxyType({})
        except OSError as e:
            raise CollectorError(f"{base}: {e.strerror or e}") from e
        for entry in entries:
            if not entry.startswith("node") or not entry[4:].isdigit():
                continue
            node = int(entry[4:])
            path = base / entry / "cpulist"
            try:
                cpus = parse_cpulist(path.read_text(errors="replace"))
            except FileNotFoundError:
                continue
            except (OSError, CpulistError) as e:
                raise CollectorError(f"{path}: {e}") from e
            for cpu in cpus:
                out[cpu] = node
        return MappingProxyType(out)

    def metrics(self, snap: Snapshot) -> Iterator[Metric]:
        sample: CpuSample | None = snap.value(self.name)
        if sample is None:
            return
        node_seconds = CounterMetricFamily(
            "gpufeed_cpu_node_seconds",
            "Seconds the CPUs of a NUMA node spent in each mode, from /proc/stat; never decreases across CPU "
            "hotplug (node 0 holds every CPU when the host has no NUMA information).",
            labels=["node", "mode"],
        )
        for node, times in sorted(sample.node_totals.items()):
            for mode in MODES:
                node_seconds.add_metric([str(node), mode], getattr(times, mode))
        yield node_seconds
        node_cpus = GaugeMetricFamily(
            "gpufeed_cpu_node_cpus", "Online CPUs of a NUMA node (from /proc/stat and node*/cpulist).",
            labels=["node"],
        )
        counts: dict[int, int] = dict.fromkeys(sample.node_totals, 0)
        for cpu in sample.cpus:
            node = sample.node_of.get(cpu, 0)
            counts[node] = counts.get(node, 0) + 1
        for node, n in sorted(counts.items()):
            node_cpus.add_metric([str(node)], float(n))
        yield node_cpus
        if self.per_core:
            per_core = CounterMetricFamily(
                "gpufeed_cpu_seconds", "Seconds each CPU spent in each mode, from /proc/stat.",
                labels=["cpu", "mode"],
            )
            for cpu, times in sorted(sample.cpus.items()):
                for mode in MODES:
                    per_core.add_metric([str(cpu), mode], getattr(times, mode))
            yield per_core
