"""The two exposition formats, written straight from the metric families: byte for byte what prometheus_client's
formatters write for the families gpufeed builds, in about a tenth of the time.

prometheus_client 0.26 checks every sample name rune by rune in its OpenMetrics formatter (its UTF-8 name
escaping); on the 8-GPU host a render of both formats cost ~13 ms, every render. What gpufeed's families use --
counters, gauges and histograms with legacy names and label names, plain values -- is formatted here; a family
with anything else (a unit, exemplars, timestamps, native histograms, ``_created`` samples, names outside the
legacy character set, a type this module does not write) goes to the library's formatter, so every family is
still formatted as the library formats it. tests/test_expfmt.py compares the two on every payload of the test
hosts and on the edge cases.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from prometheus_client import generate_latest as _library_text
from prometheus_client.core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as _library_openmetrics
from prometheus_client.utils import floatToGoString as _float_to_go  # noqa: N813

# A value as the library writes it (Go's float formatting: +Inf, NaN, 1e+06 ...).
_number: Callable[[float], str] = _float_to_go

# Legacy names without the colon: under the library's default escaping, an OpenMetrics sample name with a colon
# becomes an underscore (recording-rule names are Prometheus's, never an exporter's). Label names the same.
_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Samples the text formatter moves into a gauge family of their own.
_MOVED_SUFFIXES = ("_created", "_gsum", "_gcount")
# The types written here, and the name the text format gives each.
_TEXT_TYPES = {"counter": "counter", "gauge": "gauge", "histogram": "histogram", "summary": "summary",
               "unknown": "untyped"}

_checked: set[str] = set()  # names seen to match _NAME (a bounded vocabulary: the families' and their labels')
# 'name="escaped value"' by label name and value: most label pairs (gpu="0", collector="cpu") are in every payload.
_pairs: dict[str, dict[str, str]] = {}
_BOUND = 65_536  # entries in either cache; past it the cache starts afresh


def _legacy(names: Iterable[str]) -> bool:
    """Whether every name of ``names`` matches _NAME."""
    if _checked.issuperset(names):
        return True
    for name in names:
        if name not in _checked:
            if _NAME.fullmatch(name) is None:
                return False
            if len(_checked) >= _BOUND:
                _checked.clear()
            _checked.add(name)
    return True


def _value(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _pair(k: str, v: str) -> str:
    values = _pairs.get(k)
    if values is None:
        if len(_pairs) >= _BOUND:
            _pairs.clear()
        values = _pairs[k] = {}
    pair = values.get(v)
    if pair is None:
        if len(values) >= _BOUND:
            values.clear()
        pair = values[v] = f'{k}="{_value(v)}"'
    return pair


def _lines(metric: Metric) -> str | None:
    """``metric``'s sample lines -- the same in both formats -- if it uses only what this module writes; else None
    (the library formats it)."""
    if metric.type not in _TEXT_TYPES or metric.unit or not _legacy((metric.name,)):
        return None
    moved = tuple(metric.name + s for s in _MOVED_SUFFIXES)
    out: list[str] = []
    for s in metric.samples:
        labels = s.labels
        if (s.timestamp is not None or s.exemplar is not None or s.native_histogram is not None or s.value is None
                or s.name in moved or not _legacy((s.name, *labels) if labels else (s.name,))):
            return None
        if labels:
            pairs = ",".join([_pair(k, v) for k, v in sorted(labels.items())])
            out.append(f"{s.name}{{{pairs}}} {_number(s.value)}\n")
        else:
            out.append(f"{s.name} {_number(s.value)}\n")
    return "".join(out)


def _text_head(m: Metric) -> str:
    name = m.name + "_total" if m.type == "counter" else m.name
    doc = m.documentation.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {doc}\n# TYPE {name} {_TEXT_TYPES[m.type]}\n"


def _om_head(m: Metric) -> str:
    return f"# HELP {m.name} {_value(m.documentation)}\n# TYPE {m.name} {m.type}\n"


class _One:
    """One family, for the library's formatters (they take a collector)."""

    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> list[Metric]:
        return [self.metric]


OM_EOF = b"# EOF\n"  # an OpenMetrics payload's last line, once, after every family


def _library_text_of(m: Metric) -> str:
    return _library_text(_One(m)).decode("utf-8")


def _library_om_of(m: Metric) -> str:
    body: bytes = _library_openmetrics(_One(m))  # type: ignore[no-untyped-call]
    return body.removesuffix(OM_EOF).decode("utf-8")


# (family head, library formatter) of each format
_TEXT = (_text_head, _library_text_of)
_OPENMETRICS = (_om_head, _library_om_of)


def _format(families: Iterable[Metric], *forms: tuple[Callable[[Metric], str], Callable[[Metric], str]]) -> list[bytes]:
    """``families`` in each of ``forms``, each family's sample lines formatted once for all of them."""
    outs: list[list[str]] = [[] for _ in forms]
    for m in families:
        lines = _lines(m)
        for out, (head, library) in zip(outs, forms, strict=True):
            out.append(library(m) if lines is None else head(m) + lines)
    return ["".join(out).encode("utf-8") for out in outs]


def text(families: Iterable[Metric]) -> bytes:
    """The Prometheus text format (0.0.4) of ``families``."""
    return _format(families, _TEXT)[0]


def openmetrics(families: Iterable[Metric]) -> bytes:
    """The OpenMetrics 1.0 text of ``families``, without the closing ``# EOF`` (the payload ends with it once)."""
    return _format(families, _OPENMETRICS)[0]


def both(families: Iterable[Metric]) -> tuple[bytes, bytes]:
    """(:func:`text`, :func:`openmetrics`) of ``families``, each sample line formatted once for the two."""
    text_body, om_body = _format(families, _TEXT, _OPENMETRICS)
    return text_body, om_body
