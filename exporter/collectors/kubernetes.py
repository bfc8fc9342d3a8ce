"""Which pod holds which GPU: the kubelet's pod-resources API (``List``, v1), gRPC over its unix socket.

The kubelet answers, for every container on the node, the devices the device plugins gave it -- for the
NVIDIA device plugin, ``nvidia.com/gpu`` (and ``nvidia.com/mig-*``, ``nvidia.com/gpu.shared``) with the GPU
UUIDs as device ids. The derived layer joins that, by UUID, onto each GPU's workload:
``gpufeed_workload_info{namespace, pod, container}`` (:mod:`exporter.derived.workload`).

The call is off the scrape path and cached: the sampler (every ``--collector.kubernetes.interval``, 5 s)
lists again only when the GPU processes changed (a job ended, another started) or ``refresh`` (60 s)
passed; in between it republishes the cached answer. A socket that is absent is "not available" (not a
Kubernetes node, or the socket is not mounted: logged once); one that refuses, is slow past ``timeout``
or answers garbage is a failure (``gpufeed_collector_success{collector="kubernetes"} 0``, logged once) and
never blocks another sampler. The answer is bounded by what a node can hold: at most ``MAX_MESSAGE`` bytes
(a larger one is a failure), ``MAX_RESOURCES`` GPU resource names (the series of
``gpufeed_kubernetes_pod_devices``) and ``MAX_DEVICES`` assignments kept; a name longer than Kubernetes
allows is no Kubernetes object and is dropped; whatever is dropped is logged once. The socket is
``/var/lib/kubelet/pod-resources/kubelet.sock`` unless ``--collector.kubernetes.socket`` says otherwise (the
DaemonSet mounts that directory read-only). Sample::

    gpufeed_kubernetes_pod_devices{resource="nvidia.com/gpu"} 8
"""

from __future__ import annotations

import importlib
import os
import stat
import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter import log
from exporter.collectors import register
from exporter.samples.workload import KubernetesSample, PodDevice
from exporter.sampling import KUBERNETES, Collector, CollectorContext, CollectorError, NoDataError, Option
from exporter.snapshot import Snapshot

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
# The kubelet caps its own answers at 16 MiB (pkg/kubelet/apis/podresources: DefaultMaxMsgSize); a node's real
# answer is tens of KiB (110 pods by default, each a few containers). 16 MiB of invented pods held +130 MiB.
MAX_MESSAGE = 4 << 20
# Distinct GPU resource names kept (label values of gpufeed_kubernetes_pod_devices): the NVIDIA plugin has
# nvidia.com/gpu, nvidia.com/gpu.shared and one per MIG profile (about ten).
MAX_RESOURCES = 32
# GPU assignments kept: 16 GPUs x 64 time-sliced replicas, four times over.
MAX_DEVICES = 4096
# Kubernetes' own limits (apimachinery validation): namespace and container names are DNS labels (63), pod names
# DNS subdomains (253), extended resource names a qualified name (253-character prefix / 63-character name). A
# device id is a GPU or MIG UUID (40-ish), with "::<n>" for a time-sliced replica.
_MAX_LEN = {"namespace": 63, "pod": 253, "container": 63, "resource": 317, "device": 128}
GPU_RESOURCES = ("nvidia.com/",)
# The least privilege that reads a root-only socket (docs/deployment.md, the Helm chart's securityContext values).
_HOW = ("run as uid 0 with every capability dropped and a read-only root filesystem (Helm: "
        "podSecurityContext.runAsUser=0, podSecurityContext.runAsNonRoot=false) to attribute GPUs to pods")
INSTALL_HINT = "pip install grpcio protobuf (gpufeed's own dependencies, missing from this install)"


def _gpu_device(resource: str, device: str) -> str | None:
    """The GPU a device id names: time-sliced replicas are ``<uuid>::<n>``; other vendors' devices are not."""
    if not resource.startswith(GPU_RESOURCES):
        return None
    return device.split("::", 1)[0] or None


class _Bounded:
    """The assignments of one answer, within MAX_DEVICES, MAX_RESOURCES and Kubernetes' name lengths."""

    def __init__(self) -> None:
        self.devices: list[PodDevice] = []
        self.resources: set[str] = set()
        self.dropped: dict[str, int] = {}

    def add(self, d: PodDevice) -> None:
        long = next((k for k, n in _MAX_LEN.items() if len(getattr(d, k)) > n), None)
        if long is not None:
            why = f"{long} longer than {_MAX_LEN[long]} characters (not a Kubernetes name)"
        elif d.resource not in self.resources and len(self.resources) >= MAX_RESOURCES:
            why = f"more than {MAX_RESOURCES} GPU resource names"
        elif len(self.devices) >= MAX_DEVICES:
            why = f"more than {MAX_DEVICES} GPU assignments"
        else:
            self.resources.add(d.resource)
            self.devices.append(d)
            return
        self.dropped[why] = self.dropped.get(why, 0) + 1


@register
class KubernetesCollector(Collector):
    """Pods and containers per GPU from the kubelet's pod-resources API."""

    name = KUBERNETES
    help = "Kubernetes pod, namespace and container of each GPU, from the kubelet's pod-resources API (gRPC, v1)."
    default_interval = 5.0
    options = (
        Option("socket", "str", DEFAULT_SOCKET, "The kubelet's pod-resources unix socket."),
        Option("timeout", "duration", 2.0, "Deadline of one List call (connect included)."),
        Option("refresh", "duration", 60.0, "List again at least this often, even when no GPU process changed."),
    )

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self.socket = str(ctx.options.get("socket", DEFAULT_SOCKET))
        self.timeout = float(ctx.options.get("timeout", 2.0))
        self.refresh = float(ctx.options.get("refresh", 60.0))
        self._lock = threading.Lock()
        self._channel: Any = None
        self._stub: Any = None
        self._cached: KubernetesSample | None = None
        self._seen: frozenset[int] | None = None

    def update(self) -> KubernetesSample:
        why = self._unreachable()
        if why is not None:
            self._cached = None
            raise NoDataError(why)
        gpu_pids = self.ctx.targets.pids()
        now = self.ctx.clock()
        c = self._cached
        if c is not None and gpu_pids == self._seen and now - c.fetched_t < self.refresh:
            return c
        sample = self._list(now)
        self._cached, self._seen = sample, gpu_pids
        return sample

    def _unreachable(self) -> str | None:
        """What keeps this process from connecting to the socket, exactly; None when nothing does."""
        where = os.path.dirname(os.path.abspath(self.socket))
        try:
            st = os.stat(self.socket)
        except PermissionError:
            return (f"kubelet pod-resources socket {self.socket}: permission denied searching {where} "
                    f"(uid {os.geteuid()}): {_HOW}")
        except OSError:
            if not os.path.isdir(where):
                return (f"kubelet pod-resources socket {self.socket} absent: {where} does not exist (not a "
                        "Kubernetes node, or /var/lib/kubelet/pod-resources is not mounted there; see "
                        "--collector.kubernetes.socket)")
            return (f"kubelet pod-resources socket {self.socket} absent: {where} has no such socket (the kubelet "
                    "is not running, or names it otherwise; see --collector.kubernetes.socket)")
        if not stat.S_ISSOCK(st.st_mode):
            return f"kubelet pod-resources socket {self.socket} absent: it is not a socket"
        if not os.access(self.socket, os.W_OK):
            # connect(2) on a unix socket needs write permission; the kubelet makes it root's only (0755).
            group = (f"; or add its group {st.st_gid} to the pod's supplementalGroups"
                     if st.st_mode & stat.S_IWGRP else "")
            return (f"kubelet pod-resources socket {self.socket} not writable by this user (socket mode "
                    f"{stat.S_IMODE(st.st_mode):04o}, owner {st.st_uid}:{st.st_gid}; this process uid "
                    f"{os.geteuid()}, groups {sorted(os.getgroups())}): connecting needs write permission: "
                    f"{_HOW}{group}")
        return None

    def _client(self) -> tuple[Any, Any]:
        """The grpc module and a stub on a channel to the socket (made once, reconnects by itself)."""
        try:
            grpc = importlib.import_module("grpc")
            rpc = importlib.import_module("exporter.kubelet.api_pb2_grpc")
        except ImportError as e:
            raise NoDataError(f"kubelet client not available: {INSTALL_HINT} ({e})") from e
        with self._lock:
            if self._stub is None:
                self._channel = grpc.insecure_channel(
                    f"unix://{os.path.abspath(self.socket)}",
                    options=[("grpc.max_receive_message_length", MAX_MESSAGE), ("grpc.enable_http_proxy", 0)])
                self._stub = rpc.PodResourcesListerStub(self._channel)
            return grpc, self._stub

    def _list(self, now: float) -> KubernetesSample:
        grpc, stub = self._client()
        pb = importlib.import_module("exporter.kubelet.api_pb2")
        try:
            resp = stub.List(pb.ListPodResourcesRequest(), timeout=self.timeout, wait_for_ready=False)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            detail = e.details() if hasattr(e, "details") else str(e)
            raise CollectorError(f"kubelet pod-resources List on {self.socket}: {code}: {detail}") from e
        kept = _Bounded()
        pods = 0
        for pod in resp.pod_resources:
            pods += 1
            for ctr in pod.containers:
                for dev in ctr.devices:
                    for did in dev.device_ids:
                        uuid = _gpu_device(dev.resource_name, did)
                        if uuid is not None:
                            kept.add(PodDevice(pod.namespace, pod.name, ctr.name, dev.resource_name, uuid))
                for dyn in ctr.dynamic_resources:
                    for claim in dyn.claim_resources:
                        for cdi in claim.cdi_devices:
                            # DRA: a CDI name "nvidia.com/gpu=<uuid>" names the GPU the claim holds.
                            kind, _, value = cdi.name.partition("=")
                            uuid = _gpu_device(kind + "/", value) if kind.startswith("nvidia.com") else None
                            if uuid is not None and uuid.startswith(("GPU-", "MIG-")):
                                kept.add(PodDevice(pod.namespace, pod.name, ctr.name, kind, uuid))
        for why, n in kept.dropped.items():
            if log.once(("kubernetes_devices_dropped", why)):
                self.log.warning("kubernetes_devices_dropped", reason=why, count=n, socket=self.socket)
        return KubernetesSample(devices=tuple(kept.devices), fetched_t=now, pods=pods)

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
            self._channel = self._stub = None

    def metrics(self, snap: Snapshot) -> Iterator[Metric]:
        s: KubernetesSample | None = snap.value(self.name)
        if s is None:
            return
        fam = GaugeMetricFamily("gpufeed_kubernetes_pod_devices",
                                "Devices the kubelet reports assigned to containers, per resource (pod-resources API).",
                                labels=["resource"])
        counts: dict[str, int] = {}
        for d in s.devices:
            counts[d.resource] = counts.get(d.resource, 0) + 1
        for res, n in sorted(counts.items()):
            fam.add_metric([res], float(n))
        yield fam
