"""The attack, side by side: the same phases against ``gpufeed serve --simulate launch_bound`` and node_exporter.

What docs/reliability.md's side-by-side table is measured with. Every phase runs against gpufeed, then at once
against node_exporter (Debian: ``apt-get install prometheus-node-exporter``, run with defaults and
``--web.listen-address=127.0.0.1:<port>``), so the two meet the same machine load:

    baseline            the probe alone
    scrapers            200 back-to-back keep-alive scrapers
    slowloris           500 connections dripping a header byte a second, reconnecting when cut
    burst               5000 connections opened at once, each sends one scrape
    held                5000 connections opened and held silent, then each sends one scrape
    slow_readers        60 connections that pipeline 64 scrapes each and never read
    bcrypt              TLS + basic auth (bcrypt cost 10): 50 clients sending random passwords; the probe
                        scrapes with the valid password
    empty_config        an empty --web.config.file at start: does it listen, and in plain HTTP?
    truncated_reload    TLS + auth running, then the file cut to nothing, then to its TLS section only:
                        what a client without a password, and one over plain HTTP, gets after each

For each: the probe (one keep-alive gzip scraper every 100 ms in its own process) p50 / p99 / max and errors;
the daemon's RSS at the start and peak, CPU (utime + stime over the phase, 100 % = one core) and open
descriptors peak, sampled every 0.25 s from /proc by a thread; and what the load itself met.

All traffic goes to 127.0.0.1. Every loop is bounded in count and in time, the run stops by itself, and both
daemons are killed at the end whatever happens.

    python -m bench.attack --seconds 15 --json out.json         # every phase, both daemons
    python -m bench.attack --seconds 2 --phases baseline,burst  # a tiny run (tests/bench/test_attack.py)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import platform
import resource
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.load import (  # _slow_wave: the same slow readers as bench.load's waves
    HOST,
    SCRAPE,
    Latencies,
    _slow_wave,
    auth_scrape,
    flood,
    free_port,
    hold_connections,
    peer_binary,
    proc_stats,
    read_response,
    scraper,
)

PHASES = ("baseline", "scrapers", "slowloris", "burst", "held", "slow_readers", "bcrypt", "empty_config",
          "truncated_reload")
USER, PASSWORD = "prometheus", "correct horse battery staple"
PROBE_INTERVAL = 0.1
HARD_STOP_S = 900.0  # the whole run, whatever --seconds says


def _client_tls() -> ssl.SSLContext:
    """The self-signed test certificate is not verified: what is measured is the server, not the PKI."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _probe_child(port: int, seconds: float, request: bytes, tls: bool, conn: Any) -> None:
    out = Latencies()
    error_at: list[float] = []
    asyncio.run(scraper(port, time.monotonic() + seconds, out, interval=PROBE_INTERVAL, request=request,
                        tls=_client_tls() if tls else None, error_at=error_at))
    conn.send((out.ok, dict(out.status), dict(out.errors), error_at))
    conn.close()


class Probe:
    """The well-behaved scraper in its own process, so the attackers' client work does not slow it."""

    def __init__(self, port: int, seconds: float, *, request: bytes = SCRAPE, tls: bool = False) -> None:
        ctx = multiprocessing.get_context("fork")
        self.recv, send = ctx.Pipe(duplex=False)
        self.seconds = seconds
        self.proc = ctx.Process(target=_probe_child, args=(port, seconds, request, tls, send), daemon=True)
        self.proc.start()
        send.close()

    def result(self) -> dict[str, Any]:
        """The probe's summary: p50/p99/max of its 200s, and errors = every request that did not get 200."""
        got = self.recv.recv() if self.recv.poll(self.seconds + 30) else ([], {}, {"probe_lost": 1}, [])
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
        ok, status, errors, error_at = got
        summary = Latencies(ok=ok, status=Counter(status), errors=Counter(errors)).summary()
        total = summary["requests"] + sum(errors.values())
        summary["total"] = total
        summary["failed"] = total - status.get(200, 0)
        summary["errors_sent_at_s"] = error_at[:20]  # the first 20 (a timeout at 0 s: the first request)
        return summary


class Resources:
    """The daemon's RSS, CPU and descriptors over a phase: a thread reading /proc every 0.25 s (a thread, so a
    busy event loop in this process does not thin the samples)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start = proc_stats(pid)
        self.t0 = time.monotonic()
        self.peak: dict[str, float] = dict(self.start)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            for k, v in proc_stats(self.pid).items():
                self.peak[k] = max(self.peak.get(k, 0.0), v)

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join(2)
        end = proc_stats(self.pid)
        wall = time.monotonic() - self.t0
        cpu = end.get("cpu_s", math.nan) - self.start.get("cpu_s", math.nan)
        return {"rss_start_mib": self.start.get("rss_mib"), "rss_peak_mib": self.peak.get("rss_mib"),
                "cpu_pct": round(100 * cpu / wall, 1) if wall > 0 else None, "fds_peak": self.peak.get("fds"),
                "wall_s": round(wall, 1)}


# ---- the load of each phase ---------------------------------------------------------------------------------

async def _open_many(port: int, n: int, timeout: float) -> tuple[list[tuple[asyncio.StreamReader,
                                                                               asyncio.StreamWriter]], Counter[str]]:
    """``n`` connections opened at once (each within ``timeout``)."""
    stats: Counter[str] = Counter()

    async def one() -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        try:
            return await asyncio.wait_for(asyncio.open_connection(HOST, port), timeout)
        except (OSError, asyncio.TimeoutError) as e:
            stats[f"connect_{type(e).__name__}"] += 1
            return None

    got = await asyncio.gather(*(one() for _ in range(n)))
    return [c for c in got if c is not None], stats


async def _one_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout: float,
                       outcome: Counter[str]) -> None:
    """Send one scrape on an open connection; count its status, or how the connection ended."""
    try:
        writer.write(SCRAPE[:-2] + b"Connection: close\r\n\r\n")
        await writer.drain()
        status, _, _ = await asyncio.wait_for(read_response(reader), timeout)
        outcome[str(status)] += 1
    except (asyncio.IncompleteReadError, ConnectionError):
        outcome["closed"] += 1
    except asyncio.TimeoutError:
        outcome["timeout"] += 1
    except (OSError, ValueError) as e:
        outcome[type(e).__name__] += 1
    finally:
        writer.close()


async def burst(port: int, n: int, timeout: float) -> dict[str, Any]:
    """``n`` connections at once, each sends a scrape; the statuses, closes and how long it took."""
    t0 = time.monotonic()
    conns, stats = await _open_many(port, n, timeout)
    outcome: Counter[str] = Counter(stats)
    await asyncio.gather(*(_one_request(r, w, timeout, outcome) for r, w in conns))
    return {"connections": n, "outcome": dict(outcome), "took_s": round(time.monotonic() - t0, 1)}


async def held(port: int, n: int, hold_s: float, timeout: float) -> dict[str, Any]:
    """``n`` connections opened at once and each held silent for ``hold_s`` from its own connect; how many the
    server closed meanwhile, and how long after their connect; then a scrape on each that is still open."""
    stats: Counter[str] = Counter()
    closed_after: list[float] = []
    closed_at: list[float] = []  # from the phase's start: this client's connect stamps run late when its loop is busy
    t0 = time.monotonic()
    still: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def one() -> None:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), timeout)
        except (OSError, asyncio.TimeoutError) as e:
            stats[f"connect_{type(e).__name__}"] += 1
            return
        opened = time.monotonic()
        with contextlib.suppress(asyncio.TimeoutError, OSError):
            if await asyncio.wait_for(reader.read(1), hold_s) == b"":
                closed_after.append(time.monotonic() - opened)
                closed_at.append(time.monotonic() - t0)
                writer.close()
                return
        still.append((reader, writer))

    await asyncio.gather(*(one() for _ in range(n)))
    outcome: Counter[str] = Counter(stats)
    await asyncio.gather(*(_one_request(r, w, timeout, outcome) for r, w in still))
    early = [t for t in closed_after if t < 1.0]
    later = [t for t in closed_after if t >= 1.0]
    return {"connections": n, "hold_s": hold_s, "closed_while_held": len(closed_after),
            "closed_within_1s": len(early),
            "closed_later_s_min_max": [round(min(later), 2), round(max(later), 2)] if later else None,
            "closed_since_start_s_max": round(max(closed_at), 2) if closed_at else None,
            "then_a_request": dict(outcome)}


async def slow_readers(port: int, n: int, pipelined: int, seconds: float) -> dict[str, Any]:
    """``n`` connections that pipeline ``pipelined`` scrapes each with a 4 KiB receive window and never read."""
    socks = _slow_wave(port, n, pipelined)
    try:
        await asyncio.sleep(seconds)
        closed = 0
        for s in socks:
            with contextlib.suppress(BlockingIOError, OSError):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
                if s.recv(1 << 16, socket.MSG_PEEK) == b"":
                    closed += 1
    finally:
        for s in socks:
            s.close()
    return {"connections": n, "pipelined": pipelined, "held": len(socks), "closed_by_server": closed}


async def bcrypt_flood(port: int, clients: int, seconds: float) -> dict[str, Any]:
    """``clients`` TLS connections, each sending random passwords (Connection: close) as fast as answered."""
    stop_at = time.monotonic() + seconds
    out = Latencies()
    ctx = _client_tls()

    async def attacker() -> None:
        while time.monotonic() < stop_at:
            t0 = time.monotonic()
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port, ssl=ctx), 5)
                try:
                    writer.write(auth_scrape(USER, os.urandom(8).hex())[:-2] + b"Connection: close\r\n\r\n")
                    left = max(0.5, stop_at - time.monotonic() + 5)
                    status, _, _ = await asyncio.wait_for(read_response(reader), left)
                    out.status[status] += 1
                    out.ok.append(time.monotonic() - t0)
                finally:
                    writer.close()
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as e:
                out.errors[type(e).__name__] += 1
                await asyncio.sleep(0.05)

    await asyncio.gather(*(attacker() for _ in range(clients)))
    s = out.summary()  # here "ok" holds every answered request's time, whatever its status
    return {"clients": clients, "answered": s["status"], "errors": s["errors"],
            "answer_p50_ms": s["p50_ms"], "answer_max_ms": s["max_ms"]}


# ---- the daemons -------------------------------------------------------------------------------------------

@dataclass
class Target:
    """How to start one of the two daemons."""

    name: str
    argv: Callable[[int, Path | None], list[str]]


def gpufeed_argv(port: int, web_config: Path | None) -> list[str]:
    wc = [f"--web.config.file={web_config}"] if web_config else []
    return [sys.executable, "-m", "exporter", "serve", "--simulate", "launch_bound",
            f"--web.listen-address={HOST}:{port}", "--log.level=warn", *wc]


def node_exporter_argv(port: int, web_config: Path | None) -> list[str]:
    binary = peer_binary()
    assert binary is not None
    wc = [f"--web.config.file={web_config}"] if web_config else []
    return [binary, f"--web.listen-address={HOST}:{port}", "--log.level=warn", *wc]


class Daemon:
    """One daemon on a fresh port; killed (TERM, then KILL after 5 s) by :meth:`close`."""

    def __init__(self, target: Target, web_config: Path | None = None) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(target.argv(self.port, web_config), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        self.listening = False
        deadline = time.monotonic() + 30.0  # until it listens or exits
        while time.monotonic() < deadline and self.proc.poll() is None:
            with contextlib.suppress(OSError), socket.create_connection((HOST, self.port), 0.5):
                self.listening = True
                break
            time.sleep(0.1)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)  # gpufeed's simulator children too
                self.proc.wait(5)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)


def _tls_auth_config(d: Path) -> tuple[Path, str]:
    """A self-signed certificate (openssl CLI), a bcrypt (cost 10) user, and the exporter-toolkit web config."""
    import bcrypt

    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", "key.pem", "-out", "cert.pem", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"],
                   cwd=d, check=True, capture_output=True, timeout=30)
    h = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode().replace("$2b$", "$2y$", 1)
    tls = "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n"
    text = f"{tls}basic_auth_users:\n  {USER}: '{h}'\n"
    path = d / "web.yml"
    path.write_text(text)
    return path, tls


async def _one_get(port: int, *, tls: bool, password: str | None, timeout: float = 5.0) -> str:
    """One fresh-connection GET /metrics: its status, or how it failed."""
    request = auth_scrape(USER, password) if password is not None else SCRAPE
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(HOST, port, ssl=_client_tls() if tls else None), timeout)
    except (OSError, asyncio.TimeoutError) as e:
        return type(e).__name__
    try:
        writer.write(request[:-2] + b"Connection: close\r\n\r\n")
        return str((await asyncio.wait_for(read_response(reader), timeout))[0])
    except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as e:
        return type(e).__name__
    finally:
        writer.close()


async def _access(port: int) -> dict[str, str]:
    """What three clients get: TLS with the password, TLS without one, plain HTTP without one."""
    return {"tls_with_password": await _one_get(port, tls=True, password=PASSWORD),
            "tls_no_password": await _one_get(port, tls=True, password=None),
            "plain_http": await _one_get(port, tls=False, password=None)}


# ---- the run -----------------------------------------------------------------------------------------------

def _measured(daemon: Daemon, seconds: float, load: Callable[[], Any], *, probe_tls: bool = False,
              probe_request: bytes = SCRAPE, settle: float = 0.0) -> dict[str, Any]:
    """Run ``load`` (a coroutine factory) with the probe and the resource sampler around it."""
    res = Resources(daemon.proc.pid)

    async def go() -> Any:
        task = asyncio.create_task(load())
        if settle:
            await asyncio.sleep(settle)  # let the attackers connect before the probe starts
        probe = Probe(daemon.port, seconds, request=probe_request, tls=probe_tls)
        out = await task
        return out, await asyncio.get_running_loop().run_in_executor(None, probe.result)

    outcome, probe = asyncio.run(go())
    return {"probe": probe, "resources": res.stop(), "load": outcome}


def _phase(name: str, daemon: Daemon, seconds: float, small: bool) -> dict[str, Any]:
    """One phase against a running daemon (the plain ones)."""
    n_conn = 200 if small else 5000
    if name == "baseline":
        return _measured(daemon, seconds, lambda: asyncio.sleep(seconds))
    if name == "scrapers":
        async def scrapers() -> dict[str, Any]:
            got = await flood(daemon.port, 20 if small else 200, seconds, probe_interval=10.0)
            return {"load": got["load"], "load_rps": got["load_rps"]}
        return _measured(daemon, seconds, scrapers)
    if name == "slowloris":
        async def slow() -> dict[str, Any]:
            got = await hold_connections(daemon.port, 50 if small else 500, seconds, drip=1.0,
                                         probe_interval=10.0)
            got.pop("probe", None)  # hold_connections' own probe is sparse: ours is the one reported
            return got
        return _measured(daemon, seconds, slow, settle=min(1.0, seconds / 4))
    if name == "burst":
        return _measured(daemon, seconds, lambda: burst(daemon.port, n_conn, 10.0))
    if name == "held":
        return _measured(daemon, seconds, lambda: held(daemon.port, n_conn, seconds, 10.0))
    if name == "slow_readers":
        return _measured(daemon, seconds, lambda: slow_readers(daemon.port, 60, 64, seconds))
    raise ValueError(name)


def run(targets: Sequence[Target], phases: Sequence[str], seconds: float, small: bool) -> dict[str, Any]:
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()), "seconds": seconds, "small": small,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "loadavg_start": list(os.getloadavg()), "nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE))},
        "targets": [t.name for t in targets], "phases": {},
    }
    tmp = Path(tempfile.mkdtemp(prefix="gpufeed-bench-attack-"))
    daemons: list[Daemon] = []
    try:
        plain = [p for p in phases if p in PHASES[:6]]
        running = {}
        if plain:
            for t in targets:
                d = Daemon(t)
                daemons.append(d)
                if not d.listening:
                    raise RuntimeError(f"{t.name} did not start listening")
                running[t.name] = d
            time.sleep(2.0)  # first samples, first renders
        for p in phases:
            report["phases"][p] = {}
            for t in targets:
                if p in plain:
                    report["phases"][p][t.name] = _phase(p, running[t.name], seconds, small)
                else:
                    report["phases"][p][t.name] = _config_phase(p, t, tmp, seconds, small=small, daemons=daemons)
        report["machine"]["loadavg_end"] = list(os.getloadavg())
    finally:
        for d in daemons:
            d.close()
        shutil.rmtree(tmp, ignore_errors=True)
    report["daemon_pids"] = [d.proc.pid for d in daemons]  # all gone by now (the smoke test checks)
    return report


def _config_phase(name: str, target: Target, tmp: Path, seconds: float, *, small: bool,
                  daemons: list[Daemon]) -> dict[str, Any]:
    """The phases that need their own daemon with a web config."""
    d = tmp / f"{target.name}-{name}"
    d.mkdir()
    if name == "empty_config":
        path = d / "web.yml"
        path.write_text("")
        daemon = Daemon(target, path)  # until it listens or exits
        daemons.append(daemon)
        try:
            return {"exit_code": daemon.proc.poll(), "listening": daemon.listening,
                    "plain_http": asyncio.run(_one_get(daemon.port, tls=False, password=None))
                    if daemon.listening else None}
        finally:
            daemon.close()
    path, tls_only = _tls_auth_config(d)
    daemon = Daemon(target, path)
    daemons.append(daemon)
    try:
        if not daemon.listening:
            raise RuntimeError(f"{target.name} did not start with TLS and auth")
        if name == "bcrypt":
            return _measured(daemon, seconds, lambda: bcrypt_flood(daemon.port, 10 if small else 50, seconds),
                             probe_tls=True, probe_request=auth_scrape(USER, PASSWORD), settle=1.0)
        if name == "truncated_reload":
            out: dict[str, Any] = {"before": asyncio.run(_access(daemon.port))}
            for step, text in (("cut_to_nothing", ""), ("cut_to_tls_section", tls_only)):
                with path.open("w") as f:  # truncated in place, as an interrupted write leaves it
                    f.write(text)
                time.sleep(4.0)  # gpufeed polls the file every 3 s; node_exporter reads it per connection
                out[step] = asyncio.run(_access(daemon.port))
                if target.name == "gpufeed":
                    out[step]["last_reload_successful"] = asyncio.run(_reload_gauge(daemon.port))
            return out
        raise ValueError(name)
    finally:
        daemon.close()


async def _reload_gauge(port: int) -> float | None:
    """gpufeed_web_config_last_reload_successful, read with the password over TLS."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port, ssl=_client_tls()), 5)
    except (OSError, asyncio.TimeoutError):
        return None
    try:
        writer.write(auth_scrape(USER, PASSWORD).replace(b"Accept-Encoding: gzip\r\n", b"")[:-2]
                     + b"Connection: close\r\n\r\n")
        data = await asyncio.wait_for(reader.read(), 10)
    except (OSError, asyncio.TimeoutError):
        return None
    finally:
        writer.close()
    for line in data.decode(errors="replace").splitlines():
        if line.startswith("gpufeed_web_config_last_reload_successful "):
            return float(line.split()[1])
    return None


def _raise_nofile() -> None:
    """5000 client connections need 5000 descriptors here: the soft limit up to the hard one."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=15.0, help="length of each timed phase (default 15)")
    p.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated, from: {', '.join(PHASES)}")
    p.add_argument("--small", action="store_true",
                   help="a tenth of the clients (200 connections instead of 5000): the smoke test's mode")
    p.add_argument("--gpufeed-only", action="store_true", help="skip node_exporter even when installed")
    p.add_argument("--json", metavar="FILE", help="also write the report here")
    a = p.parse_args(argv)
    phases = [x for x in a.phases.split(",") if x]
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        p.error(f"unknown phases: {', '.join(unknown)}")
    if not 0.5 <= a.seconds <= 120:
        p.error("--seconds: 0.5 to 120")
    _raise_nofile()
    need = 10_300 if not a.small else 600  # 5000 clients + the peer's 5000 sockets, when both run here
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < need // 2:
        p.error(f"the descriptor limit ({resource.getrlimit(resource.RLIMIT_NOFILE)[0]}) is below {need // 2}:"
                " use --small")
    targets = [Target("gpufeed", gpufeed_argv)]
    if not a.gpufeed_only and peer_binary() is not None:
        targets.append(Target("node_exporter", node_exporter_argv))
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError("bench.attack: hard stop")))
    signal.alarm(int(HARD_STOP_S))
    try:
        report = run(targets, phases, a.seconds, a.small)
    finally:
        signal.alarm(0)
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if a.json:
        Path(a.json).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
