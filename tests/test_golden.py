"""The whole-daemon golden of every fixture host: all collectors and the derived layer on a virtual clock,
``/metrics`` diffed against ``tests/fixtures/hosts/<name>/golden.prom``.

A change to any collector, the analyzer or the exposition shows up here as a diff to review like code:
regenerate with ``pytest tests/test_golden.py --update-golden`` and read ``git diff tests/fixtures/hosts``.
"""

from __future__ import annotations

import difflib
import shutil
import subprocess

import pytest

from tests.support.golden import golden_path, hosts, run


@pytest.mark.parametrize("name", hosts())
def test_whole_daemon_metrics_of_the_fixture_host_match_its_golden(name: str, update_golden: bool) -> None:
    got = run(name)
    path = golden_path(name)
    if update_golden:
        path.write_text(got)
        return
    assert path.exists(), f"no golden for {name}: run pytest tests/test_golden.py --update-golden"
    want = path.read_text()
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), str(path), "now", n=1))
        pytest.fail(f"/metrics of host {name} differs from its golden:\n{diff[:6000]}")


def test_the_run_is_deterministic() -> None:
    assert run("riser") == run("riser")


@pytest.mark.parametrize("name", hosts())
def test_whole_daemon_metrics_pass_promtool_check_metrics(name: str) -> None:
    """The full payload, GPU identity labels included, is lint-clean (no camelCase label names, units, types)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: install Debian's prometheus package (tools/ensure-test-deps.sh)")
    payload = golden_path(name).read_text().replace("{<machine>}", '{version="0"}').replace(" <machine>\n", " 0\n")
    r = subprocess.run([promtool, "check", "metrics"], input=payload, capture_output=True, text=True, timeout=60,
                       check=False)
    assert (r.returncode, r.stdout + r.stderr) == (0, ""), r.stdout + r.stderr
