"""Validation primitives of the scenario loader: typed reads that know the file and the key path, so every
error names both (``phases[1].gpus.0.link.gen``). The YAML itself is read by :mod:`exporter.yamlsafe` (size,
nesting and numbers bounded, YAML 1.2 floats, no duplicate keys)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from exporter import linkmath
from exporter.cpulist import CpulistError, parse_cpulist
from exporter.sim.spec import MAX_MAGNITUDE, MAX_PHASE_S, MIN_PERIOD_S, Noise, ScenarioError, Square, Value

# ---- the reader ------------------------------------------------------------------------------------------------


class Reader:
    """Validation helpers that know the file and build key paths for messages."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.version = 1  # the scenario's format version, once read: version-2 keys check it

    def fail(self, path: str, msg: str) -> ScenarioError:
        return ScenarioError(f"{self.file}: {path or '<top level>'}: {msg}")

    def mapping(self, v: object, path: str) -> Mapping[Any, Any]:
        if not isinstance(v, Mapping):
            raise self.fail(path, f"must be a mapping, not {kind(v)}")
        return v

    def seq(self, v: object, path: str) -> list[Any]:
        if not isinstance(v, list):
            raise self.fail(path, f"must be a list, not {kind(v)}")
        return v

    def keys(self, m: Mapping[Any, Any], path: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> None:
        for k in m:
            if not isinstance(k, str) or k not in allowed:
                raise self.fail(join(path, k), f"unknown key (allowed: {', '.join(allowed)})")
        for k in required:
            if k not in m:
                raise self.fail(join(path, k), "required key missing")

    def number(self, v: object, path: str, lo: float = -math.inf, hi: float = math.inf) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.fail(path, f"must be a number, not {kind(v)}")
        f = float(v)
        if not math.isfinite(f) or not lo <= f <= hi:  # no scenario value is meaningfully infinite
            raise self.fail(path, f"{v!r} out of range [{lo:g}, {hi:g}]")
        return f

    def integer(self, v: object, path: str, lo: int = -(2**63), hi: int = 2**63) -> int:
        if isinstance(v, bool):
            raise self.fail(path, f"must be an integer, not {kind(v)}")
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, int):
            raise self.fail(path, f"must be an integer, not {kind(v)}")
        if not lo <= v <= hi:
            raise self.fail(path, f"{v} out of range [{lo}, {hi}]")
        return v

    def string(self, v: object, path: str) -> str:
        if not isinstance(v, str):
            raise self.fail(path, f"must be a string, not {kind(v)}")
        return v

    def boolean(self, v: object, path: str) -> bool:
        if not isinstance(v, bool):
            raise self.fail(path, f"must be true or false, not {kind(v)}")
        return v

    def cpulist(self, v: object, path: str, limit: int, what: str = "CPU") -> frozenset[int]:
        if isinstance(v, int) and not isinstance(v, bool):
            v = str(v)
        text = self.string(v, path)
        try:
            cpus = parse_cpulist(text)
        except CpulistError as e:
            raise self.fail(path, str(e)) from e
        if not cpus:
            raise self.fail(path, f"empty {what} list")
        bad = sorted(c for c in cpus if c >= limit)
        if bad:
            raise self.fail(path, f"{what} {bad[0]} does not exist (host has {limit})")
        return cpus

    def value(self, v: object, path: str, rng: tuple[float, float]) -> Value:
        """A number, ``{square: {...}}`` or ``{noise: {...}}``."""
        lo, hi = rng
        if isinstance(v, Mapping):
            self.keys(v, path, ("square", "noise"))
            if len(v) != 1:
                raise self.fail(path, "a pattern is exactly one of square or noise")
            if "square" in v:
                p = join(path, "square")
                sq = self.mapping(v["square"], p)
                self.keys(sq, p, ("high", "low", "period_s", "duty"), ("high", "low", "period_s", "duty"))
                return Square(
                    high=self.number(sq["high"], join(p, "high"), lo, hi),
                    low=self.number(sq["low"], join(p, "low"), lo, hi),
                    period_s=self._positive(sq["period_s"], join(p, "period_s"), hi=MAX_PHASE_S, floor=MIN_PERIOD_S),
                    duty=self.number(sq["duty"], join(p, "duty"), 0.0, 1.0),
                )
            p = join(path, "noise")
            nz = self.mapping(v["noise"], p)
            self.keys(nz, p, ("mean", "sd"), ("mean", "sd"))
            return Noise(
                mean=self.number(nz["mean"], join(p, "mean"), lo, hi),
                sd=self.number(nz["sd"], join(p, "sd"), 0.0, MAX_MAGNITUDE),
            )
        return self.number(v, path, lo, hi)

    def _positive(self, v: object, path: str, *, hi: float = MAX_MAGNITUDE, floor: float = 0.0) -> float:
        """A number above 0 (at least ``floor`` when one is given) and at most ``hi``."""
        f = self.number(v, path, 0.0, hi)
        if f <= 0:
            raise self.fail(path, "must be positive")
        if f < floor:
            raise self.fail(path, f"{v!r} is below the minimum {floor:g}")
        return f


def kind(v: object) -> str:
    if v is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a mapping"}.get(type(v), type(v).__name__)


def join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def item(path: str, i: int) -> str:
    return f"{path}[{i}]"



# ---- typed fields shared by the sections -----------------------------------------------------------------


def generation(r: Reader, v: object, path: str) -> int:
    g = r.integer(v, path)
    if g not in linkmath.GENERATIONS:
        raise r.fail(path, f"PCIe generation must be 1-6, not {g}")
    return g


def width(r: Reader, v: object, path: str) -> int:
    w = r.integer(v, path)
    if w not in (1, 2, 4, 8, 12, 16, 32):
        raise r.fail(path, f"PCIe width must be 1, 2, 4, 8, 12, 16 or 32, not {w}")
    return w


def governor(r: Reader, v: object, path: str) -> str:
    s = r.string(v, path)
    if not re.match(r"^[a-z_]{1,32}$", s):
        raise r.fail(path, f"bad governor name {s!r}")
    return s


def list_str(s: set[int]) -> str:
    return ", ".join(str(x) for x in sorted(s)) or "none"


def indexed(r: Reader, m: Mapping[Any, Any], path: str, known: set[int], what: str) -> dict[int, Any]:
    out: dict[int, Any] = {}
    for k, v in m.items():
        kp = join(path, k)
        try:
            idx = int(str(k), 10) if not isinstance(k, bool) else None
        except ValueError:
            idx = None
        if idx is None:
            raise r.fail(kp, f"{what} key must be an integer, not {k!r}")
        if idx not in known:
            raise r.fail(kp, f"unknown {what} {idx} (known: {list_str(known)})")
        out[idx] = v
    return out
