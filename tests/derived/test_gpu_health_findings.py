"""The gpu_xid_error and gpu_memory_errors findings, with plain data: which codes raise, at which severity,
for how long after the last event, and which memory-error conditions stand until a reset."""

from __future__ import annotations

from types import MappingProxyType

from exporter import thresholds
from exporter.derived import findings as fnd
from exporter.samples.gpu import GpuIdentity, GpuSample, GpuSlow
from exporter.snapshot import Stamped


def _slow(t: float = 100.0, *, fields: dict[str, float] | None = None, xid_errors: dict[int, int] | None = None,
          xid_last_seen: dict[int, float] | None = None) -> list[Stamped[GpuSample]]:
    g = GpuSlow(link_gen=None, link_width=None, max_link_gen=None, max_link_width=None, gpu_max_link_gen=None,
                clock_event_reasons=frozenset(), temperature_c=None, memory_used_bytes=None, memory_total_bytes=None,
                power_limit_w=None, max_sm_clock_hz=None, processes=(), numa_node=None,
                fields=MappingProxyType(fields or {}), xid_errors=MappingProxyType(xid_errors or {}),
                xid_last_seen=MappingProxyType(xid_last_seen or {}))
    ident = GpuIdentity(0, "GPU-0", "H100", "0000:82:00.0", True)
    return [Stamped(t, GpuSample(MappingProxyType({0: ident}), MappingProxyType({0: g}), frozenset()))]


def test_a_critical_xid_raises_a_critical_finding_naming_code_meaning_count_and_age() -> None:
    f = fnd.xid_errors(_slow(xid_errors={79: 1, 13: 4}, xid_last_seen={79: 90.0, 13: 99.0}), 0, now=100.0)
    assert f is not None and f.check == "gpu_xid_error" and f.gpu == 0 and f.severity == "critical"
    assert "Xid 79 (GPU has fallen off the bus), 1 since gpufeed started, last 10 s ago" in f.detail
    assert "Xid 13" not in f.detail, "an application Xid is counted, not raised"


def test_xids_the_gpu_keeps_working_through_warn_and_a_critical_one_among_them_wins() -> None:
    warn = fnd.xid_errors(_slow(xid_errors={94: 2}, xid_last_seen={94: 95.0}), 0, now=100.0)
    assert warn is not None and warn.severity == "warning"
    both = fnd.xid_errors(_slow(xid_errors={94: 2, 48: 1}, xid_last_seen={94: 95.0, 48: 96.0}), 0, now=100.0)
    assert both is not None and both.severity == "critical"
    assert thresholds.XID.warning < thresholds.XID.critical


def test_the_xid_finding_holds_for_the_alert_window_then_clears() -> None:
    hold = thresholds.XID.hold_s
    assert hold == 600.0
    def at(t: float) -> list[Stamped[GpuSample]]:
        return _slow(t=t, xid_errors={48: 1}, xid_last_seen={48: 100.0})

    assert fnd.xid_errors(at(100.0 + hold), 0, now=100.0 + hold) is not None
    assert fnd.xid_errors(at(101.0 + hold), 0, now=101.0 + hold) is None
    assert fnd.xid_errors(_slow(), 0, now=100.0) is None


def test_memory_errors_stand_until_a_reset_and_a_pending_remap_alone_warns() -> None:
    unc = fnd.memory_errors(_slow(fields={"ecc_uncorrected_volatile": 3.0, "ecc_corrected_volatile": 900.0}), 0)
    assert unc is not None and unc.severity == "critical" and "3 uncorrectable ECC errors" in unc.detail
    failed = fnd.memory_errors(_slow(fields={"row_remap_failure": 1.0}), 0)
    assert failed is not None and failed.severity == "critical" and "RMA" in failed.detail
    pending = fnd.memory_errors(_slow(fields={"row_remap_pending": 1.0, "ecc_uncorrected_volatile": 0.0}), 0)
    assert pending is not None and pending.severity == "warning"
    # Corrected errors alone are a trend for the alert, not a standing condition; no ECC (consumer card): none.
    assert fnd.memory_errors(_slow(fields={"ecc_corrected_volatile": 900.0}), 0) is None
    assert fnd.memory_errors(_slow(), 0) is None
