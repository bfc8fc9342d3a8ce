"""A scenario's kubelet: the pod-resources API v1 (``List``, ``Get``, ``GetAllocatableResources``) served over
gRPC on a unix socket in the simulated root, answering what ``host.kubernetes`` says (SPEC v2).

The answer is static, as the spec says; GPUs are reported by UUID under ``nvidia.com/gpu``, as the NVIDIA
device plugin registers them. The server is grpcio's, on its own small thread pool; ``stop()`` ends it.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from concurrent import futures
from pathlib import Path
from typing import Any

from exporter.sim.spec import Scenario

RESOURCE = "nvidia.com/gpu"


def answer(sc: Scenario) -> Any:
    """The ``ListPodResourcesResponse`` of the scenario's pods."""
    pb: Any = importlib.import_module("exporter.kubelet.api_pb2")
    uuids = {g.index: g.uuid for g in sc.gpus}
    resp = pb.ListPodResourcesResponse()
    k8s = sc.host.kubernetes
    for pod in k8s.pods if k8s is not None else ():
        pr = resp.pod_resources.add(name=pod.name, namespace=pod.namespace)
        for c in pod.containers:
            cr = pr.containers.add(name=c.name)
            if c.gpus:
                cr.devices.add(resource_name=RESOURCE, device_ids=[uuids[i] for i in c.gpus])
    return resp


class Kubelet:
    """The pod-resources server of one scenario, on ``path`` (a unix socket, created by the server)."""

    def __init__(self, sc: Scenario, path: Path) -> None:
        grpc: Any = importlib.import_module("grpc")
        pb: Any = importlib.import_module("exporter.kubelet.api_pb2")
        rpc: Any = importlib.import_module("exporter.kubelet.api_pb2_grpc")

        self.path = path
        listed = answer(sc)
        allocatable = pb.AllocatableResourcesResponse()
        allocatable.devices.add(resource_name=RESOURCE, device_ids=[g.uuid for g in sc.gpus])

        class Servicer(rpc.PodResourcesListerServicer):  # type: ignore[misc]  # an untyped generated base
            def List(self, request: Any, context: Any) -> Any:  # noqa: N802 - the proto's method name
                return listed

            def GetAllocatableResources(self, request: Any, context: Any) -> Any:  # noqa: N802
                return allocatable

            def Get(self, request: Any, context: Any) -> Any:  # noqa: N802
                for p in listed.pod_resources:
                    if p.name == request.pod_name and p.namespace == request.pod_namespace:
                        return pb.GetPodResourcesResponse(pod_resources=p)
                context.abort(grpc.StatusCode.NOT_FOUND, f"pod {request.pod_namespace}/{request.pod_name} not found")
                return None

        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            os.unlink(path)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="sim-kubelet"))
        rpc.add_PodResourcesListerServicer_to_server(Servicer(), self.server)
        self.server.add_insecure_port(f"unix://{path}")
        self.server.start()

    def stop(self) -> None:
        """Stop serving (in-flight calls get a second) and remove the socket."""
        self.server.stop(grace=1.0).wait(5.0)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
