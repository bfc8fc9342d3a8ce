"""The joins of docs/dcgm-exporter.md run on series as each exporter writes them.

``alerts/tests/joins.test.yml`` (run by promtool with the other rule tests) evaluates each query of the docs
page. This module keeps that file honest: the queries are the page's, the gpufeed series are lines of a fixture
host's whole-daemon golden, and the dcgm-exporter and node_exporter series carry exactly the labels those
exporters write, with the values that belong to the same GPU and host.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from exporter import pci
from tests.rules.conftest import ALERTS, REPO
from tests.support.golden import golden_path, hosts

JOINS = ALERTS / "tests" / "joins.test.yml"
PAGE = REPO / "docs" / "dcgm-exporter.md"
HOST = "dgx"  # the fixture host whose golden the gpufeed series come from
# Labels a Prometheus scrape adds (prometheus-operator's ServiceMonitor target labels), not the exporter.
TARGET_LABELS = {"container", "endpoint", "instance", "job", "namespace", "pod", "service"}
# dcgm-exporter's per-GPU labels, in its exposition template (internal/pkg/rendermetrics/render_metrics.go),
# and its pod attribution as it arrives through a ServiceMonitor with honorLabels: false. After 4.5.3-4.8.2
# Hostname is hostname (#655).
DCGM_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"}
DCGM_MAIN_LABELS = DCGM_LABELS - {"Hostname"} | {"hostname"}
DCGM_POD_LABELS = {"exported_namespace", "exported_pod", "exported_container"}
# node_exporter's families used, and their labels (collector/uname.go, collector/pressure_linux.go).
NODE_LABELS = {"node_uname_info": {"sysname", "release", "version", "machine", "nodename", "domainname"},
               "node_pressure_io_waiting_seconds_total": set()}
_SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _parse(series: str) -> tuple[str, dict[str, str]]:
    m = _SERIES.match(series.strip())
    assert m, series
    return m.group(1), dict(_LABEL.findall(m.group(2)))


def _cases() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = yaml.safe_load(JOINS.read_text())["tests"]
    assert cases
    return cases


def _input() -> list[tuple[str, dict[str, str]]]:
    return [_parse(s["series"]) for case in _cases() for s in case["input_series"]]


def _tests() -> list[dict[str, Any]]:
    return [t for case in _cases() for t in case["promql_expr_test"]]


def _golden(host: str = HOST) -> list[tuple[str, dict[str, str]]]:
    lines = golden_path(host).read_text().splitlines()
    return [_parse(line.rpartition(" ")[0]) for line in lines if line.startswith("gpufeed_") and "{" in line]


def _normalized(query: str) -> str:
    return " ".join(query.split())


def test_every_join_on_the_docs_page_is_the_one_the_promtool_test_runs_and_back() -> None:
    shown = {_normalized(q) for q in re.findall(r"```promql\n(.*?)```", PAGE.read_text(), re.S)}
    tested = {_normalized(t["expr"]) for t in _tests()}
    assert shown and shown == tested, (shown ^ tested)


def test_every_join_expects_a_result_so_an_empty_join_fails() -> None:
    assert all(t["exp_samples"] for t in _tests())


def test_gpufeed_series_in_the_join_test_are_lines_gpufeed_writes() -> None:
    golden = _golden()
    # A label set any fixture host's daemon writes is one gpufeed writes (the dgx host's GPUs do not wait).
    written = [series for host in hosts() for series in _golden(host)]
    for name, labels in _input():
        if not name.startswith("gpufeed_"):
            continue
        assert labels["job"] == "gpufeed" and labels["instance"] == HOST, labels
        own = {k: v for k, v in labels.items() if k not in TARGET_LABELS}
        if name == "gpufeed_gpu_info":
            assert (name, own) in golden, f"{name}{own} is not in the {HOST} golden"
        else:
            # Values over time are the test's scenario; the label set must be one gpufeed writes.
            assert any(n == name and set(lb) == set(own) and lb.get("gpu") == own.get("gpu")
                       for n, lb in written), f"{name}{own}: no such series in any fixture host's golden"


def test_dcgm_series_carry_dcgm_exporters_labels_with_the_values_of_the_same_gpu() -> None:
    series = _input()
    info = {lb["gpu"]: lb for n, lb in series if n == "gpufeed_gpu_info"}
    dcgm = [(n, lb) for n, lb in series if n.startswith("DCGM_FI_")]
    assert dcgm
    for name, labels in dcgm:
        own = set(labels) - TARGET_LABELS
        assert own in (DCGM_LABELS | DCGM_POD_LABELS, DCGM_MAIN_LABELS | DCGM_POD_LABELS), (name, own)
        # The GPU operator's ServiceMonitor keeps the pod's address as instance: not the node name.
        assert re.fullmatch(r"[0-9.]+:9400", labels["instance"]), labels["instance"]
        g = info[labels["gpu"]]
        assert labels["UUID"] == g["uuid"]
        assert labels["pci_bus_id"] == pci.to_nvml(g["gpu_bdf"])
        assert labels["modelName"] == g["name"]
        assert labels["device"] == f"nvidia{labels['gpu']}"
        assert labels.get("Hostname", labels.get("hostname")) == g["Hostname"] == g["hostname"]


def test_node_exporter_series_carry_node_exporters_labels_and_the_node_name_as_instance() -> None:
    info = [lb for n, lb in _input() if n == "gpufeed_gpu_info"]
    node = [(n, lb) for n, lb in _input() if n.startswith("node_")]
    assert {n for n, _ in node} == set(NODE_LABELS)
    for name, labels in node:
        assert set(labels) - TARGET_LABELS == NODE_LABELS[name], name
        # kube-prometheus relabels instance to the node name; kube-prometheus-stack keeps the address.
        assert labels["instance"] == info[0]["instance"] or re.fullmatch(r"[0-9.]+:9100", labels["instance"])
        if name == "node_uname_info":
            assert labels["nodename"] == info[0]["Hostname"]
