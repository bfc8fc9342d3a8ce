"""On a host without an NVIDIA driver (this CI machine) the GPU collector is "not available", quietly."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest
from structlog.testing import capture_logs

from exporter.collectors.gpu import GpuCollector
from exporter.collectors.pressure import PressureCollector
from exporter.engine import Engine, VirtualClock
from exporter.exposition import Renderer
from exporter.sampling import CollectorContext


def _driver_present() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(_driver_present(), reason="this host has an NVIDIA driver")
def test_host_without_driver_reports_gpu_not_available_and_still_serves_host_metrics(tmp_path: Path) -> None:
    procfs = tmp_path / "proc"
    (procfs / "pressure").mkdir(parents=True)
    (procfs / "pressure" / "cpu").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=1000000\n")
    clock = VirtualClock()
    gpu = GpuCollector(CollectorContext(procfs=Path("/proc"), sysfs=Path("/sys"), clock=clock.now))
    psi = PressureCollector(CollectorContext(procfs=procfs, sysfs=Path("/sys")))
    engine = Engine([gpu, psi], clock, inline=True)
    with capture_logs() as logs:
        engine.run_until(3.0)
    st = engine.snapshot.status
    for name in ("gpu", "gpu_samples", "gpu_slow"):
        assert not st[name].available and st[name].failures == 0
        assert "not available" in (st[name].error or "")
    assert not [e for e in logs if e["log_level"] in ("error", "warning")]
    renderer = Renderer([gpu, psi])
    renderer.render(engine.snapshot)
    text = renderer.text().body.decode()
    assert 'gpufeed_collector_available{collector="gpu"} 0.0' in text
    assert 'gpufeed_collector_success{collector="gpu"}' not in text
    assert "gpufeed_gpu_" not in text
    assert 'gpufeed_pressure_stalled_seconds_total{resource="cpu"} 1.0' in text
