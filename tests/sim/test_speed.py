"""``serve --simulate --simulate-speed N``: a fast-forwarded simulation gives the verdicts of speed 1.

What makes speed N right is timing alone: the renderers draw the scenario at ``(t - origin) x N``; the daemon's
engine must measure on the same scenario clock (its rates, 15 s windows and intervals); and each group must be
redrawn N times as often. Those three are the live path's own pieces (:mod:`exporter.sim.timebase`:
``group_intervals``, ``Playback`` and ``ScaledClock``, the clock ``LiveSimulation.clock`` gives the daemon).
Here they are driven from a virtual wall clock instead of CLOCK_MONOTONIC, with the daemon's pipeline on the
simulation's clock, so every shared scenario plays at speed 10 in seconds and deterministically. The
wall-clock path, with its child processes, runs at speed 10 in ``test_serve_simulate.py``.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest

from exporter import names, pipeline
from exporter.config import resolve
from exporter.diagnose.report import check
from exporter.engine import VirtualClock
from exporter.samples.derived import DerivedState
from exporter.sim.fakenvml import FakeNvml
from exporter.sim.model import Model
from exporter.sim.player import PhaseResult, PlayResult
from exporter.sim.render import GROUPS, Renderer
from exporter.sim.scenario import load
from exporter.sim.spec import Scenario
from exporter.sim.timebase import Playback, ScaledClock, group_intervals

HERE = Path(__file__).resolve().parent
SHARED = sorted((HERE.parent / "scenarios").glob("*.yaml"))
STARTUP_S = 0.3  # wall seconds between the renderers' origin and the engine's start (the children start first)


async def _play_live(sc: Scenario, speed: float, root: Path) -> PlayResult:
    """The scenario as ``serve --simulate --simulate-speed {speed}`` plays it, on a virtual wall clock."""
    wall = VirtualClock(0.0)
    model = Model(sc)
    renderer = Renderer(model, root, atomic=False)
    renderer.setup()
    renderer.render(0.0)
    settings = resolve(pipeline.registry(), {}, {"path.procfs": str(root / "proc"), "path.sysfs": str(root / "sys")})
    playback = Playback(model, group_intervals(settings, pipeline.registry()), origin=wall.now(), speed=speed)
    fake = FakeNvml(playback.nvml(0.0))

    async def draw() -> None:
        while True:
            await wall.sleep_until(playback.next_due())
            now = wall.now()
            groups = playback.due(now)
            t = playback.scenario_time(now)
            renderer.render(t, [g for g in groups if g in GROUPS])
            if "nvml" in groups:
                fake.set_state(playback.nvml(t))

    clock = ScaledClock(speed, playback.origin, base=wall)  # LiveSimulation.clock, on the virtual wall clock
    drawer = asyncio.get_running_loop().create_task(draw())
    await wall.advance(STARTUP_S)
    pipe = pipeline.build(settings, clock=clock, nvml=fake, inline=True)
    pipe.engine.start()
    result = PlayResult(scenario=sc, phases=[])
    try:
        for ph in sc.phases:
            await wall.advance(clock.to_base(ph.end_s) - wall.now())
            value = pipe.engine.snapshot.value(names.DERIVED)
            result.phases.append(PhaseResult(ph.name, ph.end_s, value if isinstance(value, DerivedState) else None))
    finally:
        drawer.cancel()
        await pipe.engine.stop(timeout=1.0)
    return result


def play_live(sc: Scenario, speed: float) -> PlayResult:
    with tempfile.TemporaryDirectory(prefix="gpufeed-speed-") as tmp:
        return asyncio.run(_play_live(sc, speed, Path(tmp)))


@pytest.mark.parametrize("path", SHARED, ids=lambda p: p.stem)
def test_every_shared_scenario_at_speed_10_gives_the_verdicts_of_speed_1(path: Path) -> None:
    sc = load(path)
    # The shared scenarios' expectations name the verdict of every GPU at the end of every phase; speed 1
    # (virtual time, tests/sim/test_diagnose.py) meets them all, so meeting them is giving the same verdicts.
    assert {(e.phase, i) for e in sc.expect for i in e.gpus} == {(p.name, g.index) for p in sc.phases for g in sc.gpus}
    assert check(play_live(sc, 10.0)) == [], f"{path.name} at speed 10"


@pytest.mark.parametrize("flags", [{}, {"collector.gpu.samples-steady-interval": "7s"}])
def test_the_simulated_sample_buffer_covers_the_buffered_readers_longest_interval(flags: dict[str, str]) -> None:
    """While every GPU is steady the buffered sampler reads every --collector.gpu.samples-steady-interval: a
    buffer drawn for its 1 s interval ran over between two reads, the gap read as a dip, and no GPU of the
    benchmark host ever stayed at its steady rate under ``serve --simulate``."""
    settings = resolve(pipeline.registry(), {}, flags)
    intervals = group_intervals(settings, pipeline.registry())
    longest = 7.0 if flags else 4.0
    sc = load(SHARED[0])
    playback = Playback(Model(sc), intervals, origin=0.0, speed=1.0)
    assert playback.buffer_s >= longest + 1.0
    state = playback.nvml(60.0)
    stamps = [ts for ts, _ in state["devices"][0]["util_samples"]]
    assert (stamps[-1] - stamps[0]) / 1e6 >= longest + 1.0, "the newest samples reach back past the previous read"
