"""PCIe link arithmetic: sysfs speed strings, generations, and the achievable throughput of a link.

Pure functions, no I/O: the pcie collector uses them to export the capacity of each current link, and the
derived layer uses them to compare a GPU's PCIe traffic with what its link can carry. Nothing here imports a
collector.

Capacity model (unidirectional, bytes/s, payload only)::

    raw      = GT/s * lanes / 8                        bits on the wire per lane -> bytes
    encoded  = raw * line-code efficiency              8b/10b (Gen1-2), 128b/130b (Gen3-5), FLIT (Gen6)
    payload  = encoded * tlp_efficiency * link_efficiency

``tlp_efficiency`` is the share of a TLP that is payload: for a 256-byte payload (the usual
Max_Payload_Size of GPUs and their root ports) the packet also carries a 4DW header (16 bytes, 64-bit
addresses: DMA to host memory above 4 GiB), an LCRC (4) and framing with the sequence number (Gen1-2:
STP + END symbols and a 2-byte sequence number; Gen3-5: a 4-byte STP token holding the sequence number),
24 bytes in all, so 256/280 = 91.4%. In FLIT mode (Gen6) the LCRC and sequence number move into the
flit: 236 of every 256 flit bytes carry TLPs, and only the 16-byte header is per packet.

``link_efficiency`` is what the data-link layer and the physical layer take on top: ACK/NAK and
flow-control DLLPs, SKP ordered sets, and completion traffic interleaved with posted writes. It is an
empirical factor (0.90 for Gen1-5), calibrated so the model lands on the published achievable figures:
about 12-13 GB/s for Gen3 x16 and 25-26 GB/s for Gen4 x16 (pinned-memory host<->device copies, e.g.
CUDA's bandwidthTest; the "80-85% of the encoded rate" rule of thumb). For Gen6 the DLLPs ride in the
flit's DLP bytes, leaving SKP and completion overhead (0.95). Gen6 is an estimate: no measured
figures were available when this was written.
"""

from __future__ import annotations

import math
import re

# Transfer rate (GT/s) of each generation, PCIe Base Specification 1.0 .. 6.0.
GENERATION_GTS: dict[int, float] = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}

GENERATIONS = tuple(GENERATION_GTS)

# Valid link widths (PCIe Base Specification, Link Capabilities "Maximum Link Width").
WIDTHS = (1, 2, 4, 8, 12, 16, 32)

DEFAULT_PAYLOAD_BYTES = 256
TLP_HEADER_BYTES = 16  # 4DW header: memory write/read completion with 64-bit address
# Per-TLP framing outside FLIT mode: Gen1-2 STP(1) + seq(2) + END(1); Gen3-5 STP token (4, holds the seq).
TLP_FRAMING_BYTES = 4
TLP_LCRC_BYTES = 4
FLIT_BYTES = 256
FLIT_TLP_BYTES = 236  # 256-byte flit = 236 TLP + 6 DLP + 8 CRC + 6 FEC (PCIe 6.0, FLIT mode)
LINK_EFFICIENCY_NON_FLIT = 0.90  # DLLPs (ACK, UpdateFC), SKP ordered sets, completion interleave
LINK_EFFICIENCY_FLIT = 0.95  # DLLPs travel in the flit's DLP bytes; SKP and completions remain

_GTS_TO_GEN = {v: k for k, v in GENERATION_GTS.items()}
# Kernel speed strings (drivers/pci/probe.c pci_speed_string / pci-sysfs.c): "2.5 GT/s PCIe", "8.0 GT/s
# PCIe", ... "64.0 GT/s PCIe"; kernels before 4.19 wrote "2.5 GT/s", "5 GT/s", "8 GT/s", "Unknown speed".
_SPEED = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*GT/s(?:\s+PCIe)?\s*$", re.IGNORECASE)
# Conventional PCI / PCI-X bus speeds ("33 MHz PCI", "133 MHz PCI-X 533"): not a PCIe link.
_LEGACY = re.compile(r"^\s*\d+\s*MHz\s+PCI", re.IGNORECASE)


class LinkParseError(ValueError):
    """A link attribute that is neither a known value nor ``Unknown``; the message quotes it."""


def parse_speed(text: str) -> float | None:
    """GT/s from a sysfs ``*_link_speed`` value; None for ``Unknown`` or a non-PCIe bus.

    ``"16.0 GT/s PCIe"`` -> 16.0, ``"5 GT/s"`` -> 5.0, ``"Unknown"`` -> None; LinkParseError on anything
    else (including a well-formed rate that no generation uses).
    """
    s = text.strip().rstrip("\x00").strip()
    if not s or s.lower().startswith("unknown") or _LEGACY.match(s):
        return None
    m = _SPEED.match(s)
    if not m:
        raise LinkParseError(f"not a PCIe link speed: {text!r}")
    gts = float(m.group(1))
    if gts not in _GTS_TO_GEN:
        raise LinkParseError(f"no PCIe generation runs at {gts:g} GT/s: {text!r}")
    return gts


def parse_width(text: str) -> int | None:
    """Lanes from a sysfs ``*_link_width`` value; None when the link is down (0) or unknown.

    LinkParseError on anything that is not a valid width.
    """
    s = text.strip().rstrip("\x00").strip()
    if not s or s.lower().startswith("unknown"):
        return None
    s = s.removeprefix("x").removeprefix("X")
    try:
        w = int(s, 10)
    except ValueError as e:
        raise LinkParseError(f"not a PCIe link width: {text!r}") from e
    if w == 0:
        return None  # link down (LnkSta Negotiated Link Width reads 0), e.g. a device in D3cold
    if w not in WIDTHS:
        raise LinkParseError(f"not a PCIe link width: {text!r}")
    return w


def generation(gts: float) -> int:
    """PCIe generation (1..6) of a transfer rate in GT/s; ValueError for a rate no generation uses."""
    try:
        return _GTS_TO_GEN[float(gts)]
    except KeyError:
        raise ValueError(f"no PCIe generation runs at {gts:g} GT/s") from None


def generation_of(gts: float | None) -> int | None:
    """Like :func:`generation`, but None for an unknown rate or None (sysfs ``Unknown``)."""
    return None if gts is None else _GTS_TO_GEN.get(float(gts))


def speed_string(gen: int) -> str:
    """The kernel's ``*_link_speed`` text for generation ``gen``: ``16.0 GT/s PCIe`` (kernel >= 4.19)."""
    return f"{gts(gen):.1f} GT/s PCIe"


def gts(gen: int) -> float:
    """Transfer rate in GT/s of PCIe generation ``gen`` (1..6); ValueError otherwise."""
    try:
        return GENERATION_GTS[gen]
    except KeyError:
        raise ValueError(f"unknown PCIe generation {gen!r} (1..6)") from None


def encoding_efficiency(gen: int) -> float:
    """Share of line bits that carry data: 8b/10b Gen1-2, 128b/130b Gen3-5, FLIT (TLP bytes per flit) Gen6."""
    if gen in (1, 2):
        return 8 / 10
    if gen in (3, 4, 5):
        return 128 / 130
    if gen == 6:
        # PAM4 with no line code; the flit's CRC, FEC and DLP bytes are its overhead.
        return FLIT_TLP_BYTES / FLIT_BYTES
    raise ValueError(f"unknown PCIe generation {gen!r} (1..6)")


def encoded_bytes_per_second(gen: int, width: int) -> float:
    """Unidirectional data rate after line encoding, before protocol overhead (the "marketing" figure)."""
    _check_width(width)
    return gts(gen) * 1e9 * width / 8 * encoding_efficiency(gen)


def tlp_efficiency(gen: int, payload_bytes: int = DEFAULT_PAYLOAD_BYTES) -> float:
    """Share of TLP bytes that are payload, for ``payload_bytes`` per packet."""
    if payload_bytes <= 0:
        raise ValueError(f"payload must be positive: {payload_bytes!r}")
    per_packet = TLP_HEADER_BYTES if gen == 6 else TLP_HEADER_BYTES + TLP_FRAMING_BYTES + TLP_LCRC_BYTES
    gts(gen)  # validates gen
    return payload_bytes / (payload_bytes + per_packet)


def capacity_bytes_per_second(gen: int, width: int, payload_bytes: int = DEFAULT_PAYLOAD_BYTES) -> float:
    """Achievable unidirectional payload throughput of a Gen ``gen`` x``width`` link, in bytes/s.

    Gen3 x16 -> ~12.96e9, Gen4 x16 -> ~25.9e9 (see the module docstring for the model and its sources).
    """
    link = LINK_EFFICIENCY_FLIT if gen == 6 else LINK_EFFICIENCY_NON_FLIT
    return encoded_bytes_per_second(gen, width) * tlp_efficiency(gen, payload_bytes) * link


def capacity_from_speed(speed_gts: float | None, width: int | None) -> float | None:
    """Like :func:`capacity_bytes_per_second` from sysfs-style values; None when either is unknown."""
    if speed_gts is None or width is None or not math.isfinite(speed_gts):
        return None
    try:
        return capacity_bytes_per_second(generation(speed_gts), width)
    except ValueError:
        return None


def _check_width(width: int) -> None:
    if width not in WIDTHS:
        raise ValueError(f"not a PCIe link width: {width!r} (one of {', '.join(map(str, WIDTHS))})")
