"""POST /capture and GET /captures: behind the same basic auth as /metrics, answered at once, one at a time."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import bcrypt
import pytest

from exporter.capture.http import routes
from exporter.capture.options import CaptureConfig
from exporter.capture.stage import CaptureStage
from exporter.cli import build_parser, settings_from_args
from exporter.collectors import load_all
from exporter.daemon import Daemon
from exporter.exposition import Renderer
from exporter.sampling import Targets
from exporter.web import WebServer, WebSettings
from exporter.webconfig import WebConfigManager
from tests.support.hosts import box
from tests.test_daemon import scrape
from tests.test_web import get, request

Start = Callable[..., subprocess.Popen[bytes]]
AUTH = "Authorization: Basic " + base64.b64encode(b"ops:s3cret").decode()


@pytest.mark.asyncio
async def test_capture_endpoint_needs_the_metrics_credentials_and_runs_one_capture_at_a_time(
        workload: Start, tmp_path: Path) -> None:
    proc = workload("queue_wait")
    targets = Targets()
    targets.publish({"0": [proc.pid]})
    stage = CaptureStage(CaptureConfig(enabled=True, duration=1.0, dir=tmp_path / "c"), targets)
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"basic_auth_users:\n  ops: '{bcrypt.hashpw(b's3cret', bcrypt.gensalt(4)).decode()}'\n")
    policy = WebConfigManager(cfg)
    web = WebServer(Renderer([]), WebSettings(host="127.0.0.1", port=0), lambda: True, policy=policy,
                    routes=routes(stage))
    await web.start()
    try:
        status, _, _ = await request(web, get("/capture?gpu=0", method="POST"))
        assert status == 401
        assert not stage.running
        status, _, _ = await request(web, get("/captures"))
        assert status == 401
        status, _, body = await request(web, get("/capture?gpu=0", AUTH, method="POST"))
        assert status == 202, body
        started = json.loads(body)
        assert started["gpu"] == 0 and started["name"].endswith("-gpu0-http")
        status, _, _ = await request(web, get("/capture?gpu=0", AUTH, method="POST"))
        assert status == 409
        assert (await request(web, get("/capture?gpu=7", AUTH, method="POST")))[0] == 404
        assert (await request(web, get("/capture?gpu=x", AUTH, method="POST")))[0] == 400
        assert (await request(web, get("/capture?gpu=0", AUTH)))[0] == 405
        assert (await request(web, get("/captures", AUTH, method="POST")))[0] == 405
        stage.wait(30)
        status, headers, body = await request(web, get("/captures", AUTH))
        assert status == 200 and headers["content-type"] == "application/json"
        listing = json.loads(body)
        assert [b["name"] for b in listing["bundles"]] == [started["name"]]
        (recent,) = listing["recent"]
        assert recent["label"] == "input" and recent["trigger"] == "http"
        # POST elsewhere is still refused.
        assert (await request(web, get("/metrics", AUTH, method="POST")))[0] == 405
    finally:
        await web.stop()
        policy.close()


async def _serve(args: list[str]) -> tuple[str, int, int, int]:
    """gpufeed serve on the riser box with ``args``: /metrics, POST /capture?gpu=0, GET /captures statuses."""
    registry = load_all()
    root = box("riser")
    ns = build_parser(registry).parse_args([
        "serve", "--web.listen-address", "127.0.0.1:0", "--path.sysfs", str(root / "sys"),
        "--path.procfs", str(root / "proc"), "--web.render-interval", "50ms", *args])
    settings = settings_from_args(ns, registry)
    settings.enabled = {n: n == "pcie" for n in registry}
    daemon = Daemon(settings)
    await daemon.start()
    try:
        body = ""
        for _ in range(100):
            body = await scrape(daemon.web.port)
            if "gpufeed_pcie_link_capacity" in body and (not args or "gpufeed_capture_" in body):
                break
            await asyncio.sleep(0.05)
        post = (await request(daemon.web, get("/capture?gpu=0", method="POST")))[0]
        listing = (await request(daemon.web, get("/captures")))[0]
        root_page = (await request(daemon.web, get("/")))[0]
    finally:
        await daemon.stop()
    return body, post, listing, root_page


@pytest.mark.asyncio
async def test_serve_with_captures_enabled_serves_the_paths_and_exports_the_counts(tmp_path: Path) -> None:
    body, post, listing, _ = await _serve(["--capture.enabled", "--capture.dir", str(tmp_path)])
    assert post == 404  # no process known on GPU 0 of a box without GPUs
    assert listing == 200
    assert "gpufeed_capture_in_progress 0.0" in body
    assert "gpufeed_capture_cpu_seconds_total 0.0" in body
    assert "# TYPE gpufeed_captures_total counter" in body


@pytest.mark.asyncio
async def test_serve_without_captures_has_no_capture_path_and_no_capture_series() -> None:
    body, post, listing, root_page = await _serve([])
    assert (post, listing, root_page) == (405, 404, 200)
    assert "gpufeed_capture" not in body
    assert 'collector="capture"' not in body
