"""Counters are monotonic for the life of a series, whatever fails: a property test over injected failures on a
whole simulated host, checked on every ``_total`` family of the rendered payload.

Round 2 found ``gpufeed_process_cpu_seconds_total`` going down 6 times in 8 injected ``/proc/<pid>/stat``
failures: the proc collector fell back to the deep sampler's older (up to 5 s) sample, and ``rate()``
invented a spike the size of the whole counter. The sources are now monotonic by construction, and the
exposition withholds any sample lower than the one exported before for the same series
(``gpufeed_exposition_regressions_withheld_total``); the property demands both: the payload never goes back,
and nothing had to be withheld.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.core import CounterMetricFamily, Metric

from exporter.exposition import Renderer
from exporter.sampling import Collector, CollectorContext
from exporter.snapshot import Snapshot, Stamped
from exporter.sources import KeptFiles

from .faults import GPU_PID, Host, scratch_dir

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*_total)(\{.*\})? (\S+)$", re.M)
TARGETS = (f"proc/{GPU_PID}/stat", f"proc/{GPU_PID}/status", f"proc/{GPU_PID}/io", "proc/stat", "proc/diskstats",
           f"proc/{GPU_PID}/task/{GPU_PID}/stat", "proc/vmstat")
KINDS = ("denied", "eio", "garbage", "missing", "ok")


def counters(body: str) -> dict[str, float]:
    return {m.group(1) + (m.group(2) or ""): float(m.group(3)) for m in _SAMPLE.finditer(body)}


class Faults:
    """Injects read failures (EACCES/EIO from os.open, as a non-root daemon or a failing disk sees them),
    garbage and missing files into the host, and makes its counters advance between cycles."""

    def __init__(self, host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
        self.host = host
        self.original = {rel: (host.root / rel).read_bytes() for rel in TARGETS}
        self.errors: dict[str, int] = {}
        self.step = 0
        real_open = os.open

        def fake_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            code = self.errors.get(os.fspath(path)) if isinstance(path, str | os.PathLike) else None
            if code is not None:
                raise OSError(code, os.strerror(code), os.fspath(path))
            return real_open(path, flags, *args, **kwargs)

        monkeypatch.setattr(os, "open", fake_open)
        # A file read through a descriptor kept open (exporter/sources.py KeptFiles) fails at the read.
        real_read = KeptFiles.read

        def fake_read(kept: KeptFiles, path: str) -> bytes:
            code = self.errors.get(path)
            if code is not None:
                raise OSError(code, os.strerror(code), path)
            return real_read(kept, path)

        monkeypatch.setattr(KeptFiles, "read", fake_read)

    def _content(self, rel: str) -> bytes:
        """The file as it would read now: its counters advanced by ``step`` (utime/stime, rchar/syscr, per-CPU
        user time, disk reads, OOM kills)."""
        text = self.original[rel].decode()
        k = self.step
        if rel.endswith("/stat") and "(" in text:
            head, _, tail = text.rpartition(") ")
            f = tail.split(" ")
            f[11], f[12] = str(int(f[11]) + 7 * k), str(int(f[12]) + 3 * k)  # (14) utime, (15) stime
            text = head + ") " + " ".join(f)
        elif rel.endswith("/io"):
            text = re.sub(r"^(rchar|syscr): (\d+)", lambda m: f"{m.group(1)}: {int(m.group(2)) + 4096 * k}",
                          text, flags=re.M)
        elif rel == "proc/stat":
            text = re.sub(r"^(cpu\d*) (\d+)", lambda m: f"{m.group(1)} {int(m.group(2)) + 11 * k}", text, flags=re.M)
        elif rel == "proc/diskstats":
            text = re.sub(r"^(\s*\d+\s+\d+ \S+) (\d+)", lambda m: f"{m.group(1)} {int(m.group(2)) + 5 * k}", text,
                          flags=re.M)
        elif rel == "proc/vmstat":
            text = re.sub(r"^oom_kill (\d+)", lambda m: f"oom_kill {int(m.group(1)) + k}", text, flags=re.M)
        return text.encode()

    def apply(self, faults: dict[str, str]) -> None:
        """Advance every counter one step, then put each target in the given state (absent: healthy)."""
        self.step += 1
        self.errors.clear()
        for rel in TARGETS:
            kind = faults.get(rel, "ok")
            path = self.host.root / rel
            if kind == "missing":
                path.unlink(missing_ok=True)
                continue
            tmp = path.with_name(path.name + ".new")
            tmp.write_bytes(b"\x00garbage (\n" if kind == "garbage" else self._content(rel))
            os.replace(tmp, path)
            if kind in ("denied", "eio"):
                self.errors[str(path)] = errno.EACCES if kind == "denied" else errno.EIO


@pytest.fixture
def root() -> Iterator[Path]:
    d = scratch_dir()
    yield d / "root"
    shutil.rmtree(d, ignore_errors=True)


def _check(host: Host, before: dict[str, float]) -> dict[str, float]:
    host.renderer.render(host.engine.snapshot)
    now = counters(host.renderer.text().body.decode())
    down = {k: (v, now[k]) for k, v in before.items() if k in now and now[k] < v}
    assert down == {}, down
    assert host.renderer.regressions == 0, "a source went backwards (withheld by the exposition)"
    return now


def test_eight_proc_stat_read_failures_never_make_process_cpu_go_back(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every second a read, failed or not (with every GPU working the process sampler would be at its quiet 5 s).
    host = Host(root, options={"collector.derived.quiet-host": False})
    faults = Faults(host, monkeypatch)
    host.run(6.0)  # a deep (5 s) pass has happened: the fallback the old code took is there
    before = _check(host, {})
    cpu_key = f'gpufeed_process_cpu_seconds_total{{comm="python3",pid="{GPU_PID}"}}'
    seen = 0
    for _ in range(8):
        faults.apply({})
        host.run(1.0)
        before = _check(host, before)
        faults.apply({f"proc/{GPU_PID}/stat": "eio"})
        host.run(1.0)
        before = _check(host, before)
        seen += cpu_key in before  # the shallow sampler failed: its counters are omitted, not replaced
    faults.apply({})
    host.run(1.0)
    after = _check(host, before)
    assert cpu_key in after and seen == 0  # failed reads omit the series; they never show an older value


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(
    st.tuples(st.dictionaries(st.sampled_from(TARGETS), st.sampled_from(KINDS), max_size=3),
              st.sampled_from([0.1, 0.5, 1.0, 2.5, 5.0])),
    min_size=3, max_size=10,
))
def test_no_counter_family_ever_goes_back_under_injected_failures(
    monkeypatch: pytest.MonkeyPatch, steps: list[tuple[dict[str, str], float]]
) -> None:
    d = scratch_dir()
    try:
        with monkeypatch.context() as m:
            host = Host(d / "root")
            faults = Faults(host, m)
            host.run(6.0)
            seen = _check(host, {})
            for state, dt in steps:
                faults.apply(state)
                host.run(dt)
                seen = _check(host, seen)
            faults.apply({})
            host.run(6.0)
            _check(host, seen)
    finally:
        shutil.rmtree(d, ignore_errors=True)


class Backwards(Collector):
    """A source that goes back (what the guard exists for): 10, 20, 15, 25 ... then the series disappears."""

    name = "backwards"
    help = "test"

    def __init__(self, ctx: CollectorContext, values: Iterable[float | None]) -> None:
        super().__init__(ctx)
        self.values = iter(values)
        self.current: float | None = None

    def update(self) -> int:
        return 1

    def metrics(self, snap: Snapshot) -> Iterable[Metric]:
        c = CounterMetricFamily("test_things", "test", labels=["k"])
        if self.current is not None:
            c.add_metric(["a"], self.current)
        yield c


def test_the_exposition_withholds_a_lower_counter_until_it_passes_the_last_value_or_the_series_ends() -> None:
    col = Backwards(CollectorContext(procfs=Path("/nonexistent"), sysfs=Path("/nonexistent")), ())
    renderer = Renderer([col])
    shown: list[float | None] = []
    for version, value in enumerate([10.0, 20.0, 15.0, 18.0, 25.0, None, 3.0, 4.0], start=1):
        col.current = value
        # A new sample of the collector's sampler each time, as the engine publishes (the renderer formats a
        # stage again only when one of its samplers has a new sample).
        sample = Stamped(float(version), value)
        renderer.render(Snapshot(version=version, t=float(version), latest=MappingProxyType({"backwards": sample})))
        got = counters(renderer.text().body.decode())
        shown.append(got.get('test_things_total{k="a"}'))
    # 15 and 18 are below 20: withheld; the series gone (None) ends its life: 3 starts a new one (a reset).
    assert shown == [10.0, 20.0, None, None, 25.0, None, 3.0, 4.0]
    assert renderer.regressions == 2
    assert counters(renderer.text().body.decode())["gpufeed_exposition_regressions_withheld_total"] == 2.0
