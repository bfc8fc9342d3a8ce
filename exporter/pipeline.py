"""The one assembly: the stage registry, then collectors + analyzer, then the engine that runs them.

``gpufeed serve`` (:mod:`exporter.daemon`), ``gpufeed diagnose`` on a live host (:mod:`exporter.diagnose`) and the
scenario simulator (:mod:`exporter.sim.player`, ``serve --simulate``) all call :func:`build`; nothing else
constructs collectors, the analyzer or the engine. What differs between them is passed in: the clock (real or
virtual), the NVML module (the real ``pynvml`` or the strict fake), inline execution, and the history kept.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from exporter import log
from exporter.capture.options import CaptureConfig
from exporter.capture.stage import CaptureStage
from exporter.collectors import load_all
from exporter.config import Settings
from exporter.derived.analyzer import Analyzer
from exporter.engine import Clock, Engine, RealClock
from exporter.sampling import Collector, CollectorContext, Stage, Targets

_log = log.get_logger(component="pipeline")


def registry() -> dict[str, type[Stage]]:
    """Every stage settings can name, by name: the registered collectors and the analyzer (``derived``).

    This is what generates the ``--collector.<name>`` flags and config keys.
    """
    stages: dict[str, type[Stage]] = dict(load_all())
    stages[Analyzer.name] = Analyzer
    return dict(sorted(stages.items()))


@dataclass
class Pipeline:
    """The assembled parts. ``engine.stages`` is ``collectors``, the analyzer and the capture stage (each when
    enabled)."""

    settings: Settings
    collectors: list[Collector]
    analyzer: Analyzer | None
    engine: Engine
    targets: Targets
    capture: CaptureStage | None = None  # --capture.enabled: the stage, also for POST /capture and diagnose

    @property
    def stages(self) -> list[Stage]:
        """Everything the engine schedules and the exposition renders, in render order."""
        return self.engine.stages

    def close(self) -> None:
        """Release every stage's resources (for drivers that never started the engine's tasks)."""
        for s in self.engine.stages:
            try:
                s.close()
            except Exception as e:
                _log.warning("collector_close_failed", collector=s.name, error=repr(e))


def build(
    settings: Settings,
    *,
    stages: Mapping[str, type[Stage]] | None = None,
    clock: Clock | None = None,
    nvml: Any = None,
    inline: bool = False,
    history_seconds: float | None = None,
    on_publish: Callable[[], None] | None = None,
) -> Pipeline:
    """Build every stage ``settings`` enables and the engine over them.

    A stage is built when ``settings.enabled`` says so (settings resolved against a subset of the registry
    enable only that subset); ``stages`` replaces the registry (tests with collectors of their own). A
    collector whose constructor fails is logged and left out, so one broken
    source never stops the daemon. ``nvml`` is the NVML module the GPU collector uses (None: the real
    ``pynvml``); ``clock`` the engine's and every collector's time (default: monotonic wall time).
    """
    clock = clock or RealClock()
    targets = Targets()
    collectors: list[Collector] = []
    analyzer: Analyzer | None = None
    for name, cls in (registry() if stages is None else stages).items():
        if not settings.enabled.get(name, False):
            continue
        options = settings.collector.get(name, {})
        if cls is Analyzer:
            analyzer = Analyzer(options, targets)
            continue
        if not issubclass(cls, Collector):
            raise TypeError(f"stage {name!r} is neither a collector nor the analyzer")
        ctx = CollectorContext(procfs=settings.procfs, sysfs=settings.sysfs, options=options, targets=targets,
                               nvml=nvml, clock=clock.now, background=not inline)
        try:
            collectors.append(cls(ctx))
        except Exception as e:
            _log.error("collector_init_failed", collector=name, error=repr(e))
    built: list[Stage] = [*collectors, *([analyzer] if analyzer is not None else [])]
    # Nothing of the capture exists unless enabled (settings built by hand in tests may not have the key).
    stage = CaptureStage(CaptureConfig.from_values(settings.values), targets, procfs=settings.procfs) \
        if settings.values.get("capture.enabled") else None
    built += [stage] if stage is not None else []
    history = float(settings["engine.history"]) if history_seconds is None else history_seconds
    engine = Engine(built, clock, history_seconds=history, inline=inline, on_publish=on_publish)
    if analyzer is not None:
        analyzer.bind(engine)
    if stage is not None:
        stage.bind(engine)
    return Pipeline(settings=settings, collectors=collectors, analyzer=analyzer, engine=engine, targets=targets,
                    capture=stage)
