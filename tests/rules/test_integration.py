"""The shipped rules and dashboards against real Prometheus and Alertmanager, fed by simulated hosts.

``gpufeed serve --simulate`` exporters, one per scenario of SCENARIOS, are scraped every second by a real
``prometheus`` that evaluates the SHIPPED alert and recording rules, with every duration (``for:``, range
windows, group intervals) divided by 60 in a temporary copy -- one minute of production time is one
second here; the shipped files are not touched. Alerts go to a real Alertmanager, which posts them to a
webhook run by this test. Asserted: (a) the riser scenario pages the PCIe downgrade alert and the NUMA
scenario the NUMA alert, through Alertmanager to the webhook; (b) the healthy-training and idle-downshift
scenarios fire no alert over a whole loop of their timeline; (c) every dashboard panel's query, with its
template variables substituted, parses and returns data.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.rules.conftest import ALERTS, GRAFANA, REPO

HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.integration

SPEED = 2.0  # scenario seconds per real second: fast enough to loop in a minute, slow enough to stay realistic
SCALE = 60  # shipped rule durations are divided by this
SCENARIOS = {
    "riser": "transfer_bound_riser.yaml",
    "numa": "numa_mismatch.yaml",
    "healthy": "healthy_training.yaml",
    "idle": "idle_downshift.yaml",
    "nfs": "io_bound_nfs.yaml",  # no alert asserted: it gives the NFS and IO panels data
    "mig": "mig_gpu_health.yaml",  # MIG instances and an Xid per loop: the GPU health and MIG panels
    # A pod whose CPU limit throttles it (its kubelet answers on a socket in the simulated root): the
    # per-namespace GPU-hours rules and the "by team / job" dashboard row get data.
    "k8s": "workloads/k8s_cpu_quota_v2.yaml",
    # A Slurm job step owning a GPU: the per-Slurm-job GPU-hours rules and the "by Slurm job" panels.
    "slurm": "slurm_job.yaml",
    # Two ranks of one job, one behind a downgraded link, the other waiting for it in collectives: the Jobs row.
    "job": "job_two_ranks.yaml",
    # NVLink on an NVSwitch system, and InfiniBand ports beside the GPUs: the interconnect row.
    "nvlink": "nvlink_down_one_of_eight.yaml",
    "nic": "nic_half_rate_under_load.yaml",
}
# Measures the test machine (the exporters, Prometheus and Alertmanager on shared CI cores), not the
# scenario: a sampler overrunning here says nothing about the simulated host.
HOST_LOAD_ALERTS = {"GpufeedSamplerOverruns"}
_DUR = re.compile(r"([0-9]+)(ms|s|m|h|d|w|y)")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def scenario_path(name: str) -> Path:
    for base in (REPO / "tests" / "scenarios", HERE / "scenarios", REPO / "tests" / "derived" / "scenarios",
                 REPO.parent / "shared" / "scenarios"):
        if (base / name).exists():
            return base / name
    pytest.fail(f"scenario {name} not found under tests/scenarios or ../shared/scenarios")


def shrink(duration: str) -> str:
    """A Prometheus duration divided by SCALE, at least one second ("15m" -> "15s", "1d" -> "1440s")."""
    seconds = sum(int(n) * _UNIT_S[u] for n, u in _DUR.findall(duration))
    return f"{max(1, round(seconds / SCALE))}s"


def shrink_rules(src: Path, dst: Path) -> None:
    """Copy a rule file with every for:, interval:, range window and subquery range and step divided by SCALE;
    the daily rules' hours become SCALE seconds, so they stay in step with their shrunk day."""
    doc = yaml.safe_load(src.read_text())
    for group in doc["groups"]:
        if "interval" in group:
            group["interval"] = shrink(group["interval"])
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = shrink(rule["for"])
            rule["expr"] = re.sub(r"\[([0-9a-z]+)\]", lambda m: f"[{shrink(m.group(1))}]", rule["expr"])
            rule["expr"] = re.sub(r"\[([0-9a-z]+):([0-9a-z]+)\]",
                                  lambda m: f"[{shrink(m.group(1))}:{shrink(m.group(2))}]", rule["expr"])
            if rule.get("record", "").endswith(":increase1d"):
                rule["expr"] = rule["expr"].replace("/ 3600", f"/ {3600 // SCALE}")
            rule["expr"] = re.sub(r"offset ([0-9a-z]+)", lambda m: f"offset {shrink(m.group(1))}", rule["expr"])
    dst.write_text(yaml.safe_dump(doc, sort_keys=False))


def shrunk_rule_files(tmp: Path) -> list[str]:
    """The shipped alert and recording rules, shrunk into ``tmp``: their paths for rule_files."""
    for f in ("gpufeed-alerts.yml", "gpufeed-recording.yml"):
        shrink_rules(ALERTS / f, tmp / f)
    return [str(tmp / "gpufeed-alerts.yml"), str(tmp / "gpufeed-recording.yml")]


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Terminate the processes this test started, each by its own handle; kill what does not exit."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        body: bytes = r.read()
        return body


def wait_until(what: str, check: Any, deadline: float, every: float = 0.5) -> Any:
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            got = check()
            if got:
                return got
        except (OSError, ValueError, urllib.error.URLError) as e:
            last = e
        time.sleep(every)
    pytest.fail(f"timed out waiting for {what}" + (f" (last error: {last!r})" if last else ""))


class _Webhook(BaseHTTPRequestHandler):
    received: list[dict[str, Any]]
    lock: threading.Lock

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with self.lock:
            self.received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_args: Any) -> None:
        return


@dataclass
class Stack:
    """The running servers and what the webhook received."""

    tmp: Path
    prom: str
    instances: dict[str, str]  # scenario key -> instance label
    started: float
    received: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    logs: list[Path] = field(default_factory=list)

    def webhook_alerts(self) -> list[dict[str, str]]:
        """Labels of every firing alert received, with the annotations under "annotations:<name>"."""
        with self.lock:
            return [{**a["labels"], **{f"annotations:{k}": v for k, v in a["annotations"].items()}}
                    for msg in self.received for a in msg["alerts"] if a["status"] == "firing"]

    def query(self, expr: str) -> dict[str, Any]:
        url = f"{self.prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            data: dict[str, Any] = json.loads(http_get(url))
        except urllib.error.HTTPError as e:  # 400 on a parse error: keep Prometheus's message
            data = json.loads(e.read())
        return data

    def log_tails(self) -> str:
        return "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
                         for p in self.logs if p.exists())


def _binary(*names: str) -> str:
    for n in names:
        path = shutil.which(n)
        if path:
            return path
    pytest.fail(f"{names[0]} not found: install Debian's {names[0]} package (tools/ensure-test-deps.sh)")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prometheus = _binary("prometheus")
    alertmanager = _binary("prometheus-alertmanager", "alertmanager")
    tmp = tmp_path_factory.mktemp("stack")
    procs: list[subprocess.Popen[bytes]] = []
    servers: list[ThreadingHTTPServer] = []
    logs: list[Path] = []

    def start(name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = tmp / f"{name}.log"
        logs.append(log)
        with log.open("wb") as fh:
            p = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp)
        procs.append(p)
        return p

    try:
        instances: dict[str, str] = {}
        for key, file in SCENARIOS.items():
            port = free_port()
            instances[key] = f"127.0.0.1:{port}"
            extra: list[str] = []
            if key == "healthy":  # a web config with neither TLS nor users: the "Web config in force" panel's data
                (tmp / "web.yml").write_text("http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n")
                extra = ["--web.config.file", str(tmp / "web.yml")]
            if key == "nic":  # the adapters' byte counters are opt-in: the traffic lines of the interconnect row
                extra = ["--collector.nic.traffic"]
            start(f"gpufeed-{key}", [
                sys.executable, "-m", "exporter", "serve", "--simulate", str(scenario_path(file)),
                "--simulate-speed", str(SPEED), "--web.listen-address", instances[key], "--log.level", "warn", *extra])

        # Prometheus starts once every exporter serves: a target still starting must not count as down. A bound,
        # not a measure: eight Python daemons importing at once on two shared cores took over 40 s in CI here.
        deadline = time.monotonic() + 120
        for key, inst in instances.items():
            try:
                wait_until(f"gpufeed {key} serving GPU state", lambda inst=inst: b"gpufeed_gpu_state_seconds_total"
                           in http_get(f"http://{inst}/metrics"), deadline)
            except BaseException:
                print("\n".join(p.name + ":\n" + p.read_text(errors="replace")[-2000:] for p in logs))
                raise

        received: list[dict[str, Any]] = []
        lock = threading.Lock()
        handler = type("Webhook", (_Webhook,), {"received": received, "lock": lock})
        hook = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        servers.append(hook)
        threading.Thread(target=hook.serve_forever, daemon=True).start()

        am_port = free_port()
        (tmp / "alertmanager.yml").write_text(yaml.safe_dump({
            "route": {"receiver": "webhook", "group_by": ["alertname", "instance", "gpu", "bdf"],
                      "group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"},
            "receivers": [{"name": "webhook", "webhook_configs": [
                {"url": f"http://127.0.0.1:{hook.server_address[1]}/", "send_resolved": False}]}],
        }))
        (tmp / "am-data").mkdir()
        start("alertmanager", [alertmanager, f"--config.file={tmp / 'alertmanager.yml'}",
                               f"--storage.path={tmp / 'am-data'}", f"--web.listen-address=127.0.0.1:{am_port}",
                               "--cluster.listen-address="])

        rule_files = shrunk_rule_files(tmp)
        prom_port = free_port()
        (tmp / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": rule_files,
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
            "scrape_configs": [{"job_name": "gpufeed", "static_configs": [
                {"targets": [inst], "labels": {"scenario": key}} for key, inst in instances.items()]}],
        }))
        start("prometheus", [prometheus, f"--config.file={tmp / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp / 'prom-data'}", f"--web.listen-address=127.0.0.1:{prom_port}",
                             "--rules.alert.resend-delay=1s"])

        st = Stack(tmp=tmp, prom=f"http://127.0.0.1:{prom_port}", instances=instances, started=time.monotonic(),
                   received=received, lock=lock, logs=logs)
        try:
            deadline = time.monotonic() + 30
            wait_until("Prometheus ready", lambda: http_get(f"{st.prom}/-/ready"), deadline)
            wait_until("Alertmanager ready", lambda: http_get(f"http://127.0.0.1:{am_port}/-/ready"), deadline)
        except BaseException:
            print(st.log_tails())
            raise
        st.started = time.monotonic()
        yield st
        for p in procs:
            if p.poll() is not None and p.returncode not in (0, -15):
                print(st.log_tails())
    finally:
        stop(procs)
        for s in servers:
            s.shutdown()
            s.server_close()


def _loop_seconds(key: str) -> float:
    doc = yaml.safe_load(scenario_path(SCENARIOS[key]).read_text())
    return float(sum(p["duration_s"] for p in doc["phases"])) / SPEED


def _wait_for_page(stack: Stack, alertname: str, scenario: str) -> dict[str, str]:
    # The condition needs the phase to start, the shrunk window to fill and the shrunk for: to pass.
    deadline = stack.started + _loop_seconds(scenario) + 30
    found: dict[str, str] = wait_until(
        f"{alertname} from the {scenario} scenario at the webhook",
        lambda: next((a for a in stack.webhook_alerts()
                      if a["alertname"] == alertname and a.get("scenario") == scenario), None),
        deadline)
    return found


def test_riser_scenario_pages_pcie_link_downgraded_through_alertmanager(stack: Stack) -> None:
    alert = _wait_for_page(stack, "GpufeedPCIeLinkDowngraded", "riser")
    assert alert["gpu"] == "0" and alert["severity"] == "warning"
    assert alert["instance"] == stack.instances["riser"]
    # The riser (0000:81:00.0) or the GPU's own link below it (0000:82:00.0): both run at Gen3 x8.
    assert alert["bdf"] in ("0000:81:00.0", "0000:82:00.0")
    # The evidence templates found the link series and the info labels: Gen3 x8 (8 GT/s) under a Gen4 x16 limit.
    assert "runs at 8GT/s x8 instead of 16.0 GT/s x16" in alert["annotations:description"]
    # The default runbook_url, rendered by Prometheus: the alerting gpufeed's own runbooks page, at the alert's section.
    url = alert["annotations:runbook_url"]
    assert url == f"http://{stack.instances['riser']}/runbooks#gpufeedpcielinkdowngraded", url
    assert b'<h2 id="gpufeedpcielinkdowngraded">' in http_get(url.partition("#")[0])


def test_numa_scenario_pages_numa_mismatch_through_alertmanager(stack: Stack) -> None:
    alert = _wait_for_page(stack, "GpufeedNUMAMismatch", "numa")
    assert alert["gpu"] == "0" and alert["instance"] == stack.instances["numa"]
    # The GPU hangs off node 0; the process 27431 is pinned to node 1.
    assert "NUMA node 0," in alert["annotations:description"]
    assert "python[27431]" in alert["annotations:description"], alert["annotations:description"]


def test_mig_scenario_pages_the_xid_of_one_instance_and_exports_per_instance_verdicts(stack: Stack) -> None:
    alert = _wait_for_page(stack, "GpufeedGPUXidError", "mig")
    assert (alert["gpu"], alert["xid"], alert["severity"]) == ("0", "94", "warning")
    assert "Xid 94 (contained ECC error)" in alert["annotations:description"]
    r = stack.query(f'gpufeed_gpu_bottleneck{{instance="{stack.instances["mig"]}", mig!=""}} == 1')
    assert {(s["metric"]["gpu"], s["metric"]["mig"]) for s in r["data"]["result"]} == {("0", "1"), ("0", "2")}


def _alerts_fired(stack: Stack, scenario: str) -> set[tuple[str, ...]]:
    """Every alert that was firing for ``scenario`` since the start, in Prometheus or at the webhook."""
    loop = _loop_seconds(scenario)
    # One whole loop, plus the longest shrunk for: so a condition late in the loop could still fire.
    end = stack.started + loop + 10
    while time.monotonic() < end:
        time.sleep(1)
    window = f"{round(time.monotonic() - stack.started) + 5}s"
    r = stack.query(f'max_over_time(ALERTS{{alertstate="firing", scenario="{scenario}"}}[{window}])')
    assert r["status"] == "success", r

    def key(labels: dict[str, str]) -> tuple[str, ...]:
        return (labels["alertname"], labels.get("gpu", ""), labels.get("cause", ""), labels.get("bdf", ""))

    fired = {key(s["metric"]) for s in r["data"]["result"]}
    hooked = {key(a) for a in stack.webhook_alerts() if a.get("scenario") == scenario}
    # The scenario did run: Prometheus holds its GPU time (otherwise "no alert" proves nothing).
    seen = stack.query(f'count(gpufeed_gpu_state_seconds_total{{scenario="{scenario}"}})')
    assert seen["data"]["result"], f"no GPU state from the {scenario} scenario in Prometheus"
    return {f for f in fired | hooked if f[0] not in HOST_LOAD_ALERTS}


def test_gpu_hours_lost_per_cause_come_out_per_namespace(stack: Stack) -> None:
    # The pod vision/trainer-0 waits on its quota-starved submission thread: its namespace's GPU-hours lost
    # to launch_bound, from the shipped recording rules joined through gpufeed_workload_info.
    instance = stack.instances["k8s"]
    info = wait_until("gpufeed_workload_info of the k8s scenario", lambda: stack.query(
        f'gpufeed_workload_info{{instance="{instance}",namespace="vision",pod="trainer-0"}}')["data"]["result"]
        or None, stack.started + 60)
    assert info[0]["metric"]["container"] == "trainer"

    def lost() -> float | None:
        res = stack.query('namespace_cause:gpufeed_gpu_waiting_hours:increase1d{namespace="vision",'
                          'cause="launch_bound"}')["data"]["result"]
        return float(res[0]["value"][1]) if res and float(res[0]["value"][1]) > 0 else None

    hours = wait_until("per-namespace GPU-hours lost to launch_bound", lost, stack.started + 90)
    assert hours is not None and hours > 0
    rate = stack.query('namespace_cause:gpufeed_gpu_waiting_seconds:rate5m{namespace="vision",cause="launch_bound"}')
    assert rate["data"]["result"], rate


def test_quota_alert_routes_by_namespace_and_pod(stack: Stack) -> None:
    alert = _wait_for_page(stack, "GpufeedCPUQuotaThrottled", "k8s")
    assert (alert["namespace"], alert["pod"], alert["container"]) == ("vision", "trainer-0", "trainer")
    assert "Pod vision/trainer-0." in alert["annotations:description"]


def test_idle_gpu_dropping_to_gen1_fires_no_alert_over_a_whole_loop(stack: Stack) -> None:
    assert _alerts_fired(stack, "idle") == set()


def test_healthy_training_fires_no_alert_over_a_whole_loop(stack: Stack) -> None:
    assert _alerts_fired(stack, "healthy") == set()


def _dashboard_queries() -> Iterator[tuple[str, str, str]]:
    for f in sorted((GRAFANA / "dashboards").glob("*.json")):
        d = json.loads(f.read_text())
        for v in d["templating"]["list"]:
            query = v.get("query")
            m = re.fullmatch(r"label_values\((.*),\s*\w+\)", query["query"] if isinstance(query, dict) else "")
            if m:
                yield f.name, f"variable {v['name']}", m.group(1)
        for a in d["annotations"]["list"]:
            yield f.name, f"annotation {a['name']}", a["expr"]
        for p in d["panels"]:
            for t in p.get("targets", []):
                yield f.name, p["title"], t["expr"]


def test_every_dashboard_query_parses_and_returns_data(stack: Stack) -> None:
    # Findings and firing alerts are among the panels: let the riser page first.
    _wait_for_page(stack, "GpufeedPCIeLinkDowngraded", "riser")
    # The Jobs row's slowest rank needs the straggling rank's waiting booked (once its verdict has held a window)
    # and rated by the rules: before that every rank of the job waits 0 and the slowest may be the other one.
    wait_until("the job's straggling rank waits", lambda: bool(stack.query(
        "job_rank:gpufeed_gpu_own_waiting:ratio_rate5m > 0")["data"]["result"]), time.monotonic() + 90)
    hosts = "|".join(stack.instances.values())  # "." matches itself too; PromQL strings need no escaping
    subst = {"$cluster": ".*", "$host": hosts, "$gpu": ".*", "$__rate_interval": "10s", "$__interval": "5s",
             "$__range": "1m"}
    empty, errors = [], []
    for name, title, expr in _dashboard_queries():
        q = expr
        for k, v in subst.items():
            q = q.replace(k, v)
        r = stack.query(q)
        if r.get("status") != "success":
            errors.append(f"{name} / {title}: {r.get('error')}: {q}")
        elif not r["data"]["result"]:
            empty.append(f"{name} / {title}: {q}")
    assert errors == [], "queries that do not parse or evaluate:\n" + "\n".join(errors)
    assert empty == [], "queries that returned no data:\n" + "\n".join(empty)


def test_the_shrunk_durations_apply_to_a_temporary_copy_only(stack: Stack) -> None:
    shipped = yaml.safe_load((ALERTS / "gpufeed-alerts.yml").read_text())
    used = yaml.safe_load((stack.tmp / "gpufeed-alerts.yml").read_text())
    pairs = [(a["for"], b["for"]) for ga, gb in zip(shipped["groups"], used["groups"], strict=True)
             for a, b in zip(ga["rules"], gb["rules"], strict=True)]
    assert ("15m", "15s") in pairs and all(a != b or a == "0m" for a, b in pairs)
