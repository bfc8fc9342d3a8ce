"""--web.config.file end to end with curl: TLS, mTLS, allowed SANs, basic auth, headers, rate limit, reload."""

from __future__ import annotations

import base64
import os
import shutil
import ssl
import textwrap
from pathlib import Path

import bcrypt
import pytest

from exporter import webconfig
from exporter.cli import main
from exporter.webconfig import WebConfigError, WebConfigManager, load, parse_basic_auth

from .conftest import Pki, Serve, curl


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def tls_yaml(pki: Pki, extra: str = "") -> str:
    return f"""
    tls_server_config:
      cert_file: {pki.server_cert}
      key_file: {pki.server_key}
    {extra}"""


# ---- validation: a bad file names the key --------------------------------------------------------------

@pytest.mark.parametrize(
    ("body", "names"),
    [
        ("tls_server_confg: {}\n", "tls_server_confg: unknown key"),
        ("tls_server_config: {cert_file: /nonexistent.crt, key_file: /nonexistent.key}\n",
         "tls_server_config.cert_file: /nonexistent.crt: no such file"),
        ("basic_auth_users: {alice: plaintext}\n", "basic_auth_users.alice: not a bcrypt hash"),
        ("http_server_config: {headers: {X-Powered-By: me}}\n", "http_server_config.headers.X-Powered-By"),
        ("http_server_config: {headers: {X-Frame-Options: allow}}\n", "invalid value 'allow'"),
        ("rate_limit: {interval: soon, burst: 2}\n", "rate_limit.interval: not a duration"),
        ("rate_limit: {interval: 1s, burst: 0}\n", "rate_limit.burst"),
        ("- a list\n", "web config: must be a mapping"),
        ("a: [\n", "invalid YAML"),
    ],
)
def test_invalid_web_config_is_refused_naming_the_key(tmp_path: Path, body: str, names: str) -> None:
    with pytest.raises(WebConfigError, match="web config file") as e:
        load(write(tmp_path / "web.yml", body))
    assert names in str(e.value)


@pytest.mark.parametrize(
    ("tls_extra", "names"),
    [
        ("client_auth_type: RequireAndVerifyClinetCert", "client_auth_type: invalid"),
        ("client_auth_type: RequireAnyClientCert", "without verifying them"),
        ("min_version: TLS14", "min_version: invalid 'TLS14'"),
        ("{min_version: TLS13, max_version: TLS12}".strip("{}").replace(", ", "\n  "), "higher than max_version"),
        ("cipher_suites: [TLS_FAKE_WITH_NOTHING]", "cipher_suites: unknown"),
        ("client_ca_file: ca.crt", "client CAs configured without a client_auth_type"),
        ("client_allowed_sans: [x]", "requires client_auth_type RequireAndVerifyClientCert"),
        ("curve_preferences: [CurveP999]", "curve_preferences: unknown curve"),
    ],
)
def test_invalid_tls_setting_is_refused_naming_the_key(pki: Pki, tmp_path: Path, tls_extra: str, names: str) -> None:
    shutil.copy(pki.ca, tmp_path / "ca.crt")
    body = f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n  {tls_extra}\n"
    with pytest.raises(WebConfigError, match="tls_server_config") as e:
        load(write(tmp_path / "web.yml", body))
    assert names in str(e.value)


def test_key_not_matching_certificate_is_refused(pki: Pki, tmp_path: Path) -> None:
    body = f"tls_server_config: {{cert_file: {pki.server_cert}, key_file: {pki.client_key}}}\n"
    with pytest.raises(WebConfigError, match="cannot load certificate and key"):
        load(write(tmp_path / "web.yml", body))


def test_serve_with_invalid_web_config_exits_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write(tmp_path / "web.yml", "basic_auth_users: {alice: hunter2}\n")
    assert main(["serve", "--web.config.file", str(cfg), "--web.listen-address", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err
    assert "--web.config.file" in err and "basic_auth_users.alice" in err


def test_relative_paths_resolve_against_the_config_directory_and_inline_pem_works(pki: Pki, tmp_path: Path) -> None:
    shutil.copy(pki.server_cert, tmp_path / "s.crt")
    shutil.copy(pki.server_key, tmp_path / "s.key")
    cfg = load(write(tmp_path / "web.yml", "tls_server_config: {cert_file: s.crt, key_file: s.key}\n"))
    assert cfg.ssl_context is not None and tmp_path / "s.crt" in cfg.watched
    inline = {"tls_server_config": {"cert": pki.server_cert.read_text(), "key": pki.server_key.read_text()}}
    assert webconfig.parse(inline, tmp_path).ssl_context is not None


def test_tls_defaults_match_exporter_toolkit(pki: Pki, tmp_path: Path) -> None:
    ctx = load(write(tmp_path / "web.yml", tls_yaml(pki))).ssl_context
    assert ctx is not None
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert ctx.verify_mode == ssl.CERT_NONE


def test_basic_auth_header_parsing_rejects_garbage() -> None:
    good = "Basic " + base64.b64encode(b"alice:pa:ss").decode()
    assert parse_basic_auth(good) == ("alice", "pa:ss")
    for bad in ("", "Bearer x", "Basic !!!", "Basic " + base64.b64encode(b"nocolon").decode(), "Basic"):
        assert parse_basic_auth(bad) is None


# ---- end to end with curl ---------------------------------------------------------------------------------

async def test_plain_tls_scrape_with_curl_presents_the_configured_certificate(
    pki: Pki, tmp_path: Path, serve: Serve
) -> None:
    srv = await serve(WebConfigManager(write(tmp_path / "web.yml", tls_yaml(pki))))
    url = f"https://127.0.0.1:{srv.port}/metrics"
    rc, out, _ = await curl("--cacert", str(pki.ca), url)
    assert rc == 0 and "gpufeed_build_info" in out
    rc, _, _err = await curl(f"http://127.0.0.1:{srv.port}/metrics")  # plain HTTP to a TLS port
    assert rc != 0
    rc, _, _ = await curl(url)  # server certificate not trusted without the CA
    assert rc == 60


async def test_mtls_requires_a_client_certificate_from_the_configured_ca(
    pki: Pki, tmp_path: Path, serve: Serve
) -> None:
    cfg = tls_yaml(pki, f"""  client_auth_type: RequireAndVerifyClientCert
      client_ca_file: {pki.ca}
      client_allowed_sans: [prometheus.example]""")
    srv = await serve(WebConfigManager(write(tmp_path / "web.yml", cfg)))
    url = f"https://127.0.0.1:{srv.port}/metrics"
    rc, _, _ = await curl("--cacert", str(pki.ca), url)
    assert rc != 0  # no client certificate: handshake refused
    rc, out, _ = await curl("--cacert", str(pki.ca), "--cert", str(pki.client_cert), "--key", str(pki.client_key), url)
    assert rc == 0 and "gpufeed_build_info" in out
    # Signed by the same CA but not an allowed SAN: the connection is closed before any response.
    rc, out, _ = await curl("--cacert", str(pki.ca), "--cert", str(pki.other_client_cert),
                            "--key", str(pki.other_client_key), url)
    assert rc != 0 and "gpufeed_build_info" not in out
    assert srv.tls_handshakes_failed == 2


async def test_basic_auth_with_curl_and_bcrypt_paid_once_per_credential(
    alice_hash: str, tmp_path: Path, serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    real = bcrypt.checkpw

    def counting(pw: bytes, h: bytes) -> bool:
        calls.append(pw)
        return real(pw, h)

    monkeypatch.setattr(bcrypt, "checkpw", counting)
    mgr = WebConfigManager(write(tmp_path / "web.yml", f"basic_auth_users:\n  alice: '{alice_hash}'\n"))
    srv = await serve(mgr)
    url = f"http://127.0.0.1:{srv.port}/metrics"
    code = ("-o", "/dev/null", "-w", "%{http_code}")
    assert (await curl(*code, url))[1] == "401"
    assert (await curl(*code, "-u", "alice:wrong", url))[1] == "401"
    assert (await curl(*code, "-u", "mallory:wonderland", url))[1] == "401"
    for _ in range(3):
        assert (await curl(*code, "-u", "alice:wonderland", url))[1] == "200"
    _rc, out, _ = await curl("-i", url)
    assert 'WWW-Authenticate: Basic realm="gpufeed"' in out
    assert (await curl(*code, f"http://127.0.0.1:{srv.port}/"))[1] == "401"  # the landing page too
    assert (await curl(*code, f"http://127.0.0.1:{srv.port}/healthz"))[1] == "200"  # probes need no password
    # wrong password, unknown user (checked against a dummy hash: same time), right password -- once each
    assert calls == [b"wrong", b"wonderland", b"wonderland"]


async def test_configured_headers_are_sent_and_rate_limit_answers_429(
    tmp_path: Path, serve: Serve
) -> None:
    cfg = """
    http_server_config:
      headers: {X-Frame-Options: deny, X-Content-Type-Options: nosniff}
    rate_limit: {interval: 1h, burst: 2}
    """
    srv = await serve(WebConfigManager(write(tmp_path / "web.yml", cfg)))
    url = f"http://127.0.0.1:{srv.port}/metrics"
    _rc, out, _ = await curl("-i", url)
    assert "X-Frame-Options: deny" in out and "X-Content-Type-Options: nosniff" in out
    codes = [(await curl("-o", "/dev/null", "-w", "%{http_code}", url))[1] for _ in range(2)]
    assert codes == ["200", "429"]


# ---- reload ----------------------------------------------------------------------------------------------------

async def test_rotated_certificate_is_served_to_new_connections_after_reload(
    pki: Pki, tmp_path: Path, serve: Serve
) -> None:
    shutil.copy(pki.server_cert, tmp_path / "tls.crt")
    shutil.copy(pki.server_key, tmp_path / "tls.key")
    mgr = WebConfigManager(write(tmp_path / "web.yml", "tls_server_config: {cert_file: tls.crt, key_file: tls.key}\n"))
    srv = await serve(mgr)
    url = f"https://127.0.0.1:{srv.port}/metrics"
    _, _out, err = await curl("-v", "--cacert", str(pki.ca), "-o", "/dev/null", url)
    assert "CN=gpufeed" in err and "gpufeed-rotated" not in err
    # cert-manager style rotation: new files in place, config file untouched -> detected by the poll
    shutil.copy(pki.server2_cert, tmp_path / "tls.crt")
    shutil.copy(pki.server2_key, tmp_path / "tls.key")
    os.utime(tmp_path / "tls.crt", ns=(1, 1))  # distinct mtime even within one clock tick
    assert mgr.changed()
    assert mgr.reload(reason="file_changed")
    rc, _, err = await curl("-v", "--cacert", str(pki.ca), "-o", "/dev/null", url)
    assert rc == 0 and "CN=gpufeed-rotated" in err


async def test_broken_reload_keeps_the_previous_config_and_logs_it(
    alice_hash: str, tmp_path: Path, serve: Serve, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path / "web.yml", f"basic_auth_users:\n  alice: '{alice_hash}'\n")
    mgr = WebConfigManager(path)
    srv = await serve(mgr)
    url = f"http://127.0.0.1:{srv.port}/metrics"
    write(path, "basic_auth_users: {alice: not-a-hash}\n")
    assert mgr.changed()
    assert not mgr.reload(reason="file_changed")
    assert not mgr.changed()  # the broken version is not retried every poll
    assert mgr.last_reload_successful is False and mgr.reloads_failed == 1
    assert (await curl("-o", "/dev/null", "-w", "%{http_code}", url))[1] == "401"
    assert (await curl("-o", "/dev/null", "-w", "%{http_code}", "-u", "alice:wonderland", url))[1] == "200"
    captured = capsys.readouterr()
    assert "web_config_reload_failed" in captured.out + captured.err
    # fixing the file restores reloads; removing the users (said so in the file) turns auth off for new requests
    write(path, "http_server_config: {headers: {X-Frame-Options: deny}}\nallow_downgrade: true\n")
    assert mgr.reload() and mgr.last_reload_successful
    assert (await curl("-o", "/dev/null", "-w", "%{http_code}", url))[1] == "200"


# ---- a reload that removes protection --------------------------------------------------------------------


def _gauges(mgr: WebConfigManager) -> dict[str, float]:
    return {f.name: f.samples[0].value for f in mgr.metrics()}


@pytest.mark.parametrize("order", ["tls_first", "users_first"])
def test_a_file_cut_at_a_section_boundary_cannot_turn_tls_or_auth_off_at_reload(
    order: str, pki: Pki, alice_hash: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # N4: config management rewriting the file line by line leaves a valid prefix: TLS without users, or users
    # without TLS. Applied, it served /metrics without auth (or passwords in clear) until the next write.
    tls = f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
    users = f"basic_auth_users:\n  alice: '{alice_hash}'\n"
    full = tls + users if order == "tls_first" else users + tls
    path = write(tmp_path / "web.yml", full)
    mgr = WebConfigManager(path)
    assert _gauges(mgr) == {"gpufeed_web_config_tls_enabled": 1.0, "gpufeed_web_config_auth_enabled": 1.0,
                            "gpufeed_web_config_last_reload_successful": 1.0}
    cut = full[: full.index("basic_auth_users:" if order == "tls_first" else "tls_server_config:")]
    write(path, cut)
    assert not mgr.reload(reason="file_changed")
    assert mgr.ssl_context() is not None and mgr.authenticates()  # the previous config stays in force
    err = capsys.readouterr()
    removed = "authentication (every user)" if order == "tls_first" else "TLS"
    assert f"would turn {removed} off" in err.out + err.err and "allow_downgrade: true" in err.out + err.err
    assert _gauges(mgr)["gpufeed_web_config_last_reload_successful"] == 0.0
    # Said explicitly, it is the operator's call: applied, and the gauges say what is in force.
    write(path, cut + "allow_downgrade: true\n")
    assert mgr.reload(reason="file_changed")
    assert _gauges(mgr) == {"gpufeed_web_config_tls_enabled": float(order == "tls_first"),
                            "gpufeed_web_config_auth_enabled": float(order == "users_first"),
                            "gpufeed_web_config_last_reload_successful": 1.0}


def test_allow_downgrade_must_be_true_or_false(tmp_path: Path) -> None:
    with pytest.raises(WebConfigError, match="allow_downgrade: must be true or false"):
        load(write(tmp_path / "web.yml", "allow_downgrade: yes please\n"))


# ---- certificate expiry --------------------------------------------------------------------------------------

def test_an_expired_or_expiring_server_certificate_is_logged_once(pki: Pki, tmp_path: Path) -> None:
    import time

    from structlog.testing import capture_logs

    path = write(tmp_path / "web.yml", tls_yaml(pki))  # the test PKI's certificates are valid for 2 days
    now = [time.time() - 30 * 86400]
    with capture_logs() as logs:
        mgr = WebConfigManager(path, wall=lambda: now[0])  # a month before: nothing to say
        mgr._check_expiry()
        now[0] = time.time()  # within a week of the end
        mgr._check_expiry()
        mgr._check_expiry()  # the watcher checks on every poll: once is enough
        now[0] = time.time() + 3 * 86400  # past it
        mgr._check_expiry()
        mgr._check_expiry()
    events = [e["event"] for e in logs]
    assert events == ["tls_certificate_expiring", "tls_certificate_expired"], events
    assert mgr.config.cert_not_after is not None and mgr.config.cert_not_after > time.time()
