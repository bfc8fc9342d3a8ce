"""Collector registry: each collector module registers its class; adding a collector touches one file."""

from __future__ import annotations

import importlib
import pkgutil

from exporter.sampling import Collector

REGISTRY: dict[str, type[Collector]] = {}

_NOT_COLLECTORS = {"base"}


def register(cls: type[Collector]) -> type[Collector]:
    """Class decorator: make ``cls`` available as ``--collector.<cls.name>``; its samplers' names
    (``cls.sampler_names()``) are then taken."""
    if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
        raise RuntimeError(f"collector {cls.name!r} registered twice")
    taken = {s: other.name for other in REGISTRY.values() if other is not cls for s in other.sampler_names()}
    for sampler in cls.sampler_names():
        if sampler in taken:
            raise RuntimeError(f"sampler {sampler!r} of collector {cls.name!r} is collector {taken[sampler]!r}'s")
    REGISTRY[cls.name] = cls
    return cls


def load_all() -> dict[str, type[Collector]]:
    """Import every collector module in this package and return the registry, sorted by name."""
    for mod in pkgutil.iter_modules(__path__):
        if mod.name not in _NOT_COLLECTORS and not mod.name.startswith("_"):
            importlib.import_module(f"{__name__}.{mod.name}")
    return dict(sorted(REGISTRY.items()))
