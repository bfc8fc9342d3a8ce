"""A read-only filesystem (F18): every command that needs a scratch directory says which one it could not write,
in one line with its exit code, never "internal error" (exit 70).

Run for real: a private mount namespace (``unshare --mount``, root only) in which /tmp, /var/tmp and /dev/shm are
bind-remounted read-only and the working directory is /tmp; nothing outside the namespace sees the remounts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_RO = """
for d in /tmp /var/tmp /dev/shm; do mount --bind "$d" "$d" && mount -o remount,bind,ro "$d" || exit 99; done
cd /tmp && exec "$@"
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="needs root and unshare(1) for a private read-only mount namespace")


def _read_only(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "MPLCONFIGDIR": "/tmp/gpufeed-mpl", "HOME": "/tmp"}
    env.pop("TMPDIR", None)
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", _RO, "sh",
                           sys.executable, "-m", "exporter", *args],
                          capture_output=True, text=True, timeout=timeout, env=env, check=False)


@pytest.mark.parametrize("args", [
    ("diagnose", "--scenario", "launch_bound"),
    ("serve", "--simulate", "launch_bound", "--web.listen-address", "127.0.0.1:0"),
])
def test_a_simulation_without_a_writable_directory_names_the_directories_in_one_line(args: tuple[str, ...]) -> None:
    r = _read_only(*args)
    assert r.returncode == 74, r.stderr[-2000:]
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("gpufeed: error: no writable directory for the simulated host"), r.stderr[-2000:]
    assert "/dev/shm" in line and "/tmp" in line and "TMPDIR" in line


def test_report_without_a_writable_cache_directory_says_so_in_one_line() -> None:
    r = _read_only("report", "--prometheus", "http://127.0.0.1:9", "--out", "/tmp/out")
    assert r.returncode == 8, r.stderr[-2000:]
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("gpufeed report: error: matplotlib") and "MPLCONFIGDIR" in line, r.stderr[-2000:]
