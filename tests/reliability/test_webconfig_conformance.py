"""exporter-toolkit conformance of ``--web.config.file``: one row per documented field and example.

The rows come from exporter-toolkit's ``docs/web-configuration.md`` (every field it defines) and from the
configurations its own tests load (``web/testdata/*.yml`` at the toolkit's HEAD, commit 19a7c2d; each row
names its file). The certificate files those examples name (``server.crt``, ``server.key``,
``client_selfsigned.pem``) are written next to the config from this suite's test PKI, so each example is
loaded as written. A row says what the toolkit does and what gpufeed does; where they differ the row says
why (``deliberate``) -- every such difference is a refusal with a message or an HTTP/2-only concern, never a
config read differently in silence.
"""

from __future__ import annotations

import shutil
import ssl
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from exporter.webconfig import WebConfig, WebConfigError, load

from .conftest import Pki

# The toolkit's documented example hash (docs/web-configuration.md, "About bcrypt"): cost 10.
DOC_HASH = "$2y$10$X0h1gDsPszWURQaxFh.zoubFi6DXncSjhoQNJgRrnGs7EsimhC7zG"
TLS = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"


@dataclass(frozen=True)
class Row:
    source: str  # the toolkit's file or doc section the example comes from
    body: str
    toolkit_accepts: bool
    refused: str = ""  # gpufeed's error names this; empty: gpufeed accepts
    deliberate: str = ""  # why gpufeed differs from the toolkit, when it does


ROWS = [
    # ---- tls_server_config ---------------------------------------------------------------------------------
    Row("docs/web-config.yml", TLS, True),
    Row("web_config_noAuth.good.yml", TLS + "  client_auth_type: VerifyClientCertIfGiven\n", True),
    Row("tls_config_noAuth.requireandverifyclientcert.good.yml",
        TLS + "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: client_selfsigned.pem\n", True),
    Row("web_config_noAuth.good.blocking.yml (no client CA: the system roots, as Go)",
        TLS + "  client_auth_type: RequireAndVerifyClientCert\n", True),
    Row("tls_config_noAuth.requireanyclientcert.good.yml", TLS + "  client_auth_type: RequireAnyClientCert\n",
        True, refused="without verifying them",
        deliberate="accepts any client certificate unverified; the toolkit's docs call it insecure, and "
                   "Python's ssl cannot accept an unverified certificate"),
    Row("tls_config.go: RequireClientCert (alias of RequireAnyClientCert)",
        TLS + "  client_auth_type: RequireClientCert\n", True, refused="without verifying them",
        deliberate="as RequireAnyClientCert"),
    Row("web_config_noAuth_tlsInline.good.yml, and docs: client_ca inline",
        "tls_server_config:\n  cert: @server.crt@\n  key: @server.key@\n"
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca: @client_selfsigned.pem@\n", True),
    Row("docs: client_auth_type default (empty string = NoClientCert)", TLS + "  client_auth_type: ''\n", True),
    Row("web_config_auth_client_san.good.yaml",
        TLS + "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: client_selfsigned.pem\n"
        "  client_allowed_sans: [one, test3, two]\n", True),
    Row("docs: client_allowed_sans with VerifyClientCertIfGiven",
        TLS + "  client_auth_type: VerifyClientCertIfGiven\n  client_allowed_sans: [one]\n", True,
        refused="requires client_auth_type RequireAndVerifyClientCert",
        deliberate="a client that sends no certificate would skip the SAN check: refused rather than open"),
    Row("web_config_noAuth.bad.yml", TLS + "  client_ca_file: /dev/null\n", False,
        refused="client CAs configured without a client_auth_type"),
    Row("web_config_auth_clientCAs_invalid.bad.yml", TLS + "  client_ca_file: somefile\n", False,
        refused="tls_server_config.client_ca"),
    Row("web_config_noAuth_allCiphers.good.yml", TLS + "  client_auth_type: VerifyClientCertIfGiven\n"
        "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,"
        " TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,"
        " TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,"
        " TLS_AES_128_GCM_SHA256, TLS_AES_256_GCM_SHA384, TLS_CHACHA20_POLY1305_SHA256,"
        " TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA,"
        " TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA, TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA]\n", True),
    Row("web_config_noAuth_someCiphers.good.yml", TLS + "  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,"
        " TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384]\n  min_version: TLS12\n  max_version: TLS12\n", True),
    Row("web_config_noAuth_someCiphers_noOrder.good.yml", TLS + "  cipher_suites:"
        " [TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384, TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]\n"
        "  prefer_server_cipher_suites: false\n  min_version: TLS12\n  max_version: TLS12\n", True),
    Row("web_config_noAuth_inventedCiphers.bad.yml",
        TLS + "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA2048]\n", False, refused="cipher_suites"),
    Row("web_config_noAuth_allCurves.good.yml",
        TLS + "  curve_preferences: [CurveP256, CurveP384, CurveP521, X25519]\n", True),
    Row("web_config_noAuth_someCurves.good.yml", TLS + "  min_version: TLS13\n  curve_preferences: [CurveP521]\n",
        True),
    Row("web_config_noAuth_inventedCurves.bad.yml", TLS + "  curve_preferences: [CurveP257]\n", False,
        refused="curve_preferences"),
    Row("web_config_noAuth_wrongTLSVersion.bad.yml", TLS + "  min_version: TLS111\n", False,
        refused="min_version"),
    Row("docs: min_version / max_version", TLS + "  min_version: TLS10\n  max_version: TLS11\n", True),
    Row("web_config_noAuth_certPath_empty.bad.yml", "tls_server_config: {cert_file: '', key_file: server.key}\n",
        False, refused="cert_file"),
    Row("web_config_noAuth_keyPath_empty.bad.yml", "tls_server_config: {cert_file: server.crt, key_file: ''}\n",
        False, refused="key_file"),
    Row("web_config_noAuth_certPath_keyPath_empty.bad.yml",
        "tls_server_config: {cert_file: '', key_file: '', client_auth_type: x}\n", False, refused="cert_file"),
    Row("web_config_noAuth_certPath_invalid.bad.yml",
        "tls_server_config: {cert_file: somefile, key_file: server.key}\n", False, refused="no such file"),
    Row("web_config_noAuth_keyPath_invalid.bad.yml",
        "tls_server_config: {cert_file: server.cert, key_file: somefile}\n", False, refused="no such file"),
    Row("web_config_noAuth_cert_empty.bad.yml", "tls_server_config: {cert: '', key_file: server.key}\n", False,
        refused="cert_file"),
    Row("web_config_noAuth_key_empty.bad.yml", "tls_server_config: {cert_file: server.crt, key: ''}\n", False,
        refused="key_file"),
    Row("web_config_junk_key.yml", "tls_server_config:\n  cert_filse: server.crt\n", False,
        refused="cert_filse: unknown key"),
    Row("web_config_junk.yml", "hWkNKCp3fvIx3jKnsaBI\nTuEjdwNS8A2vYdFbiKqr\n", False, refused="must be a mapping"),
    Row("web_config_empty.yml", "", True, refused="empty: it would turn TLS and authentication off",
        deliberate="a file truncated while being rewritten would silently serve without TLS or auth: fail closed"),
    # ---- http_server_config --------------------------------------------------------------------------------
    Row("web_config_noAuth_noHTTP2.good.yml", TLS + "  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384]\n"
        "  max_version: TLS12\nhttp_server_config:\n  http2: false\n", True),
    Row("web_config_noAuth_noHTTP2Cipher.bad.yml (HTTP/2 forbids the suite; a handshake failure in Go)",
        TLS + "  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384]\n  max_version: TLS12\n", False,
        deliberate="gpufeed speaks HTTP/1.1 only, so HTTP/2's cipher rules do not apply"),
    Row("web_config_headers.good.yml", "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
        "    Strict-Transport-Security: max-age=31536000; includeSubDomains\n    X-Content-Type-Options: nosniff\n"
        "    X-XSS-Protection: 1\n    Content-Security-Policy: \"default-src 'self' *.test.example.net\"\n", True),
    Row("web_config_headers_content_type_options.bad.yml",
        "http_server_config: {headers: {X-Content-Type-Options: sniff}}\n", False, refused="invalid value 'sniff'"),
    Row("web_config_headers_extra_header.bad.yml", "http_server_config: {headers: {Content-Type: foo}}\n", False,
        refused="headers.Content-Type: header cannot be configured"),
    Row("web_config_headers_frame_options.bad.yml", "http_server_config: {headers: {X-Frame-Options: foo}}\n",
        False, refused="invalid value 'foo'"),
    Row("docs: headers, 'Unset if blank'", "http_server_config: {headers: {Content-Security-Policy: ''}}\n", True),
    # ---- basic_auth_users ----------------------------------------------------------------------------------
    Row("web_config_users.good.yml (with the docs' example hash)", TLS + f"basic_auth_users:\n  alice: {DOC_HASH}\n"
        f"  carol: {DOC_HASH}\n", True),
    Row("web_config_users_noTLS.good.yml", "basic_auth_users:\n", True, refused="basic_auth_users: empty",
        deliberate="an empty user list (a truncated file?) would turn authentication off: fail closed"),
    Row("web_config_auth_user_list_invalid.bad.yml", TLS + "basic_auth_users:\n  john: doe\n", False,
        refused="basic_auth_users.john: not a bcrypt hash"),
    # ---- rate_limit ----------------------------------------------------------------------------------------
    Row("web_config_rate_limiter_nonblocking.yaml (interval 0: off)", "rate_limit: {interval: 0, burst: 0}\n", True),
    Row("docs: rate_limit.interval 0 with a burst", "rate_limit: {interval: 0s, burst: 10}\n", True),
    Row("docs: rate_limit without an interval (Go's zero value: off)", "rate_limit: {burst: 10}\n", True),
    Row("docs: rate_limit.interval as a Go duration", "rate_limit: {interval: 1m30s, burst: 3}\n", True),
    Row("web_config_rate_limiter_one_second.yaml (burst 0: every request 429)",
        "rate_limit: {interval: '1s', burst: 0}\n", True, refused="rate_limit.burst: must be at least 1",
        deliberate="a bucket that never holds a token refuses every scrape: a start-up error instead"),
    Row("docs: rate_limit.interval without a unit (Go reads nanoseconds)", "rate_limit: {interval: 1, burst: 3}\n",
        True, refused="rate_limit.interval: 1 has no unit",
        deliberate="Go's YAML decoder reads a bare 1 as 1 ns (no limit at all); a reader expects a second"),
]


@pytest.fixture
def config_dir(pki: Pki, tmp_path: Path) -> Path:
    """A directory with the files the toolkit's examples name, from this suite's PKI."""
    shutil.copy(pki.server_cert, tmp_path / "server.crt")
    shutil.copy(pki.server_key, tmp_path / "server.key")
    shutil.copy(pki.ca, tmp_path / "client_selfsigned.pem")
    return tmp_path


def _load(config_dir: Path, body: str) -> WebConfig:
    """Load ``body`` as web.yml in ``config_dir``; ``@name@`` is the file's PEM text inline (a block scalar)."""
    for f in config_dir.iterdir():
        if f"@{f.name}@" in body:
            block = "|\n" + textwrap.indent(f.read_text(), "    ")
            body = body.replace(f"@{f.name}@", block.rstrip("\n"))
    path = config_dir / "web.yml"
    path.write_text(textwrap.dedent(body))
    return load(path)


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")  # the toolkit still offers TLS10/11
@pytest.mark.parametrize("row", ROWS, ids=[r.source.split(" ")[0] for r in ROWS])
def test_exporter_toolkit_example_is_read_as_the_toolkit_reads_it_or_refused_with_the_reason(
    config_dir: Path, row: Row
) -> None:
    # A row differs from the toolkit exactly when it says why.
    differs = row.toolkit_accepts != (not row.refused)
    assert differs == bool(row.deliberate), row
    if row.refused:
        with pytest.raises(WebConfigError) as e:
            _load(config_dir, row.body)
        assert row.refused in str(e.value), str(e.value)
    else:
        _load(config_dir, row.body)


def test_every_field_exporter_toolkit_documents_has_a_row() -> None:
    fields = ("cert:", "key:", "client_ca:", "cert_file", "key_file", "client_auth_type", "client_ca_file",
              "client_allowed_sans", "min_version", "max_version", "cipher_suites", "prefer_server_cipher_suites",
              "curve_preferences", "http2", "Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options",
              "X-XSS-Protection", "Strict-Transport-Security", "basic_auth_users", "interval", "burst")
    bodies = " ".join(r.body for r in ROWS)
    assert [f for f in fields if f not in bodies] == []


def test_rate_limit_interval_zero_or_absent_turns_the_limiter_off(config_dir: Path) -> None:
    for body in ("rate_limit: {interval: 0, burst: 0}\n", "rate_limit: {interval: 0s, burst: 10}\n",
                 "rate_limit: {burst: 10}\n", "rate_limit: {interval: '0', burst: 5}\n"):
        assert _load(config_dir, body).rate_limit is None, body


def test_rate_limit_interval_takes_go_style_durations(config_dir: Path) -> None:
    rl = _load(config_dir, "rate_limit: {interval: 1m30s, burst: 3}\n").rate_limit
    assert rl is not None and rl.interval == 90.0 and rl.burst == 3
    rl = _load(config_dir, "rate_limit: {interval: 1.5h, burst: 1}\n").rate_limit
    assert rl is not None and rl.interval == 5400.0


def test_headers_take_numbers_as_their_text_and_blank_values_are_not_sent(config_dir: Path) -> None:
    cfg = _load(config_dir, "http_server_config:\n  headers:\n    X-XSS-Protection: 1\n"
                            "    Content-Security-Policy: ''\n    X-Frame-Options: ''\n")
    assert dict(cfg.headers) == {"X-XSS-Protection": "1"}


def test_toolkit_defaults_tls12_to_tls13_server_cipher_preference_and_no_client_certificate(
    config_dir: Path,
) -> None:
    ctx = _load(config_dir, TLS).ssl_context
    assert ctx is not None
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2 and ctx.maximum_version == ssl.TLSVersion.TLSv1_3
    assert ctx.options & ssl.OP_CIPHER_SERVER_PREFERENCE
    assert ctx.verify_mode == ssl.CERT_NONE
    ctx = _load(config_dir, TLS + "  prefer_server_cipher_suites: false\n").ssl_context
    assert ctx is not None and not ctx.options & ssl.OP_CIPHER_SERVER_PREFERENCE
