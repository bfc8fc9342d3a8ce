"""A small client of the Prometheus HTTP API (stdlib urllib): instant and range queries, the rules list.

Authentication and TLS come from the same ``--http.config.file`` promtool reads (Prometheus' http_config:
``basic_auth``, ``authorization``, ``tls_config``), or from explicit flags that override it. A setting this
client does not implement is an error naming the key, never silently ignored: a report must not quietly
go out without the client certificate it was told to use.

Every failure is a ``PromError`` whose ``exit_code`` tells the kind (unreachable, refused credentials, a
query the server rejected) and whose message is one line for a human.
"""

from __future__ import annotations

import base64
import json
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

_log = log.get_logger(component="report")


class PromError(Exception):
    """A Prometheus request that failed; ``exit_code`` is the report's exit status for it."""

    exit_code = EXIT_QUERY


class UnreachableError(PromError):
    exit_code = EXIT_UNREACHABLE


class AuthRefusedError(PromError):
    exit_code = EXIT_AUTH


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
    timeout_s: float = 60.0


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
        try:
            with self._opener.open(req, timeout=self.opts.timeout_s) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            raise self._http_error(e) from None
        except urllib.error.URLError as e:
            raise self._unreachable(e.reason) from None
        except (TimeoutError, ConnectionError, ssl.SSLError) as e:
            raise self._unreachable(e) from None
        _log.debug("report_request", path=path, seconds=round(time.monotonic() - t0, 3), bytes=len(raw))
        try:
            doc = json.loads(raw)
        except ValueError:
            raise PromError(f"{self.url} did not answer {path} with JSON: is this a Prometheus server?") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            err = doc.get("error", "unknown error") if isinstance(doc, dict) else "unexpected answer"
            raise PromError(f"Prometheus at {self.url} rejected {path}: {err}")
        return doc.get("data")

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
            doc = json.loads(e.read())
            detail = f": {doc.get('error')}" if isinstance(doc, dict) and doc.get("error") else ""
        except (ValueError, OSError):
            pass
        if e.code == 404:
            return PromError(f"{self.url} has no Prometheus API at {e.url} (404): check the --prometheus URL "
                             "(include any path prefix, e.g. https://host/prometheus)")
        return PromError(f"Prometheus at {self.url} answered {e.code} {e.reason}{detail}")

    # -- API

    def rules(self) -> list[RuleInfo]:
        """The recording rules loaded on the server (GET /api/v1/rules?type=record)."""
        data = self._call("/api/v1/rules", {"type": "record"}, post=False)
        out = []
        for g in data.get("groups", []) if isinstance(data, dict) else []:
            for r in g.get("rules", []):
                if r.get("type") == "recording":
                    out.append(RuleInfo(name=str(r.get("name", "")), group=str(g.get("name", "")),
                                        interval_s=float(g.get("interval", 0) or 0), health=str(r.get("health", "")),
                                        last_error=str(r.get("lastError", "") or "")))
        return out

    def query(self, expr: str, at: float) -> list[Sample]:
        """An instant query at ``at`` (POST /api/v1/query): one Sample per vector element."""
        data = self._call("/api/v1/query", {"query": expr, "time": _ts(at)}, post=True)
        if not isinstance(data, dict) or data.get("resultType") not in ("vector", "scalar"):
            raise PromError(f"unexpected result type for {expr!r}: {data!r:.80}")
        if data["resultType"] == "scalar":
            return [Sample({}, float(data["result"][1]))]
        return [Sample(dict(s["metric"]), float(s["value"][1])) for s in data["result"]]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        """A range query (POST /api/v1/query_range): one Series per result, points at start + k * step."""
        data = self._call("/api/v1/query_range",
                          {"query": expr, "start": _ts(start), "end": _ts(end), "step": f"{step:g}"}, post=True)
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            raise PromError(f"unexpected result type for {expr!r}: {data!r:.80}")
        return [Series(dict(s["metric"]), tuple((float(t), float(v)) for t, v in s["values"]))
                for s in data["result"]]


def _ts(t: float) -> str:
    return f"{t:.3f}"


def values_by(series: Sequence[Series], keys: Sequence[str]) -> dict[tuple[str, ...], list[tuple[float, float]]]:
    """Points of each series keyed by the given label values (a missing label is "")."""
    out: dict[tuple[str, ...], list[tuple[float, float]]] = {}
    for s in series:
        out.setdefault(tuple(s.labels.get(k, "") for k in keys), []).extend(s.points)
    return out
