"""Shared fixtures of the host-collector tests: fixture roots, a collector factory, engine and exposition helpers."""

from __future__ import annotations

import builtins
import contextlib
import errno
import io
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from exporter import log
from exporter.collectors import load_all
from exporter.collectors.base import Collector, CollectorContext, TargetPids
from exporter.engine import Engine, VirtualClock
from exporter.exposition import Renderer
from exporter.snapshot import Snapshot

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "host"
LARGE = FIXTURES / "large"
CAPTURE = FIXTURES / "capture"
HOST_COLLECTORS = ("cpu", "cpufreq", "disk", "memory", "nfs", "pressure", "proc")
SAMPLERS = ("cpu", "cpufreq", "disk", "memory", "nfs", "pressure", "proc", "proc_threads")


def pytest_addoption(parser: pytest.Parser) -> None:
    """``pytest tests/host --update-golden`` (pytest reads this hook only from conftests of the given paths)."""
    with contextlib.suppress(ValueError):  # another package's conftest registered the same option first
        parser.addoption("--update-golden", action="store_true", default=False,
                         help="rewrite golden files (tests/fixtures/host/e2e-output.txt) instead of diffing")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden", default=False))


@pytest.fixture(autouse=True)
def _fresh_log_once() -> Iterator[None]:
    """Each test sees the first occurrence of a persistent condition (log.once is process-wide)."""
    for name in SAMPLERS:
        log.forget(("sampler_failed", name))
        log.forget(("sampler_nodata", name))
    yield


@pytest.fixture
def large(tmp_path: Path) -> Path:
    """A private, writable copy of the large fixture (symlinks kept)."""
    dst = tmp_path / "large"
    shutil.copytree(LARGE, dst, symlinks=True)
    return dst


MakeCollector = Callable[..., Collector]


def make(name: str, root: Path, *, pids: tuple[int, ...] = (), options: Mapping[str, Any] | None = None) -> Collector:
    """Collector ``name`` reading ``root/proc`` and ``root/sys`` with its default options plus ``options``."""
    cls = load_all()[name]
    opts: dict[str, Any] = {o.name: o.default for o in cls.options}
    opts["interval"] = cls.default_interval
    opts.update(options or {})
    return cls(CollectorContext(procfs=root / "proc", sysfs=root / "sys", options=opts,
                                targets=TargetPids(pids)))


def run_engine(*collectors: Collector, until: float = 0.0) -> Engine:
    """Run every sampler of ``collectors`` through a virtual-time engine up to ``until``."""
    eng = Engine(list(collectors), VirtualClock(), inline=True)
    eng.run_until(until)
    return eng


def exposition(eng: Engine) -> str:
    """The text exposition of the engine's newest snapshot, as a scrape would get it."""
    r = Renderer(eng.collectors)
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


def value(snap: Snapshot, sampler: str) -> Any:
    return snap.value(sampler)


@pytest.fixture
def deny(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], None]:
    """Make reads of one path fail with EACCES, as for a non-root daemon (tests run as root in CI, where
    chmod 000 would not stop the read)."""
    denied: set[str] = set()
    real_open = io.open
    real_listdir = os.listdir

    def fake_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, str | os.PathLike) and os.fspath(file) in denied:
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(file))
        return real_open(file, *args, **kwargs)

    def fake_listdir(path: Any = ".") -> list[str]:
        if isinstance(path, str | os.PathLike) and os.fspath(path) in denied:
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real_listdir(path)

    real_os_open = os.open

    def fake_os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if isinstance(path, str | os.PathLike) and os.fspath(path) in denied:
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real_os_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", fake_os_open)
    monkeypatch.setattr(io, "open", fake_open)
    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(os, "listdir", fake_listdir)

    def add(path: Path) -> None:
        denied.add(os.fspath(path))

    return add
