"""The kernel's cpulist format (``0-15,32-47``, also ``0-31:2`` strides), used by sysfs and /proc/<pid>/status."""

from __future__ import annotations

from collections.abc import Iterable

MAX_CPU = 1 << 16  # far above any real host; bounds memory on hostile input
# CPUs a list may name, counting repeats: the kernel never repeats one, so twice every possible CPU is far
# beyond any real list, and it bounds the work of a hostile one ("0-65535" ten thousand times took 30 s).
MAX_LISTED = 2 * MAX_CPU


class CpulistError(ValueError):
    """Not a valid cpulist; the message quotes the offending part."""


# Parsed lists, shared: every process sample carries its Cpus_allowed_list, and the same few lists recur (a
# 96-CPU frozenset is ~2 KB: 1,400 copies in the buffers of the 8-GPU bench host). Bounded, emptied when full.
_PARSED: dict[str, frozenset[int]] = {}
_PARSED_MAX = 512
_PARSED_TEXT_MAX = 256  # longer lists are parsed every time (and never kept)


def parse_cpulist(text: str) -> frozenset[int]:
    """``"0-3,8,10-14:2"`` -> {0,1,2,3,8,10,12,14}; empty string -> empty set."""
    text = text.strip()
    got = _PARSED.get(text)
    if got is not None:
        return got
    out = _parse(text)
    if len(text) <= _PARSED_TEXT_MAX:
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[text] = out
    return out


def _parse(text: str) -> frozenset[int]:
    out: set[int] = set()
    listed = 0
    if not text:
        return frozenset()
    for raw in text.split(","):
        part = raw.strip()
        rng, _, stride_s = part.partition(":")
        lo_s, dash, hi_s = rng.partition("-")
        try:
            lo = int(lo_s, 10)
            hi = int(hi_s, 10) if dash else lo
            stride = int(stride_s, 10) if stride_s else 1
        except ValueError as e:
            raise CpulistError(f"bad cpulist element {part!r} in {_short(text)!r}") from e
        if lo < 0 or hi < lo or stride < 1 or hi >= MAX_CPU:
            raise CpulistError(f"bad cpulist range {part!r} in {_short(text)!r}")
        listed += (hi - lo) // stride + 1
        if listed > MAX_LISTED:
            raise CpulistError(f"cpulist names more than {MAX_LISTED} CPUs (repeated ranges?): {_short(text)!r}")
        out.update(range(lo, hi + 1, stride))
    return frozenset(out)


def _short(text: str) -> str:
    """A cpulist for a message: an 80 KB one would flood the log line."""
    return text if len(text) <= 80 else f"{text[:60]}...({len(text)} characters)"


def format_cpulist(cpus: Iterable[int]) -> str:
    """{0,1,2,3,8} -> ``"0-3,8"`` (the kernel's canonical form)."""
    s = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        parts.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ",".join(parts)
