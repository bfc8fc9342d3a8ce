"""What this gpufeed is: version, the source revision it was built from, and the Python running it.

``gpufeed --version`` prints it as node_exporter does, and ``gpufeed_build_info{version,revision,python}`` (one
series, value 1) exports it, so a fleet query can find the hosts still running an old build. The revision is
``git describe --always --dirty`` of the checkout a wheel was built from, written into the package at build
time (``setup.py``); a source checkout or an sdist built without git says ``unknown``.
"""

from __future__ import annotations

import platform
from functools import cache
from importlib import resources

from exporter import __version__

REVISION_FILE = "_revision.txt"
UNKNOWN = "unknown"


@cache
def revision() -> str:
    """The source revision recorded at build time, or ``unknown``."""
    try:
        text = resources.files("exporter").joinpath(REVISION_FILE).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return UNKNOWN
    # One short line of printable ASCII, or nothing: it becomes a label value.
    return text if text and len(text) <= 80 and text.isascii() and text.isprintable() else UNKNOWN


def labels() -> dict[str, str]:
    """The labels of ``gpufeed_build_info``."""
    return {"version": __version__, "revision": revision(), "python": platform.python_version()}


def version_text(prog: str = "gpufeed") -> str:
    """``gpufeed --version``, laid out like node_exporter's."""
    return (f"{prog}, version {__version__} (revision: {revision()})\n"
            f"  python version:   {platform.python_version()} ({platform.python_implementation()})\n"
            f"  platform:         {platform.system().lower()}/{platform.machine()}")
