"""Structured logging (structlog): logfmt or JSON, one event name per thing that happened."""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

import structlog

LEVELS = ("debug", "info", "warn", "error")
FORMATS = ("logfmt", "json")

_once_lock = threading.Lock()
_once_keys: set[tuple[str, ...]] = set()


def configure(level: str = "info", fmt: str = "logfmt", stream: Any = None) -> None:
    """Configure structlog for the whole process; call once at start."""
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
        logger_factory=structlog.PrintLoggerFactory(file=stream or sys.stderr),
        cache_logger_on_first_use=False,
    )


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
