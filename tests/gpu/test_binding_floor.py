"""The oldest nvidia-ml-py that pyproject.toml admits, installed beside the suite's own and run under the GPU tests.

The rest of the suite runs against whatever binding pip resolved (the newest); a floor nobody runs admits
bindings that break on real drivers (issue 38: 12.535.77's process struct is 32 bytes against the driver's 24
and it has no ``_v2`` fallback). Here the floor version goes into a temporary directory that shadows the
installed ``pynvml`` on PYTHONPATH, and tests/gpu (the binding's surface, the backend through real ctypes
calls over bench/nvmlstub, process enumeration, MIG) runs against it in a child pytest (about 10 s; bounded at
150 s for a loaded machine). Needs PyPI (CI has it); skipped, saying so, only when the network is unreachable.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
# What pip prints when it cannot reach an index at all (not a missing version: that must fail).
OFFLINE = re.compile(r"NewConnectionError|Temporary failure in name resolution|Network is unreachable|"
                     r"ProxyError|Failed to establish a new connection")
CHILD_TIMEOUT_S = 150


def floor() -> str:
    """The version in pyproject.toml's ``nvidia-ml-py>=X``."""
    m = re.search(r'"nvidia-ml-py>=([0-9.]+)"', (REPO / "pyproject.toml").read_text())
    assert m, "pyproject.toml must declare nvidia-ml-py>=<version>"
    return m.group(1)


def test_the_gpu_tests_pass_on_the_oldest_nvidia_ml_py_the_package_admits(tmp_path: Path) -> None:
    version = floor()
    target = tmp_path / "site"
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
         "--only-binary=:all:", "--target", str(target), f"nvidia-ml-py=={version}"],
        capture_output=True, text=True, timeout=30, check=False)
    if pip.returncode != 0 and OFFLINE.search(pip.stdout + pip.stderr):
        pytest.skip(f"PyPI unreachable, nvidia-ml-py=={version} not installed: {pip.stderr.strip()[-300:]}")
    assert pip.returncode == 0, pip.stdout + pip.stderr
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), str(REPO)]))
    seen = subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m, pynvml; print(m.version('nvidia-ml-py'), "
                               "pynvml.__file__)"],
        capture_output=True, text=True, timeout=30, env=env, cwd=REPO, check=True).stdout.split()
    assert seen[0] == version and seen[1].startswith(str(target)), seen
    # Verbose: a child that runs out of time names the test it was in. ~10 s on an idle 2-core machine; the bound
    # leaves room for a loaded CI machine (55 s was once not enough there) and for fresh bytecode.
    try:
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "0", "-x",
             "tests/gpu", f"--ignore={Path(__file__).relative_to(REPO)}"],
            capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, env=env, cwd=REPO, check=False)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"GPU tests on nvidia-ml-py {version} still running after {CHILD_TIMEOUT_S} s:\n{out[-3000:]}")
    assert run.returncode == 0, f"GPU tests fail on nvidia-ml-py {version}:\n{run.stdout[-4000:]}"


def test_the_image_pins_a_binding_at_or_above_the_floor() -> None:
    m = re.search(r"^ARG NVIDIA_ML_PY_VERSION=([0-9.]+)$", (REPO / "Dockerfile").read_text(), re.M)
    assert m, "the Dockerfile must pin nvidia-ml-py (ARG NVIDIA_ML_PY_VERSION)"
    assert '"nvidia-ml-py==${NVIDIA_ML_PY_VERSION}"' in (REPO / "Dockerfile").read_text()

    def key(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in v.split("."))
    assert key(m.group(1)) >= key(floor())
