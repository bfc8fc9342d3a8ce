"""A small client of the Prometheus HTTP API (stdlib urllib): instant and range queries, the rules list.

Authentication and TLS come from the same ``--http.config.file`` promtool reads (Prometheus' http_config:
``basic_auth``, ``authorization``, ``tls_config``), or from explicit flags that override it. A setting this
client does not implement is an error naming the key, never silently ignored: a report must not quietly
go out without the client certificate it was told to use.

Every failure is a ``PromError`` whose ``exit_code`` tells the kind (unreachable, refused credentials, a
query the server rejected or answered in a shape this client cannot read, an answer past a bound) and whose
message is one line for a human. Every answer is bounded: at most ``max_answer_bytes`` read, each request
over within ``timeout_s`` of its start (not per socket read: a server that trickles one byte every few
seconds is cut), the whole report within ``deadline_s``; text from the server is shortened before printing.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from exporter import log

EXIT_UNREACHABLE = 3
EXIT_AUTH = 4
EXIT_QUERY = 7
EXIT_BOUND = 9
# The longest piece of server text (an error message, a value) quoted in one error line.
QUOTE_CHARS = 200
# An error body is read up to this size only: its message is all that is quoted.
ERROR_BODY_BYTES = 64 * 1024
_CHUNK = 64 * 1024

_log = log.get_logger(component="report")


class PromError(Exception):
    """A Prometheus request that failed; ``exit_code`` is the report's exit status for it."""

    exit_code = EXIT_QUERY


class UnreachableError(PromError):
    exit_code = EXIT_UNREACHABLE


class AuthRefusedError(PromError):
    exit_code = EXIT_AUTH


class BoundError(PromError):
    """An answer larger than ``max_answer_bytes``, or the report past its overall deadline."""

    exit_code = EXIT_BOUND


def quote(text: object) -> str:
    """Server text for a one-line message: repr-escaped (no newline gets through), at most QUOTE_CHARS."""
    r = repr(text) if not isinstance(text, str) else repr(text)[1:-1]
    return r if len(r) <= QUOTE_CHARS else f"{r[:QUOTE_CHARS]}... ({len(r)} characters)"


class HttpConfigError(ValueError):
    """A bad --http.config.file or auth/TLS flag (usage error: exit 2)."""


@dataclass(frozen=True, slots=True)
class HttpOptions:
    """How to reach Prometheus: credentials, TLS and the timeout of one request."""

    username: str | None = None
    password: str | None = None
    authorization: tuple[str, str] | None = None  # (type, credentials), e.g. ("Bearer", "...")
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure_skip_verify: bool = False
    timeout_s: float = 60.0  # one request, from its start to the last byte of its answer
    max_answer_bytes: int = 64 * 1024 * 1024
    deadline_s: float = 600.0  # every request of the client, from its creation


_HTTP_KEYS = {"basic_auth", "authorization", "tls_config", "follow_redirects", "enable_http2"}
_BASIC_KEYS = {"username", "password", "password_file"}
_AUTHZ_KEYS = {"type", "credentials", "credentials_file"}
_TLS_KEYS = {"ca_file", "cert_file", "key_file", "insecure_skip_verify"}


def _read_secret(path: str, key: str, base: Path) -> str:
    p = Path(path) if Path(path).is_absolute() else base / path
    try:
        return p.read_text().strip()
    except OSError as e:
        raise HttpConfigError(f"{key}: cannot read {p}: {e.strerror}") from e


def _check_keys(section: Any, allowed: set[str], where: str) -> Mapping[str, Any]:
    if not isinstance(section, Mapping):
        raise HttpConfigError(f"{where} must be a mapping")
    unknown = sorted(set(section) - allowed)
    if unknown:
        raise HttpConfigError(f"{where}.{unknown[0]} is not supported by gpufeed report "
                              f"(supported: {', '.join(sorted(allowed))})")
    return section


def load_http_config(path: Path) -> HttpOptions:
    """Options from promtool's --http.config.file (the Prometheus http_config subset named above)."""
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except OSError as e:
        raise HttpConfigError(f"--http.config.file: cannot read {path}: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise HttpConfigError(f"--http.config.file: {path} is not valid YAML: {e}") from e
    base = path.resolve().parent
    top = _check_keys(doc, _HTTP_KEYS, "--http.config.file")
    opts = HttpOptions()
    if "basic_auth" in top:
        ba = _check_keys(top["basic_auth"], _BASIC_KEYS, "basic_auth")
        if "username" not in ba:
            raise HttpConfigError("basic_auth.username is required")
        pw = ba.get("password")
        if "password_file" in ba:
            pw = _read_secret(str(ba["password_file"]), "basic_auth.password_file", base)
        opts = replace(opts, username=str(ba["username"]), password=None if pw is None else str(pw))
    if "authorization" in top:
        az = _check_keys(top["authorization"], _AUTHZ_KEYS, "authorization")
        cred = az.get("credentials")
        if "credentials_file" in az:
            cred = _read_secret(str(az["credentials_file"]), "authorization.credentials_file", base)
        if cred is None:
            raise HttpConfigError("authorization needs credentials or credentials_file")
        opts = replace(opts, authorization=(str(az.get("type", "Bearer")), str(cred)))
    if opts.username is not None and opts.authorization is not None:
        raise HttpConfigError("basic_auth and authorization are mutually exclusive")
    if "tls_config" in top:
        tls = _check_keys(top["tls_config"], _TLS_KEYS, "tls_config")

        def _file(key: str) -> str | None:
            v = tls.get(key)
            if v is None:
                return None
            p = Path(str(v))
            return str(p if p.is_absolute() else base / p)

        skip = tls.get("insecure_skip_verify", False)
        if not isinstance(skip, bool):
            raise HttpConfigError("tls_config.insecure_skip_verify must be true or false")
        opts = replace(opts, ca_file=_file("ca_file"), cert_file=_file("cert_file"), key_file=_file("key_file"),
                       insecure_skip_verify=skip)
    return opts


def ssl_context(opts: HttpOptions) -> ssl.SSLContext:
    """The TLS context for https URLs: the system CAs or --ca-file, an optional client certificate."""
    try:
        ctx = ssl.create_default_context(cafile=opts.ca_file)
    except (OSError, ssl.SSLError) as e:
        raise HttpConfigError(f"--ca-file: cannot load {opts.ca_file}: {e}") from e
    if opts.insecure_skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if opts.cert_file or opts.key_file:
        if not opts.cert_file:
            raise HttpConfigError("--key-file needs --cert-file")
        try:
            ctx.load_cert_chain(opts.cert_file, opts.key_file)
        except (OSError, ssl.SSLError) as e:
            raise HttpConfigError(f"--cert-file/--key-file: cannot load {opts.cert_file}: {e}") from e
    return ctx


@dataclass(frozen=True, slots=True)
class Sample:
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class Series:
    labels: Mapping[str, str]
    points: tuple[tuple[float, float], ...]  # (unix time, value)


@dataclass(frozen=True, slots=True)
class RuleInfo:
    """A recording rule loaded on the server: its group's evaluation interval and its health."""

    name: str
    group: str
    interval_s: float
    health: str
    last_error: str


class PrometheusClient:
    """Queries one Prometheus server; thread-safe (one urllib request per call)."""

    def __init__(self, url: str, opts: HttpOptions) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise HttpConfigError(f"--prometheus: {url!r} is not an http:// or https:// URL")
        if parsed.username is not None:
            # http://user:pass@host: basic auth (unless configured otherwise), and never printed in the report.
            if opts.username is None and opts.authorization is None:
                opts = replace(opts, username=urllib.parse.unquote(parsed.username),
                               password=urllib.parse.unquote(parsed.password or ""))
            parsed = parsed._replace(netloc=parsed.netloc.rsplit("@", 1)[1])
        self.url = urllib.parse.urlunsplit(parsed).rstrip("/")
        self.opts = opts
        self._deadline = time.monotonic() + opts.deadline_s
        handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
        if parsed.scheme == "https":
            handlers.append(urllib.request.HTTPSHandler(context=ssl_context(opts)))
        self._opener = urllib.request.build_opener(*handlers)
        self._headers = {"Accept": "application/json", "User-Agent": "gpufeed-report"}
        if opts.username is not None:
            token = base64.b64encode(f"{opts.username}:{opts.password or ''}".encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"
        elif opts.authorization is not None:
            self._headers["Authorization"] = f"{opts.authorization[0]} {opts.authorization[1]}"

    # -- transport

    def _call(self, path: str, params: Mapping[str, str], *, post: bool) -> Any:
        """One API call; the ``data`` member of a success answer, or a PromError."""
        body = urllib.parse.urlencode(params).encode()
        url = f"{self.url}{path}"
        if post:
            req = urllib.request.Request(url, data=body, headers={
                **self._headers, "Content-Type": "application/x-www-form-urlencoded"}, method="POST")
        else:
            req = urllib.request.Request(f"{url}?{body.decode()}" if params else url, headers=self._headers)
        t0 = time.monotonic()
        limit = min(self.opts.timeout_s, self._deadline - t0)
        if limit <= 0:
            raise self._past_deadline()
        try:
            with self._opener.open(req, timeout=limit) as r:
                raw = self._read(r, path, t0 + limit)
        except urllib.error.HTTPError as e:
            raise self._http_error(e) from None
        except urllib.error.URLError as e:
            raise self._unreachable(e.reason) from None
        except (TimeoutError, ConnectionError, ssl.SSLError) as e:
            raise self._unreachable(e) from None
        except http.client.HTTPException as e:
            # IncompleteRead (the connection closed before Content-Length), a bad status line or header.
            raise UnreachableError(f"Prometheus at {self.url} broke off its answer to {path}: "
                                   f"{type(e).__name__}") from None
        _log.debug("report_request", path=path, seconds=round(time.monotonic() - t0, 3), bytes=len(raw))
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError):
            raise PromError(f"{self.url} did not answer {path} with JSON: is this a Prometheus server?") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            err = doc.get("error", "unknown error") if isinstance(doc, dict) else "unexpected answer"
            raise PromError(f"Prometheus at {self.url} rejected {path}: {quote(err)}")
        return doc.get("data")

    def _read(self, r: http.client.HTTPResponse, path: str, until: float) -> bytes:
        """The whole body, at most max_answer_bytes, over before ``until`` (checked after every chunk; one read
        waits at most the socket timeout, itself no longer than the request's time)."""
        cap = self.opts.max_answer_bytes
        length = r.getheader("Content-Length")
        if length is not None and length.isdigit() and int(length) > cap:
            raise self._too_large(path)
        chunks: list[bytes] = []
        size = 0
        while chunk := r.read1(_CHUNK):
            size += len(chunk)
            if size > cap:
                raise self._too_large(path)
            chunks.append(chunk)
            now = time.monotonic()
            if now > self._deadline:
                raise self._past_deadline()
            if now > until:
                raise TimeoutError
        if r.length:  # the connection closed before Content-Length bytes came
            raise http.client.IncompleteRead(b"", r.length)
        return b"".join(chunks)

    def _too_large(self, path: str) -> BoundError:
        return BoundError(f"Prometheus at {self.url} answered {path} with more than "
                          f"{self.opts.max_answer_bytes / 2**20:g} MiB (--max-answer-size): "
                          "narrow --range, use a longer --step, or raise the limit")

    def _past_deadline(self) -> BoundError:
        return BoundError(f"the queries to {self.url} took more than {self.opts.deadline_s:g} s in all (--deadline)")

    def _unreachable(self, reason: object) -> PromError:
        if isinstance(reason, ssl.SSLCertVerificationError):
            return UnreachableError(f"TLS certificate of {self.url} not trusted ({reason.verify_message}): "
                               "pass --ca-file, or --insecure-skip-verify to skip the check")
        if isinstance(reason, ssl.SSLError):
            return UnreachableError(f"TLS handshake with {self.url} failed: {reason.reason or reason}")
        if isinstance(reason, TimeoutError):
            return UnreachableError(f"Prometheus at {self.url} did not answer within {self.opts.timeout_s:g} s")
        text = getattr(reason, "strerror", None) or str(reason)
        return UnreachableError(f"cannot reach Prometheus at {self.url}: {text}")

    def _http_error(self, e: urllib.error.HTTPError) -> PromError:
        if e.code in (401, 403):
            how = "no credentials were sent" if "Authorization" not in self._headers else "the credentials were refused"
            return AuthRefusedError(f"Prometheus at {self.url} answered {e.code} {e.reason}: {how} "
                               "(basic_auth or authorization in --http.config.file, or --user/--password-file)")
        detail = ""
        try:
            doc = json.loads(e.read(ERROR_BODY_BYTES))
            detail = f": {quote(doc.get('error'))}" if isinstance(doc, dict) and doc.get("error") else ""
        except (ValueError, RecursionError, OSError, http.client.HTTPException):
            pass
        if e.code == 404:
            return PromError(f"{self.url} has no Prometheus API at {e.url} (404): check the --prometheus URL "
                             "(include any path prefix, e.g. https://host/prometheus)")
        return PromError(f"Prometheus at {self.url} answered {e.code} {quote(e.reason)}{detail}")

    # -- API

    def rules(self) -> list[RuleInfo]:
        """The recording rules loaded on the server (GET /api/v1/rules?type=record)."""
        path = "/api/v1/rules"
        data = self._call(path, {"type": "record"}, post=False)
        try:
            out = []
            for g in data.get("groups", []) if isinstance(data, dict) else []:
                for r in g.get("rules", []):
                    if r.get("type") == "recording":
                        out.append(RuleInfo(name=str(r.get("name", "")), group=str(g.get("name", "")),
                                            interval_s=_seconds(g.get("interval", 0)),
                                            health=str(r.get("health", "")),
                                            last_error=str(r.get("lastError", "") or "")))
            return out
        except (AttributeError, TypeError, ValueError, OverflowError) as e:
            raise self._malformed(path, e) from None

    def query(self, expr: str, at: float) -> list[Sample]:
        """An instant query at ``at`` (POST /api/v1/query): one Sample per vector element."""
        path = "/api/v1/query"
        data = self._call(path, {"query": expr, "time": _ts(at)}, post=True)
        if not isinstance(data, dict) or data.get("resultType") not in ("vector", "scalar"):
            raise PromError(f"unexpected result type for {expr!r}: {quote(data)}")
        try:
            if data["resultType"] == "scalar":
                return [Sample({}, float(data["result"][1]))]
            return [Sample(_labels(s["metric"]), float(s["value"][1])) for s in data["result"]]
        except (KeyError, IndexError, AttributeError, TypeError, ValueError) as e:
            raise self._malformed(path, e) from None

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        """A range query (POST /api/v1/query_range): one Series per result, points at start + k * step."""
        path = "/api/v1/query_range"
        data = self._call(path, {"query": expr, "start": _ts(start), "end": _ts(end), "step": f"{step:g}"}, post=True)
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            raise PromError(f"unexpected result type for {expr!r}: {quote(data)}")
        try:
            return [Series(_labels(s["metric"]), tuple((float(t), float(v)) for t, v in s["values"]))
                    for s in data["result"]]
        except (KeyError, IndexError, AttributeError, TypeError, ValueError) as e:
            raise self._malformed(path, e) from None

    def _malformed(self, path: str, e: Exception) -> PromError:
        return PromError(f"Prometheus at {self.url} answered {path} in a shape gpufeed report cannot read "
                         f"({type(e).__name__}: {quote(str(e))})")


def _labels(metric: object) -> dict[str, str]:
    """A result's label set: a JSON object of strings (anything else is a malformed answer)."""
    if not isinstance(metric, dict):
        raise TypeError(f"metric is a {type(metric).__name__}, not an object")
    return {str(k): str(v) for k, v in metric.items()}


def _seconds(value: object) -> float:
    """A rule group's interval: Prometheus sends seconds as a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(f"interval {quote(value)} is not a number of seconds")
    seconds = float(value or 0)
    if not math.isfinite(seconds):
        raise ValueError(f"interval {quote(value)} is not a number of seconds")
    return seconds


def _ts(t: float) -> str:
    return f"{t:.3f}"


def values_by(series: Sequence[Series], keys: Sequence[str]) -> dict[tuple[str, ...], list[tuple[float, float]]]:
    """Points of each series keyed by the given label values (a missing label is "")."""
    out: dict[tuple[str, ...], list[tuple[float, float]]] = {}
    for s in series:
        out.setdefault(tuple(s.labels.get(k, "") for k in keys), []).extend(s.points)
    return out
