"""The whole-daemon golden of every fixture host: all collectors and the derived layer on a virtual clock,
``/metrics`` diffed against ``tests/fixtures/hosts/<name>/golden.prom``.

A change to any collector, the analyzer or the exposition shows up here as a diff to review like code:
regenerate with ``pytest tests/test_golden.py --update-golden`` and read ``git diff tests/fixtures/hosts``.
"""

from __future__ import annotations

import difflib

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
