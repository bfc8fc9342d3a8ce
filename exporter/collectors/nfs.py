"""NFS client RPC counters from /proc/net/rpc/nfs: calls, retransmissions, per-op counts."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType

from prometheus_client.core import CounterMetricFamily, Metric

from exporter.collectors import register
from exporter.samples.host import NfsSample
from exporter.sampling import NFS, Collector, CollectorError
from exporter.snapshot import Snapshot
from exporter.sources import read_source

OPS = ("getattr", "lookup", "open", "read")
# Position of each op in the ``procN`` lines (0 is NULL). The kernel prints one counter per procedure in
# procedure-number order (net/sunrpc/stats.c rpc_proc_show):
# - proc2/proc3: the RFC 1094 / RFC 1813 procedure numbers (NFSPROC3_GETATTR = 1, LOOKUP = 3, READ = 6);
#   v2 and v3 have no OPEN.
# - proc4: the client's own enum in include/linux/nfs4.h (NFSPROC4_CLNT_NULL = 0, READ, WRITE, COMMIT, OPEN,
#   ... ACCESS = 17, GETATTR = 18, LOOKUP = 19), used as p_statidx in fs/nfs/nfs4xdr.c nfs4_procedures[].
OP_INDEX: Mapping[str, Mapping[str, int]] = MappingProxyType({
    "proc2": MappingProxyType({"getattr": 1, "lookup": 4, "read": 6}),
    "proc3": MappingProxyType({"getattr": 1, "lookup": 3, "read": 6}),
    "proc4": MappingProxyType({"read": 1, "open": 4, "getattr": 18, "lookup": 19}),
})


def parse_nfs(text: str) -> NfsSample:
    """Parse /proc/net/rpc/nfs: ``rpc <calls> <retrans> <authrefresh>`` and ``procN <count> <v0> <v1> ...``."""
    rpc: list[int] | None = None
    ops = dict.fromkeys(OPS, 0)
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        try:
            if parts[0] == "rpc":
                rpc = [int(v) for v in parts[1:4]]
                if len(rpc) != 3:
                    raise CollectorError(f"/proc/net/rpc/nfs: rpc line has {len(rpc)} values, expected 3")
            elif parts[0] in OP_INDEX:
                count = int(parts[1])
                values = [int(v) for v in parts[2:]]
                if count != len(values):
                    raise CollectorError(
                        f"/proc/net/rpc/nfs: {parts[0]} announces {count} counters but has {len(values)}"
                    )
                for op, idx in OP_INDEX[parts[0]].items():
                    if idx < len(values):  # older kernels have fewer v4 procedures
                        ops[op] += values[idx]
        except (ValueError, IndexError) as e:
            raise CollectorError(f"/proc/net/rpc/nfs: bad line {line[:80]!r}") from e
    if rpc is None:
        raise CollectorError("/proc/net/rpc/nfs: no rpc line")
    return NfsSample(rpc_calls=rpc[0], retransmissions=rpc[1], auth_refreshes=rpc[2], ops=MappingProxyType(ops))


@register
class NfsCollector(Collector):
    """NFS client: getattr storms and retransmissions are io_bound evidence on network file systems."""

    name = NFS
    help = "NFS client RPC statistics from /proc/net/rpc/nfs (absent without an NFS client)."
    default_interval = 1.0

    def update(self) -> NfsSample:
        path = self.ctx.proc("net", "rpc", "nfs")
        return parse_nfs(read_source(
            path, absent=f"{path} not present (no NFS client; the nfs module loads on first mount)"))

    def metrics(self, snap: Snapshot) -> Iterator[Metric]:
        sample: NfsSample | None = snap.value(self.name)
        if sample is None:
            return
        calls = CounterMetricFamily("gpufeed_nfs_rpc_calls", "RPC calls made by the NFS client (/proc/net/rpc/nfs).")
        calls.add_metric([], float(sample.rpc_calls))
        retrans = CounterMetricFamily(
            "gpufeed_nfs_rpc_retransmissions",
            "RPC calls the NFS client had to retransmit (server or network not answering in time).",
        )
        retrans.add_metric([], float(sample.retransmissions))
        ops = CounterMetricFamily(
            "gpufeed_nfs_operations", "NFS client operations by op, summed over NFS versions 2, 3 and 4.",
            labels=["op"],
        )
        for op, n in sorted(sample.ops.items()):
            ops.add_metric([op], float(n))
        yield calls
        yield retrans
        yield ops
