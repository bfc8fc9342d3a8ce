"""Web server: /metrics (text, OpenMetrics, gzip), /healthz, /runbooks, landing page, 404, 405, HEAD, keep-alive."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gzip
from collections.abc import AsyncIterator

import pytest

from exporter import runbooks
from exporter.exposition import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, Renderer
from exporter.web import Auth, WebServer, WebSettings
from tests.support.hosts import LARGE, make, run_engine


class Health:
    ok = True

    def __call__(self) -> bool:
        return self.ok


@pytest.fixture
async def server() -> AsyncIterator[tuple[WebServer, Health]]:
    eng = run_engine(make("memory", LARGE), make("nfs", LARGE))
    renderer = Renderer(eng.stages)
    renderer.render(eng.snapshot)
    health = Health()
    web = WebServer(renderer, WebSettings(host="127.0.0.1", port=0, telemetry_path="/metrics"), health)
    await web.start()
    try:
        yield web, health
    finally:
        await web.stop()


Response = tuple[int, dict[str, str], bytes]


async def _read_response(reader: asyncio.StreamReader, head_only: bool = False) -> Response:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
    n = 0 if head_only else int(headers.get("content-length", "0"))
    body = await asyncio.wait_for(reader.readexactly(n), 5)
    return status, headers, body


async def request(web: WebServer, raw: str, head_only: bool = False) -> Response:
    reader, writer = await asyncio.open_connection("127.0.0.1", web.port)
    writer.write(raw.encode())
    try:
        return await _read_response(reader, head_only)
    finally:
        writer.close()


def get(path: str, *headers: str, method: str = "GET", version: str = "HTTP/1.1") -> str:
    return f"{method} {path} {version}\r\nHost: t\r\n" + "".join(h + "\r\n" for h in headers) + \
        "Connection: close\r\n\r\n"


async def test_metrics_text_format(server: tuple[WebServer, Health]) -> None:
    web, _ = server
    status, headers, body = await request(web, get("/metrics"))
    assert status == 200 and headers["content-type"] == TEXT_CONTENT_TYPE
    assert body == web.renderer.text().body
    assert b"gpufeed_memory_total_bytes 1.08181714944e+12" in body


async def test_openmetrics_when_negotiated(server: tuple[WebServer, Health]) -> None:
    web, _ = server
    status, headers, body = await request(
        web, get("/metrics", "Accept: application/openmetrics-text;version=1.0.0,text/plain;q=0.5")
    )
    assert status == 200 and headers["content-type"] == OPENMETRICS_CONTENT_TYPE
    assert body.endswith(b"# EOF\n")
    assert b"gpufeed_nfs_rpc_calls_total 1.85e+06" in body


async def test_gzip_when_accepted(server: tuple[WebServer, Health]) -> None:
    web, _ = server
    status, headers, body = await request(web, get("/metrics", "Accept-Encoding: gzip, deflate"))
    assert status == 200 and headers["content-encoding"] == "gzip"
    assert gzip.decompress(body) == web.renderer.text().body
    _, plain_headers, _ = await request(web, get("/metrics"))
    assert "content-encoding" not in plain_headers


async def test_healthz_follows_sampler_liveness(server: tuple[WebServer, Health]) -> None:
    web, health = server
    assert (await request(web, get("/healthz")))[0] == 200
    health.ok = False
    status, _, body = await request(web, get("/healthz"))
    assert status == 503 and b"not alive" in body


async def test_landing_page_links_the_telemetry_path(server: tuple[WebServer, Health]) -> None:
    web, _ = server
    status, headers, body = await request(web, get("/"))
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert b'href="/metrics"' in body and b'href="/healthz"' in body


async def test_unknown_path_is_404(server: tuple[WebServer, Health]) -> None:
    web, _ = server
    assert (await request(web, get("/metricz")))[0] == 404


async def test_post_is_405_with_allow(server: tuple[WebServer, Health]) -> None:
    web, _ = server
    status, headers, _ = await request(web, get("/metrics", method="POST"))
    assert status == 405 and headers["allow"] == "GET, HEAD"


async def test_head_has_length_but_no_body(server: tuple[WebServer, Health]) -> None:
    web, _ = server
    reader, writer = await asyncio.open_connection("127.0.0.1", web.port)
    writer.write(get("/metrics", method="HEAD").encode())
    status, headers, _ = await _read_response(reader, head_only=True)
    rest = await asyncio.wait_for(reader.read(), 5)  # server closes: nothing may follow the head
    writer.close()
    assert status == 200 and int(headers["content-length"]) == len(web.renderer.text().body)
    assert rest == b""


async def test_keep_alive_serves_several_requests_on_one_connection(server: tuple[WebServer, Health]) -> None:
    web, _ = server
    reader, writer = await asyncio.open_connection("127.0.0.1", web.port)
    try:
        for path in ("/metrics", "/healthz", "/metrics"):
            writer.write(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
            status, headers, _ = await _read_response(reader)
            assert status == 200 and headers["connection"] == "keep-alive"
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        status, headers, _ = await _read_response(reader)
        assert status == 200 and headers["connection"] == "close"
        assert await asyncio.wait_for(reader.read(), 5) == b""
    finally:
        writer.close()


async def test_http10_closes_after_one_response(server: tuple[WebServer, Health]) -> None:
    web, _ = server
    reader, writer = await asyncio.open_connection("127.0.0.1", web.port)
    writer.write(b"GET /metrics HTTP/1.0\r\n\r\n")
    status, headers, _ = await _read_response(reader)
    assert status == 200 and headers["connection"] == "close"
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()


async def test_malformed_request_line_is_400(server: tuple[WebServer, Health]) -> None:
    web, _ = server
    status, _, _ = await request(web, "NONSENSE\r\n\r\n")
    assert status == 400


async def test_a_scrape_is_told_to_the_pacer_with_its_scraper_and_waits_for_the_render_it_asked_for() -> None:
    eng = run_engine(make("memory", LARGE))
    renderer = Renderer(eng.stages)
    renderer.render(eng.snapshot)
    seen: list[str] = []
    asked: list[concurrent.futures.Future[None]] = []

    def on_scrape(peer: str) -> concurrent.futures.Future[None]:
        seen.append(peer)
        fut: concurrent.futures.Future[None] = concurrent.futures.Future()
        asked.append(fut)
        return fut

    web = WebServer(renderer, WebSettings(host="127.0.0.1", port=0), Health(), on_scrape=on_scrape)
    await web.start()
    try:
        pending = asyncio.ensure_future(request(web, get("/metrics", "User-Agent: Prometheus/2.53.0")))
        while not asked:
            await asyncio.sleep(0.01)
        assert not pending.done()  # the response waits for the render
        asked[0].set_result(None)
        status, _, _ = await pending
        assert status == 200
        assert seen == ["127.0.0.1 Prometheus/2.53.0"]
        await request(web, get("/healthz"))
        assert len(seen) == 1  # only scrapes of the telemetry path count
    finally:
        await web.stop()


async def test_landing_page_links_the_runbooks(server: tuple[WebServer, Health]) -> None:
    web, _ = server
    _, _, body = await request(web, get("/"))
    assert b'href="/runbooks"' in body


async def test_runbooks_page_is_the_shipped_runbooks_as_html_with_a_no_script_policy(
    server: tuple[WebServer, Health],
) -> None:
    web, _ = server
    status, headers, body = await request(web, get("/runbooks"))
    assert status == 200 and headers["content-type"] == "text/html; charset=utf-8"
    assert headers["content-security-policy"].startswith("default-src 'none'")
    assert body == runbooks.page()
    assert b'<h2 id="gpufeedgpulost">GpufeedGPULost</h2>' in body


class DenyAll:
    """An access policy whose basic auth refuses everyone (the web config's, without bcrypt)."""

    def ssl_context(self) -> None:
        return None

    def peer_allowed(self, peercert: object) -> bool:
        return True

    def headers(self) -> dict[str, str]:
        return {"X-Frame-Options": "DENY"}

    def allow(self) -> bool:
        return True

    async def authorize(self, headers: object) -> Auth:
        return Auth.DENIED


async def test_runbooks_page_needs_the_same_basic_auth_as_metrics() -> None:
    eng = run_engine(make("memory", LARGE))
    renderer = Renderer(eng.stages)
    renderer.render(eng.snapshot)
    web = WebServer(renderer, WebSettings(host="127.0.0.1", port=0), Health(), policy=DenyAll())
    await web.start()
    try:
        for path in ("/metrics", "/runbooks", "/"):
            status, _, body = await request(web, get(path))
            assert status == 401 and b"<h" not in body, path
        assert (await request(web, get("/healthz")))[0] == 200
    finally:
        await web.stop()
