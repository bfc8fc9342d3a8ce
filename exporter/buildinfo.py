"""What this gpufeed is: version, the source revision it was built from, and the Python running it.

``gpufeed --version`` prints it as node_exporter does, and ``gpufeed_build_info{version,revision,python}`` (one
series, value 1) exports it, so a fleet query can find the hosts still running an old build. The revision is
``git describe --always --dirty`` of the checkout a wheel was built from, written into the package at build
time (``setup.py``). Where nothing was recorded -- an editable install (``pip install -e .``, ``make serve``)
runs the checkout itself -- the revision is read from that checkout's git metadata at runtime (the commit
``HEAD`` names, abbreviated to 7 characters; files only, no git program is run); an sdist built without git
says ``unknown``.
"""

from __future__ import annotations

import platform
import re
from functools import cache
from importlib import resources
from pathlib import Path

from exporter import __version__

REVISION_FILE = "_revision.txt"
UNKNOWN = "unknown"
_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


@cache
def revision() -> str:
    """The source revision recorded at build time, or ``unknown``."""
    try:
        text = resources.files("exporter").joinpath(REVISION_FILE).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return git_revision(Path(__file__).resolve().parent.parent) or UNKNOWN
    # One short line of printable ASCII, or nothing: it becomes a label value.
    return text if text and len(text) <= 80 and text.isascii() and text.isprintable() else UNKNOWN


def git_revision(checkout: Path) -> str | None:
    """The commit HEAD of the git checkout at ``checkout`` names, 7 characters; None where it is not one.

    Reads ``.git`` (a directory, or a worktree's ``gitdir:`` file and its ``commondir``), ``HEAD``, the loose
    ref and ``packed-refs``; anything unexpected is None, never an error.
    """
    try:
        git = checkout / ".git"
        if git.is_file():
            line = git.read_text(encoding="utf-8").strip()
            if not line.startswith("gitdir: "):
                return None
            git = (checkout / line.removeprefix("gitdir: ")).resolve()
        common = (git / (git / "commondir").read_text(encoding="utf-8").strip()).resolve() \
            if (git / "commondir").is_file() else git
        head = (git / "HEAD").read_text(encoding="utf-8").strip()
        if head.startswith("ref: "):
            ref = head.removeprefix("ref: ")
            sha = next((f.read_text(encoding="utf-8").strip() for f in (git / ref, common / ref) if f.is_file()), "")
            if not sha and (common / "packed-refs").is_file():
                for row in (common / "packed-refs").read_text(encoding="utf-8").splitlines():
                    if row.endswith(f" {ref}"):
                        sha = row.split(" ", 1)[0]
            head = sha
    except (OSError, UnicodeDecodeError):
        return None
    return head[:7] if _SHA.fullmatch(head) else None


def labels() -> dict[str, str]:
    """The labels of ``gpufeed_build_info``."""
    return {"version": __version__, "revision": revision(), "python": platform.python_version()}


def version_text(prog: str = "gpufeed") -> str:
    """``gpufeed --version``, laid out like node_exporter's."""
    return (f"{prog}, version {__version__} (revision: {revision()})\n"
            f"  python version:   {platform.python_version()} ({platform.python_implementation()})\n"
            f"  platform:         {platform.system().lower()}/{platform.machine()}")
