"""Scenario keys for the interconnect (docs/simulator.md): each GPU's NVLinks and the network adapters on the GPUs'
PCIe switches -- their static description, their state per phase, their counters over time, and what the
simulator renders of them (the fake NVML's ``nvlink`` list, ``/sys/class/infiniband`` trees).

Static, per GPU (``gpus[]``): ``nvlinks`` (how many; 0: PCIe only, the default), ``nvlink_remote`` (``switch`` or
``gpu``), ``nvlink_speed_mbps`` (per link and direction). Host (``host.nics``): a list of InfiniBand/RoCE ports,
each ``{name, gpus, kind, rate_gbps}`` -- the adapter sits on the PCIe switch of the GPUs it names, so those GPUs
need a switch above them (``upstream``: root port, the switch's upstream port, its downstream port).

Per phase, per GPU (``phases[].gpus.<i>.nvlink``): ``down`` (link ids, or ``all``: idle links asleep),
``tx_bytes_per_s`` / ``rx_bytes_per_s`` (the GPU's payload, spread over its up links), ``replays_per_s`` and
``recoveries_per_s`` (on its first link). Per adapter (``phases[].host.nics.<name>``): ``up``, ``rate_gbps`` (the
negotiated rate now), ``rx_bytes_per_s``, ``tx_bytes_per_s``, ``symbol_errors_per_s``, ``link_downed_per_s``.
Every key merges over the previous phase's, like the rest of a phase's state.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from exporter.sim.reader import Reader, item, join
from exporter.sim.spec import MAX_MAGNITUDE, Gpu, Nic, NicState, NvLinkState

# The model and the renderer are passed in (typed Any: they import this module, and imports point one way).
Model = Any
Renderer = Any

NONNEG = (0.0, MAX_MAGNITUDE)
NVLINK_RATES = ("tx_bytes_per_s", "rx_bytes_per_s", "replays_per_s", "recoveries_per_s")
NIC_RATES = ("rx_bytes_per_s", "tx_bytes_per_s", "symbol_errors_per_s", "link_downed_per_s")
NIC_KINDS = ("infiniband", "roce")
REMOTES = ("switch", "gpu")
MAX_LINKS = 18
HCA_TYPE = "MT4129"  # ConnectX-7
PORT_PREFIX = "1f"  # the simulated switch's downstream port for an adapter: device 0x1f of the switch's bus



# ---- static --------------------------------------------------------------------------------------------------


def gpu_links(r: Reader, m: Mapping[str, Any], p: str) -> dict[str, Any]:
    """The static NVLink keys of one ``gpus[]`` entry, as Gpu's fields."""
    return {"nvlinks": r.integer(m.get("nvlinks", 0), p + ".nvlinks", 0, MAX_LINKS),
            "nvlink_remote": _choice(r, m.get("nvlink_remote", "switch"), p + ".nvlink_remote", REMOTES),
            "nvlink_speed_mbps": r.integer(m.get("nvlink_speed_mbps", 25000), p + ".nvlink_speed_mbps", 1, 10**6)}


def nics(r: Reader, v: object, gpus: tuple[Gpu, ...]) -> tuple[Nic, ...]:
    """``host.nics``: each adapter on the PCIe switch of the GPUs it names (they must share that switch)."""
    if v is None:
        return ()
    by_index = {g.index: g for g in gpus}
    out: list[Nic] = []
    for i, raw in enumerate(r.seq(v, "host.nics")):
        p = item("host.nics", i)
        m = r.mapping(raw, p)
        r.keys(m, p, ("name", "gpus", "kind", "rate_gbps"), ("name", "gpus"))
        name = r.string(m["name"], p + ".name")
        if not name.replace("_", "").isalnum() or any(n.name == name for n in out):
            raise r.fail(p + ".name", f"bad or repeated adapter name {name!r}")
        idx = tuple(r.integer(x, item(p + ".gpus", j), 0) for j, x in enumerate(r.seq(m["gpus"], p + ".gpus")))
        if not idx or any(x not in by_index for x in idx):
            raise r.fail(p + ".gpus", f"must name GPUs of this scenario (have {sorted(by_index)})")
        switches = {by_index[x].upstream[-2].bdf if len(by_index[x].upstream) >= 3 else None for x in idx}
        if None in switches or len(switches) != 1:
            raise r.fail(p + ".gpus", "the GPUs must share one PCIe switch (upstream: root port, the switch's "
                                      "upstream and downstream ports; the same upstream port): the adapter sits on it")
        switch = str(next(iter(switches)))
        bus = int(switch[5:7], 16) + 0x40 + i  # a bus of its own below the switch
        out.append(Nic(name=name, kind=_choice(r, m.get("kind", "infiniband"), p + ".kind", NIC_KINDS), gpus=idx,
                       bdf=f"{switch[:4]}:{bus & 0xFF:02x}:00.0",
                       rate_gbps=r.number(m.get("rate_gbps", 400), p + ".rate_gbps", 1.0, 10_000.0)))
    return tuple(out)


def _choice(r: Reader, v: object, p: str, allowed: tuple[str, ...]) -> str:
    s = r.string(v, p)
    if s not in allowed:
        raise r.fail(p, f"must be one of {', '.join(allowed)}")
    return s


# ---- per phase -----------------------------------------------------------------------------------------------


def nvlink_partial(r: Reader, v: object, kp: str, gpu: Gpu) -> dict[str, Any]:
    """``phases[].gpus.<i>.nvlink``."""
    if not gpu.nvlinks:
        raise r.fail(kp, f"GPU {gpu.index} has no NVLink (gpus[].nvlinks)")
    m = r.mapping(v, kp)
    r.keys(m, kp, ("down", *NVLINK_RATES))
    out: dict[str, Any] = {k: r.value(x, join(kp, k), NONNEG) for k, x in m.items() if k != "down"}
    if "down" in m:
        if m["down"] == "all":
            out["down"] = None
        else:
            links = tuple(r.integer(x, item(kp + ".down", j), 0, gpu.nvlinks - 1)
                          for j, x in enumerate(r.seq(m["down"], kp + ".down")))
            out["down"] = tuple(sorted(set(links)))
    return out


def nvlink_state(s: Mapping[str, Any]) -> NvLinkState:
    return NvLinkState(**{k: s[k] for k in ("down", *NVLINK_RATES) if k in s})


def nics_partial(r: Reader, v: object, kp: str, known: tuple[Nic, ...]) -> dict[str, Any]:
    """``phases[].host.nics``: per adapter, its state keys."""
    names = {n.name for n in known}
    out: dict[str, Any] = {}
    for name, raw in r.mapping(v, kp).items():
        np_ = join(kp, str(name))
        if name not in names:
            raise r.fail(np_, f"unknown adapter {name!r} (host.nics: {', '.join(sorted(names)) or 'none'})")
        m = r.mapping(raw, np_)
        r.keys(m, np_, ("up", "rate_gbps", *NIC_RATES))
        st: dict[str, Any] = {k: r.value(x, join(np_, k), NONNEG) for k, x in m.items() if k in NIC_RATES}
        if "up" in m:
            st["up"] = r.boolean(m["up"], np_ + ".up")
        if "rate_gbps" in m:
            st["rate_gbps"] = r.number(m["rate_gbps"], np_ + ".rate_gbps", 1.0, 10_000.0)
        out[str(name)] = st
    return out


def nic_states(s: Mapping[str, Any], known: tuple[Nic, ...]) -> Mapping[str, NicState]:
    return MappingProxyType({n.name: NicState(**s.get(n.name, {})) for n in known})


# ---- over time ------------------------------------------------------------------------------------------------


class InterconnectTracks:
    """The scenario's NVLink and adapter counters as tracks (exact integrals of the phases' rates)."""

    def __init__(self, model: Model) -> None:
        sc = model.sc
        self.nvlink = {g.index: {k: model._track(lambda ph, i=g.index, k=k: getattr(ph.gpus[i].nvlink, k),
                                                 f"gpus.{g.index}.nvlink.{k}", NONNEG) for k in NVLINK_RATES}
                       for g in sc.gpus if g.nvlinks}
        self.nics = {n.name: {k: model._track(lambda ph, a=n.name, k=k: getattr(ph.host.nics[a], k),
                                              f"host.nics.{n.name}.{k}", NONNEG) for k in NIC_RATES}
                     for n in sc.host.nics}


def nvml_links(model: Model, g: Gpu, t: float) -> list[dict[str, Any]]:
    """The fake NVML's ``nvlink`` list of GPU ``g`` at ``t`` (exporter/sim/fakenvlink.py)."""
    if not g.nvlinks:
        return []
    tr = model.interconnect.nvlink[g.index]
    st = model.phase(t).gpus[g.index].nvlink
    down = set(range(g.nvlinks)) if st.down is None else set(st.down)
    up = [i for i in range(g.nvlinks) if i not in down] or [0]
    tx, rx = tr["tx_bytes_per_s"].integral(t) / 1024, tr["rx_bytes_per_s"].integral(t) / 1024
    return [{"up": i not in down, "version": 6, "remote": g.nvlink_remote, "speed_mbps": g.nvlink_speed_mbps,
             "tx_kib": int(tx / len(up)) if i in up else 0, "rx_kib": int(rx / len(up)) if i in up else 0,
             "replay": int(tr["replays_per_s"].integral(t)) if i == 0 else 0,
             "recovery": int(tr["recoveries_per_s"].integral(t)) if i == 0 else 0, "crc": 0}
            for i in range(g.nvlinks)]


def setup_nics(rd: Renderer) -> None:
    """Each adapter's PCI function on its GPUs' switch and its /sys/class/infiniband/<name> (static files)."""
    by_index = {g.index: g for g in rd.sc.gpus}
    for n in rd.sc.host.nics:
        switch_dir = _bridge_dir(rd, by_index[n.gpus[0]], 2)
        port = switch_dir / f"{n.bdf[:5]}{n.bdf[5:7]}:{PORT_PREFIX}.0"
        fn = port / n.bdf
        fn.mkdir(parents=True, exist_ok=True)
        rd.write(fn / "class", "0x020700\n" if n.kind == "infiniband" else "0x020000\n")
        rd.write(fn / "vendor", "0x15b3\n")
        rd.write(fn / "device", "0x1021\n")
        rd.write(fn / "numa_node", f"{by_index[n.gpus[0]].numa_node}\n")
        cls = rd.sys / "class" / "infiniband" / n.name
        (cls / "ports" / "1" / "counters").mkdir(parents=True, exist_ok=True)
        depth = len(cls.relative_to(rd.sys).parts)
        rd._link(cls / "device", "/".join([".."] * depth) + "/" + str(fn.relative_to(rd.sys)))
        rd.write(cls / "hca_type", HCA_TYPE + "\n")
        rd.write(cls / "ports" / "1" / "link_layer", ("InfiniBand" if n.kind == "infiniband" else "Ethernet") + "\n")


def render_nics(rd: Renderer, t: float) -> None:
    """Each adapter port's state, rate and counters at ``t`` (data counters in 4-byte words, as the kernel)."""
    model = rd.model
    states = model.phase(t).host.nics
    for n in rd.sc.host.nics:
        st = states[n.name]
        tr = model.interconnect.nics[n.name]
        port = rd.sys / "class" / "infiniband" / n.name / "ports" / "1"
        rd.write(port / "state", "4: ACTIVE\n" if st.up else "1: DOWN\n")
        rd.write(port / "phys_state", "5: LinkUp\n" if st.up else "3: Disabled\n")
        rate = st.rate_gbps if st.rate_gbps is not None else n.rate_gbps
        rd.write(port / "rate", f"{rate:g} Gb/sec (4X NDR)\n")
        c = port / "counters"
        rd.write(c / "port_rcv_data", f"{int(tr['rx_bytes_per_s'].integral(t) / 4)}\n")
        rd.write(c / "port_xmit_data", f"{int(tr['tx_bytes_per_s'].integral(t) / 4)}\n")
        rd.write(c / "symbol_error", f"{int(tr['symbol_errors_per_s'].integral(t))}\n")
        rd.write(c / "link_downed", f"{int(tr['link_downed_per_s'].integral(t))}\n")
        rd.write(c / "port_rcv_errors", "0\n")
        rd.write(c / "link_error_recovery", "0\n")


def _bridge_dir(rd: Renderer, g: Gpu, above: int) -> Path:
    """The sysfs directory of the bridge ``above`` hops over GPU ``g`` (1: its parent)."""
    d = Path(rd._gpu_dirs[g.index])
    for _ in range(above):
        d = d.parent
    return d
