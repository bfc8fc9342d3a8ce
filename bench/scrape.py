"""A light scrape client: N keep-alive connections in one asyncio loop, raw HTTP/1.1, timed per request.

Raw streams rather than an HTTP library so the client costs as little CPU as possible (on a small host
client and server compete for the same cores; the client's own CPU time is reported with the result).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from bench import procstat

# What Prometheus 2.x sends (scrape.go, scrapeAcceptHeader with OpenMetrics enabled by default since 2.5x)
# and what a plain text client sends.
PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
              "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}
TEXT_HEADERS = {"Accept": "text/plain;version=0.0.4"}


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100.0 * len(s)) - 1))
    return s[k]


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    """Latencies of every completed request (seconds), errors, bytes and the client's own CPU."""

    latencies: tuple[float, ...]
    errors: int
    bytes: int
    wall: float
    client_cpu: float

    @property
    def p50(self) -> float:
        return percentile(self.latencies, 50)

    @property
    def p99(self) -> float:
        return percentile(self.latencies, 99)

    @property
    def rate(self) -> float:
        """Completed requests per second."""
        return len(self.latencies) / self.wall if self.wall > 0 else 0.0


def _request(path: str, headers: dict[str, str]) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1", "User-Agent: gpufeed-bench"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, int]:
    """(status, body length) of one response; reads the whole body (Content-Length or chunked)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length = -1
    chunked = False
    for line in lines[1:]:
        name, _, value = line.partition(":")
        n = name.strip().lower()
        if n == "content-length":
            length = int(value.strip())
        elif n == "transfer-encoding" and "chunked" in value.lower():
            chunked = True
    if chunked:
        total = 0
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            total += size
            if size == 0:
                return status, total
    if length < 0:
        raise ValueError("response without Content-Length")
    await reader.readexactly(length)
    return status, length


async def _scraper(port: int, req: bytes, *, stop_at: float, interval: float, out: list[float],
                   errs: list[int], nbytes: list[int]) -> None:
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    next_at = time.monotonic()
    while True:
        now = time.monotonic()
        if now >= stop_at:
            break
        if interval > 0 and now < next_at:
            await asyncio.sleep(next_at - now)
        next_at += interval
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            assert reader is not None
            t0 = time.perf_counter()
            writer.write(req)
            status, n = await _read_response(reader)
            dt = time.perf_counter() - t0
            if status == 200:
                out.append(dt)
                nbytes[0] += n
            else:
                errs[0] += 1
        except (OSError, asyncio.IncompleteReadError, ValueError, asyncio.LimitOverrunError):
            errs[0] += 1
            if writer is not None:
                writer.close()
            reader = writer = None
            await asyncio.sleep(0.01)
    if writer is not None:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def scrape_async(port: int, *, path: str, headers: dict[str, str], concurrency: int, seconds: float,
                       interval: float) -> ScrapeResult:
    req = _request(path, headers)
    out: list[float] = []
    errs = [0]
    nbytes = [0]
    c0 = procstat.cpu_seconds_self()
    t0 = time.monotonic()
    stop_at = t0 + seconds
    await asyncio.gather(*(
        _scraper(port, req, stop_at=stop_at, interval=interval, out=out, errs=errs, nbytes=nbytes)
        for _ in range(concurrency)
    ))
    wall = time.monotonic() - t0
    return ScrapeResult(tuple(out), errs[0], nbytes[0], wall, procstat.cpu_seconds_self() - c0)


def scrape(port: int, *, concurrency: int = 1, seconds: float = 5.0, path: str = "/metrics",
           headers: dict[str, str] | None = None, interval: float = 0.0) -> ScrapeResult:
    """Scrape ``path`` from ``concurrency`` keep-alive connections for ``seconds``.

    ``interval`` 0 is closed-loop (each scraper sends its next request as soon as the last one is
    answered: the server's capacity); > 0 paces each scraper at that period (e.g. 0.25 for 4 Hz).
    """
    hdrs = dict(PROMETHEUS_HEADERS if headers is None else headers)
    return asyncio.run(scrape_async(port, path=path, headers=hdrs, concurrency=concurrency, seconds=seconds,
                                    interval=interval))
