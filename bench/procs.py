"""Start and always stop the processes a benchmark measures: gpufeed, node_exporter, stress-ng.

Every process is started in its own session (process group) on 127.0.0.1, and stopped by its own
pid and group -- SIGTERM, a grace period, then SIGKILL -- when the ``with`` block ends, whatever
happened inside it. Nothing a benchmark starts outlives it.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType

from bench import procstat

REPO = Path(__file__).resolve().parent.parent
NODE_EXPORTER_CANDIDATES = ("prometheus-node-exporter", "node_exporter")


class BenchError(Exception):
    """A benchmark could not run (a binary is missing, a process died or never became ready)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_exporter_binary() -> str | None:
    """Path of node_exporter (Debian names it prometheus-node-exporter), or None."""
    for name in NODE_EXPORTER_CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def get(port: int, path: str = "/metrics", headers: dict[str, str] | None = None,
        timeout: float = 5.0) -> tuple[int, bytes]:
    """One GET on 127.0.0.1:port, on a connection of its own; (status, body)."""
    with Scraper(port, path, headers, timeout) as scraper:
        return scraper.get()


class Scraper:
    """GETs of ``path`` on one kept-alive connection to 127.0.0.1:port, as a Prometheus server scrapes a target
    (its HTTP client reuses the connection from scrape to scrape). A connection per scrape would make the daemon
    pay an accept and, in asyncio, a transport whose reference cycle only the cycle collector frees -- costs a
    Prometheus never causes."""

    def __init__(self, port: int, path: str = "/metrics", headers: dict[str, str] | None = None,
                 timeout: float = 5.0) -> None:
        self.port, self.path, self.headers, self.timeout = port, path, dict(headers or {}), timeout
        self._conn: http.client.HTTPConnection | None = None
        self.connections = 0  # connections opened so far

    def get(self) -> tuple[int, bytes]:
        """One scrape; (status, body). A kept connection the server has closed meanwhile is replaced once; a new
        connection's failure is the caller's."""
        reused = self._conn is not None
        if self._conn is None:
            self._conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
            self.connections += 1
        try:
            self._conn.request("GET", self.path, headers=self.headers)
            resp = self._conn.getresponse()
            body = resp.read()
        except (http.client.HTTPException, ConnectionError):
            self.close()
            if not reused:
                raise
            return self.get()
        if resp.will_close:
            self.close()
        return resp.status, body

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Scraper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Proc:
    """A started process, stopped on exit of the ``with`` block (or by ``stop()``)."""

    def __init__(self, name: str, argv: Sequence[str], *, nice: int | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.nice = nice
        self.env = env
        self.log_path = Path(tempfile.mkstemp(prefix=f"gpufeed-bench-{name}-", suffix=".log")[1])
        self.popen: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        assert self.popen is not None, "not started"
        return self.popen.pid

    def start(self) -> Proc:
        # coreutils nice execs the command: the pid stays the measured process's own (systemd's Nice=).
        argv = ["nice", "-n", str(self.nice), *self.argv] if self.nice else self.argv
        with self.log_path.open("wb") as log:
            self.popen = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=REPO, env=self.env,
            )
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log_text(self) -> str:
        """Everything the process wrote so far (stdout and stderr); empty once the log is gone."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, n: int = 2000) -> str:
        return self.log_text()[-n:]

    def check_alive(self) -> None:
        """BenchError with the log tail when the process has exited."""
        if not self.alive():
            rc = self.popen.returncode if self.popen else None
            raise BenchError(f"{self.name} exited (rc={rc}): {self.log_tail()}")

    def stop(self, grace: float = 5.0) -> int | None:
        """SIGTERM the process, SIGKILL its group after ``grace`` s; the exit status."""
        p = self.popen
        if p is None:
            return None
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
        # Whatever the process left in its own group (the simulator child, stress-ng workers) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
        self.returncode = p.returncode
        return p.returncode

    def __enter__(self) -> Proc:
        return self.start() if self.popen is None else self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
        with contextlib.suppress(OSError):
            self.log_path.unlink()


def gpufeed(port: int, args: Sequence[str], *, name: str = "gpufeed", nice: int | None = None,
            probe_out: Path | None = None, log_level: str = "warn") -> Proc:
    """``gpufeed serve`` on 127.0.0.1:port (or, with ``probe_out``, the same daemon under bench/probe.py)."""
    head = [sys.executable, "-m", "exporter"] if probe_out is None else \
        [sys.executable, str(REPO / "bench" / "probe.py"), str(probe_out)]
    argv = [*head, "serve", "--web.listen-address", f"127.0.0.1:{port}", "--log.level", log_level, *args]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return Proc(name, argv, nice=nice, env=env)


def node_exporter(port: int, collectors: Sequence[str] | None = None) -> Proc:
    """node_exporter on 127.0.0.1:port, default collectors or only ``collectors``."""
    binary = node_exporter_binary()
    if binary is None:
        raise BenchError("node_exporter not installed (Debian: apt-get install prometheus-node-exporter)")
    argv = [binary, f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    if collectors is not None:
        argv.append("--collector.disable-defaults")
        argv += [f"--collector.{c}" for c in collectors]
    return Proc("node_exporter", argv)


def stress(cpus: int, seconds: float) -> Proc:
    """A bounded CPU burner: stress-ng on ``cpus`` workers that stops by itself after ``seconds``."""
    binary = shutil.which("stress-ng")
    if binary is None:
        raise BenchError("stress-ng not installed (Debian: apt-get install stress-ng)")
    return Proc("stress-ng", [binary, "--cpu", str(cpus), "--timeout", f"{max(1, round(seconds))}s", "--quiet"])


def wait_ready(proc: Proc, port: int, *, timeout: float = 30.0, path: str = "/metrics",
               until: Callable[[bytes], bool] | None = None) -> bytes:
    """Poll ``path`` until it answers 200 (and ``until(body)`` holds); the body. BenchError on timeout."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        proc.check_alive()
        try:
            status, body = get(port, path, timeout=2.0)
            if status == 200 and (until is None or until(body)):
                return body
            last = f"HTTP {status}"
        except OSError as e:
            last = repr(e)
        time.sleep(0.2)
    raise BenchError(f"{proc.name} not ready on 127.0.0.1:{port}{path} after {timeout:.0f}s ({last}): "
                     f"{proc.log_tail()}")


def sample_rss(pid: int) -> int:
    """RSS of ``pid``, 0 when it is gone."""
    try:
        return procstat.rss_bytes(pid)
    except OSError:
        return 0


@contextlib.contextmanager
def running(*procs: Proc) -> Iterator[tuple[Proc, ...]]:
    """Start every process; stop all of them (in reverse) whatever happens."""
    started: list[Proc] = []
    try:
        for p in procs:
            started.append(p.start())
        yield procs
    finally:
        for p in reversed(started):
            p.__exit__(None, None, None)
