"""The ``--capture.*`` settings: when a capture runs, how long it samples, where its bundles go and how many stay.

Off by default: with ``--capture.enabled`` unset nothing of :mod:`exporter.capture` is built, no thread or
process is started and no series is exported (py-spy needs ptrace on the workload: docs/deployment.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.durations import format_duration
from exporter.sampling import Option

MAX_DURATION_S = 60.0  # py-spy runs this long at most: a capture is a glance, not a profile
MAX_RATE_HZ = 1000
DIAGNOSE_DIR = "gpufeed-captures"  # ``gpufeed diagnose --stacks``'s bundles: beside the person running it

CAPTURE_OPTIONS: tuple[Option, ...] = (
    Option("capture.enabled", "bool", False, "Capture the stacks of a GPU's workload (py-spy, needs ptrace: "
           "CAP_SYS_PTRACE and the workload's PID namespace) and a bundle of evidence when the GPU has waited on "
           "one cause for --capture.after; also enables POST /capture and GET /captures."),
    Option("capture.after", "duration", 120.0, "How long a GPU waits on one cause before its workload is captured."),
    Option("capture.interval", "duration", 3600.0, "Least time between two automatic captures of one workload."),
    Option("capture.duration", "duration", 5.0,
           f"How long py-spy samples (at most {format_duration(MAX_DURATION_S)})."),
    Option("capture.rate", "int", 100, f"py-spy samples per second (at most {MAX_RATE_HZ})."),
    Option("capture.native", "bool", False, "Also sample native frames (cudaStreamSynchronize, cuLaunchKernel); "
           "py-spy then pauses the target at each sample instead of reading it while it runs."),
    Option("capture.dir", "str", "/var/lib/gpufeed/captures", "Folder the capture bundles are written to."),
    Option("capture.max-count", "int", 20, "Most bundles kept in --capture.dir; the oldest are removed first."),
    Option("capture.max-bytes", "int", 100 * 1024 * 1024,
           "Most bytes the bundles in --capture.dir may take; the oldest are removed first."),
)

_DEFAULT = {o.name: o.default for o in CAPTURE_OPTIONS}


@dataclass(frozen=True, slots=True)
class CaptureConfig:
    """The resolved ``--capture.*`` settings."""

    enabled: bool = _DEFAULT["capture.enabled"]
    after: float = _DEFAULT["capture.after"]
    interval: float = _DEFAULT["capture.interval"]
    duration: float = _DEFAULT["capture.duration"]
    rate: int = _DEFAULT["capture.rate"]
    native: bool = _DEFAULT["capture.native"]
    dir: Path = Path(_DEFAULT["capture.dir"])
    max_count: int = _DEFAULT["capture.max-count"]
    max_bytes: int = _DEFAULT["capture.max-bytes"]

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> CaptureConfig:
        """From resolved settings values (``capture.*`` keys)."""
        return cls(enabled=bool(values["capture.enabled"]), after=float(values["capture.after"]),
                   interval=float(values["capture.interval"]), duration=float(values["capture.duration"]),
                   rate=int(values["capture.rate"]), native=bool(values["capture.native"]),
                   dir=Path(values["capture.dir"]), max_count=int(values["capture.max-count"]),
                   max_bytes=int(values["capture.max-bytes"]))


def check(values: Mapping[str, Any]) -> None:
    """ValueError naming the flag when a ``capture.*`` value is out of range."""
    if not 0 < values["capture.duration"] <= MAX_DURATION_S:
        raise ValueError(f"--capture.duration must be above 0 and at most {format_duration(MAX_DURATION_S)}")
    if not 1 <= values["capture.rate"] <= MAX_RATE_HZ:
        raise ValueError(f"--capture.rate must be between 1 and {MAX_RATE_HZ}")
    if values["capture.max-count"] < 1:
        raise ValueError("--capture.max-count must be at least 1")
    if values["capture.max-bytes"] < 1024 * 1024:
        raise ValueError("--capture.max-bytes must be at least 1048576 (one bundle's stacks alone take that)")
    if not values["capture.dir"]:
        raise ValueError("--capture.dir must name a folder")
