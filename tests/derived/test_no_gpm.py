"""Older GPUs without GPM (Ampere and before, consumer boards): every shared contract scenario is played again
with every GPU's ``gpm`` forced to false (tests/scenarios/*.yaml are byte-identical mirrors of the contract and
are not edited: the change is made on the loaded scenario).

Without GPM the verdict rests on the driver's utilisation samples (idle gaps and burstiness from them), the SM
clock and throttle reasons, the PCIe byte counters and the host; SM activity and occupancy are not measured.
So every verdict holds except the one that *is* SM activity against kernel-resident time:

- ``gpu_inefficient`` (kernels resident but SMs mostly empty) reads as ``healthy``: a GPU busy doing a poor
  job looks like a GPU busy doing a good one when only residency is measured. Its evidence says so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.derived.evaluate import NO_GPM_NOTE
from exporter.diagnose import report
from tests.support.plays import played

CONTRACT = sorted((Path(__file__).parent.parent / "scenarios").glob("*.yaml"))
# Scenario -> (phase, GPU, verdict with GPM, verdict without it): the verdicts that need GPM, and why above.
NEEDS_GPM = {"gpu_inefficient": ("running", 0, "gpu_inefficient", "healthy")}


@pytest.mark.parametrize("path", CONTRACT, ids=[p.stem for p in CONTRACT])
def test_every_contract_scenario_holds_without_gpm_where_its_verdict_does_not_need_it(path: Path) -> None:
    res = played(path, gpm=False)  # some already describe GPUs without GPM (L4, A100 PCIe)
    failures = report.check(res)
    if path.stem in NEEDS_GPM:
        phase, gpu, with_gpm, without = NEEDS_GPM[path.stem]
        assert failures == [f"phase {phase!r}: GPU {gpu}: expected {with_gpm}, got {without}"]
    else:
        assert failures == []
    # Every verdict that is not idle says what it was judged from.
    for ph in res.phases:
        assert ph.state is not None
        for v in ph.state.gpus.values():
            assert (NO_GPM_NOTE in v.evidence) == (v.cause != "idle"), (ph.name, v.index, v.cause)


def test_the_no_gpm_scenarios_really_ran_without_gpm() -> None:
    res = played(CONTRACT[0], gpm=False)
    assert res.sampler_errors == {}
    st = res.phases[-1].state
    assert st is not None and all(not any("SM active" in e for e in v.evidence) for v in st.gpus.values())
