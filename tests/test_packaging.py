"""What an installed gpufeed is: the wheel carries its data and examples, ``gpufeed --version`` and
``gpufeed_build_info`` say which build it is, and ``pipx install`` of the wheel runs a shipped scenario."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import jsonschema
import pytest

from exporter import __version__, buildinfo, examples
from exporter.diagnose import report
from exporter.exposition import self_metrics
from exporter.snapshot import Snapshot

REPO = Path(__file__).resolve().parents[1]


def test_build_info_is_one_series_labelled_with_version_revision_and_python() -> None:
    (fam,) = [f for f in self_metrics(Snapshot(version=0, t=0.0)) if f.name == "gpufeed_build_info"]
    (sample,) = fam.samples
    assert sample.value == 1.0
    assert set(sample.labels) == {"version", "revision", "python"}
    assert sample.labels["version"] == __version__ and sample.labels["revision"]


def test_a_source_checkout_has_every_kind_of_example_and_finds_a_scenario_by_name() -> None:
    for kind in examples.SOURCES:
        assert examples.files(kind), f"no {kind} found in the checkout"
    assert examples.scenario("transfer_bound_riser") == REPO / "tests" / "scenarios" / "transfer_bound_riser.yaml"
    assert examples.scenario("launch_bound.yaml").name == "launch_bound.yaml"
    with pytest.raises(examples.ExampleError, match=r"shipped: .*healthy_training"):
        examples.scenario("nope")


# What a build reads (the Dockerfile copies the same): the package, its metadata and build step, the examples.
BUILD_INPUTS = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "exporter")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built offline (the venv's setuptools, no build isolation) from the files a build is given."""
    src = tmp_path_factory.mktemp("src")
    for name in BUILD_INPUTS:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(REPO / name, src / name)
    for source, pattern in examples.SOURCES.values():
        (src / source).mkdir(parents=True, exist_ok=True)
        for f in (REPO / source).glob(pattern):
            shutil.copy(f, src / source / f.name)
    if (REPO / ".git").exists():
        (src / ".git").symlink_to(REPO / ".git")  # git describe works in the copy as in the checkout
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                        "--no-index", "--wheel-dir", str(out), str(src)],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = out.glob("gpufeed-*.whl")
    return whl


def test_the_wheel_carries_thresholds_schema_and_the_examples(wheel: Path) -> None:
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"exporter/thresholds.yaml", "exporter/diagnose/report.schema.json", "exporter/_revision.txt"} <= names
    for kind, (src, pattern) in examples.SOURCES.items():
        for f in sorted((REPO / src).glob(pattern)):
            assert f"exporter/data/{kind}/{f.name}" in names


def test_pipx_install_of_the_wheel_runs_diagnose_on_a_shipped_scenario(wheel: Path, tmp_path: Path) -> None:
    if sys.prefix == sys.base_prefix:
        pytest.fail("run the tests from the project's venv (make test): its site-packages serve the dependencies")
    pipx = Path(sys.executable).with_name("pipx")
    assert pipx.exists(), "pipx is a test dependency: pip install -e '.[test]'"
    # Offline: pipx's shared libraries are a venv whose site-packages is the project venv's, so the app's venv
    # sees the installed dependencies and pip installs only the wheel; no index is asked, nothing is upgraded.
    shared = tmp_path / "shared"
    venv.create(shared, with_pip=False, symlinks=True)
    (site,) = shared.glob("lib/python*/site-packages")
    site.rmdir()
    site.symlink_to(sysconfig.get_paths()["purelib"], target_is_directory=True)
    (shared / "bin" / "pip").symlink_to(Path(sys.executable).with_name("pip"))  # pipx's test of a valid venv
    env = {**os.environ, "PIPX_HOME": str(tmp_path / "pipx"), "PIPX_BIN_DIR": str(tmp_path / "bin"),
           "PIPX_MAN_DIR": str(tmp_path / "man"), "PIPX_SHARED_LIBS": str(shared),
           "PIPX_DISABLE_SHARED_LIBS_AUTO_UPGRADE": "1", "PIP_NO_INDEX": "1"}
    env.pop("PYTHONPATH", None)
    r = subprocess.run([str(pipx), "install", "--python", sys.executable, "--pip-args=--no-deps --no-index",
                        str(wheel)], capture_output=True, text=True, timeout=300, check=False, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    gpufeed = tmp_path / "bin" / "gpufeed"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(gpufeed), *args], capture_output=True, text=True, timeout=300, check=False, env=env,
                              cwd=tmp_path)

    # From outside the checkout: whatever it finds comes from the installed package.
    r = run("diagnose", "--scenario", "transfer_bound_riser", "--json")
    assert r.returncode == 1, r.stderr  # a waiting GPU and a critical finding
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, report.schema())
    assert doc["phases"][-1]["gpus"][0]["cause"] == "transfer_bound"
    r = run("examples")
    app_venv = tmp_path / "pipx" / "venvs" / "gpufeed"
    rows = [line.split() for line in r.stdout.splitlines()]
    assert {row[0] for row in rows} == set(examples.SOURCES)
    assert all(Path(row[2]).is_relative_to(app_venv) for row in rows), r.stdout
    r = run("--version")
    head = _git_head()
    assert r.stdout.startswith(f"gpufeed, version {__version__} (revision: ")
    if head is not None:  # git describe of the commit built (``-dirty``: the copy lacks the rest of the tree)
        assert head in r.stdout.splitlines()[0], r.stdout
    else:
        assert f"(revision: {buildinfo.UNKNOWN})" in r.stdout


def _git_head() -> str | None:
    git = shutil.which("git")
    if git is None or not (REPO / ".git").exists():
        return None
    r = subprocess.run([git, "-C", str(REPO), "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True,
                       timeout=30, check=False)
    return r.stdout.strip() if r.returncode == 0 else None


def test_an_editable_install_reads_its_revision_from_the_checkout(tmp_path: Path) -> None:
    # P9: `pip install -e .` and `make serve` (the README's own paths) said "revision: unknown" in a git checkout.
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")

    def g(*args: str, cwd: Path) -> str:
        return subprocess.run([git, "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                              capture_output=True, text=True).stdout.strip()

    repo = tmp_path / "repo"
    repo.mkdir()
    g("init", "-q", "-b", "main", cwd=repo)
    g("commit", "-q", "--allow-empty", "-m", "one", cwd=repo)
    first = g("rev-parse", "--short=7", "HEAD", cwd=repo)
    assert buildinfo.git_revision(repo) == first  # a loose ref
    g("pack-refs", "--all", cwd=repo)
    assert buildinfo.git_revision(repo) == first  # packed-refs
    g("worktree", "add", "-q", "-b", "side", str(tmp_path / "wt"), cwd=repo)
    g("commit", "-q", "--allow-empty", "-m", "two", cwd=tmp_path / "wt")
    assert buildinfo.git_revision(tmp_path / "wt") == g("rev-parse", "--short=7", "HEAD", cwd=tmp_path / "wt")
    g("checkout", "-q", "--detach", cwd=repo)
    assert buildinfo.git_revision(repo) == first  # a detached HEAD
    assert buildinfo.git_revision(tmp_path) is None  # not a checkout
    head = _git_head()
    if head is not None and not (REPO / "exporter" / buildinfo.REVISION_FILE).exists():
        assert buildinfo.revision() == head  # this checkout, as the editable install runs it
