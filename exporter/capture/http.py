"""The capture's HTTP paths, served by exporter/web.py behind the same TLS, basic auth and rate limit as
``/metrics`` (``--web.config.file``), only when ``--capture.enabled``:

- ``POST /capture?gpu=N`` starts a capture of GPU N's workload (``trigger="http"``) and answers at once:
  202 with the bundle's name, 409 while another capture runs, 404 when no process is known on that GPU;
- ``GET /captures`` lists the bundles in ``--capture.dir`` and the recent outcomes (JSON).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs

from exporter.capture.stage import CaptureStage
from exporter.capture.take import TRIGGER_HTTP
from exporter.web import Route

JSON = "application/json"
TEXT = "text/plain; charset=utf-8"


def _json(status: int, doc: Mapping[str, Any]) -> tuple[int, bytes, str]:
    return status, (json.dumps(doc, indent=1) + "\n").encode(), JSON


def routes(stage: CaptureStage) -> dict[str, Route]:
    """The paths to hand the web server."""

    def capture(method: str, query: str) -> tuple[int, bytes, str]:
        if method != "POST":
            return 405, b"POST /capture?gpu=N starts a capture; GET /captures lists them\n", TEXT
        values = parse_qs(query).get("gpu", [])
        if len(values) != 1 or not values[0].isdigit():
            return 400, b"expected one ?gpu=N (the GPU's NVML index)\n", TEXT
        gpu = int(values[0])
        if not stage.targets.by_gpu().get(str(gpu)):
            return 404, f"no process is known on GPU {gpu}\n".encode(), TEXT
        name = stage.start(gpu, TRIGGER_HTTP)
        if name is None:
            return 409, b"a capture is running; try again when GET /captures says it is done\n", TEXT
        return _json(202, {"name": name, "gpu": gpu, "dir": str(stage.config.dir),
                           "seconds": stage.config.duration})

    def captures(method: str, _query: str) -> tuple[int, bytes, str]:
        if method == "POST":
            return 405, b"GET /captures lists the captures; POST /capture?gpu=N starts one\n", TEXT
        return _json(200, stage.listing())

    return {"/capture": capture, "/captures": captures}
