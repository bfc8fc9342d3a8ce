"""The whole daemon on a fixture host, on a virtual clock: every collector and the derived layer, built by the
pipeline exactly as ``gpufeed serve`` builds them, over ``tests/fixtures/hosts/<name>/{proc,sys}`` and the
strict fake NVML in ``nvml/state.json``. ``host.yaml`` says how long to run, which flags to set and at what
constant rates the fake's GPUs work (``exporter.sim.fakenvml.advance_device`` keyword arguments per index).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from exporter import pipeline, yamlsafe
from exporter.config import resolve
from exporter.engine import VirtualClock
from exporter.exposition import Renderer
from exporter.sim.fakenvml import FakeNvml, advance_device
from tests.support.hosts import HOSTS

# Families whose values depend on the machine running the test, not on the host: how long runs took (and so
# how many ticks they overran, how long NVML calls took) and the Python version. Their presence is still
# checked, not their values.
# Values of the machine or of the test process, not of the host: log_messages_dropped_total counts the whole
# process's drops (earlier tests in the same pytest run write to closed streams on purpose).
MACHINE_DEPENDENT = re.compile(
    r"^gpufeed_(collector_cpu_seconds_total|nvml_call_duration_seconds_\w+|sampler_overruns_total|build_info|"
    r"log_messages_dropped_total|self_\w+)"
    r"(\{| )")
STEP = 0.05  # the fake's counters advance in steps of at most this (the fast sampler runs every 0.1 s)


def hosts() -> list[str]:
    """Every fixture host with a golden run description."""
    return sorted(p.parent.name for p in HOSTS.glob("*/host.yaml"))


def run(name: str) -> str:
    """``/metrics`` of the whole pipeline after the host's run, machine-dependent values masked."""
    pipe = after_run(name)
    renderer = Renderer(pipe.stages)
    renderer.render(pipe.engine.snapshot)
    pipe.close()
    lines = [_masked(line) for line in renderer.text().body.decode().splitlines()]
    return "\n".join(lines) + "\n"


def after_run(name: str) -> pipeline.Pipeline:
    """The whole pipeline after the host's run (the caller closes it)."""
    root = HOSTS / name
    # The loader scenario files go through: YAML 1.2 floats (5.8e9), bounded.
    spec: dict[str, Any] = yamlsafe.load(root / "host.yaml") or {}
    state = json.loads((root / "nvml" / "state.json").read_text())
    fake = FakeNvml(state)
    rates = {int(k): v for k, v in (spec.get("nvml_rates") or {}).items()}
    # The Hostname label would otherwise be the machine's running the test ($NODE_NAME, gethostname()).
    settings = resolve(pipeline.registry(), {}, {
        "path.procfs": str(root / "proc"), "path.sysfs": str(root / "sys"), "collector.gpu.hostname": name,
        **(spec.get("flags") or {})})
    clock = VirtualClock(0.0)
    pipe = pipeline.build(settings, clock=clock, nvml=fake, inline=True)
    engine = pipe.engine
    end = float(spec.get("seconds", 20.0))
    t = 0.0
    engine.run_until(0.0)
    while t < end - 1e-9:
        nxt = min(end, t + STEP)
        if state.get("devices"):
            st = fake.state
            for idx, kw in rates.items():
                advance_device(st["devices"][idx], t, nxt, **kw)
            st["t"] = nxt
            fake.set_state(st)
        engine.run_until(nxt)
        t = nxt
    return pipe


def _masked(line: str) -> str:
    """A sample line whose value (and, for build_info, labels) depends on the machine, masked."""
    if line.startswith("gpufeed_build_info{"):
        return "gpufeed_build_info{<machine>} <machine>"
    return line.rpartition(" ")[0] + " <machine>" if MACHINE_DEPENDENT.match(line) else line


def golden_path(name: str) -> Path:
    return HOSTS / name / "golden.prom"
