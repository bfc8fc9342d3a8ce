"""The kubelet pod-resources client against a real gRPC server on a unix socket, speaking the real proto --
and against sockets that are absent, refuse, hang or answer garbage."""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.core import Metric

from exporter.collectors.kubernetes import MAX_DEVICES, MAX_MESSAGE, MAX_RESOURCES, KubernetesCollector
from exporter.samples.workload import KubernetesSample
from exporter.sampling import CollectorContext, CollectorError, NoDataError, Targets
from exporter.snapshot import Snapshot, Stamped

grpc: Any = importlib.import_module("grpc")
pb: Any = importlib.import_module("exporter.kubelet.api_pb2")
rpc: Any = importlib.import_module("exporter.kubelet.api_pb2_grpc")

UUID0 = "GPU-8c1f6a2e-0000-4a1b-9c3d-000000000000"
UUID1 = "GPU-8c1f6a2e-0000-4a1b-9c3d-000000000001"


@pytest.fixture
def sockdir() -> Iterator[Path]:
    # A unix socket path is at most 107 bytes: pytest's tmp_path can be longer.
    d = Path(tempfile.mkdtemp(prefix="gpufeed-k8s-", dir="/tmp"))
    try:
        yield d
    finally:
        for p in d.iterdir():
            p.unlink()
        d.rmdir()


def _answer() -> Any:
    resp = pb.ListPodResourcesResponse()
    pod = resp.pod_resources.add(name="trainer-0", namespace="vision")
    c = pod.containers.add(name="trainer")
    c.devices.add(resource_name="nvidia.com/gpu", device_ids=[UUID0])
    c.devices.add(resource_name="example.com/nic", device_ids=["eth7"])
    shared = resp.pod_resources.add(name="notebook", namespace="lab").containers.add(name="jupyter")
    shared.devices.add(resource_name="nvidia.com/gpu.shared", device_ids=[f"{UUID1}::3"])
    return resp


class _Lister(rpc.PodResourcesListerServicer):  # type: ignore[misc]  # generated, untyped
    def __init__(self) -> None:
        self.calls = 0

    def List(self, request: Any, context: Any) -> Any:  # noqa: N802 - the proto's name
        self.calls += 1
        return _answer()


@contextlib.contextmanager
def kubelet(path: Path, servicer: Any) -> Iterator[Any]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    rpc.add_PodResourcesListerServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    try:
        yield server
    finally:
        server.stop(0).wait(5)


def _collector(path: Path, targets: Targets | None = None, **opts: Any) -> KubernetesCollector:
    options = {"socket": str(path), "timeout": 1.0, "refresh": 60.0, **opts}
    return KubernetesCollector(CollectorContext(procfs=path.parent, sysfs=path.parent, options=options,
                                                targets=targets or Targets()))


def test_list_maps_each_gpu_uuid_to_its_pod_and_container(sockdir: Path) -> None:
    sock = sockdir / "kubelet.sock"
    with kubelet(sock, _Lister()):
        col = _collector(sock)
        try:
            s = col.update()
        finally:
            col.close()
    got = {(d.device, d.namespace, d.pod, d.container) for d in s.devices}
    assert got == {(UUID0, "vision", "trainer-0", "trainer"), (UUID1, "lab", "notebook", "jupyter")}
    assert s.pods == 2  # the NIC is no GPU; the time-sliced replica "::3" names its GPU


def test_the_answer_is_cached_until_gpu_processes_change(sockdir: Path) -> None:
    sock = sockdir / "kubelet.sock"
    lister = _Lister()
    targets = Targets()
    targets.publish({"0": [100]})
    with kubelet(sock, lister):
        col = _collector(sock, targets)
        try:
            col.update()
            col.update()
            assert lister.calls == 1
            targets.publish({"0": [100, 200]})  # a job started: list again
            col.update()
            assert lister.calls == 2
        finally:
            col.close()


def test_an_absent_socket_is_not_available_quietly_saying_what_is_missing(sockdir: Path) -> None:
    with pytest.raises(NoDataError, match=r"absent: .* has no such socket"):
        _collector(sockdir / "kubelet.sock").update()
    with pytest.raises(NoDataError, match=r"absent: .*/unmounted does not exist .*not mounted"):
        _collector(sockdir / "unmounted" / "kubelet.sock").update()
    (sockdir / "plain").write_text("not a socket")
    with pytest.raises(NoDataError, match="absent: it is not a socket"):
        _collector(sockdir / "plain").update()


def test_a_socket_that_refuses_is_a_failure(sockdir: Path) -> None:
    sock = sockdir / "kubelet.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    s.close()  # the file stays, nobody listens: ECONNREFUSED
    col = _collector(sock, timeout=0.5)
    try:
        with pytest.raises(CollectorError, match="List on"):
            col.update()
    finally:
        col.close()


def test_a_kubelet_that_never_answers_fails_within_the_timeout(sockdir: Path) -> None:
    sock = sockdir / "kubelet.sock"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(sock))
    srv.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = srv.accept()
                held.append(conn)  # accepted, never spoken to

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    col = _collector(sock, timeout=0.5)
    try:
        with pytest.raises(CollectorError, match=r"DEADLINE_EXCEEDED|UNAVAILABLE"):
            col.update()
    finally:
        col.close()
        stop.set()
        t.join(5)
        for c in held:
            c.close()
        srv.close()


def test_a_kubelet_answering_garbage_is_a_failure(sockdir: Path) -> None:
    sock = sockdir / "kubelet.sock"
    handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
        "List": grpc.unary_unary_rpc_method_handler(
            lambda req, ctx: b"\xff\xff\xff\xff not a protobuf",
            request_deserializer=pb.ListPodResourcesRequest.FromString,
            response_serializer=lambda b: b),
    })
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    col = _collector(sock)
    try:
        with pytest.raises(CollectorError, match="List on"):
            col.update()
    finally:
        col.close()
        server.stop(0).wait(5)
    assert not os.path.exists(sock) or sock.is_socket()


def test_a_directory_this_user_may_not_search_says_permission_denied(
        sockdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sock = sockdir / "kubelet.sock"
    real = os.stat

    def denied(p: Any, *a: Any, **k: Any) -> os.stat_result:
        if str(p) == str(sock):
            raise PermissionError(13, "Permission denied", str(p))
        return real(p, *a, **k)

    monkeypatch.setattr(os, "stat", denied)
    with pytest.raises(NoDataError, match=f"permission denied searching {sockdir} .*run as uid 0"):
        _collector(sock).update()


def test_a_socket_this_user_may_not_connect_to_is_not_available_not_a_failure(
        sockdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The kubelet makes its socket root's only: a non-root exporter must not page "collector failing".
    sock = sockdir / "kubelet.sock"
    with kubelet(sock, _Lister()):
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(sock) else real(p, mode))
        with pytest.raises(NoDataError, match=r"not writable by this user \(socket mode 0[0-7]{3}, owner "
                                              r"[0-9]+:[0-9]+; this process uid [0-9]+, groups .*run as uid 0"):
            _collector(sock).update()


class _Hostile(rpc.PodResourcesListerServicer):  # type: ignore[misc]  # generated, untyped
    """Answers what no node can hold (N8): the review's 50,000 resource names, a 1 MB pod name, 16 MB answers."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def List(self, request: Any, context: Any) -> Any:  # noqa: N802 - the proto's name
        return self.answer


def _list_with(sock: Path, answer: Any) -> tuple[KubernetesSample, list[Metric]]:
    with kubelet(sock, _Hostile(answer)):
        col = _collector(sock)
        try:
            sample = col.update()
        finally:
            col.close()
    return sample, list(col.metrics(Snapshot(version=1, t=0.0, latest={col.name: Stamped(0.0, sample)})))


def test_a_kubelet_inventing_resource_names_cannot_grow_the_series_past_the_limit(sockdir: Path) -> None:
    resp = pb.ListPodResourcesResponse()
    ctr = resp.pod_resources.add(name="p", namespace="ns").containers.add(name="c")
    for i in range(5000):
        ctr.devices.add(resource_name=f"nvidia.com/r{i}", device_ids=[UUID0])
    sample, fams = _list_with(sockdir / "kubelet.sock", resp)
    resources = {d.resource for d in sample.devices}
    assert len(resources) == MAX_RESOURCES
    assert len(fams[0].samples) == MAX_RESOURCES


def test_names_longer_than_kubernetes_allows_are_dropped_not_exported(sockdir: Path) -> None:
    resp = _answer()
    resp.pod_resources.add(name="p" * 1_000_000, namespace="ns").containers.add(name="c").devices.add(
        resource_name="nvidia.com/gpu", device_ids=[UUID1])
    sample, _ = _list_with(sockdir / "kubelet.sock", resp)
    assert {d.pod for d in sample.devices} == {"trainer-0", "notebook"}


def test_a_kubelet_answer_of_5_mib_is_past_the_message_cap_and_a_failure(sockdir: Path) -> None:
    # 2000 pods x 64 device ids held +114 MiB in the old client (cap 16 MiB, the kubelet's own); a node's real
    # answer is tens of KiB (110 pods by default).
    assert MAX_MESSAGE < 5 << 20
    resp = pb.ListPodResourcesResponse()
    while resp.ByteSize() <= 5 << 20:
        pod = resp.pod_resources.add(name=f"pod-{len(resp.pod_resources)}", namespace="ns")
        pod.containers.add(name="c").devices.add(resource_name="nvidia.com/gpu",
                                                 device_ids=[f"{UUID0}::{i}" for i in range(2000)])
    with pytest.raises(CollectorError, match="RESOURCE_EXHAUSTED"):
        _list_with(sockdir / "kubelet.sock", resp)


def test_devices_past_the_limit_are_dropped(sockdir: Path) -> None:
    resp = pb.ListPodResourcesResponse()
    for i in range(MAX_DEVICES // 100 + 5):
        resp.pod_resources.add(name=f"pod-{i}", namespace="ns").containers.add(name="c").devices.add(
            resource_name="nvidia.com/gpu.shared", device_ids=[f"{UUID0}::{j}" for j in range(100)])
    sample, _ = _list_with(sockdir / "kubelet.sock", resp)
    assert len(sample.devices) == MAX_DEVICES
