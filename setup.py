"""Build hooks (metadata and everything else: pyproject.toml).

A wheel carries the examples (scenarios, rules, dashboards: exporter/examples.py SOURCES) under
exporter/data/, and the source revision (``git describe``) in exporter/_revision.txt for ``gpufeed --version``
and ``gpufeed_build_info``. An sdist carries the revision file, so a wheel built from it keeps it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from exporter.buildinfo import REVISION_FILE  # noqa: E402 - standard library only, importable before install
from exporter.examples import DATA_DIR, SOURCES  # noqa: E402


def _revision() -> str:
    """``git describe`` of the checkout; the file an sdist carries; else unknown."""
    try:
        r = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty", "--tags"],
                           capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        r = None
    if r is not None and r.returncode == 0 and r.stdout.strip():
        return r.stdout.strip()
    carried = ROOT / "exporter" / REVISION_FILE
    return carried.read_text(encoding="utf-8").strip() if carried.is_file() else "unknown"


class BuildPy(build_py):
    """build_py, plus the examples and the revision file in the built package."""

    def run(self) -> None:
        super().run()
        pkg = Path(self.build_lib) / "exporter"
        for kind, (src, pattern) in SOURCES.items():
            dest = pkg / DATA_DIR / kind
            dest.mkdir(parents=True, exist_ok=True)
            for f in sorted((ROOT / src).glob(pattern)):
                shutil.copyfile(f, dest / f.name)
        (pkg / REVISION_FILE).write_text(_revision() + "\n", encoding="utf-8")


class Sdist(sdist):
    """sdist, plus the revision file (an sdist has no .git to describe)."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        (Path(base_dir) / "exporter" / REVISION_FILE).write_text(_revision() + "\n", encoding="utf-8")


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
