"""PCI addresses in their two written forms, and the one place that converts between them.

The kernel names a device ``0000:82:00.0`` (domain of 4 hex digits -- more only on hosts with 16-bit+
domains -- lower case; sysfs, lspci). NVML's ``nvmlPciInfo_t.busId`` is ``00000000:82:00.0`` (8-digit
domain, upper-case hex, as ``nvidia-smi`` and dcgm-exporter's ``pci_bus_id`` label print it). gpufeed keys
everything by the sysfs form; :func:`to_nvml` gives the NVML form for joins with dcgm-exporter.
"""

from __future__ import annotations

import re

# domain:bus:device.function; device 0x00-0x1f, function 0-7 (PCI Local Bus Specification).
ADDRESS = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([01][0-9a-fA-F])\.([0-7])$")
# A host bridge's directory under /sys/devices: pci<domain>:<bus>.
HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")


def normalize(text: str | bytes) -> str | None:
    """Either form (or bytes from NVML, NUL-padded) -> sysfs form ``0000:82:00.0``; None if not an address."""
    s = text.decode("ascii", "replace") if isinstance(text, bytes) else str(text)
    m = ADDRESS.match(s.strip("\x00 \n"))
    if not m:
        return None
    dom = m.group(1).lower().lstrip("0").rjust(4, "0")
    return f"{dom}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


def is_address(text: str) -> bool:
    """Whether ``text`` is a PCI address in the sysfs form (a directory name under /sys/devices)."""
    return normalize(text) == text


def from_nvml(bus_id: str | bytes, domain: int | None = None) -> str:
    """``nvmlPciInfo_t.busId`` -> sysfs form. Legacy ``busIdLegacy`` values without a domain
    (``82:00.0``) take ``domain``; an unparsable value is returned lower-cased, as given."""
    s = bus_id.decode("ascii", "replace") if isinstance(bus_id, bytes) else str(bus_id)
    s = s.strip("\x00 ")
    got = normalize(s)
    if got is not None:
        return got
    if domain is not None and s.count(":") == 1:
        got = normalize(f"{domain:04x}:{s}")
        if got is not None:
            return got
    return s.lower()


def to_nvml(bdf: str) -> str:
    """sysfs form -> NVML's ``00000000:82:00.0`` (what dcgm-exporter exports as ``pci_bus_id``)."""
    norm = normalize(bdf)
    if norm is None:
        raise ValueError(f"not a PCI address: {bdf!r}")
    dom, rest = norm.split(":", 1)
    return f"{int(dom, 16):08X}:{rest.upper()}"
