"""A small, bounded HTTP/1.1 server on asyncio: /metrics, /healthz, /runbooks and a landing page.

Bounded like node_exporter's web server, and tighter where an attack found it lacking:

- ``--web.max-requests`` requests served at once (excess: 503). A slot covers the serving work only: a
  request waiting for bcrypt (basic auth) or for a render (a stale payload, exporter/pacing.py) or a
  response waiting for a slow reader to drain holds none, so none of them can lock valid scrapers out.
- ``--web.max-connections`` open connections, counted from ``accept()`` until the socket is really closed
  (not until the handler returns: a closed transport holding unsent data keeps its socket), and never more
  than the file-descriptor limit allows (the soft ``RLIMIT_NOFILE`` is raised to the hard one at start, as Go
  does for node_exporter). The limit is one budget for every kind of descriptor (exporter/sources.py
  ``fd_budget``): ``FD_RESERVE`` for collectors' reads, NVML device files and logs, then the connections, and
  what is left for the collectors' kept descriptors, which give way first; the cap is lowered only when the
  reserve alone leaves fewer than configured.
- The listener's ``accept()`` is ours, not asyncio's: over the cap a connection is closed before a transport
  exists, and a transient ``EMFILE`` pauses accepting for a second with one log line (asyncio's accept loop
  logs a traceback per attempt and re-arms itself per attempt: 126 MB of log in 30 s).
- A request head has ``--web.read-timeout`` from its first byte (a keep-alive connection may idle up to
  ``--web.idle-timeout`` *before* that byte, not while dripping a head); 16 KiB head, no bodies.
- A response the peer does not read within ``--web.read-timeout`` is aborted (RST), freeing the socket at
  once; a graceful close would keep it open as long as the peer keeps not reading.
- On stop, requests being answered get ``DRAIN_GRACE`` seconds to finish; idle connections close at once.

Scrapes only copy pre-rendered bytes (a scrape that finds the payload stale first waits, at most
``RENDER_WAIT`` s, for the render it asked for: exporter/pacing.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import errno
import resource
import socket
import ssl
import sys
import threading
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from html import escape
from typing import Any, Protocol

from exporter import __version__, log, runbooks
from exporter.exposition import Renderer
from exporter.sources import BUDGET as KEPT_BUDGET
from exporter.sources import FD_RESERVE, fd_budget

_log = log.get_logger(component="web")

MAX_HEADER_BYTES = 16 * 1024
REASONS = {
    200: "OK", 202: "Accepted", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
    408: "Request Timeout", 409: "Conflict", 413: "Payload Too Large", 414: "URI Too Long", 429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable", 505: "HTTP Version Not Supported",
}
BACKLOG = 1024
ACCEPT_BATCH = 64  # connections accepted per wake-up of the listener, so one flood cannot hog the loop
ACCEPT_PAUSE = 1.0  # seconds accepting stops after EMFILE/ENFILE/ENOBUFS/ENOMEM (the backlog keeps the rest)
DRAIN_GRACE = 1.0  # seconds in-flight responses get at stop
RENDER_WAIT = 1.0  # seconds a scrape that found the payload stale waits for its render (then: what there is)
_RESOURCE_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class Auth(enum.Enum):
    """The outcome of basic auth for one request."""

    OK = "ok"
    DENIED = "denied"  # 401
    BUSY = "busy"  # not cached, and pushed out of the full bcrypt queue by newer checks: 503, try again


class AccessPolicy(Protocol):
    """What ``--web.config.file`` decides (see exporter.webconfig.WebConfigManager); asked per connection or
    request, so a reloaded config applies to new connections without restarting the listener."""

    def ssl_context(self) -> ssl.SSLContext | None:
        """TLS context for a new connection; None for plain HTTP."""

    def peer_allowed(self, peercert: Mapping[str, Any] | None) -> bool:
        """Whether a verified client certificate is acceptable (client_allowed_sans)."""

    def headers(self) -> Mapping[str, str]:
        """Extra headers for every response."""

    def allow(self) -> bool:
        """Rate limit: False answers 429."""

    async def authorize(self, headers: Mapping[str, str]) -> Auth:
        """Basic auth: DENIED answers 401, BUSY 503."""


@dataclass
class WebSettings:
    """Listener settings (flags ``--web.*``)."""

    host: str = ""
    port: int = 9842
    telemetry_path: str = "/metrics"
    max_requests: int = 40
    max_connections: int = 512
    read_timeout: float = 10.0
    idle_timeout: float = 60.0
    also: tuple[tuple[str, int], ...] = ()  # further (host, port) listeners: --web.listen-address repeated


@dataclass
class Request:
    """A parsed request head."""

    method: str
    path: str
    version: str
    headers: dict[str, str]
    query: str = ""


# A further path served behind the same TLS, auth and rate limit as the telemetry path (POST /capture, GET
# /captures: exporter/capture/http.py): (method, query string) -> (status, body, content type). GET, HEAD and
# POST reach it; it must answer at once (nothing here waits for it).
Route = Callable[[str, str], tuple[int, bytes, str]]


class _BadRequestError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class _Protocol(asyncio.StreamReaderProtocol):
    """A stream protocol that counts its connection until the socket is gone and, for a TLS connection, stops
    reading the socket before any byte arrives.

    The listener is plain TCP and TLS starts per connection. If the protocol read the ClientHello into the
    plain-text stream buffer before ``start_tls`` took over, the handshake would wait forever for bytes it
    already lost (a race seen as ~1 in 3 handshakes hanging). Paused, the bytes stay in the kernel until
    the TLS protocol resumes reading.
    """

    def __init__(self, reader: asyncio.StreamReader, cb: Any, *, pause: bool, server: WebServer) -> None:
        super().__init__(reader, cb)
        self._pause = pause
        self._server = server
        self._counted = True  # counted at accept(); released once, when the connection is lost

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._pause and isinstance(transport, asyncio.ReadTransport):
            transport.pause_reading()
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._counted:
            self._counted = False
            self._server._open -= 1
        super().connection_lost(exc)


async def _within(aw: Coroutine[Any, Any, bytes], timeout: float) -> bytes:
    """``wait_for`` without its extra task per call (3.11+: asyncio.timeout); TimeoutError when late.

    Every request head is read through this: at hundreds of connections the per-call task of wait_for was
    a measurable share of the loop's time when they all time out or reconnect at once.
    """
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout):
            return await aw
    return await asyncio.wait_for(aw, timeout)  # pragma: no cover - Python 3.10


async def _head_bytes(reader: asyncio.StreamReader, timeout: float, idle: float | None, first: list[bytes]) -> bytes:
    """A request head: up to ``idle`` s for its first byte (when given), then ``timeout`` s for the rest -- or
    ``timeout`` s for all of it. One timer per head (3.11+: rescheduled after the first byte), as before the
    keep-alive rule existed: the per-request cost of a back-to-back scraper does not grow."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout if idle is None else idle) as cm:
            if idle is not None:
                first.append(await reader.readexactly(1))
                cm.reschedule(asyncio.get_running_loop().time() + timeout)
            return b"".join(first) + await reader.readuntil(b"\r\n\r\n")
    if idle is not None:  # pragma: no cover - Python 3.10
        first.append(await _within(reader.readexactly(1), idle))
    return b"".join(first) + await _within(reader.readuntil(b"\r\n\r\n"), timeout)  # pragma: no cover


def parse_address(addr: str) -> tuple[str, int]:
    """``host:port``, ``:port`` or ``[v6]:port`` -> (host, port); ValueError with a reason otherwise."""
    if addr.startswith("["):
        host, sep, port = addr[1:].partition("]:")
        if not sep:
            raise ValueError(f"bad listen address {addr!r}: expected [host]:port")
    else:
        host, sep, port = addr.rpartition(":")
        if not sep:
            raise ValueError(f"bad listen address {addr!r}: expected host:port or :port")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"bad listen address {addr!r}: port must be 0-65535")
    return host, int(port)


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (what the Go runtime does at start since Go 1.19, so
    node_exporter gets it too); the soft limit in force afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft


def _bind(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for ``host:port`` (every address family of an empty host), like asyncio.create_server:
    SO_REUSEADDR, and IPV6_V6ONLY on IPv6 so the IPv4 socket can bind the same port."""
    infos: list[Any] = socket.getaddrinfo(host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0,
                                          socket.AI_PASSIVE)
    seen: set[tuple[int, Any]] = set()
    out: list[socket.socket] = []
    try:
        for family, kind, proto, _, addr in infos:
            if (family, addr) in seen:
                continue
            seen.add((family, addr))
            sock = socket.socket(family, kind, proto)
            out.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(addr)
            sock.listen(BACKLOG)
            sock.setblocking(False)
            if port == 0:  # the other families take the port the first one got
                port = sock.getsockname()[1]
                infos = [(f, k, p, c, (a[0], port, *a[2:])) for f, k, p, c, a in infos]
    except OSError:
        for sock in out:
            sock.close()
        raise
    return out


class _Listener:
    """One listening socket; accepts in batches on the server's loop (see the module docstring)."""

    def __init__(self, server: WebServer, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        self.server = server
        self.sock = sock
        self.loop = loop
        self.paused = False

    def start(self) -> None:
        self.loop.add_reader(self.sock.fileno(), self._accept)

    def close(self) -> None:
        with contextlib.suppress(ValueError, OSError):
            self.loop.remove_reader(self.sock.fileno())
        self.sock.close()

    def _resume(self) -> None:
        self.paused = False
        if self.sock.fileno() >= 0:
            self.start()

    def _accept(self) -> None:
        srv = self.server
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as e:
                srv.accept_errors += 1
                if srv.accept_errors % 1000 == 1:
                    _log.error("accept_failed", error=e.strerror or repr(e), errno=e.errno, open=srv._open,
                               note=f"accepting paused {ACCEPT_PAUSE:g} s" if e.errno in _RESOURCE_ERRNOS else "")
                if e.errno in _RESOURCE_ERRNOS and not self.paused:
                    self.paused = True
                    self.loop.remove_reader(self.sock.fileno())
                    self.loop.call_later(ACCEPT_PAUSE, self._resume)
                return
            if srv._open >= srv.max_connections or srv._stopping:
                srv.connections_refused += 1
                if srv.connections_refused % 1000 == 1:
                    _log.warning("connection_limit_reached", max_connections=srv.max_connections)
                conn.close()
                continue
            srv._open += 1
            conn.setblocking(False)
            self.loop.create_task(srv._adopt(conn))


class WebServer:
    """Serves the renderer's cached payloads."""

    def __init__(
        self,
        renderer: Renderer,
        settings: WebSettings,
        healthy: Callable[[], bool],
        *,
        policy: AccessPolicy | None = None,
        on_scrape: Callable[[str], concurrent.futures.Future[None] | None] | None = None,
        routes: Mapping[str, Route] | None = None,
    ) -> None:
        self.renderer = renderer
        self.routes = dict(routes or {})
        # Told of every scrape of the telemetry path (the scraper: its address and User-Agent); may return a
        # future to wait on -- the payload was stale and a render was asked for (exporter/pacing.py).
        self.on_scrape = on_scrape
        self.settings = settings
        self.healthy = healthy
        self.policy = policy
        self.max_connections = settings.max_connections
        self._listeners: list[_Listener] = []
        self._groups: list[list[_Listener]] = []  # the listeners of each --web.listen-address, in order
        self._active = 0  # requests holding a --web.max-requests slot
        self._open = 0  # connections from accept() until their socket is closed
        self._busy: set[asyncio.Task[None]] = set()  # connections answering a request (drained at stop)
        self._connections: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.requests_served = 0
        self.requests_rejected = 0
        self.connections_refused = 0
        self.tls_handshakes_failed = 0
        self.slow_readers_aborted = 0
        self.accept_errors = 0

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        assert self._listeners
        return int(self._listeners[0].sock.getsockname()[1])

    @property
    def open_connections(self) -> int:
        """Connections accepted and not yet closed."""
        return self._open

    @property
    def ports(self) -> list[int]:
        """The bound port of every listener, in --web.listen-address order."""
        return [int(g[0].sock.getsockname()[1]) for g in self._groups]

    async def start(self) -> None:
        """Bind and start accepting.

        The listener is plain TCP; TLS is started per connection with the policy's *current* context, so
        certificates, client CAs and TLS versions reloaded from --web.config.file apply to new connections.
        """
        ctx = self.policy.ssl_context() if self.policy else None
        nofile = raise_fd_limit()
        kept, usable = fd_budget(nofile, self.settings.max_connections)
        KEPT_BUDGET.set_limit(kept)
        if self.settings.max_connections > usable:
            self.max_connections = usable
            _log.warning("connection_limit_lowered", max_connections=self.settings.max_connections,
                         effective=usable, nofile=nofile, reserve=FD_RESERVE,
                         note="raise the open-files limit (LimitNOFILE=) to allow more")
        loop = asyncio.get_running_loop()
        # One group of sockets per --web.listen-address, all or nothing: a half-bound daemon would look healthy.
        groups: list[list[socket.socket]] = []
        try:
            for host, port in ((self.settings.host, self.settings.port), *self.settings.also):
                groups.append(_bind(host, port))
        except OSError:
            for socks in groups:
                for sock in socks:
                    sock.close()
            raise
        self._groups = [[_Listener(self, sock, loop) for sock in socks] for socks in groups]
        self._listeners = [listener for g in self._groups for listener in g]
        for listener in self._listeners:
            listener.start()
        for (host, _), g in zip(((self.settings.host, self.settings.port), *self.settings.also), self._groups,
                                strict=True):
            _log.info("listening", address=f"{host}:{g[0].sock.getsockname()[1]}", tls=ctx is not None)

    async def start_in_thread(self) -> None:
        """Bind and serve from a dedicated thread with its own event loop.

        The daemon does this so HTTP and sampling never share an event loop: a flood of requests then competes
        with the samplers only for the GIL (handed over every 5 ms), not for the loop that schedules them --
        sharing it, 200 back-to-back scrapers cost a 50 ms sampler about half of its ticks.
        """
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()

        def main() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            loop.set_exception_handler(log.loop_exception_handler)
            self._loop = loop
            try:
                loop.run_until_complete(self.start())
            except BaseException as e:
                ready.set_exception(e)
                loop.close()
                return
            ready.set_result(None)
            try:
                loop.run_forever()
            finally:
                with contextlib.suppress(Exception):
                    loop.run_until_complete(loop.shutdown_default_executor())
                loop.close()

        self._thread = threading.Thread(target=main, name="web", daemon=True)
        self._thread.start()
        await asyncio.wrap_future(ready)

    async def stop_in_thread(self, timeout: float = DRAIN_GRACE + 0.5) -> None:
        """Stop a server started with :meth:`start_in_thread` and join its thread (bounded)."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            await self.stop()
            return
        fut = asyncio.run_coroutine_threadsafe(self.stop(), loop)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.wrap_future(fut), timeout)
        loop.call_soon_threadsafe(loop.stop)
        await asyncio.get_running_loop().run_in_executor(None, thread.join, timeout)
        self._thread = None

    async def stop(self, grace: float = DRAIN_GRACE) -> None:
        """Stop accepting; let requests being answered finish for up to ``grace`` s; close the rest."""
        self._stopping = True
        for listener in self._listeners:
            listener.close()
        for t in list(self._connections - self._busy):  # waiting for a request head: nothing to lose
            t.cancel()
        if self._busy:
            await asyncio.wait(list(self._busy), timeout=grace)
        for t in list(self._connections):
            t.cancel()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=1.0)

    async def _adopt(self, conn: socket.socket) -> None:
        """Make a transport and a handler for an accepted socket (already counted in ``_open``)."""
        ctx = self.policy.ssl_context() if self.policy else None  # this connection's TLS context: the current one
        reader = asyncio.StreamReader(limit=MAX_HEADER_BYTES)

        async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await self._handle(r, w, ctx)

        protocol = _Protocol(reader, handle, pause=ctx is not None, server=self)
        try:
            await asyncio.get_running_loop().connect_accepted_socket(lambda: protocol, conn)
        except Exception as e:  # the peer reset before the transport existed, or the loop is closing
            if protocol._counted:
                protocol._counted = False
                self._open -= 1
            conn.close()
            if not isinstance(e, OSError | asyncio.CancelledError):
                _log.warning("connection_setup_failed", error=repr(e))

    async def _handle(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ctx: ssl.SSLContext | None = None
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            if ctx is not None and not await self._start_tls(writer, ctx):
                return
            await self._serve_connection(reader, writer, task)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError, ssl.SSLError,
                asyncio.TimeoutError):
            pass
        except Exception as e:
            _log.warning("connection_failed", error=repr(e))
        finally:
            self._connections.discard(task)
            self._busy.discard(task)
            transport = writer.transport
            if transport.get_write_buffer_size() > 0:
                transport.abort()  # unsent data would keep the socket open as long as the peer does not read
            else:
                with contextlib.suppress(Exception):
                    writer.close()

    async def _start_tls(self, writer: asyncio.StreamWriter, ctx: ssl.SSLContext) -> bool:
        """Upgrade the connection to TLS; False when the handshake or the peer check failed."""
        if sys.version_info < (3, 11):  # pragma: no cover - StreamWriter.start_tls is 3.11+
            raise RuntimeError("TLS needs Python 3.11 or newer")
        try:
            await asyncio.wait_for(writer.start_tls(ctx), self.settings.read_timeout)
        except (ssl.SSLError, ConnectionError, OSError, asyncio.TimeoutError) as e:
            self.tls_handshakes_failed += 1
            _log.debug("tls_handshake_failed", peer=str(writer.get_extra_info("peername")), error=repr(e))
            return False
        assert self.policy is not None
        if not self.policy.peer_allowed(writer.get_extra_info("peercert")):
            self.tls_handshakes_failed += 1
            _log.debug("tls_client_not_allowed", peer=str(writer.get_extra_info("peername")))
            return False
        return True

    async def _read_head(
        self, reader: asyncio.StreamReader, timeout: float, idle: float | None = None
    ) -> Request | None:
        """The next request head: within ``timeout`` seconds, counted from its first byte when ``idle`` (a
        keep-alive connection's wait for that byte) is given, else from now."""
        first: list[bytes] = []
        try:
            head = await _head_bytes(reader, timeout, idle, first)
        except asyncio.LimitOverrunError as e:
            raise _BadRequestError(431) from e
        except asyncio.IncompleteReadError as e:
            if not (b"".join(first) + e.partial).strip():
                return None
            raise _BadRequestError(400) from e
        except asyncio.TimeoutError:
            return None
        if len(head) > MAX_HEADER_BYTES:
            raise _BadRequestError(431)
        try:
            text = head.decode("latin-1")
        except UnicodeDecodeError as e:  # pragma: no cover - latin-1 decodes every byte
            raise _BadRequestError(400) from e
        lines = text.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            raise _BadRequestError(400)
        method, target, version = parts
        if any(ord(ch) < 0x21 or ord(ch) == 0x7F for ch in target) or not method.isalpha():
            raise _BadRequestError(400)  # control bytes or spaces in the target; RFC 9112 3.2
        if version not in ("HTTP/1.0", "HTTP/1.1"):
            raise _BadRequestError(505)
        if len(target) > 4096:
            raise _BadRequestError(414)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise _BadRequestError(400)
            headers[name.lower()] = value.strip()
        path, _, query = target.partition("?")
        return Request(method=method, path=path, version=version, headers=headers, query=query)

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, task: asyncio.Task[None]
    ) -> None:
        idle: float | None = None  # the first head: read timeout from the accept; later ones: idle, then read
        while not self._stopping:
            try:
                req = await self._read_head(reader, self.settings.read_timeout, idle)
            except _BadRequestError as e:
                self._write(writer, e.status, b"bad request\n", "text/plain; charset=utf-8", close=True)
                await self._drain(writer)
                return
            if req is None:
                return
            idle = self.settings.idle_timeout
            self._busy.add(task)
            keep_alive = await self._answer(req, writer)
            await self._drain(writer)  # holds no request slot: a slow reader delays only itself
            self._busy.discard(task)
            if not keep_alive:
                return

    async def _answer(self, req: Request, writer: asyncio.StreamWriter) -> bool:
        """Write the response to ``req`` into the transport; whether the connection stays open."""
        keep_alive = (req.version == "HTTP/1.1" and req.headers.get("connection", "").lower() != "close"
                      and not self._stopping)
        text = "text/plain; charset=utf-8"
        if req.headers.get("content-length", "0") not in ("", "0") or "transfer-encoding" in req.headers:
            # Nothing here takes a body; refuse instead of reading an attacker-sized one.
            self._write(writer, 413, b"request bodies are not accepted\n", "text/plain", close=True)
            return False
        if req.method not in ("GET", "HEAD") and not (req.method == "POST" and req.path in self.routes):
            self._write(writer, 405, b"method not allowed\n", text, close=not keep_alive,
                        extra={"Allow": "GET, HEAD, POST" if req.path in self.routes else "GET, HEAD"})
            return keep_alive
        policy = self.policy
        # /healthz answers without basic auth and outside the rate limit: container and Kubernetes probes
        # cannot easily send credentials, it tells nothing but "ok", and a probe refused under a flood would
        # restart a healthy daemon. TLS and client certificates still apply to it.
        if policy is not None and req.path != "/healthz":
            # Before any request slot is taken: bcrypt may queue (bounded, see WebConfigManager).
            auth = await policy.authorize(req.headers)
            if auth is Auth.DENIED:
                self._write(writer, 401, b"Unauthorized\n", text, close=not keep_alive,
                            extra={"WWW-Authenticate": 'Basic realm="gpufeed"'})
                return keep_alive
            if auth is Auth.BUSY:
                self.requests_rejected += 1
                self._write(writer, 503, b"authentication busy, retry\n", text, close=not keep_alive,
                            extra={"Retry-After": "1"})
                return keep_alive
            # The rate limit counts authenticated requests only (when auth is on): unauthenticated clients
            # cannot spend the tokens of the scrapers that hold the password.
            if not policy.allow():
                self.requests_rejected += 1
                self._write(writer, 429, b"Too Many Requests\n", text, close=not keep_alive)
                return keep_alive
        if self._active >= self.settings.max_requests:
            self.requests_rejected += 1
            self._write(writer, 503, b"too many concurrent requests\n", text, close=True)
            return False
        if self.on_scrape is not None and req.path == self.settings.telemetry_path:
            # Before a slot is taken: a scrape waiting for a render holds none (200 of them at once must not
            # lock the next scraper out).
            await self._fresh(req, writer)
        self._active += 1
        try:
            self._respond(req, writer, keep_alive)
        finally:
            self._active -= 1
        return keep_alive

    async def _fresh(self, req: Request, writer: asyncio.StreamWriter) -> None:
        """Tell the pacer of this scrape; when it found the payload stale, wait (bounded) for the render."""
        assert self.on_scrape is not None
        peer = writer.get_extra_info("peername")
        host = peer[0] if isinstance(peer, tuple) and peer else str(peer)
        fut = self.on_scrape(f"{host} {req.headers.get('user-agent', '')}")
        if fut is not None:
            with contextlib.suppress(asyncio.TimeoutError, concurrent.futures.CancelledError):
                await asyncio.wait_for(asyncio.wrap_future(fut), RENDER_WAIT)

    def _respond(self, req: Request, writer: asyncio.StreamWriter, keep_alive: bool) -> None:
        head_only = req.method == "HEAD"
        close = not keep_alive
        self.requests_served += 1
        if req.path == self.settings.telemetry_path:
            accept = req.headers.get("accept", "")
            payload = (
                self.renderer.openmetrics() if "application/openmetrics-text" in accept else self.renderer.text()
            )
            gz = "gzip" in req.headers.get("accept-encoding", "")
            body = payload.gz if gz else payload.body
            extra = {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"} if gz else {"Vary": "Accept-Encoding"}
            self._write(writer, 200, body, payload.content_type, close=close, extra=extra, head_only=head_only)
        elif req.path == "/healthz":
            ok = self.healthy()
            self._write(writer, 200 if ok else 503, b"ok\n" if ok else b"samplers not alive\n",
                        "text/plain; charset=utf-8", close=close, head_only=head_only)
        elif req.path == "/":
            self._write(writer, 200, self._landing(), "text/html; charset=utf-8", close=close, head_only=head_only)
        elif req.path == "/runbooks":
            # The alerts' default runbook_url (http://<instance>/runbooks#<alert>): behind the same TLS, auth
            # and rate limit as /metrics.
            page = runbooks.page()
            if page is None:
                self._write(writer, 404, b"this installation ships no runbooks\n", "text/plain; charset=utf-8",
                            close=close, head_only=head_only)
            else:
                self._write(writer, 200, page, "text/html; charset=utf-8", close=close, head_only=head_only,
                            extra={"Content-Security-Policy": runbooks.CSP})
        elif req.path in self.routes:
            status, body, content_type = self.routes[req.path](req.method, req.query)
            self._write(writer, status, body, content_type, close=close, head_only=head_only)
        else:
            self._write(writer, 404, b"not found\n", "text/plain; charset=utf-8", close=close, head_only=head_only)

    def _landing(self) -> bytes:
        path = escape(self.settings.telemetry_path)
        return (
            "<!doctype html><html><head><title>gpufeed</title></head><body>"
            f"<h1>gpufeed {escape(__version__)}</h1>"
            "<p>Is each GPU working, or waiting &mdash; and if waiting, on what?</p>"
            f'<ul><li><a href="{path}">Metrics</a></li><li><a href="/healthz">Health</a></li>'
            '<li><a href="/runbooks">Runbooks</a></li></ul>'
            "</body></html>\n"
        ).encode()

    def _write(
        self,
        writer: asyncio.StreamWriter,
        status: int,
        body: bytes,
        content_type: str,
        *,
        close: bool,
        extra: Mapping[str, str] | None = None,
        head_only: bool = False,
    ) -> None:
        """Hand one response to the transport (never waits; see :meth:`_drain`)."""
        lines = [
            f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}",
            "Connection: close" if close else "Connection: keep-alive",
        ]
        lines += [f"{k}: {v}" for k, v in (extra or {}).items()]
        if self.policy is not None:
            lines += [f"{k}: {v}" for k, v in self.policy.headers().items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if not head_only:
            writer.write(body)

    async def _drain(self, writer: asyncio.StreamWriter) -> None:
        """Wait, at most --web.read-timeout, for the peer to take what was written; abort the connection when it
        does not (a slow or stalled reader), so its socket is closed now, not when the peer gives up.

        Only waits when the socket did not take everything: an unconditional wait yields to the loop, which
        under many fast scrapers kept requests in flight for a whole loop round.
        """
        transport = writer.transport
        if transport.get_write_buffer_size() == 0:
            return
        try:
            await asyncio.wait_for(writer.drain(), self.settings.read_timeout)
        except asyncio.TimeoutError:
            self.slow_readers_aborted += 1
            if self.slow_readers_aborted % 1000 == 1:
                _log.info("slow_reader_aborted", unsent_bytes=transport.get_write_buffer_size(),
                          timeout_s=self.settings.read_timeout)
            transport.abort()
            raise
