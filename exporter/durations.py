"""The one duration parser: every flag, config key, web-config field and CLI option that takes a duration.

Accepted forms, as Prometheus and exporter-toolkit write them: a Go-style sequence of ``<number><unit>``
(``250ms``, ``1s``, ``1m30s``, ``1.5h``, ``2h45m``; units ``ns us µs ms s m h d w``), or a YAML number of
seconds (``1.5``). A bare number written as text (``--web.read-timeout 10``) is refused with the unit to add:
Prometheus and Go refuse it too, and ``10`` could as well have meant milliseconds. Negative, not-a-number,
infinite and absurdly large values are rejected with a message that says what was given and what would be
accepted.
"""

from __future__ import annotations

import math
import re

UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0,
         "w": 604800.0}
# One hundred years: no interval, timeout or window of gpufeed is longer; beyond this a value is a typo.
MAX_SECONDS = 100 * 365 * 86400.0
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h|d|w)")
_WHOLE = re.compile(r"^(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|ms|s|m|h|d|w))+$")
HINT = "use e.g. 250ms, 1s, 1m30s, 2h"


def parse_duration(value: object, *, allow_zero: bool = False) -> float:
    """Seconds from a duration (see the module docstring); ValueError with a reason otherwise.

    ``allow_zero`` admits 0 (exporter-toolkit's "off" for ``rate_limit.interval``); otherwise a duration must
    be positive.
    """
    if isinstance(value, bool) or value is None:
        raise ValueError(f"not a duration: {value!r} ({HINT})")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = str(value).strip()
        negative = text.startswith("-")
        body = text[1:] if negative or text.startswith("+") else text
        if body == "0":  # Go's time.ParseDuration takes "0" alone without a unit
            seconds = 0.0
        elif not _WHOLE.match(body):
            try:
                number = float(body) if len(body) <= 32 else math.nan
            except ValueError:
                raise ValueError(f"not a duration: {value!r} ({HINT})") from None
            if math.isfinite(number) and not negative:
                raise ValueError(f"a duration needs a unit: {value!r} (use {format_duration(number)} for "
                                 f"{number:g} seconds)")
            raise ValueError(f"not a duration: {value!r} ({HINT})")
        else:
            seconds = sum(float(n) * UNITS[u] for n, u in _PART.findall(body))
        if negative:
            seconds = -seconds
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"not a duration: {value!r} ({HINT})")
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative: {value!r}")
    if seconds == 0 and not allow_zero:
        raise ValueError(f"duration must be positive: {value!r}")
    if seconds > MAX_SECONDS:
        raise ValueError(f"duration too long: {value!r} (at most 100 years)")
    return seconds


def format_duration(seconds: float) -> str:
    """A short human form for help texts and logs: ``250ms``, ``1s``, ``1m30s``."""
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    whole = int(seconds)
    if whole != seconds or whole < 60:
        return f"{seconds:g}s"
    out = []
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        n, whole = divmod(whole, size)
        if n:
            out.append(f"{n}{unit}")
    return "".join(out)
