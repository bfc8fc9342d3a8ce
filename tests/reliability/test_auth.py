"""Basic auth under attack (127.0.0.1, in-process server, bounded): a bcrypt flood with random passwords must not
lock out the valid scraper, waiting for bcrypt holds no request slot, wrong passwords never evict a verified
credential, timing does not reveal which users exist, and the rate limit cannot be spent by strangers.

Round 2 found: 50 clients with random passwords gave the valid scraper 503 on 137 of 141 requests
(node_exporter: 87/87 got 200), because bcrypt waits held ``--web.max-requests`` slots and wrong passwords
evicted the valid entry from the credential cache. The full-size measurement is ``python -m bench.load
--auth-flood``; its figures are in docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import base64
import os
import threading
import time
from pathlib import Path

import bcrypt
import pytest

from exporter import webconfig
from exporter.web import Auth
from exporter.webconfig import WebConfigManager

from .conftest import Serve


def _header(user: str, password: str) -> dict[str, str]:
    return {"authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


async def status(port: int, path: str = "/metrics", auth: tuple[str, str] | None = None) -> tuple[int, dict[str, str]]:
    """One request on a fresh connection: (status, headers)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    extra = ""
    if auth is not None:
        extra = "Authorization: " + _header(*auth)["authorization"] + "\r\n"
    writer.write(f"GET {path} HTTP/1.1\r\nHost: t\r\n{extra}Connection: close\r\n\r\n".encode())
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    finally:
        writer.close()
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
    return int(lines[0].split(" ")[1]), headers


def manager(tmp_path: Path, users: dict[str, str], extra: str = "") -> WebConfigManager:
    path = tmp_path / "web.yml"
    path.write_text("basic_auth_users:\n" + "".join(f"  {u}: '{h}'\n" for u, h in users.items()) + extra)
    return WebConfigManager(path)


def _hash(password: str, cost: int) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode()


async def test_wrong_passwords_never_evict_a_verified_credential(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mgr = manager(tmp_path, {"prometheus": _hash("secret", 4)})
    checks: list[str] = []
    real = webconfig._check

    def counting(password: str, hashed: bytes) -> tuple[bool, float]:
        checks.append(password)
        return real(password, hashed)

    monkeypatch.setattr(webconfig, "_check", counting)
    assert await mgr.authorize(_header("prometheus", "secret")) is Auth.OK
    for i in range(3 * webconfig.AUTH_CACHE_SIZE):  # random passwords: every one a new cache entry
        assert await mgr.authorize(_header("prometheus", f"guess-{i}")) is Auth.DENIED
    assert await mgr.authorize(_header("prometheus", "secret")) is Auth.OK
    assert checks.count("secret") == 1  # still cached: the flood evicted nothing
    assert await mgr.authorize(_header("prometheus", "guess-0")) is Auth.DENIED
    assert checks.count("guess-0") == 1  # a refused credential retried costs nothing either


async def test_waiting_for_bcrypt_holds_no_request_slot(
    tmp_path: Path, serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    mgr = manager(tmp_path, {"prometheus": _hash("secret", 4)})
    assert await mgr.authorize(_header("prometheus", "secret")) is Auth.OK  # the scraper's credential, cached
    release = threading.Event()
    real = webconfig._check

    def slow(password: str, hashed: bytes) -> tuple[bool, float]:
        release.wait(20)  # an expensive bcrypt in progress
        return real(password, hashed)

    monkeypatch.setattr(webconfig, "_check", slow)
    srv = await serve(mgr, max_requests=1)
    attacker = asyncio.create_task(status(srv.port, auth=("prometheus", "wrong")))
    for _ in range(200):
        if mgr.pending:
            break
        await asyncio.sleep(0.01)
    assert mgr.pending == 1  # the attacker's request is waiting for bcrypt...
    assert (await status(srv.port, auth=("prometheus", "secret")))[0] == 200  # ...and holds no slot
    release.set()
    assert (await attacker)[0] == 401


async def test_the_bcrypt_queue_serves_the_newest_first_and_answers_the_oldest_503_when_full(
    tmp_path: Path, serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    mgr = manager(tmp_path, {"prometheus": _hash("secret", 4)})
    release = threading.Event()
    order: list[str] = []

    def blocked(password: str, hashed: bytes) -> tuple[bool, float]:
        release.wait(20)
        order.append(password)
        return False, 0.0

    monkeypatch.setattr(webconfig, "AUTH_MAX_PENDING", 2)
    monkeypatch.setattr(webconfig, "_check", blocked)
    srv = await serve(mgr)

    async def pending(n: int) -> None:
        for _ in range(500):
            if mgr.pending >= n:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{mgr.pending} pending, expected {n}")

    running = asyncio.create_task(status(srv.port, auth=("prometheus", "a")))
    await pending(1)
    oldest = asyncio.create_task(status(srv.port, auth=("prometheus", "b")))
    await pending(2)
    middle = asyncio.create_task(status(srv.port, auth=("prometheus", "c")))
    await pending(3)
    newest = asyncio.create_task(status(srv.port, auth=("prometheus", "d")))  # the queue holds two: b is out
    code, headers = await oldest
    assert (code, headers.get("retry-after")) == (503, "1")
    release.set()
    assert [(await t)[0] for t in (running, middle, newest)] == [401, 401, 401]
    assert order == ["a", "d", "c"]  # newest first: under a flood a scraper's new request waits ~one check


async def test_a_50_client_bcrypt_flood_leaves_the_valid_scraper_served(tmp_path: Path, serve: Serve) -> None:
    mgr = manager(tmp_path, {"prometheus": _hash("secret", 6)})
    srv = await serve(mgr)
    stop = time.monotonic() + 4.0
    flood_answers: list[int] = []

    async def attacker() -> None:
        while time.monotonic() < stop:
            try:
                flood_answers.append((await status(srv.port, auth=("prometheus", os.urandom(6).hex())))[0])
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError):
                flood_answers.append(0)

    attackers = [asyncio.create_task(attacker()) for _ in range(50)]
    await asyncio.sleep(0.5)  # the flood is on before the scraper's first (uncached) request
    valid: list[int] = []
    while time.monotonic() < stop:
        valid.append((await status(srv.port, auth=("prometheus", "secret")))[0])
        await asyncio.sleep(0.1)
    await asyncio.gather(*attackers)
    assert len(flood_answers) > 200 and set(flood_answers) <= {401, 503}, set(flood_answers)
    assert valid.count(200) >= 0.99 * len(valid), valid


async def test_a_cheaper_users_check_is_padded_to_the_costliest_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Users with different costs: an unknown user is checked against a dummy of the highest cost, so a known
    # cheap user would answer faster -- user enumeration by timing. The cheap check is padded.
    mgr = manager(tmp_path, {"cheap": "$2y$04$" + "a" * 53, "dear": "$2y$07$" + "b" * 53})
    slept: list[float] = []

    async def record(delay: float) -> None:
        slept.append(delay)

    monkeypatch.setattr(webconfig, "_check", lambda p, h: (False, 0.01))
    monkeypatch.setattr(mgr, "_pad", record)
    await mgr.authorize(_header("cheap", "x"))
    assert slept == [pytest.approx(0.01 * (2 ** 3 - 1))]  # cost 4 -> 7: eight times as long in all
    await mgr.authorize(_header("dear", "x"))
    await mgr.authorize(_header("nobody", "x"))  # the dummy has the highest cost: no padding either
    assert len(slept) == 1


async def test_the_rate_limit_counts_authenticated_requests_and_never_probes(tmp_path: Path, serve: Serve) -> None:
    mgr = manager(tmp_path, {"prometheus": _hash("secret", 4)}, "rate_limit: {interval: 1h, burst: 2}\n")
    srv = await serve(mgr)
    for _ in range(5):  # strangers cannot spend the scrapers' tokens
        assert (await status(srv.port, auth=("mallory", "x")))[0] == 401
    for _ in range(5):
        assert (await status(srv.port, "/healthz"))[0] == 200  # a probe refused under a flood restarts pods
    codes = [(await status(srv.port, auth=("prometheus", "secret")))[0] for _ in range(3)]
    assert codes == [200, 200, 429]
