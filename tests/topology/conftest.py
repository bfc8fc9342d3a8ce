"""Shared helpers for the topology tests: fixture trees, collector contexts, metric lookup."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from prometheus_client.core import Metric

from exporter.collectors.base import CollectorContext, TargetPids
from exporter.snapshot import Snapshot, Stamped

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "sysfs"
TOOLS = Path(__file__).resolve().parents[2] / "tools"


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


def box(name: str) -> Path:
    """The root of a committed fixture box (holds ``sys`` and, for some, ``proc``)."""
    return FIXTURES / name


def context(
    name: str | Path, *, options: dict[str, Any] | None = None, targets: TargetPids | None = None,
    shared: dict[str, Any] | None = None,
) -> CollectorContext:
    """A collector context rooted at fixture box ``name`` (or a copied tree)."""
    root = name if isinstance(name, Path) else box(name)
    return CollectorContext(
        procfs=root / "proc", sysfs=root / "sys", options=options or {}, targets=targets or TargetPids(),
        shared=shared if shared is not None else {},
    )


def snapshot_of(sampler: str, value: Any) -> Snapshot:
    """A snapshot whose newest sample of ``sampler`` is ``value``."""
    return Snapshot(version=1, t=0.0, latest={sampler: Stamped(0.0, value)})


def series(families: Iterable[Metric], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Samples of family ``name`` (sample name as exposed, e.g. ``..._total``) keyed by sorted labels."""
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for fam in families:
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def value(families: Iterable[Metric], name: str, **labels: str) -> float | None:
    """The one sample of ``name`` whose labels include ``labels``; None if absent, error if ambiguous."""
    hits = [v for k, v in series(families, name).items() if all((lk, lv) in k for lk, lv in labels.items())]
    assert len(hits) <= 1, f"{name}{labels}: {len(hits)} matches"
    return hits[0] if hits else None


@pytest.fixture
def copy_box(tmp_path: Path) -> Any:
    """Copy a fixture box into tmp_path (symlinks kept relative) so a test can mutate it."""

    def _copy(name: str) -> Path:
        dst = tmp_path / name
        shutil.copytree(box(name), dst, symlinks=True)
        return dst

    return _copy
