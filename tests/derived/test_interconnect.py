"""The interconnect's judgements (exporter/derived/interconnect.py): NVLink and the adapters beside a GPU judged
only under load, and network_bound -- a waiting GPU whose wire runs near its current link's capacity."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from types import MappingProxyType

from exporter.derived import interconnect as ic
from exporter.derived.gpuview import GpuView, gpu_view
from exporter.derived.hostshape import cpu_shape, io_signals
from exporter.derived.verdict import classify
from exporter.samples.gpu import GpuSample, GpuSlow, NvLink
from exporter.samples.topology import NicPort, NicSample
from exporter.snapshot import Stamped
from tests.support.builders import GpuSpec, const, gpu_windows

GPU = "0000:18:00.0"
T1 = 15.0
LINK_BPS = 25e9  # per NVLink, per direction
PORT_BPS = 200e9  # a 4X HDR port


def nvlinks(n: int, *, down: Sequence[int] = (), remote: str = "switch", tx_per_s: float = 0.0,
            errors: Callable[[float], dict[str, int]] | None = None) -> Callable[[float], tuple[NvLink, ...]]:
    def at(t: float) -> tuple[NvLink, ...]:
        return tuple(NvLink(
            link=i, up=i not in down, version=6, remote="" if i in down and remote == "" else remote,
            speed_bytes_per_s=None if i in down else LINK_BPS, tx_bytes=int(tx_per_s / n * t), rx_bytes=0,
            errors=MappingProxyType(errors(t) if errors and i == 0 else {"replay": 0, "recovery": 0, "crc": 0}))
            for i in range(n))
    return at


def windows(util: float, links: Callable[[float], tuple[NvLink, ...]] | None = None,
            ) -> tuple[GpuView, list[Stamped[GpuSample]]]:
    """GPU 0 at ``util`` over the window, its slow samples carrying ``links`` when given."""
    fast, buf, slow = gpu_windows([GpuSpec(bdf=GPU, util=const(util))], 0.0, T1)
    if links is not None:
        slow = [Stamped(s.t, dataclasses.replace(s.value, gpus=MappingProxyType(
            {0: _with_links(s.value.gpus[0], links(s.t))}))) for s in slow]
    return gpu_view(0, fast, buf, slow), slow


def _with_links(g: object, links: tuple[NvLink, ...]) -> GpuSlow:
    assert isinstance(g, GpuSlow)
    return dataclasses.replace(g, nvlink=links)


def port(t: float, *, rate: float | None = PORT_BPS, rx_per_s: float = 0.0, up: bool = True,
         errors: dict[str, int] | None = None, key: str = "mlx5_0") -> NicPort:
    return NicPort(adapter=key, port="1", kind="infiniband", bdf="0000:1a:00.0", model="MT4123", up=up,
                   rate_bps=rate if up else None, capable_bps=PORT_BPS, rx_bytes=int(rx_per_s * t), tx_bytes=0,
                   errors=MappingProxyType(errors or {"symbol_error": 0, "link_downed": 0}), gpus=(GPU,))


def nic_window(make: Callable[[float], NicPort]) -> list[Stamped[NicSample]]:
    return [Stamped(float(t), NicSample(ports=(make(float(t)),))) for t in range(0, int(T1) + 1, 5)]


# ---- nvlink_degraded ------------------------------------------------------------------------------------------

def test_an_nvlink_down_on_a_busy_gpu_of_an_nvswitch_system_is_degraded() -> None:
    view, slow = windows(0.9, nvlinks(18, down=(5,)))
    f = ic.nvlink_degraded(view, slow)
    assert f is not None and f.severity == "critical" and "NVLink 5 down of 18" in f.detail


def test_idle_links_powered_down_are_not_degraded() -> None:
    view, slow = windows(0.0, nvlinks(18, down=tuple(range(18))))
    assert ic.nvlink_degraded(view, slow) is None


def test_a_link_never_seen_up_off_an_nvswitch_is_not_judged() -> None:
    """A board whose unused links never came up (no bridge on them): not a fault."""
    view, slow = windows(0.9, nvlinks(12, down=range(4, 12), remote=""))
    assert ic.nvlink_degraded(view, slow) is None


def test_nvlink_recoveries_rising_on_a_busy_gpu_are_degraded() -> None:
    view, slow = windows(0.9, nvlinks(4, errors=lambda t: {"replay": 0, "recovery": int(t > 7), "crc": 0}))
    f = ic.nvlink_degraded(view, slow)
    assert f is not None and "NVLink 0 errors rising (1 recovery" in f.detail


def test_a_few_replays_are_tolerated() -> None:
    view, slow = windows(0.9, nvlinks(4, errors=lambda t: {"replay": int(t > 7) * 3, "recovery": 0, "crc": 0}))
    assert ic.nvlink_degraded(view, slow) is None


def test_a_pcie_only_gpu_has_no_nvlink_finding() -> None:
    view, slow = windows(0.9)
    assert ic.nvlink_degraded(view, slow) is None and ic.wire_load(view, slow, ()) is None


# ---- nic_link_degraded -------------------------------------------------------------------------------------------

def test_an_adapter_at_half_rate_beside_a_busy_gpu_is_degraded() -> None:
    view, _ = windows(0.9)
    f = ic.nic_link_degraded(view, nic_window(lambda t: port(t, rate=100e9)))
    assert f is not None and "mlx5_0/1 (infiniband) at 100 Gb/s of the 200 Gb/s it reaches" in f.detail


def test_an_adapter_at_half_rate_beside_an_idle_gpu_is_not_judged() -> None:
    view, _ = windows(0.0)
    assert ic.nic_link_degraded(view, nic_window(lambda t: port(t, rate=100e9))) is None


def test_symbol_errors_rising_on_the_adapter_of_a_busy_gpu_are_degraded() -> None:
    view, _ = windows(0.9)
    f = ic.nic_link_degraded(view, nic_window(lambda t: port(t, errors={"symbol_error": int(4 * t),
                                                                        "link_downed": 0})))
    assert f is not None and "mlx5_0/1 errors rising (60 symbol_error" in f.detail


def test_a_link_downed_event_counts_at_once() -> None:
    view, _ = windows(0.9)
    f = ic.nic_link_degraded(view, nic_window(lambda t: port(t, errors={"symbol_error": 0,
                                                                        "link_downed": int(t > 7)})))
    assert f is not None and "1 link_downed" in f.detail


def test_an_adapter_down_beside_a_busy_gpu_is_degraded() -> None:
    view, _ = windows(0.9)
    f = ic.nic_link_degraded(view, nic_window(lambda t: port(t, up=False)))
    assert f is not None and "mlx5_0/1 (infiniband) down" in f.detail


def test_a_healthy_saturated_adapter_is_no_finding() -> None:
    view, _ = windows(0.5)
    assert ic.nic_link_degraded(view, nic_window(lambda t: port(t, rx_per_s=24e9))) is None


# ---- network_bound ---------------------------------------------------------------------------------------------

def verdict(util: float, slow: Sequence[Stamped[GpuSample]], nic: Sequence[Stamped[NicSample]]) -> tuple[str, str]:
    view, _ = windows(util)
    wire = ic.wire_load(view, slow, nic)
    shape = cpu_shape((), (), (), view.pids)
    cand = classify(view, shape, io_signals([], [], []), capacity=None, link_name="", window_s=T1, wire=wire)
    return cand.cause, "; ".join(cand.evidence)


def test_a_waiting_gpu_beside_a_saturated_adapter_is_network_bound() -> None:
    _, slow = windows(0.5)
    cause, why = verdict(0.5, slow, nic_window(lambda t: port(t, rx_per_s=23e9)))  # 184 Gb/s of 200
    assert cause == "network_bound"
    assert "mlx5_0/1 (infiniband) receives 184 Gb/s = 92% of its current 200 Gb/s link" in why


def test_a_waiting_gpu_whose_nvlinks_run_full_is_network_bound() -> None:
    _, slow = windows(0.5, nvlinks(18, tx_per_s=0.8 * 18 * LINK_BPS))
    cause, why = verdict(0.5, slow, ())
    assert cause == "network_bound" and "NVLink sends 360 GB/s = 80% of its 18 active links' 450 GB/s" in why


def test_a_waiting_gpu_with_a_quiet_wire_is_not_network_bound() -> None:
    _, slow = windows(0.5, nvlinks(18, tx_per_s=0.1 * 18 * LINK_BPS))
    cause, _ = verdict(0.5, slow, nic_window(lambda t: port(t, rx_per_s=2e9)))
    assert cause == "latency_bound"


def test_a_working_gpu_with_a_full_wire_stays_healthy() -> None:
    _, slow = windows(0.95)
    cause, _ = verdict(0.95, slow, nic_window(lambda t: port(t, rx_per_s=24e9)))
    assert cause == "healthy"


def test_the_current_rate_is_the_capacity_a_half_rate_port_fills_at_half_the_traffic() -> None:
    _, slow = windows(0.5)
    cause, why = verdict(0.5, slow, nic_window(lambda t: port(t, rate=100e9, rx_per_s=11e9)))
    assert cause == "network_bound" and "88% of its current 100 Gb/s link" in why


def test_a_held_nvlink_reading_counts_at_the_time_it_was_read() -> None:
    """A steady GPU's slow samples carry its last NVLink reading (the same tuple) until the links are read again
    (exporter/gpu/nvlink.py): the rate is taken between the readings' own times, not stretched over the repeats."""
    make = nvlinks(18, tx_per_s=0.8 * 18 * LINK_BPS)
    _, slow = windows(0.5)
    read_at: dict[float, tuple[NvLink, ...]] = {}
    held = []
    for s in slow:
        t_read = 0.0 if s.t < 10.0 else 10.0  # read at 0, held until the read at 10
        links = read_at.setdefault(t_read, make(t_read))
        held.append(Stamped(s.t, dataclasses.replace(s.value, gpus=MappingProxyType(
            {0: _with_links(s.value.gpus[0], links)}))))
    assert len(ic._links(held, 0)) == 2 < len(held)
    cause, why = verdict(0.5, held, ())
    assert cause == "network_bound" and "NVLink sends 360 GB/s = 80%" in why
