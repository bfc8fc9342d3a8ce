"""A virtual-time rig: the real GPU collector and engine, driven by the strict fake NVML.

``Rig.run_until(t)`` plays the engine's samplers in time order; before every NVML call the fake's state is
advanced to the engine's clock with the rates the test set for that GPU (piecewise constant), so counters,
GPM integrals and the driver's sample buffers are exact integrals of what the test asked for.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from prometheus_client.core import Metric

from exporter.collectors.gpu import GpuCollector
from exporter.engine import Engine, VirtualClock
from exporter.sampling import CollectorContext, Targets
from exporter.sim.fakenvml import FakeNvml, advance_device

Rates = Mapping[str, Any]
RateFn = Callable[[float], Rates]

STEP = 0.01  # the fake's state advances in steps of at most this; rates are taken at each step's midpoint


def device(index: int, **kw: Any) -> dict[str, Any]:
    """A fake device with a PCI address and sensible defaults; ``kw`` overrides state keys."""
    d: dict[str, Any] = {"pci_bus_id": f"0000:{0x82 + index:02x}:00.0", "uuid": f"GPU-test-{index}",
                         "cpu_affinity": "0-3", "memory_affinity": "0"}
    d.update(kw)
    return d


class LiveFake(FakeNvml):
    """The strict fake whose state follows the engine clock: each call first advances it to 'now'."""

    def __init__(self, state: Mapping[str, Any], clock: VirtualClock) -> None:
        super().__init__(state)
        self.clock = clock
        self.rates: dict[int, RateFn] = {}
        self.edits: list[tuple[float, Callable[[dict[str, Any]], None]]] = []

    def _maybe_reload(self) -> None:
        now = self.clock.now()
        st = self._state
        t = float(st["t"])
        if now <= t and not self.edits:
            return
        while t < now - 1e-12:
            nxt = min(now, (math.floor(t / STEP + 1e-9) + 1) * STEP)
            for idx, fn in self.rates.items():
                if idx < len(st["devices"]):
                    advance_device(st["devices"][idx], t, nxt, **fn((t + nxt) / 2))
            t = nxt
            st["t"] = t
        st["t"] = max(t, now)
        due = [e for e in self.edits if e[0] <= now]
        if due:
            self.edits = [e for e in self.edits if e[0] > now]
            for _, edit in due:
                edit(st)
            self.set_state(st)


class Rig:
    """The GPU collector in an inline engine on a virtual clock, over a LiveFake and a tmp procfs/sysfs."""

    def __init__(self, tmp: Path, devices: list[dict[str, Any]], *, options: Mapping[str, Any] | None = None,
                 procs: Mapping[int, str] | None = None, **state: Any) -> None:
        self.clock = VirtualClock(0.0)
        self.fake = LiveFake({"devices": devices, **state}, self.clock)
        self.procfs, self.sysfs = tmp / "proc", tmp / "sys"
        (self.procfs / "sys" / "kernel").mkdir(parents=True)
        (self.procfs / "sys" / "kernel" / "pid_max").write_text("4194304\n")
        self.sysfs.mkdir()
        for pid, comm in (procs or {}).items():
            (self.procfs / str(pid)).mkdir()
            (self.procfs / str(pid) / "comm").write_text(comm + "\n")
        self.targets = Targets()
        self.ctx = CollectorContext(procfs=self.procfs, sysfs=self.sysfs, options=dict(options or {}),
                                    targets=self.targets, nvml=self.fake, clock=self.clock.now)
        self.collector = GpuCollector(self.ctx)
        self.engine = Engine([self.collector], self.clock, inline=True, history_seconds=600.0)

    def rates(self, index: int, fn: RateFn | Rates) -> None:
        """Set GPU ``index``'s activity: a dict of advance_device kwargs, or a function of time giving one."""
        if callable(fn):
            self.fake.rates[index] = fn
            return
        fixed = dict(fn)

        def const(_t: float) -> Rates:
            return fixed

        self.fake.rates[index] = const

    def at(self, t: float, edit: Callable[[dict[str, Any]], None]) -> None:
        """Apply ``edit`` to the fake's state once the clock reaches ``t`` (faults, recovery)."""
        self.fake.edits.append((t, edit))

    def run_until(self, t: float) -> None:
        self.engine.run_until(t)

    def history(self, sampler: str) -> list[tuple[float, Any]]:
        return [(s.t, s.value) for s in self.engine.history(sampler)]

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every exported sample of the collector: (name, sorted labels) -> value."""
        out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        fams: Iterator[Metric] = iter(self.collector.metrics(self.engine.snapshot))
        for fam in fams:
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def value(self, metric: str, **labels: str) -> float | None:
        return self.metrics().get((metric, tuple(sorted(labels.items()))))

    def failures(self) -> dict[str, str | None]:
        """Samplers whose latest run failed (not NoData): name -> error. Empty when all is well."""
        return {n: s.last_error for n, s in self.engine.samplers.items() if s.failures}
