"""HTTP load and abuse harness: many scrapers, slowloris (plain and keep-alive) and idle connections, slow
readers at a file-descriptor limit, a basic-auth (bcrypt) flood, hostile requests.

Runs against a daemon on 127.0.0.1 (started here unless ``--port`` names one), every phase bounded in
connections and time, and reports what a real scraper saw meanwhile (latency percentiles), what the
daemon's memory, threads and descriptors did, and whether sampling was disturbed
(``gpufeed_sampler_overruns_total``). ``--peer node_exporter`` runs the same phases against node_exporter
(``prometheus-node-exporter`` or ``node_exporter`` from PATH) for side-by-side figures.

    python -m bench.load                 # full run: 200 scrapers x 60 s, 500 slowloris, 500 keep-alive
                                         # slowloris, 500 idle, abuse, the connection cap
    python -m bench.load --slow-readers  # the daemon under prlimit --nofile=256:256, waves of slow readers
    python -m bench.load --auth-flood    # basic auth (bcrypt cost 10): 50 random-password clients + a valid
                                         # scraper at 1/s
    python -m bench.load --quick         # 5 s phases (what tests/reliability/test_load.py runs)
    python -m bench.load --peer node_exporter --auth-flood --json ne.json

The functions are also used by the test suite with smaller numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import math
import multiprocessing
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
SCRAPE = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept-Encoding: gzip\r\n\r\n"


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100); NaN when empty."""
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]


async def read_response(reader: asyncio.StreamReader) -> tuple[int, int, bool]:
    """(status, body bytes, server closes) of one HTTP/1.1 response: Content-Length or chunked (Go's net/http,
    so node_exporter, sends large bodies chunked)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise ValueError(f"bad status line {lines[0][:80]!r}")
    status = int(parts[1])
    length, close, chunked = 0, False, False
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.lower() == "content-length":
            length = int(value.strip())
        elif name.lower() == "connection" and value.strip().lower() == "close":
            close = True
        elif name.lower() == "transfer-encoding" and "chunked" in value.lower():
            chunked = True
    if chunked:
        length = 0
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16):
            await reader.readexactly(size + 2)
            length += size
        await reader.readuntil(b"\r\n")  # the (empty) trailer
    elif length:
        await reader.readexactly(length)
    return status, length, close


@dataclass
class Latencies:
    """Request latencies (seconds) and outcomes of one client population."""

    ok: list[float] = field(default_factory=list)
    status: Counter[int] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)

    def summary(self) -> dict[str, Any]:
        ms = [x * 1000 for x in self.ok]
        return {
            "requests": sum(self.status.values()),
            "status": dict(sorted(self.status.items())),
            "errors": dict(self.errors),
            "p50_ms": round(percentile(ms, 50), 2),
            "p99_ms": round(percentile(ms, 99), 2),
            "max_ms": round(max(ms), 2) if ms else math.nan,
        }


async def scraper(
    port: int, stop_at: float, out: Latencies, *, interval: float = 0.0, request: bytes = SCRAPE,
    tls: ssl.SSLContext | None = None, error_at: list[float] | None = None,
) -> None:
    """One keep-alive scraper: GET /metrics until ``stop_at`` (every ``interval`` s, or back to back), over TLS
    with ``tls``; when each failed request was sent (seconds from the start) goes to ``error_at``."""
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    started = time.monotonic()
    while time.monotonic() < stop_at:
        t0 = time.monotonic()
        try:
            if writer is None:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port, ssl=tls), 5)
            assert reader is not None and writer is not None
            writer.write(request)
            status, _, close = await asyncio.wait_for(read_response(reader), 10)
            out.status[status] += 1
            if status == 200:
                out.ok.append(time.monotonic() - t0)
            if close:
                writer.close()
                writer, reader = None, None
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as e:
            out.errors[type(e).__name__] += 1
            if error_at is not None:
                error_at.append(round(t0 - started, 1))
            if writer is not None:
                writer.close()
            writer = None
            await asyncio.sleep(0.05)
        if interval:
            await asyncio.sleep(max(0.0, t0 + interval - time.monotonic()))
    if writer is not None:
        writer.close()


def _probe_child(port: int, seconds: float, interval: float, request: bytes, conn: Any) -> None:
    out = Latencies()
    asyncio.run(scraper(port, time.monotonic() + seconds, out, interval=interval, request=request))
    conn.send((out.ok, dict(out.status), dict(out.errors)))
    conn.close()


def auth_scrape(user: str, password: str) -> bytes:
    """A keep-alive scrape with basic auth."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return SCRAPE[:-2] + f"Authorization: Basic {token}\r\n\r\n".encode()


class Probe:
    """The "real" scraper, in its own process: the attackers' client work must not inflate its latency."""

    def __init__(self, port: int, seconds: float, interval: float, request: bytes = SCRAPE) -> None:
        ctx = multiprocessing.get_context("fork")
        self.recv, send = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=_probe_child, args=(port, seconds, interval, request, send), daemon=True)
        self.proc.start()
        send.close()

    async def result(self) -> Latencies:
        ok, status, errors = await asyncio.get_running_loop().run_in_executor(None, self.recv.recv)
        self.proc.join(5)
        return Latencies(ok=ok, status=Counter(status), errors=Counter(errors))


async def flood(
    port: int, scrapers: int, seconds: float, *, interval: float = 0.0, probe_interval: float = 0.1
) -> dict[str, Any]:
    """``scrapers`` scrapers (each every ``interval`` s, 0: back to back) plus one probe every ``probe_interval``."""
    stop_at = time.monotonic() + seconds
    load = Latencies()
    probe_proc = Probe(port, seconds, probe_interval)

    async def staggered(i: int) -> None:
        if interval:
            await asyncio.sleep(interval * i / scrapers)  # spread like independent Prometheus servers
        await scraper(port, stop_at, load, interval=interval)

    tasks = [asyncio.create_task(staggered(i)) for i in range(scrapers)]
    await asyncio.gather(*tasks)
    probe = await probe_proc.result()
    total = sum(load.status.values())
    return {"load": load.summary(), "probe": probe.summary(), "load_rps": round(total / seconds, 1)}


async def _hold(port: int, stop_at: float, drip: float | None, closed: list[float], stats: Counter[str], *,
                keep_alive: bool = False) -> None:
    """Hold one connection until ``stop_at``, reconnecting whenever the server closes it. With ``drip``, send
    one more header byte every ``drip`` seconds and never finish the head (slowloris); without, send nothing.
    ``keep_alive``: first make one whole request and read its answer, then drip the next head (the time to
    the server's close is counted from then)."""
    while time.monotonic() < stop_at:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), 5)
        except (OSError, asyncio.TimeoutError):
            stats["connect_failed"] += 1
            await asyncio.sleep(0.5)
            continue
        stats["opened"] += 1
        opened = time.monotonic()
        try:
            if keep_alive:
                writer.write(SCRAPE)
                try:
                    await asyncio.wait_for(read_response(reader), 10)
                except (asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
                    stats["first_request_failed"] += 1
                    continue
                stats["first_request_served"] += 1
                opened = time.monotonic()
            if drip is not None:
                writer.write(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
            while (left := stop_at - time.monotonic()) > 0:
                if drip is not None:
                    writer.write(b"a")
                    await writer.drain()
                try:
                    data = await asyncio.wait_for(reader.read(1024), min(left, drip or left))
                except asyncio.TimeoutError:
                    continue
                if data:
                    stats["answered"] += 1  # e.g. 408/431; the server closes right after
                    await reader.read()
                closed.append(time.monotonic() - opened)
                stats["closed_by_server"] += 1
                break
        except (OSError, asyncio.IncompleteReadError):
            closed.append(time.monotonic() - opened)
            stats["closed_by_server"] += 1
        finally:
            writer.close()


async def hold_connections(
    port: int, conns: int, seconds: float, *, drip: float | None, probe_interval: float = 0.1,
    keep_alive: bool = False,
) -> dict[str, Any]:
    """``conns`` idle (``drip`` None) or slowloris connections for ``seconds``, and a probe scraper; with
    ``keep_alive`` each slowloris first makes one whole request on its connection."""
    stop_at = time.monotonic() + seconds
    closed: list[float] = []
    stats: Counter[str] = Counter()
    tasks = [asyncio.create_task(_hold(port, stop_at, drip, closed, stats, keep_alive=keep_alive))
             for _ in range(conns)]
    await asyncio.sleep(min(1.0, seconds / 4))  # let them connect first
    probe_proc = Probe(port, stop_at - time.monotonic(), probe_interval)
    await asyncio.gather(*tasks)
    probe = await probe_proc.result()
    return {
        "connections": conns, **dict(stats), "probe": probe.summary(),
        "closed_after_s_p50": round(percentile(closed, 50), 2) if closed else None,
    }


# name, raw request, acceptable statuses (None: the server may just close the connection)
ABUSE: tuple[tuple[str, bytes, tuple[int, ...]], ...] = (
    ("unknown path", b"GET /../../etc/passwd HTTP/1.1\r\n\r\n", (404,)),
    ("unknown path, long", b"GET /" + b"a" * 4000 + b" HTTP/1.1\r\n\r\n", (404,)),
    ("request line 64 KiB", b"GET /" + b"a" * 65536 + b" HTTP/1.1\r\n\r\n", (414, 431)),
    ("header block 64 KiB", b"GET / HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 65536 + b"\r\n\r\n", (431,)),
    ("10000 tiny headers", b"GET / HTTP/1.1\r\n" + b"A: b\r\n" * 10000 + b"\r\n", (431,)),
    ("garbage bytes", bytes(range(256)) * 4 + b"\r\n\r\n", (400,)),
    ("NUL in request line", b"GET /\x00 HTTP/1.1\r\n\r\n", (400, 404)),
    ("no version", b"GET /metrics\r\n\r\n", (400,)),
    ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", (505, 400)),
    ("HTTP/0.9-ish", b"GET /\r\n\r\n", (400,)),
    ("unsupported version", b"GET / HTTP/3.0\r\n\r\n", (505,)),
    ("POST with body", b"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", (413, 405)),
    ("chunked body", b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", (413,)),
    ("huge content-length", b"GET / HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n", (413,)),
    ("method DELETE", b"DELETE /metrics HTTP/1.1\r\n\r\n", (405,)),
    ("header without colon", b"GET / HTTP/1.1\r\nnocolon\r\n\r\n", (400,)),
    ("header name with space", b"GET / HTTP/1.1\r\nBad Name : x\r\n\r\n", (400,)),
    ("bare LF line endings", b"GET / HTTP/1.1\nHost: x\n\n", ()),
    ("bad basic auth", b"GET /metrics HTTP/1.1\r\nAuthorization: Basic !!!\r\n\r\n", (200, 401)),
    ("header injection in path", b"GET /x\rSet-Cookie:a HTTP/1.1\r\n\r\n", (400, 404)),
)


async def abuse(port: int, timeout: float = 15.0) -> list[dict[str, Any]]:
    """Send each hostile request on a fresh connection; record the status (or 'closed')."""
    out = []
    for name, raw, ok in ABUSE:
        got: int | str
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), 5)
            writer.write(raw)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            try:
                got = (await asyncio.wait_for(read_response(reader), timeout))[0]
            except (asyncio.IncompleteReadError, ConnectionError):
                got = "closed"
            except asyncio.TimeoutError:
                got = "timeout"
            writer.close()
        except OSError as e:
            got = f"connect failed: {e}"
        passed = got in ok if ok else got in ("closed", "timeout", 400)
        out.append({"case": name, "status": got, "expected": [str(x) for x in ok] or ["closed/timeout"], "ok": passed})
    return out


async def connection_cap(port: int, n: int) -> dict[str, int]:
    """Open ``n`` connections at once; count those the server closes at once (over --web.max-connections)."""
    conns = []
    refused = 0
    for _ in range(n):
        try:
            conns.append(await asyncio.wait_for(asyncio.open_connection(HOST, port), 5))
        except (OSError, asyncio.TimeoutError):
            refused += 1
    await asyncio.sleep(0.5)
    closed = 0
    for reader, _ in conns:
        with contextlib.suppress(asyncio.TimeoutError):
            if await asyncio.wait_for(reader.read(1), 0.01) == b"":
                closed += 1
    for _, writer in conns:
        writer.close()
    return {"opened": len(conns), "closed_immediately": closed, "connect_failed": refused}


def _slow_wave(port: int, n: int, pipelined: int) -> list[socket.socket]:
    """``n`` connections that pipeline ``pipelined`` scrapes each and never read (a 4 KiB receive window)."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            s.connect((HOST, port))
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.send(SCRAPE * pipelined)
        except OSError:
            s.close()
            continue
        socks.append(s)
    return socks


async def slow_readers(
    port: int, pid: int | None, *, waves: int, per_wave: int, pipelined: int, pause: float,
    probe_interval: float = 0.2,
) -> dict[str, Any]:
    """Waves of connections that pipeline scrapes and never read, all held open, and a probe scraper; the
    daemon's open descriptors sampled meanwhile (run the daemon under ``prlimit --nofile=256:256``)."""
    probe_proc = Probe(port, waves * pause + 1.0, probe_interval)
    held: list[socket.socket] = []
    fds: list[float] = []
    try:
        for _ in range(waves):
            held += _slow_wave(port, per_wave, pipelined)
            end = time.monotonic() + pause
            while time.monotonic() < end:
                if pid:
                    fds.append(proc_stats(pid).get("fds", math.nan))
                await asyncio.sleep(0.1)
    finally:
        for s in held:
            s.close()
    probe = await probe_proc.result()
    await asyncio.sleep(1.0)
    return {"waves": waves, "per_wave": per_wave, "pipelined": pipelined, "connections_held": len(held),
            "probe": probe.summary(), "fds_peak": max(fds) if fds else None,
            "fds_after": proc_stats(pid).get("fds") if pid else None}


async def auth_flood(
    port: int, *, clients: int, seconds: float, user: str, password: str, valid_interval: float = 1.0,
) -> dict[str, Any]:
    """``clients`` connections sending random passwords as fast as they are answered, and one valid scraper
    (its own process) every ``valid_interval`` s, started once the flood is on."""
    stop_at = time.monotonic() + seconds
    flood = Latencies()

    async def attacker() -> None:
        while time.monotonic() < stop_at:
            t0 = time.monotonic()
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), 5)
                writer.write(auth_scrape(user, os.urandom(8).hex())[:-2] + b"Connection: close\r\n\r\n")
                status, _, _ = await asyncio.wait_for(read_response(reader), 30)
                flood.status[status] += 1
                flood.ok.append(time.monotonic() - t0)
                writer.close()
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as e:
                flood.errors[type(e).__name__] += 1
                await asyncio.sleep(0.05)

    tasks = [asyncio.create_task(attacker()) for _ in range(clients)]
    await asyncio.sleep(min(2.0, seconds / 10))
    valid = Probe(port, stop_at - time.monotonic(), valid_interval, auth_scrape(user, password))
    await asyncio.gather(*tasks)
    probe = await valid.result()
    ok = probe.status.get(200, 0)
    total = sum(probe.status.values()) + sum(probe.errors.values())
    return {"clients": clients, "flood": flood.summary(), "valid_scraper": probe.summary(),
            "valid_200_ratio": round(ok / total, 4) if total else None}


# ---- the daemon under test ---------------------------------------------------------------------------------

def proc_stats(pid: int) -> dict[str, float]:
    """RSS (MiB), threads, open fds and CPU seconds of ``pid`` from /proc."""
    out: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                out["rss_mib"] = round(int(line.split()[1]) / 1024, 1)
            elif line.startswith("Threads:"):
                out["threads"] = int(line.split()[1])
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        out["cpu_s"] = round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)
    return out


async def fetch(port: int, path: str = "/metrics") -> str:
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(f"GET {path} HTTP/1.1\r\nConnection: close\r\n\r\n".encode())
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return data.decode(errors="replace")


def overruns(body: str) -> float:
    """Sum of gpufeed_sampler_overruns_total over all samplers."""
    return sum(float(m.group(1)) for m in re.finditer(r"^gpufeed_sampler_overruns_total\{[^}]*\} (\S+)$", body, re.M))


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def peer_binary() -> str | None:
    """node_exporter from PATH (Debian's package names it prometheus-node-exporter)."""
    return shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")


def start_daemon(port: int, extra: Sequence[str], *, peer: bool = False, nofile: int | None = None,
                 web_config: Path | None = None) -> subprocess.Popen[bytes]:
    """gpufeed serve (or node_exporter with ``peer``) on 127.0.0.1:``port``, optionally under an fd limit."""
    wc = [f"--web.config.file={web_config}"] if web_config is not None else []
    if peer:
        binary = peer_binary()
        if binary is None:
            raise RuntimeError("node_exporter not found (Debian: apt-get install prometheus-node-exporter)")
        args = [binary, f"--web.listen-address={HOST}:{port}", "--log.level=warn", *wc, *extra]
    else:
        args = [sys.executable, "-m", "exporter", "serve", f"--web.listen-address={HOST}:{port}",
                "--log.level=warn", *wc, *extra]
    if nofile is not None:
        args = ["prlimit", f"--nofile={nofile}:{nofile}", *args]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), 0.5):
            return proc
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("daemon did not start listening")


async def run(port: int, pid: int | None, *, seconds: float, scrapers: int, slow: int, idle: int) -> dict[str, Any]:
    """Every phase in turn, with the daemon's resources and overruns around each."""
    report: dict[str, Any] = {"phases": {}}

    def stats() -> dict[str, float]:
        return proc_stats(pid) if pid else {}

    report["before"] = stats()
    over0 = overruns(await fetch(port))
    base = Latencies()
    await scraper(port, time.monotonic() + min(5.0, seconds), base, interval=0.1)
    report["phases"]["baseline probe"] = base.summary()
    peak: dict[str, float] = {}

    async def sample_peak(stop: asyncio.Event) -> None:
        while not stop.is_set():
            for k, v in stats().items():
                peak[k] = max(peak.get(k, 0.0), v)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)

    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_peak(stop))
    paced = await flood(port, scrapers, seconds, interval=1.0)
    report["phases"][f"{scrapers} scrapers each 1/s x {seconds:g}s"] = paced
    report["phases"][f"{scrapers} scrapers back to back x {seconds:g}s"] = await flood(port, scrapers, seconds)
    report["phases"][f"{slow} slowloris x {seconds:g}s"] = await hold_connections(port, slow, seconds, drip=1.0)
    report["phases"][f"{slow} keep-alive slowloris x {seconds:g}s"] = await hold_connections(
        port, slow, seconds, drip=1.0, keep_alive=True)
    report["phases"][f"{idle} idle x {seconds:g}s"] = await hold_connections(port, idle, seconds, drip=None)
    report["phases"]["abuse"] = await abuse(port)
    report["phases"]["connection cap (+100)"] = await connection_cap(port, 612)
    stop.set()
    await sampler
    await asyncio.sleep(1.0)
    report["peak"] = peak
    report["after"] = stats()
    report["overruns_during_run"] = overruns(await fetch(port)) - over0
    return report


def _htpasswd_config(d: Path, user: str, password: str, cost: int) -> Path:
    import bcrypt

    path = d / "web.yml"
    h = bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode().replace("$2b$", "$2y$", 1)
    path.write_text(f"basic_auth_users:\n  {user}: '{h}'\n")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, help="use a running daemon on 127.0.0.1:PORT instead of starting one")
    p.add_argument("--pid", type=int, help="with --port: the daemon's pid, for memory/thread figures")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--scrapers", type=int, default=200)
    p.add_argument("--slowloris", type=int, default=500)
    p.add_argument("--idle", type=int, default=500)
    p.add_argument("--quick", action="store_true", help="5 s phases")
    p.add_argument("--slow-readers", action="store_true",
                   help="only the slow-reader waves, the daemon under prlimit --nofile=256:256")
    p.add_argument("--auth-flood", action="store_true",
                   help="only the bcrypt flood: basic auth at cost 10, 50 random-password clients, a valid scraper")
    p.add_argument("--peer", choices=("node_exporter",), help="run against node_exporter instead of gpufeed")
    p.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    p.add_argument("serve_args", nargs="*", help="extra flags for the daemon (after --)")
    a = p.parse_args(argv)
    seconds = 5.0 if a.quick else a.seconds
    proc = None
    port, pid = a.port, a.pid
    tmp = Path(tempfile.mkdtemp(prefix="gpufeed-bench-load-"))
    user, password = "prometheus", "correct horse battery staple"
    try:
        if port is None:
            port = free_port()
            proc = start_daemon(
                port, a.serve_args, peer=a.peer is not None, nofile=256 if a.slow_readers else None,
                web_config=_htpasswd_config(tmp, user, password, 10) if a.auth_flood else None)
            pid = proc.pid
        report: dict[str, Any]
        if a.slow_readers:
            report = asyncio.run(slow_readers(port, pid, waves=int(max(8, seconds / 2)), per_wave=40,
                                              pipelined=400, pause=2.0))
        elif a.auth_flood:
            report = asyncio.run(auth_flood(port, clients=50, seconds=seconds, user=user, password=password))
        else:
            report = asyncio.run(run(port, pid, seconds=seconds, scrapers=a.scrapers, slow=a.slowloris,
                                     idle=a.idle))
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    report["daemon"] = a.peer or "gpufeed"
    report["cpu_count"] = os.cpu_count()
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if a.json:
        Path(a.json).write_text(text)
    if "phases" not in report:
        return 0
    failed = [c["case"] for c in report["phases"]["abuse"] if not c["ok"]]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

