"""The interconnect's judgements: NVLink and the network adapters beside a GPU, load-aware like the PCIe link.

- :func:`nvlink_degraded` and :func:`nic_link_degraded` are platform findings of one GPU: a link down or below
  what it is known to reach, or its error counters rising, *while the GPU is busy* -- idle NVLinks sleep and
  idle links mean nothing, so an idle GPU is never judged (docs/topology.md).
- :func:`wire_load` is what the ``network_bound`` verdict reads: how near its NVLinks, or the adapter on its
  PCIe switch, run to the capacity of their *current* links over the window.

Pure functions over sample windows (the GPU's slow samples, the nic collector's samples).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from exporter import thresholds
from exporter.derived.findings import SUSTAIN_S, busy_at
from exporter.derived.gpuview import GpuView
from exporter.samples.derived import Finding
from exporter.samples.gpu import GpuSample, GpuSlow, NvLink
from exporter.samples.topology import NicPort, NicSample
from exporter.snapshot import Stamped

NVLINK = thresholds.DEFAULTS["nvlink_degraded"]
NIC = thresholds.DEFAULTS["nic_link_degraded"]
NVLINK_REPLAY = int(NVLINK["min_replay_increase"])
NVLINK_RECOVERY = int(NVLINK["min_recovery_increase"])
NIC_ERRORS = int(NIC["min_error_increase"])
NIC_LINK_EVENTS = int(NIC["min_link_event_increase"])
# Counters of a link-down or retrain event (any is news), and of bit errors (a few are tolerated).
NIC_EVENT_COUNTERS = frozenset({"link_downed", "link_error_recovery", "carrier_changes"})
BUSY_UTIL = 0.10  # as findings.BUSY_UTIL: a GPU at >= 10% utilisation has work


@dataclass(frozen=True, slots=True)
class WireLoad:
    """The busiest interconnect path of a GPU over the window: ``ratio`` of its current capacity it carried
    (the busier direction), and words naming the link and its figures."""

    ratio: float
    what: str


def _busy(view: GpuView) -> bool:
    return (view.util or 0.0) >= BUSY_UTIL


def _busy_times(view: GpuView, times: Sequence[float]) -> list[float]:
    """Those of ``times`` at which the GPU was busy (its own mean when no activity point covers one)."""
    out = []
    for t in times:
        b = busy_at(view.util_points, t)
        if b if b is not None else _busy(view):
            out.append(t)
    return out


def _sustained(times: list[float]) -> bool:
    return len(times) >= 2 and times[-1] - times[0] >= SUSTAIN_S


def _links(slow: Sequence[Stamped[GpuSample]], index: int) -> list[tuple[float, tuple[NvLink, ...]]]:
    """GPU ``index``'s NVLink readings in the window, each at the time it was read: a steady GPU's slow samples
    carry the same reading (the same tuple) until its links are read again (exporter/gpu/nvlink.py), and a rate
    or a duration over those repeats would stretch one reading over cycles that did not read it."""
    rows: list[tuple[float, tuple[NvLink, ...]]] = []
    for s in slow:
        g = s.value.gpus.get(index)
        if isinstance(g, GpuSlow) and g.nvlink and not (rows and rows[-1][1] is g.nvlink):
            rows.append((s.t, g.nvlink))
    return rows


def nvlink_degraded(view: GpuView, slow: Sequence[Stamped[GpuSample]]) -> Finding | None:
    """A link of the busy GPU down across busy samples spanning SUSTAIN_S, or its errors rising in the window.

    A down link is judged only where it is known to be wired: it was seen up since gpufeed started (its far end
    is known), or the GPU has links to an NVSwitch (every link of such a system is cabled). A board whose unused
    links never came up (no bridge on them) is not degraded.
    """
    rows = _links(slow, view.index)
    if not rows or not _busy(view):
        return None
    busy_t = set(_busy_times(view, [t for t, _ in rows]))
    busy = [(t, links) for t, links in rows if t in busy_t]
    why: list[str] = []
    severity = str(NVLINK["severity"])
    if _sustained([t for t, _ in busy]):
        newest = busy[-1][1]
        switched = any(ln.remote == "switch" for ln in newest)
        ever_up = {ln.link for _, links in busy for ln in links if ln.up}
        down = [ln.link for ln in newest if ln.link not in ever_up and (ln.remote or switched)]
        if down:
            why.append(f"NVLink {', '.join(map(str, down))} down of {len(newest)} while GPU {view.index} is busy")
            severity = "critical"  # the collectives over it lose that link's share for as long as it is down
    first, last = {ln.link: ln for ln in rows[0][1]}, rows[-1][1]
    for ln in last:
        old = first.get(ln.link)
        if old is None or ln.errors is old.errors:  # unchanged (a healthy link's errors are one shared mapping)
            continue
        rise = {k: n - old.errors.get(k, n) for k, n in ln.errors.items()}
        if rise.get("recovery", 0) >= NVLINK_RECOVERY or rise.get("replay", 0) + rise.get("crc", 0) >= NVLINK_REPLAY:
            parts = ", ".join(f"{n} {k}" for k, n in sorted(rise.items()) if n > 0)
            why.append(f"NVLink {ln.link} errors rising ({parts} in {rows[-1][0] - rows[0][0]:.0f} s)")
    if not why:
        return None
    return Finding("nvlink_degraded", view.index, severity,
                   "; ".join(why) + f" (nvidia-smi nvlink -s -i {view.index}; nvidia-smi nvlink -e -i {view.index})")


def _beside(sample: NicSample, bdf: str) -> list[NicPort]:
    return [p for p in sample.ports if bdf in p.gpus]


def _gbit(bps: float) -> str:
    return f"{bps / 1e9:.0f} Gb/s"


def nic_link_degraded(view: GpuView, nic: Sequence[Stamped[NicSample]]) -> Finding | None:
    """An adapter on the busy GPU's PCIe switch down or below its capable rate across busy samples spanning
    SUSTAIN_S, or its error counters rising in the window."""
    if not nic or not view.bdf or not _busy(view):
        return None
    ports = {p.key: p for p in _beside(nic[-1].value, view.bdf)}
    if not ports:
        return None
    why: list[str] = []
    busy_t = set(_busy_times(view, [s.t for s in nic]))
    busy = [s.value for s in nic if s.t in busy_t]
    if _sustained(sorted(busy_t)):
        for key, p in sorted(ports.items()):
            seen = [q for s in busy for q in s.ports if q.key == key]
            rates = [q.rate_bps for q in seen if q.rate_bps is not None]
            cap = p.capable_bps
            if cap is None:
                continue
            if not rates and all(q.up is False for q in seen):
                why.append(f"{key} ({p.kind}) down beside busy GPU {view.index} (it reaches {_gbit(cap)})")
            elif rates and max(rates) < cap:
                why.append(f"{key} ({p.kind}) at {_gbit(max(rates))} of the {_gbit(cap)} it reaches, beside busy "
                           f"GPU {view.index}")
    first = {p.key: p for p in nic[0].value.ports}
    for key, p in sorted(ports.items()):
        old = first.get(key)
        if old is None:
            continue
        rise = {k: n - old.errors.get(k, n) for k, n in p.errors.items()}
        events = {k: n for k, n in rise.items() if k in NIC_EVENT_COUNTERS and n >= NIC_LINK_EVENTS}
        errors = sum(n for k, n in rise.items() if k not in NIC_EVENT_COUNTERS)
        if events or errors >= NIC_ERRORS:
            parts = ", ".join(f"{n} {k}" for k, n in sorted(rise.items()) if n > 0)
            why.append(f"{key} errors rising ({parts} in {nic[-1].t - nic[0].t:.0f} s)")
    if not why:
        return None
    return Finding("nic_link_degraded", view.index, str(NIC["severity"]),
                   "; ".join(why) + " (ibstat / ethtool <if>; perfquery -x for the port's counters; reseat or "
                                    "replace the cable or transceiver)")


def _ends(rows: Sequence[tuple[float, tuple[NvLink, ...]]], attr: str) -> list[tuple[float, int | None]]:
    """The links' total of counter ``attr`` at the first and the last sample where it is known (all :func:`_rate`
    reads): summed at two samples of the window, not at every one."""
    first = next(((t, v) for t, links in rows if (v := _sum([getattr(ln, attr) for ln in links])) is not None), None)
    last = next(((t, v) for t, links in reversed(rows)
                 if (v := _sum([getattr(ln, attr) for ln in links])) is not None), None)
    return [x for x in (first, last) if x is not None]


def _rate(samples: Sequence[tuple[float, int | None]]) -> float | None:
    """Bytes per second between the first and last known readings of a counter."""
    known = [(t, v) for t, v in samples if v is not None]
    if len(known) < 2 or known[-1][0] <= known[0][0] or known[-1][1] < known[0][1]:
        return None
    return (known[-1][1] - known[0][1]) / (known[-1][0] - known[0][0])


def wire_load(view: GpuView, slow: Sequence[Stamped[GpuSample]], nic: Sequence[Stamped[NicSample]]) -> WireLoad | None:
    """The busier of the GPU's NVLinks (payload against the active links' speeds) and the adapters on its PCIe
    switch (bytes against the port's current rate), over the window; None when neither is known."""
    best: WireLoad | None = None
    rows = _links(slow, view.index)
    if len(rows) >= 2:
        cap = sum(ln.speed_bytes_per_s or 0.0 for ln in rows[-1][1])
        up = sum(1 for ln in rows[-1][1] if ln.up)
        for direction, attr in (("sends", "tx_bytes"), ("receives", "rx_bytes")):
            r = _rate(_ends(rows, attr))
            if r is not None and cap > 0 and (best is None or r / cap > best.ratio):
                best = WireLoad(r / cap, f"NVLink {direction} {r / 1e9:.0f} GB/s = {round(100 * r / cap)}% of its "
                                         f"{up} active links' {cap / 1e9:.0f} GB/s")
    if len(nic) >= 2 and view.bdf:
        for p in _beside(nic[-1].value, view.bdf):
            if not p.rate_bps:
                continue
            for direction, attr in (("receives", "rx_bytes"), ("sends", "tx_bytes")):
                series = [(s.t, getattr(q, attr)) for s in nic for q in s.value.ports if q.key == p.key]
                r = _rate(series)
                if r is None:
                    continue
                ratio = 8 * r / p.rate_bps
                if best is None or ratio > best.ratio:
                    best = WireLoad(ratio, f"{p.key} ({p.kind}) {direction} {_gbit(8 * r)} = {round(100 * ratio)}% "
                                           f"of its current {_gbit(p.rate_bps)} link")
    return best


def _sum(values: list[int | None]) -> int | None:
    return None if any(v is None for v in values) else sum(v or 0 for v in values)
