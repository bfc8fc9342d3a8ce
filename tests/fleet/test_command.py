"""gpufeed report's flags, its Prometheus client (auth, TLS, errors) and its exit codes, against a stub API.

The stub is a stdlib HTTP(S) server on 127.0.0.1 that answers like Prometheus (or refuses credentials, or
answers HTML); the real Prometheus is in test_integration.py.
"""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import ssl
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from exporter.cli import main
from exporter.fleet.command import _Progress, parse_duration
from exporter.fleet.model import GpuId, Window
from exporter.fleet.promapi import HttpConfigError, HttpOptions, PromError, PrometheusClient, load_http_config
from tests.fleet.harness import free_port


@dataclass
class Stub:
    url: str
    requests: list[dict[str, str]] = field(default_factory=list)
    mode: str = "ok"  # ok, html, bad_query, empty
    password: str | None = None


def _handler(stub: Stub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            stub.requests.append({"path": self.path, "auth": self.headers.get("Authorization", ""),
                                  "body": getattr(self, "body", b"").decode()})
            if not self.path.startswith("/api/v1/"):
                self.send_error(404)
                return
            if stub.password is not None:
                want = "Basic " + base64.b64encode(f"admin:{stub.password}".encode()).decode()
                if self.headers.get("Authorization") != want:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="prometheus"')
                    self.end_headers()
                    return
            if stub.mode == "html":
                body, code = b"<html>sign in</html>", 200
            elif stub.mode == "bad_query":
                body, code = json.dumps({"status": "error", "errorType": "bad_data",
                                         "error": "invalid parameter \"query\": parse error"}).encode(), 400
            elif self.path.startswith("/api/v1/rules"):
                body, code = json.dumps({"status": "success", "data": {"groups": []}}).encode(), 200
            else:
                result_type = "matrix" if "query_range" in self.path else "vector"
                body, code = json.dumps({"status": "success", "data": {"resultType": result_type,
                                                                       "result": []}}).encode(), 200
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._answer()

        def do_POST(self) -> None:
            self.body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self._answer()

        def log_message(self, *_args: Any) -> None:
            return

    return Handler


@pytest.fixture
def stub() -> Iterator[Stub]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(s := Stub(url="")))
    s.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield s
    server.shutdown()
    server.server_close()


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    rc = main(["report", *args])
    err = capsys.readouterr().err
    return rc, err


# ------------------------------------------------------------------------------------------------ flags


@pytest.mark.parametrize(("args", "flag"), [
    ([], "--prometheus"),
    (["--range", "7q"], "--range"),
    (["--range", "0d"], "--range"),
    (["--step", "7m"], "--step"),
    (["--range", "90m"], "--range"),
    (["--range", "3y", "--step", "5m"], "--step"),
    (["--by", "team"], "--by"),
    (["--source", "cache"], "--source"),
    (["--top", "0"], "--top"),
    (["--top", "ten"], "--top"),
    (["--end", "yesterday"], "--end"),
    (["--end", "2025-11-24T00:00:00"], "--end"),
    (["--end", "4102444800"], "--end"),
    (["--log.level", "loud"], "--log.level"),
    (["--timeout", "soon"], "--timeout"),
    (["--ca-file", "/nonexistent/ca.pem"], "--ca-file"),
    (["--password-file", "/nonexistent"], "--password-file"),
    (["--selector", 'cluster="eu"'], "--selector"),
    (["--selector", "{cluster=eu}"], "--selector"),
    (["--selector", '{cluster="eu"}', "--cluster", "eu"], "--cluster"),
    (["--compare", "last-year"], "--compare"),
    (["--price-per-kwh", "cheap"], "--price-per-kwh"),
    (["--price-per-gpu-hour", "-2"], "--price-per-gpu-hour"),
])
def test_bad_flag_is_one_line_naming_it_and_exit_2(args: list[str], flag: str, capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    base = [] if args == [] else ["--prometheus", "http://127.0.0.1:9"]
    rc, err = run(capsys, *base, *args, "--out", str(tmp_path / "out"))
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith(f"gpufeed report: error: {flag}"), err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_a_url_that_is_not_http_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = run(capsys, "--prometheus", "prometheus:9090")
    assert rc == 2 and "--prometheus: 'prometheus:9090' is not an http:// or https:// URL" in err


def test_durations_are_prometheus_durations() -> None:
    assert parse_duration("7d", "--range") == 7 * 86400
    assert parse_duration("1h30m", "--range") == 5400
    assert parse_duration("90s", "--range") == 90


def test_http_config_file_takes_promtools_format_and_rejects_what_it_does_not_implement(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("s3cret\n")
    cfg = tmp_path / "http.yml"
    cfg.write_text("basic_auth: {username: admin, password_file: pw}\n"
                   "tls_config: {ca_file: ca.pem, cert_file: c.pem, key_file: c.key, insecure_skip_verify: false}\n")
    opts = load_http_config(cfg)
    assert (opts.username, opts.password) == ("admin", "s3cret")
    assert opts.ca_file == str(tmp_path / "ca.pem") and opts.key_file == str(tmp_path / "c.key")
    for text, needle in (("proxy_url: http://proxy:3128\n", "--http.config.file.proxy_url is not supported"),
                         ("oauth2: {client_id: x}\n", "oauth2"),
                         ("tls_config: {server_name: p}\n", "tls_config.server_name is not supported"),
                         ("basic_auth: {password: x}\n", "basic_auth.username is required"),
                         ("basic_auth: {username: a}\nauthorization: {credentials: t}\n", "mutually exclusive"),
                         ("- a\n", "must be a mapping")):
        cfg.write_text(text)
        with pytest.raises(HttpConfigError, match=needle):
            load_http_config(cfg)


def test_missing_plotting_library_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    import exporter.fleet

    monkeypatch.delitem(sys.modules, "exporter.fleet.plots", raising=False)
    monkeypatch.delattr(exporter.fleet, "plots", raising=False)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    rc, err = run(capsys, "--prometheus", "http://127.0.0.1:9")
    assert rc == 8 and err.count("\n") == 1 and "pip install matplotlib" in err and "pip install '.[report]'" in err


def test_progress_is_drawn_on_a_terminal_only() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty, pipe = Tty(), io.StringIO()
    for stream in (tty, pipe):
        p = _Progress(stream)
        p(3, 12, "GPU models")
        p.end()
    assert "gpufeed report: [######" in tty.getvalue() and "3/12 queries, GPU models" in tty.getvalue()
    assert pipe.getvalue() == ""


# --------------------------------------------------------------------------------------------- transport


def test_unreachable_prometheus_is_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = run(capsys, "--prometheus", f"http://127.0.0.1:{free_port()}")
    assert rc == 3 and err.count("\n") == 1 and "cannot reach Prometheus at http://127.0.0.1:" in err
    assert "refused" in err.lower()


def test_refused_credentials_are_exit_4_and_say_how_to_pass_them(stub: Stub, capsys: pytest.CaptureFixture[str],
                                                                 tmp_path: Path) -> None:
    stub.password = "s3cret"
    rc, err = run(capsys, "--prometheus", stub.url)
    assert rc == 4 and err.count("\n") == 1 and "answered 401" in err and "no credentials were sent" in err
    (tmp_path / "pw").write_text("wrong\n")
    rc, err = run(capsys, "--prometheus", stub.url, "--user", "admin", "--password-file", str(tmp_path / "pw"))
    assert rc == 4 and "the credentials were refused" in err


def test_basic_auth_from_the_http_config_file_reaches_an_empty_prometheus(stub: Stub,
                                                                          capsys: pytest.CaptureFixture[str],
                                                                          tmp_path: Path) -> None:
    stub.password = "s3cret"
    cfg = tmp_path / "http.yml"
    cfg.write_text("basic_auth: {username: admin, password: s3cret}\n")
    rc, err = run(capsys, "--prometheus", stub.url, "--http.config.file", str(cfg), "--out", str(tmp_path / "o"))
    # Authenticated, but the stub holds no gpufeed series.
    assert rc == 5 and "no gpufeed data between" in err, err
    assert stub.requests[0]["path"] == "/api/v1/rules?type=record"
    assert all(r["auth"].startswith("Basic ") for r in stub.requests)


def test_an_answer_that_is_not_prometheus_json_is_exit_7(stub: Stub, capsys: pytest.CaptureFixture[str]) -> None:
    stub.mode = "html"
    rc, err = run(capsys, "--prometheus", stub.url)
    assert rc == 7 and re.search(r"did not answer /api/v1/\S+ with JSON: is this a Prometheus server\?", err), err
    assert err.count("\n") == 1


def test_a_rejected_query_is_exit_7_with_prometheus_message(stub: Stub, capsys: pytest.CaptureFixture[str]) -> None:
    stub.mode = "bad_query"
    rc, err = run(capsys, "--prometheus", stub.url)
    assert rc == 7 and "answered 400 Bad Request: invalid parameter \"query\": parse error" in err


def test_a_wrong_path_prefix_says_so(stub: Stub) -> None:
    client = PrometheusClient(stub.url + "/prometheus", HttpOptions())
    with pytest.raises(PromError, match=r"has no Prometheus API at .*/prometheus/api/v1/query \(404\)"):
        client.query("1", 0)


# -------------------------------------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    d = tmp_path_factory.mktemp("pki")

    def ossl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=30)

    ossl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "ca.key",
         "-out", "ca.crt", "-days", "2", "-subj", "/CN=gpufeed report test CA",
         "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    ossl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "server.key",
         "-out", "server.csr", "-subj", "/CN=prometheus")
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    ossl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
         "-out", "server.crt", "-extfile", "server.ext")
    return d


@pytest.fixture
def tls_stub(pki: Path) -> Iterator[Stub]:
    s = Stub(url="")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(s))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki / "server.crt", pki / "server.key")
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    s.url = f"https://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield s
    server.shutdown()
    server.server_close()


def test_tls_with_an_untrusted_certificate_is_exit_3_and_names_the_flags(tls_stub: Stub,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = run(capsys, "--prometheus", tls_stub.url)
    assert rc == 3 and "TLS certificate of https://127.0.0.1:" in err and "--ca-file" in err, err


def test_tls_with_the_ca_file_or_skip_verify_gets_through(tls_stub: Stub, pki: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    for flags in (["--ca-file", str(pki / "ca.crt")], ["--insecure-skip-verify"]):
        rc, err = run(capsys, "--prometheus", tls_stub.url, *flags)
        assert rc == 5 and "no gpufeed data" in err, (flags, err)


def test_credentials_in_the_url_are_basic_auth_and_stay_out_of_the_report(stub: Stub) -> None:
    stub.password = "s3cret"
    client = PrometheusClient(stub.url.replace("http://", "http://admin:s3cret@"), HttpOptions())
    assert client.url == stub.url and client.rules() == []
    assert stub.requests[-1]["auth"] == "Basic " + base64.b64encode(b"admin:s3cret").decode()


def test_a_server_without_the_rules_api_falls_back_to_raw_series(stub: Stub, capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from exporter.fleet import collect as collect_mod
    from exporter.fleet.collect import CollectOptions, NoDataError

    def no_rules(self: PrometheusClient) -> list[Any]:
        raise PromError("Prometheus at stub answered 404 Not Found")

    monkeypatch.setattr(PrometheusClient, "rules", no_rules)
    client = PrometheusClient(stub.url, HttpOptions())
    window = Window(0, 3600, 3600)
    # auto: carries on with raw series (here: finds no data); rules: the error is the answer.
    with pytest.raises(NoDataError):
        collect_mod.collect(client, CollectOptions(window=window, by="host", source="auto"))
    assert any("query_range" in r["path"] for r in stub.requests)
    with pytest.raises(PromError, match="404"):
        collect_mod.collect(client, CollectOptions(window=window, by="host", source="rules"))


class _Canned(BaseHTTPRequestHandler):
    """Prometheus with both GPU rules loaded, one GPU scraped every minute for 4 hours, and the state rule's
    history only for the last 2 of them (as when the rules were loaded mid-range)."""

    seen: list[str] = []

    def do_POST(self) -> None:
        form = urllib.parse.parse_qs(self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode())
        q = form["query"][0]
        self.seen.append(q)
        start, end, step = (float(form[k][0]) for k in ("start", "end", "step")) if "step" in form else (0, 0, 1)
        times = [start + i * step for i in range(int((end - start) / step) + 1)]
        gpu = {"job": "gpufeed", "instance": "a:9842", "gpu": "0"}
        result: list[dict[str, Any]] = []
        if "count_over_time(gpufeed_gpu_state_seconds_total" in q:
            result = [{"metric": gpu, "values": [[t, "60"] for t in times]}]
        elif "instance_gpu_state:" in q:
            result = [{"metric": {**gpu, "state": "working"}, "values": [[t, "3600"] for t in times[2:]]}]
        elif "instance_gpu_cause:" in q or "gpufeed_gpu_waiting_seconds_total" in q:
            result = [{"metric": {**gpu, "cause": "io_bound"}, "values": [[t, "0"] for t in times]}]
        elif "increase(gpufeed_gpu_state_seconds_total" in q:
            result = [{"metric": {**gpu, "state": "working"}, "values": [[t, "3600"] for t in times]}]
        kind = "matrix" if "query_range" in self.path else "vector"
        self._send({"resultType": kind, "result": result if kind == "matrix" else []})

    def do_GET(self) -> None:
        rules = [{"name": n, "type": "recording", "health": "ok", "query": "..."}
                 for n in ("instance_gpu_state:gpufeed_gpu_state_seconds:rate5m",
                           "instance_gpu_cause:gpufeed_gpu_waiting_seconds:rate5m")]
        self._send({"groups": [{"name": "gpufeed-gpu-time", "interval": 60, "rules": rules}]})

    def _send(self, data: Any) -> None:
        body = json.dumps({"status": "success", "data": data}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        return


def test_a_rule_loaded_in_the_middle_of_the_range_gives_way_to_raw_series() -> None:
    from exporter.fleet.collect import CollectOptions, MissingRulesError, collect

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Canned)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = PrometheusClient(f"http://127.0.0.1:{server.server_address[1]}", HttpOptions())
        window = Window(0, 4 * 3600, 3600)
        data = collect(client, CollectOptions(window=window, by="host", source="auto"))
        src = {s.family: s for s in data.sources}
        assert src["gpu_state"].kind == "raw" and "has data for only 50% of the range" in src["gpu_state"].note
        assert src["gpu_cause"].kind == "rules" and src["gpu_cause"].note == ""
        assert any(q.startswith("sum by (job, instance, gpu, state) (increase(") for q in _Canned.seen)
        # Four full hours of work, from the raw counters, not two from the rule.
        assert sum(data.state_s[GpuId("gpufeed", "a:9842", "0")]["working"]) == 4 * 3600
        with pytest.raises(MissingRulesError, match="has data for only 50%"):
            collect(client, CollectOptions(window=window, by="host", source="rules"))
    finally:
        server.shutdown()
        server.server_close()


def test_a_cluster_or_selector_reaches_every_query_and_no_data_names_it(stub: Stub,
                                                                       capsys: pytest.CaptureFixture[str],
                                                                       tmp_path: Path) -> None:
    rc, err = run(capsys, "--prometheus", stub.url, "--cluster", 'eu-"1"', "--out", str(tmp_path))
    assert rc == 5 and 'matching {cluster="eu-\\"1\\""}' in err, err
    queries = [urllib.parse.unquote_plus(r["path"] + r["body"]) for r in stub.requests if "query" in r["path"]]
    assert queries and all('cluster="eu-\\"1\\""' in q for q in queries)
    stub.requests.clear()
    rc, err = run(capsys, "--prometheus", stub.url, "--selector", '{cluster="eu", region=~"west.*"}',
                  "--out", str(tmp_path))
    queries = [urllib.parse.unquote_plus(r["path"] + r["body"]) for r in stub.requests if "query" in r["path"]]
    assert rc == 5 and all('cluster="eu", region=~"west.*"}' in q for q in queries), queries
