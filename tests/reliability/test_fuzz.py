"""Fuzzing every parser with hypothesis: nothing escapes a parser but its documented error type.

Documented error types: the HTTP head parser answers a status (``_BadRequestError``) or gives up quietly
(None); ``--web.config.file`` -> WebConfigError; ``--config.file`` and flags -> ConfigError; scenario files ->
ScenarioError; cpulists -> CpulistError; PCIe link strings -> LinkParseError; a collector's ``update()``
-> NoDataError, CollectorError or OSError (what the engine records as "not available" / "failed"; anything
else is logged as a bug with a traceback). Budgets are set so the whole file runs in well under 60 s on
two cores (``max_examples`` per test below; no per-example deadline because CI machines are noisy).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from exporter import linkmath, webconfig, yamlsafe
from exporter.collectors import load_all
from exporter.collectors.gpu import GpuCollector
from exporter.config import ConfigError, load_file, resolve
from exporter.cpulist import CpulistError, parse_cpulist
from exporter.engine import VirtualClock
from exporter.sampling import CollectorContext, CollectorError, NoDataError, Targets
from exporter.sim import scenario
from exporter.sim.fakenvml import FakeNvml, StateError
from exporter.web import WebServer, WebSettings, _BadRequestError

from .conftest import renderer
from .faults import GPU_PID, scratch_dir

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])
FUZZ_SLOW = settings(FUZZ, max_examples=40)

# Text that looks like the real thing often enough to get past the first check.
TOKENS = st.sampled_from(["GET", "HEAD", "POST", "/", "/metrics", "HTTP/1.1", "HTTP/1.0", "HTTP/2", " ", ":",
                          "\r\n", "\n", "\r", "\x00", "Host", "Content-Length", "Transfer-Encoding", "0", "-1",
                          "99999999999999999999", "Authorization", "Basic", "=", "\t", "\xff", "é"])
HEADISH = st.lists(TOKENS | st.text(max_size=8), max_size=30).map("".join)


def _server() -> WebServer:
    return WebServer(renderer(), WebSettings(host="127.0.0.1", port=0), healthy=lambda: True)


async def _parse_head(data: bytes) -> object:
    reader = asyncio.StreamReader(limit=16 * 1024)
    reader.feed_data(data)
    reader.feed_eof()
    try:
        return await _server()._read_head(reader, 1.0)
    except _BadRequestError as e:
        assert e.status in (400, 413, 414, 431, 505)
        return e.status


@FUZZ
@given(st.binary(max_size=2048) | HEADISH.map(lambda s: s.encode("latin-1", "replace")))
def test_http_request_head_parser_answers_a_status_or_nothing(data: bytes) -> None:
    out = asyncio.run(_parse_head(data + b"\r\n\r\n"))
    assert out is None or isinstance(out, int) or out.__class__.__name__ == "Request"


@FUZZ
@given(st.text(max_size=200))
def test_basic_auth_header_parser_never_raises(header: str) -> None:
    out = webconfig.parse_basic_auth(header)
    assert out is None or (isinstance(out, tuple) and len(out) == 2)


YAMLISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20)
    | st.sampled_from(["TLS12", "TLS13", "RequireAndVerifyClientCert", "1s", "$2y$10$" + "a" * 53, "x.crt"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["tls_server_config", "http_server_config", "basic_auth_users", "rate_limit", "cert_file",
                         "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version",
                         "cipher_suites", "headers", "X-Frame-Options", "interval", "burst", "alice", "http2",
                         "curve_preferences", "client_allowed_sans", "prefer_server_cipher_suites", "cert", "key"])
        | st.text(max_size=6), children, max_size=5),
    max_leaves=20,
)


@FUZZ
@given(YAMLISH)
def test_web_config_structure_raises_only_web_config_error(data: Any) -> None:
    with contextlib.suppress(webconfig.WebConfigError):
        webconfig.parse(data, Path("/nonexistent"))


@FUZZ_SLOW
@given(st.text(max_size=400))
def test_web_config_file_text_raises_only_web_config_error(tmp_path: Path, text: str) -> None:
    p = tmp_path / "web.yml"
    p.write_text(text, encoding="utf-8", errors="surrogatepass") if False else p.write_bytes(
        text.encode("utf-8", "surrogatepass"))
    with contextlib.suppress(webconfig.WebConfigError):
        webconfig.load(p)


YAML_TOKENS = st.sampled_from(["[", "]", "{", "}", ":", ", ", "- ", "&a ", "*a", "<<: ", "!!int ", "? ", "---\n",
                               "\n", "  ", "9" * 50, "1e400", ".inf", "0x", "'", '"', "#", "|\n", "a", "b", "~"])


@FUZZ
@given(st.lists(YAML_TOKENS | st.text(max_size=5), max_size=60).map("".join) | st.text(max_size=200))
def test_the_bounded_yaml_loader_raises_only_yaml_error(text: str) -> None:
    with contextlib.suppress(yamlsafe.YamlError):
        yamlsafe.loads(text)


@FUZZ_SLOW
@given(st.text(max_size=300) | YAMLISH.map(str))
def test_config_file_raises_only_config_error(tmp_path: Path, text: str) -> None:
    p = tmp_path / "gpufeed.yml"
    p.write_bytes(text.encode("utf-8", "surrogatepass"))
    registry = load_all()
    with contextlib.suppress(ConfigError):
        resolve(registry, load_file(p), {})


FLAG_KEYS = ["web.listen-address", "web.max-requests", "web.read-timeout", "log.level", "collector.cpu",
             "collector.proc.pids", "collector.disk.device-exclude", "collector.gpu.interval", "engine.history",
             "collector.nope", "collector.cpu.nope", "nope", "simulate-speed", "web.telemetry-path"]


@FUZZ
@given(st.dictionaries(st.sampled_from(FLAG_KEYS), st.text(max_size=12) | st.integers() | st.booleans(), max_size=4))
def test_flags_raise_only_config_error(flags: dict[str, Any]) -> None:
    with contextlib.suppress(ConfigError):
        resolve(load_all(), {}, flags)


@FUZZ_SLOW
@given(st.text(max_size=500) | YAMLISH.map(lambda d: __import__("yaml").safe_dump(d)))
def test_scenario_text_raises_only_scenario_error(text: str) -> None:
    with contextlib.suppress(scenario.ScenarioError):
        scenario.loads(text)


@FUZZ
@given(YAMLISH)
def test_scenario_structure_raises_only_scenario_error(data: Any) -> None:
    with contextlib.suppress(scenario.ScenarioError):
        scenario.from_dict(data)


@FUZZ
@given(st.text(alphabet=string.digits + ",-\n x", max_size=40) | st.text(max_size=20))
def test_cpulist_raises_only_cpulist_error(text: str) -> None:
    try:
        out = parse_cpulist(text)
    except CpulistError:
        return
    assert all(c >= 0 for c in out)


@FUZZ
@given(st.text(max_size=30) | st.sampled_from(["8.0 GT/s PCIe", "2.5 GT/s", "Unknown", "32 GT/s", "x"]))
def test_pcie_link_strings_raise_only_link_parse_error(text: str) -> None:
    for fn in (linkmath.parse_speed, linkmath.parse_width):
        with contextlib.suppress(linkmath.LinkParseError):
            fn(text)


# ---- collectors: garbage in any source file ---------------------------------------------------------------

SOURCES = [  # (collector, file relative to the root); the pid is a GPU process of the fixture tree
    ("cpu", "proc/stat"), ("memory", "proc/meminfo"), ("memory", "proc/vmstat"), ("disk", "proc/diskstats"),
    ("nfs", "proc/net/rpc/nfs"), ("pressure", "proc/pressure/io"), ("proc", f"proc/{GPU_PID}/stat"),
    ("proc", f"proc/{GPU_PID}/status"), ("proc", f"proc/{GPU_PID}/io"),
    ("numa", f"proc/{GPU_PID}/status"), ("numa", "sys/devices/system/node/node1/cpulist"),
    ("pcie", "sys/bus/pci/devices/0000:41:00.0/current_link_speed"),
    ("pcie", "sys/bus/pci/devices/0000:41:00.0/current_link_width"),
    ("pcie", "sys/bus/pci/devices/0000:41:00.0/aer_dev_correctable"),
]
PROCISH = st.lists(st.sampled_from(["cpu", "cpu0", " ", "\n", "1", "-1", "18446744073709551616", "MemTotal:", "kB",
                                    "some", "full", "avg10=0.00", "total=", "(", ")", "x", "\x00", "Cpus_allowed_list:",
                                    "0-3", "8.0 GT/s PCIe", "rchar:", "syscr:", "TOTAL", "nvme0n1", "proc4"]),
                   max_size=60).map("".join)


@pytest.fixture(scope="module")
def fuzz_root() -> Iterator[Path]:
    from .faults import Host

    d = scratch_dir()
    Host(d / "root")  # materialise the merged fixture tree
    yield d / "root"
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize(("name", "rel"), SOURCES, ids=[f"{c}:{r}" for c, r in SOURCES])
def test_collector_update_raises_only_its_documented_errors_on_garbage(fuzz_root: Path, name: str, rel: str) -> None:
    cls = load_all()[name]
    opts: dict[str, Any] = {o.name: o.default for o in cls.options}
    opts["interval"] = cls.default_interval
    if name in ("proc", "numa"):
        opts["pids"] = (GPU_PID,) if name == "proc" else (f"0000:41:00.0={GPU_PID}",)
    ctx = CollectorContext(procfs=fuzz_root / "proc", sysfs=fuzz_root / "sys", options=opts,
                           targets=Targets((GPU_PID,)))
    col = cls(ctx)
    path = fuzz_root / rel
    good = path.read_bytes()

    @FUZZ_SLOW
    @given(st.binary(max_size=600) | PROCISH.map(str.encode))
    def run(data: bytes) -> None:
        tmp = path.with_name(path.name + ".fuzz")
        tmp.write_bytes(data)
        tmp.replace(path)  # a new inode: the template behind the hard links is not touched
        for spec in col.samplers():
            with contextlib.suppress(NoDataError, CollectorError, OSError):
                spec.fn()

    try:
        run()
    finally:
        tmp = path.with_name(path.name + ".fuzz")
        tmp.write_bytes(good)
        tmp.replace(path)
        col.close()


# ---- NVML values --------------------------------------------------------------------------------------------

# Any value the driver can hand back: NVML's C types are unsigned 32/64-bit (mW, MHz, degrees C, bytes, pids).
U32 = st.integers(min_value=0, max_value=2**32 - 1)
U64 = st.integers(min_value=0, max_value=2**64 - 1)
WATTS = st.floats(min_value=0, max_value=(2**32 - 1) / 1000)
RATIO_INTEGRAL = st.floats(min_value=0, max_value=1e9)


@FUZZ_SLOW
@given(st.fixed_dictionaries({}, optional={
    "sm_clock_mhz": U32, "max_sm_clock_mhz": U32, "power_w": WATTS, "power_limit_w": WATTS, "temperature_c": U32,
    "memory_used_bytes": U64, "memory_total_bytes": U64, "pcie_tx_bytes": U64, "pcie_rx_bytes": U64,
    "pcie_replays": U64, "pcie_counter_bits": st.sampled_from([32, 64]),
    "sm_active_integral": RATIO_INTEGRAL, "graphics_active_integral": RATIO_INTEGRAL,
    "util_samples": st.lists(st.tuples(U64, U32).map(list), max_size=5),
    "processes": st.lists(st.fixed_dictionaries({"pid": U32, "used_memory_bytes": st.none() | U64}), max_size=4),
    "process_util": st.lists(st.fixed_dictionaries({"pid": U32, "ts_us": U64, "sm_pct": U32, "mem_pct": U32}),
                             max_size=3),
    "link": st.fixed_dictionaries({}, optional={k: U32 for k in ("gen", "width", "max_gen", "max_width")}),
    "throttle_ns": st.fixed_dictionaries({}, optional={"sw_power_cap": U64, "hw_thermal": U64}),
}), st.floats(min_value=0, max_value=1e12))
def test_nvml_values_raise_only_documented_errors(tmp_path: Path, dev: dict[str, Any], t: float) -> None:
    state = {"t": t, "devices": [{"pci_bus_id": "0000:82:00.0", **dev}]}
    try:
        fake = FakeNvml(state)
    except (StateError, ValueError, TypeError, OverflowError):
        assume(False)
        return
    clock = VirtualClock(0.0)
    proc = tmp_path / "proc"
    (proc / "sys" / "kernel").mkdir(parents=True, exist_ok=True)
    (proc / "sys" / "kernel" / "pid_max").write_text("4194304\n")
    ctx = CollectorContext(procfs=proc, sysfs=tmp_path / "sys", options={}, targets=Targets(),
                           nvml=fake, clock=clock.now)
    col = GpuCollector(ctx)
    try:
        for step in range(3):
            clock.set(step * 1.0)
            for spec in col.samplers():
                with contextlib.suppress(NoDataError, CollectorError, OSError):
                    spec.fn()
    finally:
        col.close()
