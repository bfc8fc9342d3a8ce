"""Structured logging (structlog): logfmt or JSON, one event name per thing that happened.

Logging must never take anything down. A line that cannot be written -- stderr a closed pipe (EPIPE), a full
disk (ENOSPC, ``2>/dev/full``), a closed or missing stream -- is dropped and counted
(:func:`dropped`, exported as ``gpufeed_log_messages_dropped_total``); the caller (a sampler, the web
server) carries on. What Python itself would print -- asyncio's "Task exception was never retrieved" and
"Exception in callback", uncaught exceptions in threads, "Exception ignored in", warnings from libraries --
goes through the same renderer, so ``--log.format json`` output is one JSON object per line, always.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Mapping
from types import TracebackType
from typing import Any, TextIO

import structlog

LEVELS = ("debug", "info", "warn", "error")
FORMATS = ("logfmt", "json")

_once_lock = threading.Lock()
_once_keys: set[tuple[str, ...]] = set()
_dropped_lock = threading.Lock()
_counts = {"dropped": 0}
_loop_errors: dict[str, int] = {}


def dropped() -> int:
    """Log lines that could not be written since the process started."""
    return _counts["dropped"]


def _drop() -> None:
    with _dropped_lock:
        _counts["dropped"] += 1


class SafeLogger:
    """structlog's PrintLogger without its failure modes: a write that fails drops the line (counted)."""

    def __init__(self, file: TextIO | None = None) -> None:
        self._file = file
        self._lock = threading.Lock()

    def msg(self, message: str) -> None:
        file = self._file if self._file is not None else sys.stderr
        try:
            with self._lock:
                if file is None:  # the process was started with stderr closed
                    raise OSError("no stream")
                file.write(message + "\n")
                file.flush()
        except (OSError, ValueError, AttributeError):  # EPIPE, ENOSPC, EIO; a closed file; not a file
            _drop()

    log = debug = info = warn = warning = error = critical = exception = fatal = failure = err = msg


class SafeLoggerFactory:
    """A factory of :class:`SafeLogger` on one stream (None: ``sys.stderr`` at the time of each write)."""

    def __init__(self, file: TextIO | None = None) -> None:
        self._logger = SafeLogger(file)

    def __call__(self, *args: Any) -> SafeLogger:
        return self._logger


def ensure_std_fds() -> None:
    """Open /dev/null on any of fds 0, 1, 2 that is closed.

    A daemon started with stdout/stderr closed (``>&- 2>&-``) would otherwise hand those numbers to the first
    files and sockets it opens, and whatever writes to "stderr" -- a C library, the interpreter's last-resort
    error path -- would write into a client's connection or a certificate file.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            got = os.open(os.devnull, os.O_RDWR)
            if got != fd:  # a lower fd was also closed and took it; it is fixed on its own turn
                os.dup2(got, fd)
                os.close(got)


class _StdlibHandler(logging.Handler):
    """stdlib ``logging`` records (asyncio, libraries) as structlog events."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            event = get_logger(component="python", source=record.name)
            level = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warning"}.get(
                record.levelno, "error")
            getattr(event, level)("python_log", message=record.getMessage(), exc_info=record.exc_info or None)
        except Exception:  # a log handler must not raise (logging.Handler.handleError would print)
            _drop()


def _thread_excepthook(args: threading.ExceptHookArgs) -> None:
    name = args.thread.name if args.thread is not None else "?"
    exc = args.exc_value if args.exc_value is not None else args.exc_type()
    get_logger(component="python").error("thread_crashed", thread=name, error=repr(exc),
                                         exc_info=(args.exc_type, exc, args.exc_traceback))


def _unraisablehook(u: Any) -> None:
    get_logger(component="python").error(
        "exception_ignored", where=repr(getattr(u, "object", None)), message=getattr(u, "err_msg", None) or "",
        error=repr(u.exc_value), exc_info=(u.exc_type, u.exc_value, u.exc_traceback) if u.exc_value else None)


def _excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    get_logger(component="python").error("uncaught_exception", error=repr(value), exc_info=(kind, value, tb))


def loop_exception_handler(loop: Any, context: Mapping[str, Any]) -> None:
    """asyncio's exception handler, structured and rate-limited: the first of each kind, then every 1000th."""
    message = str(context.get("message") or "unhandled exception in event loop")
    with _dropped_lock:
        n = _loop_errors[message] = _loop_errors.get(message, 0) + 1
    if n % 1000 != 1:
        return
    exc = context.get("exception")
    get_logger(component="asyncio").error(
        "event_loop_error", message=message, error=repr(exc) if exc is not None else None, occurrences=n,
        exc_info=exc if isinstance(exc, BaseException) else None)


def configure(level: str = "info", fmt: str = "logfmt", stream: Any = None) -> None:
    """Configure structlog (and route Python's own reports through it) for the whole process; call at start."""
    ensure_std_fds()
    lvl = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR}[level]
    renderer: Any
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer(sort_keys=False)
    else:
        renderer = structlog.processors.LogfmtRenderer(key_order=["ts", "level", "event"], drop_missing=True)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=SafeLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )
    root = logging.getLogger()
    root.handlers = [_StdlibHandler()]
    root.setLevel(max(lvl, logging.WARNING))  # libraries' info chatter (asyncio debug) stays out
    logging.captureWarnings(True)
    threading.excepthook = _thread_excepthook
    sys.unraisablehook = _unraisablehook
    sys.excepthook = _excepthook


def get_logger(**bind: Any) -> Any:
    """A lazily configured structlog logger with ``bind`` as context (safe to create at import time)."""
    return structlog.get_logger(**bind)


def once(key: tuple[str, ...]) -> bool:
    """True the first time ``key`` is seen: log a persistent condition once, not every cycle."""
    with _once_lock:
        if key in _once_keys:
            return False
        _once_keys.add(key)
        return True


def forget(key: tuple[str, ...]) -> None:
    """Allow ``key`` to be logged again (the condition cleared)."""
    with _once_lock:
        _once_keys.discard(key)
