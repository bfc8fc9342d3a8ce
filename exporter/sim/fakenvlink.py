"""The strict fake NVML's NVLinks: the state keys of a device's links, their validation, and the answers of the
NVLink calls and field values (exporter/sim/fakenvml.py's ``_FakeNvLink`` serves them).

A device's ``nvlink`` is a list, one entry per link in link-id order (empty: a PCIe-only GPU, which answers
NOT_SUPPORTED for link 0 as the driver does)::

    "nvlink": [{"up": true,            nvmlDeviceGetNvLinkState / field NVLINK_GET_STATE (idle links may sleep)
                "version": 6,          nvmlDeviceGetNvLinkVersion (nvmlNvlinkVersion_t: 6 is NVLink 4.0)
                "remote": "switch",    nvmlDeviceGetNvLinkRemoteDeviceType: "gpu", "switch" (NVSwitch), "ibmnpu"
                "speed_mbps": 25781,   field NVLINK_GET_SPEED (MB/s per direction; 0 while down)
                "tx_kib": 0, "rx_kib": 0,            fields NVLINK_THROUGHPUT_DATA_TX / _RX (cumulative KiB)
                "replay": 0, "recovery": 0, "crc": 0 fields NVLINK_ERROR_DL_REPLAY / _RECOVERY / _CRC, and
                                                     nvmlDeviceGetNvLinkErrorCounter (crc: the flit CRC counter)
               }, ...]

A link id past the last link answers INVALID_ARGUMENT; the counters are absolute values at the state's time (the
simulator moves them, as it moves every counter).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pynvml

LINK_DEFAULTS: Mapping[str, Any] = {
    "up": True, "version": 6, "remote": "gpu", "speed_mbps": 25781,
    "tx_kib": 0, "rx_kib": 0, "replay": 0, "recovery": 0, "crc": 0,
}
REMOTE_TYPES: Mapping[str, int] = {
    "gpu": pynvml.NVML_NVLINK_DEVICE_TYPE_GPU, "switch": pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH,
    "ibmnpu": pynvml.NVML_NVLINK_DEVICE_TYPE_IBMNPU,
}
# Field id -> the link's state key it answers (nvml.h NVML_FI_DEV_NVLINK_*; scopeId is the link id).
FIELDS: Mapping[int, str] = {
    pynvml.NVML_FI_DEV_NVLINK_GET_STATE: "up", pynvml.NVML_FI_DEV_NVLINK_GET_SPEED: "speed_mbps",
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: "replay", pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY: "recovery",
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC: "crc",
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: "tx_kib", pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: "rx_kib",
}
# nvmlDeviceGetNvLinkErrorCounter's counters the fake answers (nvmlNvLinkErrorCounter_t).
ERROR_COUNTERS: Mapping[int, str] = {
    pynvml.NVML_NVLINK_ERROR_DL_REPLAY: "replay", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
    pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc",
}


def normalize_links(links: object, where: str) -> list[dict[str, Any]]:
    """A device's ``nvlink`` list with every default filled in; ValueError naming a bad key or value."""
    if not isinstance(links, list):
        raise ValueError(f"{where}.nvlink must be a list of links")
    out = []
    for i, raw in enumerate(links):
        at = f"{where}.nvlink[{i}]"
        if not isinstance(raw, Mapping) or set(raw) - set(LINK_DEFAULTS):
            raise ValueError(f"{at} must be a mapping with keys from {sorted(LINK_DEFAULTS)}")
        link = {k: raw.get(k, v) for k, v in LINK_DEFAULTS.items()}
        if not isinstance(link["up"], bool):
            raise ValueError(f"{at}.up must be true or false")
        if link["remote"] not in REMOTE_TYPES:
            raise ValueError(f"{at}.remote must be one of {sorted(REMOTE_TYPES)}")
        for k in ("version", "speed_mbps", "tx_kib", "rx_kib", "replay", "recovery", "crc"):
            if not isinstance(link[k], int) or isinstance(link[k], bool) or link[k] < 0:
                raise ValueError(f"{at}.{k} must be a non-negative integer")
        out.append(link)
    return out


def link_of(dev: Mapping[str, Any], link: int) -> Mapping[str, Any]:
    """Link ``link`` of ``dev``: NOT_SUPPORTED without NVLink, INVALID_ARGUMENT past its last link."""
    links = dev["nvlink"]
    if not links:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    if not 0 <= int(link) < len(links):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    out: Mapping[str, Any] = links[int(link)]
    return out


def field_answers(dev: Mapping[str, Any]) -> Callable[[int, int], tuple[int, int]]:
    """The answer of ``dev`` to each NVLink field ``(fid, link)`` of one request: (nvmlReturn, value) --
    NOT_SUPPORTED for a ``field:<id>`` the device lists as unsupported (a driver older than the field) and on a
    GPU without NVLink, INVALID_ARGUMENT past its last link. The unsupported fields are looked up once per request
    (18 links x 7 fields), not per field."""
    unsupported = {int(f[6:]) for f in dev["unsupported"] if f.startswith("field:") and f[6:].isdigit()}

    def answer(fid: int, scope: int) -> tuple[int, int]:
        if fid in unsupported:
            return pynvml.NVML_ERROR_NOT_SUPPORTED, 0
        try:
            link = link_of(dev, scope)
        except pynvml.NVMLError as e:
            return int(e.value), 0
        key = FIELDS[fid]
        if key == "up":
            return pynvml.NVML_SUCCESS, pynvml.NVML_FEATURE_ENABLED if link["up"] else pynvml.NVML_FEATURE_DISABLED
        if key == "speed_mbps" and not link["up"]:
            return pynvml.NVML_SUCCESS, 0
        return pynvml.NVML_SUCCESS, int(link[key])

    return answer
