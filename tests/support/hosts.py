"""The fixture hosts (``tests/fixtures/hosts/<name>/{proc,sys,nvml}``) and helpers to run collectors on them.

Each host is a real capture (``capture``: this project's CI VM) or a synthetic tree laid out as the kernel
does (``large``: 192 CPUs, 2 nodes; ``dgx``, ``riser``, ``switch_riser``, ``workstation``, ``vm``, ``garbage``:
PCI topologies). ``nvml/state.json``, where present, is the strict fake NVML's state for the host's GPUs.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from prometheus_client.core import Metric

from exporter.collectors import load_all
from exporter.engine import Engine, VirtualClock
from exporter.exposition import Renderer
from exporter.sampling import Collector, CollectorContext, Targets
from exporter.snapshot import Snapshot, Stamped

REPO = Path(__file__).resolve().parents[2]
HOSTS = REPO / "tests" / "fixtures" / "hosts"
TOOLS = REPO / "tools"
LARGE = HOSTS / "large"
CAPTURE = HOSTS / "capture"
HOST_COLLECTORS = ("cpu", "cpufreq", "disk", "memory", "nfs", "pressure", "proc")
SAMPLERS = ("cpu", "cpufreq", "disk", "memory", "nfs", "pressure", "proc", "proc_threads")


def host(name: str) -> Path:
    """The root of a committed fixture host (holds ``sys`` and, for most, ``proc`` and ``nvml``)."""
    return HOSTS / name


box = host  # the PCI-topology tests call their hosts boxes


def load_tool(name: str) -> ModuleType:
    """Import tools/<name>.py (tools/ is scripts, not a package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while the class is created
    spec.loader.exec_module(mod)
    return mod


def context(
    name: str | Path, *, options: dict[str, Any] | None = None, targets: Targets | None = None, nvml: Any = None,
) -> CollectorContext:
    """A collector context rooted at fixture host ``name`` (or a copied tree)."""
    root = name if isinstance(name, Path) else host(name)
    return CollectorContext(procfs=root / "proc", sysfs=root / "sys", options=options or {},
                            targets=targets or Targets(), nvml=nvml)


MakeCollector = Callable[..., Collector]


def make(name: str, root: Path, *, pids: tuple[int, ...] = (), options: Mapping[str, Any] | None = None) -> Collector:
    """Collector ``name`` reading ``root/proc`` and ``root/sys`` with its default options plus ``options``."""
    cls = load_all()[name]
    opts: dict[str, Any] = {o.name: o.default for o in cls.options}
    opts["interval"] = cls.default_interval
    opts.update(options or {})
    return cls(CollectorContext(procfs=root / "proc", sysfs=root / "sys", options=opts, targets=Targets(pids)))


def run_engine(*collectors: Collector, until: float = 0.0) -> Engine:
    """Run every sampler of ``collectors`` through a virtual-time engine up to ``until``."""
    eng = Engine(list(collectors), VirtualClock(), inline=True)
    eng.run_until(until)
    return eng


def exposition(eng: Engine) -> str:
    """The text exposition of the engine's newest snapshot, as a scrape would get it."""
    r = Renderer(eng.stages)
    r.render(eng.snapshot)
    return r.text().body.decode()


def series(text: str) -> dict[str, float]:
    """``name{labels}`` -> value for every sample line of an exposition."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def snapshot_of(sampler: str, value: Any) -> Snapshot:
    """A snapshot whose newest sample of ``sampler`` is ``value``."""
    return Snapshot(version=1, t=0.0, latest={sampler: Stamped(0.0, value)})


def family_series(families: Iterable[Metric], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Samples of family ``name`` (sample name as exposed, e.g. ``..._total``) keyed by sorted labels."""
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for fam in families:
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def family_value(families: Iterable[Metric], name: str, **labels: str) -> float | None:
    """The one sample of ``name`` whose labels include ``labels``; None if absent, error if ambiguous."""
    hits = [v for k, v in family_series(families, name).items() if all((lk, lv) in k for lk, lv in labels.items())]
    assert len(hits) <= 1, f"{name}{labels}: {len(hits)} matches"
    return hits[0] if hits else None
