"""Logging can fail without taking anything down, and ``--log.format json`` is JSON on every line.

Round 2 found: a broken stderr (EPIPE, ENOSPC) killed the first sampler that logged, for good; ``2>/dev/full``
or closed stdout and stderr made ``gpufeed serve`` exit 1 at start; asyncio's own tracebacks broke the JSON
log format.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from exporter import log

from .conftest import start_child


def _start(flags: tuple[str, ...], prlimit: int | None = None, **popen: Any) -> tuple[subprocess.Popen[bytes], int]:
    return start_child(("--flaky",), ("--log.level=debug", *flags), nofile=prlimit, **popen)


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        body = r.read().decode()
    m = re.search(rf"^{re.escape(name)} (\S+)$", body, re.M)
    assert m, name
    return float(m.group(1))


def _still_sampling(port: int) -> None:
    """The flaky sampler (it logs on every run) keeps running: its run count goes up."""
    first = _metric(port, "test_flaky_runs")
    deadline = time.monotonic() + 10
    while _metric(port, "test_flaky_runs") < first + 10:
        assert time.monotonic() < deadline, "the sampler that logs stopped"
        time.sleep(0.1)


def _stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(10)


def test_stderr_on_a_full_disk_drops_lines_and_nothing_stops(procs: list[subprocess.Popen[bytes]]) -> None:
    with open("/dev/full", "wb") as full:  # every write fails with ENOSPC
        proc, port = _start((), stdout=full, stderr=full)
    procs.append(proc)
    _still_sampling(port)
    assert _metric(port, "gpufeed_log_messages_dropped_total") > 10
    assert _stop(proc) == 0


def test_stderr_a_broken_pipe_drops_lines_and_nothing_stops(procs: list[subprocess.Popen[bytes]]) -> None:
    r, w = os.pipe()
    os.close(r)  # the log reader is gone: every write is EPIPE
    try:
        proc, port = _start((), stdout=w, stderr=w)
    finally:
        os.close(w)
    procs.append(proc)
    _still_sampling(port)
    assert _metric(port, "gpufeed_log_messages_dropped_total") > 10
    assert _stop(proc) == 0


def test_closed_stdout_and_stderr_at_start_serve_normally(procs: list[subprocess.Popen[bytes]]) -> None:
    def close_std() -> None:
        os.close(1)
        os.close(2)

    proc, port = _start((), preexec_fn=close_std)
    procs.append(proc)
    _still_sampling(port)
    assert _stop(proc) == 0


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="prlimit (util-linux) not installed")
def test_json_log_format_is_json_on_every_line_even_when_connections_run_out(
    procs: list[subprocess.Popen[bytes]],
) -> None:
    # At a 100-fd limit, 150 connections at once: asyncio's accept loop printed a plain traceback per attempt.
    proc, port = _start(("--log.format=json",), prlimit=100, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    procs.append(proc)
    held = []
    for _ in range(150):
        with contextlib.suppress(OSError):
            held.append(socket.create_connection(("127.0.0.1", port), 2))
    time.sleep(1.5)
    for s in held:
        s.close()
    deadline = time.monotonic() + 10
    while True:  # the server sees the closes at its next read of each; until then the cap is still full
        try:
            _metric(port, "test_flaky_runs")
            break
        except OSError:
            assert time.monotonic() < deadline, "connections were not released"
            time.sleep(0.2)
    _still_sampling(port)
    assert _stop(proc) == 0
    assert proc.stdout is not None
    lines = proc.stdout.read().decode().splitlines()
    events = [json.loads(line)["event"] for line in lines]  # every line is one JSON object
    assert "connection_limit_lowered" in events and "connection_limit_reached" in events


def test_what_python_and_asyncio_print_themselves_is_rendered_as_json_too() -> None:
    out = io.StringIO()
    log.configure("info", "json", stream=out)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(log.loop_exception_handler)

        def broken() -> None:
            raise RuntimeError("callback failed")

        loop.call_soon(broken)
        await asyncio.sleep(0.01)

    asyncio.run(main())
    logging.getLogger("asyncio").error("Task exception was never retrieved", exc_info=ValueError("lost"))
    t = threading.Thread(target=lambda: 1 / 0, name="doomed")
    t.start()
    t.join()
    events = [json.loads(line) for line in out.getvalue().splitlines()]  # every line is one JSON object
    assert {"event_loop_error", "python_log", "thread_crashed"} <= {e["event"] for e in events}
    assert all("Traceback" not in line or line.startswith("{") for line in out.getvalue().splitlines())


def test_a_failing_stream_never_raises_into_the_caller() -> None:
    class Broken(io.StringIO):
        def write(self, s: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    before = log.dropped()
    log.configure("info", "logfmt", stream=Broken())
    logger: Callable[..., None] = log.get_logger(component="test").error
    for _ in range(5):
        logger("collector_failed", error="x")  # would have raised into the sampler
    assert log.dropped() == before + 5
