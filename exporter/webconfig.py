"""``--web.config.file``: TLS, mutual TLS, basic auth, response headers and a rate limit, in the
exporter-toolkit format that node_exporter, Prometheus and Alertmanager users already know.

The file is parsed and every referenced certificate is loaded into an :class:`ssl.SSLContext` before a
config is accepted, so a bad file is reported (naming the key) at start -- exit 2 -- and at reload the
old config stays in force. :class:`WebConfigManager` re-reads the file when it or any file it names
(certificates rotate) changes, polled every few seconds, and on SIGHUP. New settings apply to new
connections: the web server asks for the current TLS context per accepted connection.

Security fails closed (DESIGN.md): an empty, comment-only or truncated file is refused at start (exit 2) and
at reload (the previous config stays); files are read through :mod:`exporter.yamlsafe` (bounded). A valid file
that would turn TLS off or remove every user at reload -- what a file cut at a section boundary while being
rewritten looks like -- is refused too, unless it says ``allow_downgrade: true`` (gpufeed's one key beyond
exporter-toolkit's). The config in force is exported (:meth:`WebConfigManager.metrics`) for alerts.

Basic auth follows exporter-toolkit's handler: the username lookup does not leak which users exist
(every configured name is compared with :func:`hmac.compare_digest`, an unknown user is checked
against a dummy hash of the highest cost, a cheaper user's check is padded to that cost's time), bcrypt
runs in one worker thread (it is CPU heavy: cost 10 is ~60 ms) that serves the newest request first, and
outcomes are cached keyed by a SHA-256 of user + stored hash + password -- verified ones apart from refused
ones, so a flood of wrong passwords cannot evict a scraper's entry -- so a scraper pays bcrypt once, not on
every scrape, and a reload that changes a hash invalidates its entries. None of it holds a request slot:
the web server asks before taking one.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import ipaddress
import os
import re
import secrets
import ssl
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import bcrypt
from prometheus_client.core import GaugeMetricFamily, Metric

from exporter import log, yamlsafe
from exporter.durations import parse_duration
from exporter.web import Auth

_log = log.get_logger(component="webconfig")

POLL_INTERVAL = 3.0
AUTH_CACHE_SIZE = 100  # verified credentials (only successes: a wrong password can never evict one)
AUTH_FAILED_CACHE_SIZE = 1000  # refused credentials, so a client retrying one wrong password pays bcrypt once
# bcrypt checks waiting for the one bcrypt thread. The newest is served first (adaptive LIFO: under a flood a
# new request -- a scraper's first -- waits for about one check, not for the whole queue); when the queue is
# full the oldest waiter is answered 503 (its client has likely given up). A cached credential never waits.
AUTH_MAX_PENDING = 64
# htpasswd's own ceiling (htpasswd -C: 4-17). Cost 17 is ~8 s per check on a busy core; 31 would be days.
BCRYPT_MAX_COST = 17
MAX_BURST = 1_000_000
EXPIRY_WARNING_SECONDS = 7 * 86400.0

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}

# Go crypto/tls client auth policies -> (verify_mode). Go's RequestClientCert and RequireAnyClientCert ask for a
# certificate without verifying it; OpenSSL through Python cannot accept an unverified certificate, and the
# exporter-toolkit docs call those values insecure, so they are refused with a hint instead of silently changed.
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")

# Go cipher suite names (crypto/tls cipher_suites.go) -> OpenSSL names. TLS 1.3 suites are not configurable
# in Go either; they are accepted and ignored.
CIPHER_SUITES = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
TLS13_SUITES = ("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256")
CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1", "X25519": "X25519"}

# Like exporter-toolkit: only these headers may be set, some only to fixed values.
ALLOWED_HEADERS: Mapping[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}

_BCRYPT = re.compile(r"^\$2[abxy]?\$(\d\d)\$[./A-Za-z0-9]{53}$")
_BCRYPT_ALPHABET = "./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_SECTIONS = ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit")
# gpufeed's own key: a reload may turn TLS off or remove every user only when the new file says so.
ALLOW_DOWNGRADE = "allow_downgrade"
_TOP_KEYS = (*_SECTIONS, ALLOW_DOWNGRADE)
_TLS_KEYS = (
    "cert_file", "key_file", "cert", "key", "client_auth_type", "client_ca_file", "client_ca",
    "client_allowed_sans", "min_version", "max_version", "cipher_suites", "prefer_server_cipher_suites",
    "curve_preferences",
)


class WebConfigError(Exception):
    """The web config file is invalid; the message names the file and the key."""


@dataclass(frozen=True)
class RateLimit:
    """``rate_limit``: one request per ``interval`` seconds on average, bursts of ``burst``."""

    interval: float
    burst: int


@dataclass(frozen=True)
class WebConfig:
    """One accepted web configuration (immutable; a reload builds a new one)."""

    ssl_context: ssl.SSLContext | None = None
    client_allowed_sans: tuple[str, ...] = ()
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    users: Mapping[str, bytes] = field(default_factory=lambda: MappingProxyType({}))
    rate_limit: RateLimit | None = None
    watched: tuple[Path, ...] = ()
    dummy_hash: bytes = b""  # the users' highest cost: unknown users pay the same bcrypt time
    cert_not_after: float | None = None  # Unix time the server certificate expires
    allow_downgrade: bool = False  # a reload to this config may turn TLS off or remove every user

    @property
    def max_cost(self) -> int:
        """The highest bcrypt cost among the users (0 without users)."""
        return max((_cost(h) for h in self.users.values()), default=0)


def _mapping(value: object, key: str, allowed: tuple[str, ...] | None = None) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise WebConfigError(f"{key}: must be a mapping, not {type(value).__name__}")
    for k in value:
        if not isinstance(k, str):
            raise WebConfigError(f"{key}: keys must be strings, not {k!r}")
        if allowed is not None and k not in allowed:
            raise WebConfigError(f"{key}.{k}: unknown key (known: {', '.join(allowed)})")
    return value


def _str(value: object, key: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise WebConfigError(f"{key}: must be a string, not {type(value).__name__}")
    return value


def _str_list(value: object, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise WebConfigError(f"{key}: must be a list of strings")
    return tuple(value)


def _pem_file(inline: str, key: str) -> tuple[str, Callable[[], None]]:
    """A path OpenSSL can read for inline PEM text, backed by an anonymous memfd (nothing touches the disk)."""
    fd = os.memfd_create(f"gpufeed-{key}", os.MFD_CLOEXEC)
    os.write(fd, inline.encode())

    def close() -> None:
        os.close(fd)

    return f"/proc/self/fd/{fd}", close


def _not_after(cert_path: str) -> float | None:
    """Unix time the (first) server certificate in ``cert_path`` expires; None when it cannot be decoded.

    The ssl module loads a chain without exposing it; ``_test_decode_cert`` is CPython's own PEM decoder (used
    by its test suite and present since Python 2.7), so it is called defensively.
    """
    decode = getattr(getattr(ssl, "_ssl", None), "_test_decode_cert", None)
    if decode is None:  # pragma: no cover - every CPython has it
        return None
    try:
        return float(ssl.cert_time_to_seconds(decode(cert_path)["notAfter"]))
    except (ssl.SSLError, OSError, KeyError, ValueError):
        return None


def _tls(
    section: Mapping[str, Any], base: Path
) -> tuple[ssl.SSLContext, tuple[str, ...], tuple[Path, ...], float | None]:
    """``tls_server_config`` -> a server SSLContext, the allowed client SANs, the files to watch and the server
    certificate's expiry (Unix time)."""
    k = "tls_server_config"
    opts = {name: section.get(name) for name in _TLS_KEYS}
    cert_file, key_file = _str(opts["cert_file"], f"{k}.cert_file"), _str(opts["key_file"], f"{k}.key_file")
    cert, key = _str(opts["cert"], f"{k}.cert"), _str(opts["key"], f"{k}.key")
    if cert_file and cert:
        raise WebConfigError(f"{k}: cert_file and cert are mutually exclusive")
    if key_file and key:
        raise WebConfigError(f"{k}: key_file and key are mutually exclusive")
    if not (cert_file or cert):
        raise WebConfigError(f"{k}.cert_file: missing (a certificate is required for TLS)")
    if not (key_file or key):
        raise WebConfigError(f"{k}.key_file: missing (a private key is required for TLS)")
    watched: list[Path] = []

    def resolve(name: str, value: str) -> str:
        p = Path(value)
        p = p if p.is_absolute() else base / p
        if not p.is_file():
            raise WebConfigError(f"{k}.{name}: {p}: no such file")
        watched.append(p)
        return str(p)

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    closers: list[Callable[[], None]] = []
    try:
        cpath = resolve("cert_file", cert_file) if cert_file else None
        kpath = resolve("key_file", key_file) if key_file else None
        if cpath is None:
            cpath, close = _pem_file(cert, "cert")
            closers.append(close)
        if kpath is None:
            kpath, close = _pem_file(key, "key")
            closers.append(close)
        try:
            ctx.load_cert_chain(cpath, kpath)
        except (ssl.SSLError, OSError) as e:
            raise WebConfigError(f"{k}.cert_file/key_file: cannot load certificate and key: {e}") from e
        not_after = _not_after(cpath)
    finally:
        for closer in closers:
            closer()

    auth = _str(opts["client_auth_type"], f"{k}.client_auth_type") or "NoClientCert"
    if auth in UNVERIFIED_CLIENT_AUTH:
        raise WebConfigError(
            f"{k}.client_auth_type: {auth} accepts client certificates without verifying them and is not "
            "supported; use VerifyClientCertIfGiven or RequireAndVerifyClientCert with client_ca_file"
        )
    if auth not in CLIENT_AUTH:
        raise WebConfigError(f"{k}.client_auth_type: invalid {auth!r} (one of: {', '.join(CLIENT_AUTH)})")
    ca_file = _str(opts["client_ca_file"], f"{k}.client_ca_file")
    ca = _str(opts["client_ca"], f"{k}.client_ca")
    if ca_file and ca:
        raise WebConfigError(f"{k}: client_ca_file and client_ca are mutually exclusive")
    if (ca_file or ca) and auth == "NoClientCert":
        raise WebConfigError(f"{k}.client_ca_file: client CAs configured without a client_auth_type")
    try:
        if ca_file:
            ctx.load_verify_locations(cafile=resolve("client_ca_file", ca_file))
        elif ca:
            ctx.load_verify_locations(cadata=ca)
        elif auth != "NoClientCert":
            # Go verifies against the system roots when no client CA is given; do the same.
            ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    except (ssl.SSLError, OSError, ValueError) as e:
        raise WebConfigError(f"{k}.client_ca_file: cannot load CA certificates: {e}") from e
    ctx.verify_mode = CLIENT_AUTH[auth]
    sans = _str_list(opts["client_allowed_sans"], f"{k}.client_allowed_sans")
    if sans and auth != "RequireAndVerifyClientCert":
        raise WebConfigError(f"{k}.client_allowed_sans: requires client_auth_type RequireAndVerifyClientCert")

    versions = {}
    for name, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        v = _str(opts[name], f"{k}.{name}") or default
        if v not in TLS_VERSIONS:
            raise WebConfigError(f"{k}.{name}: invalid {v!r} (one of: {', '.join(TLS_VERSIONS)})")
        versions[name] = TLS_VERSIONS[v]
    if versions["min_version"] > versions["max_version"]:
        raise WebConfigError(f"{k}.min_version: higher than max_version")
    try:
        ctx.minimum_version = versions["min_version"]
        ctx.maximum_version = versions["max_version"]
    except (ValueError, ssl.SSLError) as e:  # pragma: no cover - depends on the OpenSSL build
        raise WebConfigError(f"{k}.min_version: not supported by this OpenSSL: {e}") from e

    suites = _str_list(opts["cipher_suites"], f"{k}.cipher_suites")
    if suites:
        names = []
        for s in suites:
            if s in TLS13_SUITES:
                continue
            if s not in CIPHER_SUITES:
                raise WebConfigError(f"{k}.cipher_suites: unknown or unsupported suite {s!r}")
            names.append(CIPHER_SUITES[s])
        if names:
            try:
                ctx.set_ciphers(":".join(names))
            except ssl.SSLError as e:
                raise WebConfigError(f"{k}.cipher_suites: none usable with this OpenSSL: {e}") from e
    prefer = opts["prefer_server_cipher_suites"]
    if prefer is not None and not isinstance(prefer, bool):
        raise WebConfigError(f"{k}.prefer_server_cipher_suites: must be true or false")
    # Python's server contexts start with the server's preference on: false has to clear it.
    if prefer is False:
        ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    curves = _str_list(opts["curve_preferences"], f"{k}.curve_preferences")
    for curve in curves:
        if curve not in CURVES:
            raise WebConfigError(f"{k}.curve_preferences: unknown curve {curve!r} (one of: {', '.join(CURVES)})")
    if curves:
        # Python's ssl module sets one ECDH curve: the first preference.
        ctx.set_ecdh_curve(CURVES[curves[0]])
    return ctx, sans, tuple(watched), not_after


def _cost(h: bytes) -> int:
    """The cost field of a modular-crypt bcrypt hash (``$2y$10$...`` -> 10)."""
    return int(h.split(b"$")[2])


def _rate_limit(section: Mapping[str, Any]) -> RateLimit | None:
    """``rate_limit`` as exporter-toolkit reads it: ``interval`` is a Go duration (``1m30s``), and 0 -- or no
    interval at all, Go's zero value -- turns the limiter off, whatever ``burst`` says.

    Two deliberate differences, both refusals with a message rather than silent surprises: a bare non-zero
    number (Go's YAML decoder reads ``interval: 1`` as one *nanosecond*, so a limit that never limits; a
    reader of the file would expect a second), and ``burst`` below 1 with the limiter on (a token bucket
    that never holds a token answers 429 to every request).
    """
    burst = section.get("burst", 0)
    if isinstance(burst, bool) or not isinstance(burst, int) or not 0 <= burst <= MAX_BURST:
        raise WebConfigError(f"rate_limit.burst: must be an integer from 0 to {MAX_BURST}, not {burst!r}")
    value = section.get("interval", 0)
    if isinstance(value, int | float) and not isinstance(value, bool) and value != 0:
        raise WebConfigError(
            f"rate_limit.interval: {value!r} has no unit (exporter-toolkit would read it as nanoseconds); "
            f"write one, e.g. {value}s or 500ms"
        )
    try:
        interval = parse_duration(value, allow_zero=True)
    except ValueError as e:
        raise WebConfigError(f"rate_limit.interval: {e}") from None
    if interval == 0:
        return None
    if burst < 1:
        raise WebConfigError(f"rate_limit.burst: must be at least 1 while the limiter is on, not {burst!r} "
                             "(a burst of 0 refuses every request; interval: 0 turns the limiter off)")
    return RateLimit(interval=interval, burst=burst)


def _header_value(value: object, key: str) -> str:
    """A header value as Go's YAML decoder gives it to a string field: a number is its text
    (exporter-toolkit's own example sets ``X-XSS-Protection: 1``)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return _str(value, key)


def _users(section: Mapping[str, Any]) -> Mapping[str, bytes]:
    out: dict[str, bytes] = {}
    for user, h in section.items():
        if not isinstance(h, str) or not _BCRYPT.match(h):
            raise WebConfigError(
                f"basic_auth_users.{user}: not a bcrypt hash (generate one with: htpasswd -nBC 10 '' | tr -d ':\\n')"
            )
        cost = _cost(h.encode())
        if not 4 <= cost <= BCRYPT_MAX_COST:
            raise WebConfigError(
                f"basic_auth_users.{user}: bcrypt cost {cost} out of range 4-{BCRYPT_MAX_COST} (htpasswd's range; "
                f"each new credential costs 2^cost rounds of CPU: cost 10 is ~60 ms, 17 ~8 s)"
            )
        if ":" in user:
            raise WebConfigError(f"basic_auth_users.{user}: user names cannot contain ':'")
        out[user] = h.encode()
    return MappingProxyType(out)


def dummy_hash(cost: int) -> bytes:
    """A well-formed bcrypt hash of the given cost that no password matches, made without hashing anything.

    An unknown user is checked against it so that the answer takes as long as for a real user. Built from a
    fresh salt and 31 random characters, it costs nothing to make: hashing a random password instead (as
    before) ran bcrypt at the users' cost on the reloading thread, and a cost-16 user stalled sampling 3.5 s.
    """
    tail = "".join(secrets.choice(_BCRYPT_ALPHABET) for _ in range(31))
    return bcrypt.gensalt(cost) + tail.encode()


def parse(data: object, base: Path) -> WebConfig:
    """Validate parsed YAML and build a :class:`WebConfig`; relative paths are relative to ``base``.

    Fails closed: an empty document, or a top-level section present but empty (``tls_server_config:`` with
    nothing under it, what a file truncated mid-rewrite looks like), is an error, never "no TLS, no auth".
    """
    if data is None or data == {}:
        raise WebConfigError(
            "empty: it would turn TLS and authentication off (a file truncated while being rewritten?); "
            "to serve without them, do not pass --web.config.file"
        )
    top = _mapping(data, "web config", _TOP_KEYS)
    for key in _SECTIONS:
        if key in top and not top[key]:
            raise WebConfigError(f"{key}: empty (a truncated file?); remove the key or configure it")
    ctx: ssl.SSLContext | None = None
    sans: tuple[str, ...] = ()
    watched: tuple[Path, ...] = ()
    not_after: float | None = None
    tls = _mapping(top.get("tls_server_config"), "tls_server_config", _TLS_KEYS)
    if tls:
        ctx, sans, watched, not_after = _tls(tls, base)
    http = _mapping(top.get("http_server_config"), "http_server_config", ("http2", "headers"))
    if http.get("http2") is not None and not isinstance(http.get("http2"), bool):
        raise WebConfigError("http_server_config.http2: must be true or false")
    headers: dict[str, str] = {}
    for name, value in _mapping(http.get("headers"), "http_server_config.headers").items():
        if name not in ALLOWED_HEADERS:
            raise WebConfigError(
                f"http_server_config.headers.{name}: header cannot be configured "
                f"(allowed: {', '.join(ALLOWED_HEADERS)})"
            )
        v = _header_value(value, f"http_server_config.headers.{name}")
        if not v:
            continue  # "Unset if blank" (exporter-toolkit docs/web-configuration.md, for each of the five)
        if ALLOWED_HEADERS[name] and v not in ALLOWED_HEADERS[name]:
            raise WebConfigError(
                f"http_server_config.headers.{name}: invalid value {v!r} (one of: {', '.join(ALLOWED_HEADERS[name])})"
            )
        if "\r" in v or "\n" in v:
            raise WebConfigError(f"http_server_config.headers.{name}: value contains a line break")
        headers[name] = v
    users = _users(_mapping(top.get("basic_auth_users"), "basic_auth_users"))
    rate = _rate_limit(_mapping(top.get("rate_limit"), "rate_limit", ("interval", "burst")))
    costs = sorted({_cost(h) for h in users.values()})
    allow_downgrade = top.get(ALLOW_DOWNGRADE, False)
    if not isinstance(allow_downgrade, bool):
        raise WebConfigError(f"{ALLOW_DOWNGRADE}: must be true or false")
    return WebConfig(
        ssl_context=ctx, client_allowed_sans=sans, headers=MappingProxyType(headers), users=users,
        rate_limit=rate, watched=watched, dummy_hash=dummy_hash(costs[-1]) if costs else b"",
        cert_not_after=not_after, allow_downgrade=allow_downgrade,
    )


def _check_downgrade(old: WebConfig, new: WebConfig) -> None:
    """A reload that turns TLS off or removes every user needs ``allow_downgrade: true`` in the new file."""
    if new.allow_downgrade:
        return
    lost = [what for what, was, now in (("TLS", old.ssl_context is not None, new.ssl_context is not None),
                                        ("authentication (every user)", bool(old.users), bool(new.users)))
            if was and not now]
    if lost:
        raise WebConfigError(
            f"would turn {' and '.join(lost)} off (a file cut while being rewritten?); "
            f"to do that, say {ALLOW_DOWNGRADE}: true in the file"
        )


def load(path: Path) -> WebConfig:
    """Read, validate and build the config at ``path``; WebConfigError naming the file and key otherwise.

    Read through :mod:`exporter.yamlsafe` (size, nesting and numbers bounded; duplicate keys refused).
    """
    try:
        data = yamlsafe.load(path)
    except yamlsafe.YamlError as e:
        raise WebConfigError(f"web config file {path}: {e}") from e
    try:
        return parse(data, path.parent)
    except WebConfigError as e:
        raise WebConfigError(f"web config file {path}: {e}") from e


def parse_basic_auth(header: str) -> tuple[str, str] | None:
    """``Basic base64(user:pass)`` -> (user, pass); None for anything else."""
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        raw = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    user, sep, password = raw.partition(":")
    return (user, password) if sep else None


def san_allowed(peercert: Mapping[str, Any] | None, allowed: tuple[str, ...]) -> bool:
    """Whether a verified client certificate carries one of the allowed SANs (DNS, IP, e-mail or URI)."""
    if not allowed:
        return True
    if not peercert:
        return False
    want = set(allowed)
    for kind, value in peercert.get("subjectAltName", ()):
        if kind == "IP Address":
            if value in want or any(_same_ip(value.strip(), a) for a in want):
                return True
        elif value in want:
            return True
    return False


def _same_ip(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return False


class _TokenBucket:
    """Token bucket like golang.org/x/time/rate: ``burst`` tokens, one more every ``interval`` seconds."""

    def __init__(self, limit: RateLimit, clock: Callable[[], float]) -> None:
        self.limit = limit
        self.clock = clock
        self.tokens = float(limit.burst)
        self.t = clock()

    def allow(self) -> bool:
        now = self.clock()
        self.tokens = min(float(self.limit.burst), self.tokens + (now - self.t) / self.limit.interval)
        self.t = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class WebConfigManager:
    """The live web config: answers the web server's TLS, auth, header and rate questions; reloads safely.

    Basic auth never holds a request slot (the web server asks before taking one) and cannot be used to push
    valid credentials out: verified credentials are cached apart from refused ones, so a flood of wrong
    passwords only churns the cache of refusals. Uncached checks queue for the one bcrypt thread, newest first,
    at most ``AUTH_MAX_PENDING`` waiting (the oldest gets :attr:`Auth.BUSY`, a 503). When users have different
    costs, a check against a cheaper hash is padded to the time of the most expensive one, so timing does not
    tell which users exist (an unknown user is checked against a dummy hash of the highest cost).
    """

    def __init__(
        self, path: Path | None, *, clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,  # wall clock: certificate validity is calendar time
    ) -> None:
        self.path = path
        self.clock = clock
        self.wall = wall
        self.config = load(path) if path is not None else WebConfig()
        self.reloads_failed = 0
        self.reloads_ok = 0
        self.auth_busy = 0
        self.last_reload_successful = True
        self._stamp = self._stamps()
        self._bucket = _TokenBucket(self.config.rate_limit, clock) if self.config.rate_limit else None
        self._verified: OrderedDict[bytes, None] = OrderedDict()
        self._refused: OrderedDict[bytes, None] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._reload_lock = threading.Lock()
        # One thread for bcrypt, created on first need: bounded, and never the event loop's default pool.
        self._bcrypt = _BcryptLane()
        self._expiry_warned: float | None = None
        self._check_expiry()

    # ---- reload ----------------------------------------------------------------------------------------

    def _stamps(self) -> tuple[tuple[str, int, int, int], ...]:
        if self.path is None:
            return ()
        out = []
        for p in (self.path, *self.config.watched):
            try:
                st = p.stat()
                out.append((str(p), st.st_mtime_ns, st.st_size, st.st_ino))
            except OSError:
                out.append((str(p), -1, -1, -1))
        return tuple(out)

    def reload(self, reason: str = "sighup") -> bool:
        """Re-read the file; on error keep the current config, log and return False.

        Blocking (file reads, certificate loading): the daemon calls it from a worker thread, never on the
        loop that schedules the samplers.
        """
        if self.path is None:
            return True
        with self._reload_lock:
            try:
                new = load(self.path)
                _check_downgrade(self.config, new)
            except WebConfigError as e:
                self.reloads_failed += 1
                self.last_reload_successful = False
                self._stamp = self._stamps()  # do not retry the same broken file every poll
                _log.error("web_config_reload_failed", reason=reason, error=str(e), note="keeping previous config")
                return False
            old = self.config
            self.config = new
            self._stamp = self._stamps()
            if new.rate_limit != old.rate_limit:
                self._bucket = _TokenBucket(new.rate_limit, self.clock) if new.rate_limit else None
            self.reloads_ok += 1
            self.last_reload_successful = True
            _log.info(
                "web_config_reloaded", reason=reason, tls=new.ssl_context is not None, users=len(new.users),
                mtls=bool(new.ssl_context and new.ssl_context.verify_mode == ssl.CERT_REQUIRED),
            )
            # Asked for in the file (allow_downgrade: true): the operator's call, but never a quiet one.
            if old.ssl_context is not None and new.ssl_context is None:
                _log.warning("web_config_tls_turned_off", reason=reason, note="new connections are plain HTTP")
            if old.users and not new.users:
                _log.warning("web_config_auth_turned_off", reason=reason, note="requests are no longer authenticated")
            self._expiry_warned = None
            self._check_expiry()
            return True

    def metrics(self) -> list[Metric]:
        """The config in force, for alerts: TLS on, auth on, the last reload applied (1) or refused (0)."""
        out: list[Metric] = []
        for name, value, text in (
            ("tls_enabled", self.config.ssl_context is not None, "Whether TLS is on in the web config in force."),
            ("auth_enabled", bool(self.config.users), "Whether basic auth is on in the web config in force."),
            ("last_reload_successful", self.last_reload_successful,
             "Whether the last reload of --web.config.file was applied (0: refused, the previous config is in force)."),
        ):
            fam = GaugeMetricFamily(f"gpufeed_web_config_{name}", text)
            fam.add_metric([], float(value))
            out.append(fam)
        return out

    def changed(self) -> bool:
        """Whether the file or a file it names changed since the last (attempted) load."""
        return self.path is not None and self._stamps() != self._stamp

    async def watch(self, interval: float = POLL_INTERVAL) -> None:
        """Poll for changes forever (cancel to stop). stat() and the reload run in a worker thread; an error
        in one round is logged and the next round runs (a dead watcher would miss every later rotation)."""
        failing = False
        while True:
            await asyncio.sleep(interval)
            try:
                if await asyncio.to_thread(self.changed):
                    await asyncio.to_thread(self.reload, "file_changed")
                self._check_expiry()
                failing = False
            except Exception as e:
                if not failing:
                    _log.error("web_config_watch_failed", error=repr(e), exc_info=e, note="retrying every poll")
                failing = True

    def _check_expiry(self) -> None:
        """Warn (once per state) when the served certificate has expired or expires within a week."""
        not_after = self.config.cert_not_after
        if not_after is None:
            return
        left = not_after - self.wall()
        state = 0.0 if left <= 0 else (1.0 if left <= EXPIRY_WARNING_SECONDS else None)
        if state is None or state == self._expiry_warned:
            return
        self._expiry_warned = state
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(not_after))
        if left <= 0:
            _log.warning("tls_certificate_expired", not_after=when, note="clients verifying it will refuse it")
        else:
            _log.warning("tls_certificate_expiring", not_after=when, days_left=round(left / 86400, 1))

    # ---- questions from the web server ---------------------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context new connections get (None: plain HTTP)."""
        return self.config.ssl_context

    def peer_allowed(self, peercert: Mapping[str, Any] | None) -> bool:
        """``client_allowed_sans`` check on a verified client certificate."""
        return san_allowed(peercert, self.config.client_allowed_sans)

    def headers(self) -> Mapping[str, str]:
        """Extra response headers (``http_server_config.headers``)."""
        return self.config.headers

    def authenticates(self) -> bool:
        """Whether requests need basic auth (the rate limit then counts authenticated requests only)."""
        return bool(self.config.users)

    def allow(self) -> bool:
        """Rate limit: False means answer 429."""
        return self._bucket is None or self._bucket.allow()

    async def authorize(self, headers: Mapping[str, str]) -> Auth:
        """Basic auth against ``basic_auth_users``; OK when no users are configured."""
        config = self.config
        users = config.users
        if not users:
            return Auth.OK
        creds = parse_basic_auth(headers.get("authorization", ""))
        if creds is None:
            return Auth.DENIED
        user, password = creds
        stored: bytes | None = None
        ub = user.encode("utf-8", "surrogateescape")
        for name, h in users.items():  # no early exit: time does not depend on which user matched
            if hmac.compare_digest(name.encode(), ub):
                stored = h
        hashed = stored if stored is not None else config.dummy_hash
        key = hashlib.sha256(b"\0".join((ub, hashed, password.encode("utf-8", "surrogateescape")))).digest()
        with self._cache_lock:
            if key in self._verified:
                self._verified.move_to_end(key)
                return Auth.OK
            if key in self._refused:
                self._refused.move_to_end(key)
                return Auth.DENIED
        got = await self._bcrypt.check(password, hashed)
        if got is None:
            self.auth_busy += 1
            if self.auth_busy % 1000 == 1:
                _log.warning("auth_busy", pending=AUTH_MAX_PENDING, note="oldest uncached credential answered 503")
            return Auth.BUSY
        ok, took = got
        ok = ok and stored is not None
        # Pad a cheaper user's check to the time of the costliest hash (what an unknown user pays): bcrypt's
        # time doubles per cost step. Slept here, not in the bcrypt thread, so nobody else waits for it.
        extra = took * (2.0 ** (config.max_cost - _cost(hashed)) - 1.0)
        if extra > 0:
            await self._pad(extra)
        with self._cache_lock:
            cache, size = (self._verified, AUTH_CACHE_SIZE) if ok else (self._refused, AUTH_FAILED_CACHE_SIZE)
            cache[key] = None
            while len(cache) > size:
                cache.popitem(last=False)
        return Auth.OK if ok else Auth.DENIED

    async def _pad(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    @property
    def pending(self) -> int:
        """bcrypt checks waiting or running."""
        return self._bcrypt.pending

    def close(self) -> None:
        """Release the bcrypt thread (daemon stop)."""
        self._bcrypt.close()


class _BcryptLane:
    """The one bcrypt thread and its queue: newest first, at most ``AUTH_MAX_PENDING`` waiting, the oldest
    answered None (busy) when a new one does not fit. Results go back to each caller's event loop."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._waiting: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[tuple[bool, float] | None], str,
                                   bytes]] = deque()
        self._running = 0
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def pending(self) -> int:
        return len(self._waiting) + self._running

    async def check(self, password: str, hashed: bytes) -> tuple[bool, float] | None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[bool, float] | None] = loop.create_future()
        with self._cond:
            if self._closed:
                return None
            if len(self._waiting) >= AUTH_MAX_PENDING:
                old_loop, old, _, _ = self._waiting.popleft()
                old_loop.call_soon_threadsafe(_resolve, old, None)
            self._waiting.append((loop, fut, password, hashed))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="bcrypt", daemon=True)
                self._thread.start()
            self._cond.notify()
        return await fut

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                loop, fut, password, hashed = self._waiting.pop()  # the newest
                self._running = 1
            try:
                result: tuple[bool, float] | None = _check(password, hashed)
            except Exception:  # bcrypt itself failing: refuse, never crash the thread
                result = (False, 0.0)
            with self._cond:
                self._running = 0
            with contextlib.suppress(RuntimeError):  # the caller's loop closed meanwhile
                loop.call_soon_threadsafe(_resolve, fut, result)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            waiting = list(self._waiting)
            self._waiting.clear()
            self._cond.notify_all()
        for loop, fut, _, _ in waiting:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_resolve, fut, None)


def _resolve(fut: asyncio.Future[tuple[bool, float] | None], value: tuple[bool, float] | None) -> None:
    if not fut.done():
        fut.set_result(value)


def _check(password: str, hashed: bytes) -> tuple[bool, float]:
    """bcrypt in the bcrypt thread (one at a time: it is CPU heavy; it releases the GIL); (match, seconds)."""
    t0 = time.perf_counter()
    try:
        ok = bcrypt.checkpw(password.encode("utf-8", "surrogateescape"), hashed)
    except ValueError:
        ok = False
    return ok, time.perf_counter() - t0
