"""A small, bounded HTTP/1.1 server on asyncio: /metrics, /healthz and a landing page.

Bounded like node_exporter's web server: a cap on requests served at once (``--web.max-requests``,
excess gets 503), a cap on open connections, header size and read/idle timeouts, so slow or hostile
clients cannot grow memory or threads. Scrapes only copy pre-rendered bytes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ssl
import sys
import threading
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from html import escape
from typing import Any, Protocol

from exporter import __version__, log
from exporter.exposition import Renderer

_log = log.get_logger(component="web")

MAX_HEADER_BYTES = 16 * 1024
REASONS = {
    200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
    408: "Request Timeout", 413: "Payload Too Large", 414: "URI Too Long", 429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable", 505: "HTTP Version Not Supported",
}



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

    async def authorize(self, headers: Mapping[str, str]) -> bool:
        """Basic auth: False answers 401."""


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


class _BadRequestError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class _Protocol(asyncio.StreamReaderProtocol):
    """A stream protocol that, for a TLS connection, stops reading the socket before any byte arrives.

    The listener is plain TCP and TLS starts per connection. If the protocol read the ClientHello into the
    plain-text stream buffer before ``start_tls`` took over, the handshake would wait forever for bytes it
    already lost (a race seen as ~1 in 3 handshakes hanging). Paused, the bytes stay in the kernel until
    the TLS protocol resumes reading.
    """

    def __init__(self, reader: asyncio.StreamReader, cb: Any, *, pause: bool) -> None:
        super().__init__(reader, cb)
        self._pause = pause

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._pause and isinstance(transport, asyncio.ReadTransport):
            transport.pause_reading()
        super().connection_made(transport)


async def _within(aw: Coroutine[Any, Any, bytes], timeout: float) -> bytes:
    """``wait_for`` without its extra task per call (3.11+: asyncio.timeout); TimeoutError when late.

    Every request head is read through this: at hundreds of connections the per-call task of wait_for was
    a measurable share of the loop's time when they all time out or reconnect at once.
    """
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout):
            return await aw
    return await asyncio.wait_for(aw, timeout)  # pragma: no cover - Python 3.10


def _log_once_refused(server: WebServer) -> bool:
    """Log the connection cap at most once per 1000 refusals (a flood must not flood the log)."""
    return server.connections_refused % 1000 == 1


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


class WebServer:
    """Serves the renderer's cached payloads."""

    def __init__(
        self,
        renderer: Renderer,
        settings: WebSettings,
        healthy: Callable[[], bool],
        *,
        policy: AccessPolicy | None = None,
    ) -> None:
        self.renderer = renderer
        self.settings = settings
        self.healthy = healthy
        self.policy = policy
        self._server: asyncio.base_events.Server | None = None
        self._servers: list[asyncio.base_events.Server] = []  # _server first, then one per settings.also
        self._active = 0
        self._connections: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.requests_served = 0
        self.requests_rejected = 0
        self.connections_refused = 0
        self.tls_handshakes_failed = 0

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def ports(self) -> list[int]:
        """The bound port of every listener, in --web.listen-address order."""
        return [int(s.sockets[0].getsockname()[1]) for s in self._servers]

    async def start(self) -> None:
        """Bind and start accepting.

        The listener is plain TCP; TLS is started per connection with the policy's *current* context, so
        certificates, client CAs and TLS versions reloaded from --web.config.file apply to new connections.
        """
        ctx = self.policy.ssl_context() if self.policy else None
        loop = asyncio.get_running_loop()
        try:
            for host, port in ((self.settings.host, self.settings.port), *self.settings.also):
                server = await loop.create_server(
                    self._protocol, host=host or None, port=port, reuse_address=True, backlog=1024,
                )
                self._servers.append(server)
                self._server = self._servers[0]
                _log.info("listening", address=f"{host}:{server.sockets[0].getsockname()[1]}", tls=ctx is not None)
        except OSError:
            for server in self._servers:  # all or nothing: a half-bound daemon would look healthy
                server.close()
            self._servers, self._server = [], None
            raise

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

    async def stop_in_thread(self, timeout: float = 1.5) -> None:
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

    async def stop(self) -> None:
        """Stop accepting and close open connections."""
        for server in self._servers:
            server.close()
        for t in list(self._connections):
            t.cancel()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=1.0)
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)

    def _protocol(self) -> asyncio.StreamReaderProtocol:
        """Called once per accepted connection: fixes that connection's TLS context (the current one)."""
        ctx = self.policy.ssl_context() if self.policy else None
        reader = asyncio.StreamReader(limit=MAX_HEADER_BYTES)

        async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await self._handle(r, w, ctx)

        return _Protocol(reader, handle, pause=ctx is not None)

    async def _handle(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ctx: ssl.SSLContext | None = None
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._connections) >= self.settings.max_connections:
            self.connections_refused += 1
            if _log_once_refused(self):
                _log.warning("connection_limit_reached", max_connections=self.settings.max_connections)
            writer.close()
            return
        self._connections.add(task)
        try:
            if ctx is not None and not await self._start_tls(writer, ctx):
                return
            await self._serve_connection(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError, ssl.SSLError,
                asyncio.TimeoutError):
            pass
        except Exception as e:
            _log.warning("connection_failed", error=repr(e))
        finally:
            self._connections.discard(task)
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

    async def _read_head(self, reader: asyncio.StreamReader, timeout: float) -> Request | None:
        try:
            head = await _within(reader.readuntil(b"\r\n\r\n"), timeout)
        except asyncio.LimitOverrunError as e:
            raise _BadRequestError(431) from e
        except asyncio.IncompleteReadError as e:
            if not e.partial.strip():
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
        return Request(method=method, path=target.split("?", 1)[0], version=version, headers=headers)

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = True
        while True:
            timeout = self.settings.read_timeout if first else self.settings.idle_timeout
            first = False
            try:
                req = await self._read_head(reader, timeout)
            except _BadRequestError as e:
                await self._send(writer, e.status, b"bad request\n", "text/plain; charset=utf-8", close=True)
                return
            if req is None:
                return
            if req.headers.get("content-length", "0") not in ("", "0") or "transfer-encoding" in req.headers:
                # Nothing here takes a body; refuse instead of reading an attacker-sized one.
                await self._send(writer, 413, b"request bodies are not accepted\n", "text/plain", close=True)
                return
            keep_alive = req.version == "HTTP/1.1" and req.headers.get("connection", "").lower() != "close"
            if self._active >= self.settings.max_requests:
                self.requests_rejected += 1
                await self._send(
                    writer, 503, b"too many concurrent requests\n", "text/plain; charset=utf-8", close=True
                )
                return
            self._active += 1
            try:
                await self._respond(req, writer, keep_alive)
            finally:
                self._active -= 1
            if not keep_alive:
                return

    async def _respond(self, req: Request, writer: asyncio.StreamWriter, keep_alive: bool) -> None:
        head_only = req.method == "HEAD"
        if req.method not in ("GET", "HEAD"):
            await self._send(writer, 405, b"method not allowed\n", "text/plain; charset=utf-8",
                             close=not keep_alive, extra={"Allow": "GET, HEAD"})
            return
        if self.policy is not None and not self.policy.allow():
            self.requests_rejected += 1
            await self._send(writer, 429, b"Too Many Requests\n", "text/plain; charset=utf-8", close=not keep_alive)
            return
        # /healthz answers without basic auth: container and Kubernetes probes cannot easily send credentials,
        # and it tells nothing but "ok". TLS, client certificates and the rate limit still apply to it.
        if self.policy is not None and req.path != "/healthz" and not await self.policy.authorize(req.headers):
            await self._send(writer, 401, b"Unauthorized\n", "text/plain; charset=utf-8", close=not keep_alive,
                             extra={"WWW-Authenticate": 'Basic realm="gpufeed"'})
            return
        self.requests_served += 1
        if req.path == self.settings.telemetry_path:
            accept = req.headers.get("accept", "")
            payload = (
                self.renderer.openmetrics() if "application/openmetrics-text" in accept else self.renderer.text()
            )
            gz = "gzip" in req.headers.get("accept-encoding", "")
            body = payload.gz if gz else payload.body
            extra = {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"} if gz else {"Vary": "Accept-Encoding"}
            await self._send(writer, 200, body, payload.content_type, close=not keep_alive, extra=extra,
                             head_only=head_only)
        elif req.path == "/healthz":
            ok = self.healthy()
            await self._send(writer, 200 if ok else 503, b"ok\n" if ok else b"samplers not alive\n",
                             "text/plain; charset=utf-8", close=not keep_alive, head_only=head_only)
        elif req.path == "/":
            await self._send(writer, 200, self._landing(), "text/html; charset=utf-8", close=not keep_alive,
                             head_only=head_only)
        else:
            await self._send(writer, 404, b"not found\n", "text/plain; charset=utf-8", close=not keep_alive,
                             head_only=head_only)

    def _landing(self) -> bytes:
        path = escape(self.settings.telemetry_path)
        return (
            "<!doctype html><html><head><title>gpufeed</title></head><body>"
            f"<h1>gpufeed {escape(__version__)}</h1>"
            "<p>Is each GPU working, or waiting &mdash; and if waiting, on what?</p>"
            f'<ul><li><a href="{path}">Metrics</a></li><li><a href="/healthz">Health</a></li></ul>'
            "</body></html>\n"
        ).encode()

    async def _send(
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
        # Only wait when the socket did not take everything: wait_for() always yields to the loop (it wraps
        # the drain in a task), which under many fast scrapers kept requests "in flight" for a whole loop
        # round and turned the --web.max-requests cap into spurious 503s for everyone.
        if writer.transport.get_write_buffer_size() > 0:
            await asyncio.wait_for(writer.drain(), self.settings.read_timeout)
