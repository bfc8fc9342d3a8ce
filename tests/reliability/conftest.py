"""Shared fixtures of the reliability suite: a throwaway PKI (openssl CLI, test-only), an in-process web
server on 127.0.0.1:0, curl as the independent client that operators would use, and real daemon processes
(tests/reliability/daemon_child.py) on a known port, optionally under an open-files limit."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import pytest_asyncio
from prometheus_client.core import Metric

from bench.load import free_port
from exporter.exposition import Renderer
from exporter.sampling import Collector, CollectorContext
from exporter.snapshot import Snapshot
from exporter.web import AccessPolicy, WebServer, WebSettings


@dataclass(frozen=True)
class Pki:
    """A CA, a server certificate for 127.0.0.1 and two client certificates (allowed SAN and another)."""

    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_client_cert: Path
    other_client_key: Path
    server2_cert: Path
    server2_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def _signed(d: Path, name: str, subject: str, ext: str) -> None:
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=d)
    (d / f"{name}.ext").write_text(ext)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "2", "-out", f"{name}.crt", "-extfile", f"{name}.ext", cwd=d)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=gpufeed test CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign", cwd=d)
    server_ext = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
    _signed(d, "server", "/CN=gpufeed", server_ext)
    _signed(d, "server2", "/CN=gpufeed-rotated", server_ext)
    _signed(d, "client", "/CN=prometheus", "subjectAltName=DNS:prometheus.example\nextendedKeyUsage=clientAuth\n")
    _signed(d, "other", "/CN=intruder", "subjectAltName=DNS:intruder.example\nextendedKeyUsage=clientAuth\n")
    return Pki(
        dir=d, ca=d / "ca.crt", server_cert=d / "server.crt", server_key=d / "server.key",
        client_cert=d / "client.crt", client_key=d / "client.key",
        other_client_cert=d / "other.crt", other_client_key=d / "other.key",
        server2_cert=d / "server2.crt", server2_key=d / "server2.key",
    )


@pytest.fixture(scope="session")
def alice_hash() -> str:
    """bcrypt of 'wonderland' at cost 4 (cheap in tests; the format is what htpasswd -B writes)."""
    return bcrypt.hashpw(b"wonderland", bcrypt.gensalt(4)).decode().replace("$2b$", "$2y$", 1)


class Static(Collector):
    """A collector that exports one constant gauge, so /metrics has a body to check."""

    name = "static"
    help = "test"

    def update(self) -> int:
        return 1

    def metrics(self, snap: Snapshot) -> Iterable[Metric]:
        return ()


def renderer() -> Renderer:
    r = Renderer([Static(CollectorContext(procfs=Path("/nonexistent"), sysfs=Path("/nonexistent")))])
    r.render(Snapshot(version=1, t=0.0))
    return r


Serve = Callable[..., Awaitable[WebServer]]


@pytest_asyncio.fixture
async def serve() -> AsyncIterator[Serve]:
    """``await serve(policy, **settings)`` -> a started WebServer on 127.0.0.1:0, stopped at teardown."""
    servers: list[WebServer] = []

    async def start(policy: AccessPolicy | None = None, **kw: object) -> WebServer:
        settings = WebSettings(host="127.0.0.1", port=0, **kw)  # type: ignore[arg-type]
        srv = WebServer(renderer(), settings, healthy=lambda: True, policy=policy)
        await srv.start()
        servers.append(srv)
        return srv

    yield start
    for s in servers:
        await s.stop()


async def curl(*args: str, timeout: float = 15.0) -> tuple[int, str, str]:
    """Run curl without blocking the event loop that serves it; (exit code, stdout, stderr)."""
    if shutil.which("curl") is None:
        pytest.skip("curl not installed")
    proc = await asyncio.create_subprocess_exec(
        "curl", "-sS", "--max-time", "10", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


ROOT = Path(__file__).resolve().parents[2]


def start_child(
    extra: tuple[str, ...], flags: tuple[str, ...], *, nofile: int | None = None, **popen: Any
) -> tuple[subprocess.Popen[Any], int]:
    """``python -m tests.reliability.daemon_child *extra -- *flags`` on a free 127.0.0.1 port (under
    ``prlimit --nofile`` when given), returned once it accepts connections. The port is chosen here, not read
    from the log: some tests send the log nowhere (a full disk, a closed pipe)."""
    port = free_port()
    args = [sys.executable, "-m", "tests.reliability.daemon_child", *extra, "--",
            f"--web.listen-address=127.0.0.1:{port}", *flags]
    if nofile is not None:
        args = ["prlimit", f"--nofile={nofile}:{nofile}", *args]
    proc: subprocess.Popen[Any] = subprocess.Popen(args, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                                   **popen)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), 0.5):
                return proc, port
        except OSError:
            assert proc.poll() is None, f"daemon exited with {proc.returncode}: {proc.communicate()[0]!r}"
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("daemon did not listen")


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[Any]]]:
    """Daemon processes a test started; killed at teardown if still running."""
    started: list[subprocess.Popen[Any]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.communicate(timeout=10)
