"""The examples gpufeed ships: scenario files, alert and recording rules, Grafana dashboards, and the runbooks
the alerts link to (docs/runbooks.md, which ``gpufeed serve`` renders at ``/runbooks``: exporter/runbooks.py).

An installed gpufeed (a wheel: ``pipx install gpufeed``) carries them in the package, under
``exporter/data/<kind>/``, copied there at build time (``setup.py``) from where the source tree keeps them
(:data:`SOURCES`); in a source checkout they are read in place. ``gpufeed examples`` lists them with their
paths, and ``gpufeed diagnose --scenario`` / ``gpufeed serve --simulate`` take a shipped scenario by name
(``transfer_bound_riser``) as well as a path.

This module uses the standard library only: ``setup.py`` imports it to know what to copy.
"""

from __future__ import annotations

from pathlib import Path

# kind -> (directory in the source tree, file pattern): the one list of what is shipped.
SOURCES: dict[str, tuple[str, str]] = {
    "scenarios": ("tests/scenarios", "*.yaml"),
    "rules": ("alerts", "gpufeed-*.yml"),
    "dashboards": ("deploy/grafana/dashboards", "*.json"),
    "runbooks": ("docs", "runbooks.md"),
}
DATA_DIR = "data"  # inside the package
_PACKAGE = Path(__file__).resolve().parent


class ExampleError(LookupError):
    """No such file and no shipped example of that name; the message lists the names that exist."""


def directory(kind: str) -> Path | None:
    """Where the examples of ``kind`` lie: in the installed package, else in the source checkout."""
    installed = _PACKAGE / DATA_DIR / kind
    if installed.is_dir():
        return installed
    src, _ = SOURCES[kind]
    checkout = _PACKAGE.parent / src
    return checkout if (_PACKAGE.parent / "pyproject.toml").is_file() and checkout.is_dir() else None


def files(kind: str) -> list[Path]:
    """Every shipped example of ``kind``, sorted by name."""
    where = directory(kind)
    return [] if where is None else sorted(p for p in where.glob(SOURCES[kind][1]) if p.is_file())


def scenario(ref: str) -> Path:
    """``ref`` as a scenario file: an existing path, or the name of a shipped scenario (``.yaml`` optional)."""
    path = Path(ref)
    try:
        exists = path.exists()
    except (OSError, ValueError) as e:  # a name too long, a NUL byte
        raise ExampleError(f"{ref[:80]}: {getattr(e, 'strerror', None) or e}") from e
    if exists or "/" in ref:
        return path  # a path: the scenario loader names it in its own error when it is no good
    shipped = {p.stem: p for p in files("scenarios")}
    name = ref.removesuffix(".yaml")
    if name in shipped:
        return shipped[name]
    known = ", ".join(sorted(shipped)) or "none: this installation ships no scenarios"
    raise ExampleError(f"{ref}: no such file, and no shipped scenario of that name (shipped: {known})")
