"""gpufeed report against a hostile Prometheus: every answer is bounded in size and time, and every malformed one
ends in one line with a documented exit code (never "internal error", exit 70).

The hostile server is a raw socket server on 127.0.0.1 written here (http.server cannot trickle or lie about
Content-Length). Each connection stops by itself: an endless answer after a few MiB past the client's cap or
when the client hangs up, a trickle after 8 s, so a test of the old unbounded client ends too (and fails).
"""

from __future__ import annotations

import json
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from exporter.cli import main

Start = Callable[[str], "_Hostile"]
# Every connection's own bound: no mode writes for longer than this.
CONNECTION_S = 8.0
_EMPTY_RULES = json.dumps({"status": "success", "data": {"groups": []}}).encode()


def _matrix(result: object) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()


def _vector(result: object) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


# Complete answers to a query (both kinds): the review's malformed answers (N6).
_QUERY_BODIES: dict[str, tuple[int, bytes]] = {
    "metric_a_list": (200, _matrix([{"metric": ["gpu", "0"], "values": [[1, "1"]]}])),
    "point_of_strings": (200, _matrix([{"metric": {}, "values": [["x", "y"]]}])),
    "value_missing": (200, _matrix([{"metric": {}}])),
    "deep_json": (200, b"[" * 200_000 + b"]" * 200_000),
    "truncated_json": (200, _matrix([])[:-7]),
    "html": (200, b"<html>sign in</html>"),
    "data_null": (200, b'{"status": "success", "data": null}'),
    "wrong_result_type": (200, b'{"status": "success", "data": {"resultType": "string", "result": [1, "x"]}}'),
    "error_5mb": (500, json.dumps({"status": "error", "error": "x" * 5_000_000}).encode()),
    "rejected_5mb": (200, json.dumps({"status": "error", "error": "y" * 5_000_000}).encode()),
}
_RULES_BODIES: dict[str, bytes] = {
    "groups_of_wrong_type": json.dumps({"status": "success", "data": {"groups": [1, "x", None]}}).encode(),
    "interval_a_string": json.dumps({"status": "success", "data": {"groups": [
        {"name": "g", "interval": "1m", "rules": [{"type": "recording", "name": "r"}]}]}}).encode(),
}


class _Hostile(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, mode: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.mode = mode
        self.requests = 0


class _Handler(socketserver.StreamRequestHandler):
    server: _Hostile

    def handle(self) -> None:
        self.connection.settimeout(CONNECTION_S)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.connection.recv(65536)
            if not chunk:
                return
            head += chunk
        # Read the whole request (a POSTed query's form body) before answering: a socket closed with unread data
        # sends a reset, which the client may see before the answer and report as a connection error.
        header, _, body = head.partition(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in header.split(b"\r\n")[1:]
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            chunk = self.connection.recv(65536)
            if not chunk:
                return
            body += chunk
        request_line = head.split(b"\r\n", 1)[0].decode()
        self.server.requests += 1
        path = request_line.split()[1]
        try:
            self._answer(path)
        except OSError:
            return  # the client hung up: what a bounded client does

    def _send(self, code: int, body: bytes, length: int | None = None) -> None:
        n = len(body) if length is None else length
        self.connection.sendall(f"HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {n}\r\n"
                                "Connection: close\r\n\r\n".encode() + body)

    def _answer(self, path: str) -> None:
        mode = self.server.mode
        if path.startswith("/api/v1/rules"):
            self._send(200, _RULES_BODIES.get(mode, _EMPTY_RULES))
        elif mode in _QUERY_BODIES:
            self._send(*_QUERY_BODIES[mode])
        elif mode in _RULES_BODIES:
            self._send(200, _matrix([]) if "range" in path else _vector([]))
        elif mode == "reset_mid_body":
            self._send(200, _matrix([])[:27], length=100_000)
        elif mode == "redirect_loop":
            self.connection.sendall(f"HTTP/1.1 302 Found\r\nLocation: {path}\r\nContent-Length: 0\r\n\r\n".encode())
        elif mode == "stall":
            time.sleep(CONNECTION_S)
        elif mode == "declared_100mb":
            # Four of these, one per parallel query, took the old client to 6.1 GB.
            self._send(200, b'{"status": "success", "data": {"resultType": "matrix", "result": [',
                       length=100 * 2**20)
            self._endless()
        elif mode == "endless":
            self.connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
                                    b'{"status": "success", "data": {"resultType": "matrix", "result": [')
            self._endless()
        elif mode == "trickle":
            self.connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
            body = _matrix([]) + b" " * 1000
            stop = time.monotonic() + CONNECTION_S
            for byte in body:
                if time.monotonic() > stop:
                    return
                self.connection.sendall(bytes([byte]))
                time.sleep(0.25)

    def _endless(self) -> None:
        """Series after series, at most 64 MiB (the client's cap in these tests is 1 MiB) or CONNECTION_S."""
        series = json.dumps({"metric": {"gpu": "0"}, "values": [[1, "1"]] * 200}).encode() + b","
        stop = time.monotonic() + CONNECTION_S
        sent = 0
        while sent < 64 * 2**20 and time.monotonic() < stop:
            self.connection.sendall(series * 64)
            sent += len(series) * 64


@pytest.fixture
def hostile() -> Iterator[Start]:
    servers: list[_Hostile] = []

    def start(mode: str) -> _Hostile:
        server = _Hostile(mode)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def _report(server: _Hostile, capsys: pytest.CaptureFixture[str], out: Path, *flags: str) -> tuple[int, str, float]:
    url = f"http://127.0.0.1:{server.server_address[1]}"
    t0 = time.monotonic()
    rc = main(["report", "--prometheus", url, "--range", "1h", "--step", "5m", "--timeout", "2s",
               "--out", str(out), *flags])
    return rc, capsys.readouterr().err, time.monotonic() - t0


@pytest.mark.parametrize("mode", ["endless", "declared_100mb"])
def test_an_answer_past_the_size_cap_is_refused_at_the_cap_with_exit_9(
        mode: str, hostile: Start, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, err, took = _report(hostile(mode), capsys, tmp_path, "--source", "raw", "--max-answer-size", "1MiB")
    assert rc == 9, err
    assert err.count("\n") == 1 and "with more than 1 MiB (--max-answer-size)" in err, err
    assert took < 5


def test_an_answer_trickled_past_the_timeout_is_cut_at_the_timeout(hostile: Start, capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Path) -> None:
    # One byte every 0.25 s: each socket read returns within the timeout, the answer never ends.
    rc, err, took = _report(hostile("trickle"), capsys, tmp_path, "--source", "raw")
    assert rc == 3 and err.count("\n") == 1 and "did not answer within 2 s" in err, err
    # Two rounds of queries at most (the first round, then the one in flight when it failed), never CONNECTION_S.
    assert took < 6.5, took


def test_the_queries_together_end_at_the_deadline_with_exit_9(hostile: Start, capsys: pytest.CaptureFixture[str],
                                                              tmp_path: Path) -> None:
    rc, err, took = _report(hostile("trickle"), capsys, tmp_path, "--source", "raw", "--timeout", "60s",
                            "--deadline", "1s")
    assert rc == 9 and err.count("\n") == 1 and "took more than 1 s in all (--deadline)" in err, err
    assert took < 3.5, took


@pytest.mark.parametrize("mode", sorted([*_QUERY_BODIES, *_RULES_BODIES, "reset_mid_body", "redirect_loop", "stall"]))
def test_a_malformed_answer_is_one_short_line_with_its_exit_code_never_internal_error(
        mode: str, hostile: Start, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, err, _ = _report(hostile(mode), capsys, tmp_path)
    # 3: the connection broke or stalled; 5: a malformed rules list falls back to raw series (which hold nothing);
    # 6 is not asked for; 7: the answer is not what Prometheus sends.
    want = {"reset_mid_body": 3, "stall": 3, "groups_of_wrong_type": 5, "interval_a_string": 5}.get(mode, 7)
    assert rc == want, err
    assert err.count("\n") == 1 and err.startswith("gpufeed report: error: "), err
    assert "internal error" not in err and "Traceback" not in err
    assert len(err) < 600, len(err)


def test_a_malformed_rules_list_with_source_rules_names_the_shape(hostile: Start, capsys: pytest.CaptureFixture[str],
                                                                  tmp_path: Path) -> None:
    for mode in _RULES_BODIES:
        rc, err, _ = _report(hostile(mode), capsys, tmp_path, "--source", "rules")
        assert rc == 7 and "answered /api/v1/rules in a shape gpufeed report cannot read" in err, err


@pytest.mark.parametrize(("flag", "value"), [("--max-answer-size", "64MB"), ("--max-answer-size", "0MiB"),
                                             ("--deadline", "10")])
def test_bad_bounds_are_usage_errors(flag: str, value: str, capsys: pytest.CaptureFixture[str],
                                     tmp_path: Path) -> None:
    rc = main(["report", "--prometheus", "http://127.0.0.1:9", flag, value, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(f"gpufeed report: error: {flag}"), err
