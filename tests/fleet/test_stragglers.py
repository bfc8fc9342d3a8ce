"""The report's GPU-hours lost to stragglers against a backfilled job with known straggler episodes.

tests/fleet/fleetgen.py ``straggler_plans``: one job of four ranks on two hosts, three days; in each of its two
episodes one rank waits on a cause of its own host (transfer_bound, then io_bound) while the three others sit in
collective_wait. The report must give each job's and each cause's lost GPU-hours (3 ranks x the episode) within
1%, from the recording rule and from the raw series alike.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.cli import main
from exporter.fleet.collect import JOB_COLLECTIVE_RULE
from tests.fleet.fleetgen import STRAGGLER_EPISODES, Fleet, straggler_plans
from tests.fleet.harness import Backfilled, HarnessError, backfilled_fleet

pytestmark = pytest.mark.integration

REL = 0.01


@pytest.fixture(scope="module")
def job_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backfilled]:
    end = (int(time.time()) // 3600 - 2) * 3600
    try:
        with backfilled_fleet(straggler_plans(), end - 3 * 86400, end, tmp_path_factory.mktemp("stragglers")) as bf:
            yield bf
    except HarnessError as e:
        pytest.fail(str(e))


def _report(bf: Backfilled, url: str, out: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    rc = main(["report", "--prometheus", url, "--end", str(int(bf.fleet.end)), "--range", "3d", "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    doc: dict[str, Any] = json.loads((out / "report.json").read_text())
    return doc


def test_the_truth_is_three_ranks_times_each_episode() -> None:
    """The generator's own truth, before the report is held to it: 3 waiting ranks x each episode's hours."""
    fleet = Fleet(straggler_plans(), 0.0, 3 * 86400.0)
    truth = fleet.truth_straggler_loss()
    want: dict[str, float] = {}
    for a, b, _, cause in STRAGGLER_EPISODES:
        want[cause] = want.get(cause, 0.0) + 3 * (b - a) * 3600
    assert truth.keys() == {("llm", "llm-pretrain")}
    assert truth[("llm", "llm-pretrain")] == pytest.approx(want)


@pytest.mark.parametrize("server", ["rules", "raw"])
def test_lost_gpu_hours_per_job_and_cause_match_the_episodes(job_fleet: Backfilled, server: str, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    bf = job_fleet
    doc = _report(bf, bf.rules.url if server == "rules" else bf.raw.url, tmp_path / "out", capsys)
    s = doc["stragglers"]
    assert s["source"] == (JOB_COLLECTIVE_RULE if server == "rules" else
                           'gpufeed_gpu_bottleneck{cause="collective_wait"}')
    truth = {job: {c: v / 3600 for c, v in per.items()} for job, per in bf.fleet.truth_straggler_loss().items()}
    assert [(j["namespace"], j["job_id"]) for j in s["jobs"]] == list(truth)
    job = s["jobs"][0]
    want = truth[("llm", "llm-pretrain")]
    got = {c["cause"]: c["gpu_hours"] for c in job["by_cause"]}
    assert got.keys() == want.keys() == {"transfer_bound", "io_bound"}
    for cause, hours in want.items():
        assert got[cause] == pytest.approx(hours, rel=REL), cause
        assert {c["cause"]: c["gpu_hours"] for c in s["by_cause"]}[cause] == pytest.approx(hours, rel=REL)
    assert job["lost_gpu_hours"] == pytest.approx(sum(want.values()), rel=REL)
    assert s["lost_gpu_hours"] == pytest.approx(sum(want.values()), rel=REL)
    assert job["peak_ranks_waiting"] == pytest.approx(3, rel=REL)
    html = (tmp_path / "out" / "report.html").read_text()
    md = (tmp_path / "out" / "report.md").read_text()
    assert '<section id="stragglers">' in html and "llm-pretrain" in html.split('<section id="stragglers">')[1]
    assert "## GPU-hours lost to stragglers" in md and "| `transfer_bound` |" in md
