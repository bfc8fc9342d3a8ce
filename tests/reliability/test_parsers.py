"""Every file gpufeed is handed is bounded: size, nesting, numbers, duplicates, file type; every refusal is a clean
error naming the key, exit 2 at start, "keep the previous config" at reload (exporter/yamlsafe.py).

Reproduces the attacks of round 2: deeply nested YAML (RecursionError) and > 4300-digit integers (ValueError)
escaped the web-config, ``--config.file`` and scenario loaders; ``rate_limit.burst: 1e400`` passed validation
and overflowed later; an empty web config served plaintext; scenarios that exhaust memory or never finish.
"""

from __future__ import annotations

import asyncio
import os
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from exporter import webconfig, yamlsafe
from exporter.cli import main
from exporter.config import ConfigError, load_file
from exporter.cpulist import CpulistError, parse_cpulist
from exporter.sim import scenario
from exporter.webconfig import WebConfigError, WebConfigManager

from .conftest import Pki

DEEP = "a: " + "[" * 5000 + "]" * 5000 + "\n"
HUGE_INT = "web:\n  max-requests: " + "9" * 5000 + "\n"
BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join(["*" + chr(97 + i)] * 10) + "]\n" for i in range(7))


def _config(path: Path) -> object:
    return load_file(path)


def _web(path: Path) -> object:
    return webconfig.load(path)


def _scenario(path: Path) -> object:
    return scenario.load(path)


LOADERS: list[tuple[str, Callable[[Path], object], type[Exception]]] = [
    ("config", _config, ConfigError), ("web config", _web, WebConfigError), ("scenario", _scenario,
                                                                             scenario.ScenarioError),
]


@pytest.mark.parametrize(("what", "loader", "error"), LOADERS, ids=[x[0] for x in LOADERS])
@pytest.mark.parametrize(
    ("text", "says"),
    [
        (DEEP, "nest"),
        (HUGE_INT, "too large"),
        ("a: 1e400\n", "too large (overflows to infinity)"),
        (BOMB, "aliases are expanded"),
        ("a: &x [*x]\n", "recursive"),
        ("a: 1\na: 2\n", "duplicate key 'a'"),
        ("a: 1\n---\nb: 2\n", "more than one document"),
    ],
    ids=["nesting", "5000-digit int", "1e400", "alias bomb", "recursive alias", "duplicate key", "two documents"],
)
def test_every_loader_refuses_hostile_yaml_with_its_own_error_naming_the_file(  # noqa: PLR0917 - parametrized
    tmp_path: Path, what: str, loader: Callable[[Path], object], error: type[Exception], text: str, says: str
) -> None:
    path = tmp_path / "in.yml"
    path.write_text(text)
    with pytest.raises(error) as e:  # not RecursionError, not ValueError, not a hang
        loader(path)
    assert str(path) in str(e.value) and says in str(e.value), str(e.value)


@pytest.mark.parametrize(("what", "loader", "error"), LOADERS, ids=[x[0] for x in LOADERS])
def test_every_loader_refuses_a_fifo_a_huge_file_and_non_utf8(
    tmp_path: Path, what: str, loader: Callable[[Path], object], error: type[Exception]
) -> None:
    fifo = tmp_path / "fifo.yml"
    os.mkfifo(fifo)  # no writer: an ordinary open() would block forever
    with pytest.raises(error, match="not a regular file"):
        loader(fifo)
    big = tmp_path / "big.yml"
    with big.open("wb") as f:  # sparse: 29 MB on paper, nothing on disk
        f.truncate(29 << 20)
    with pytest.raises(error, match=f"larger than the {yamlsafe.MAX_BYTES}-byte limit"):
        loader(big)
    latin = tmp_path / "latin1.yml"
    latin.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(error, match="not UTF-8 text"):
        loader(latin)


def test_a_29_mb_scenario_is_refused_before_any_parsing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "huge.yaml"
    path.write_text("version: 1\nname: x\n" + "# padding\n" * (3 << 20))  # 29+ MB of real bytes
    monkeypatch.setattr(yamlsafe, "loads", lambda text: pytest.fail("parsed"))
    with pytest.raises(scenario.ScenarioError, match="larger than the"):
        scenario.load(path)


def test_yaml_keeps_what_real_files_use() -> None:
    doc = yamlsafe.loads(textwrap.dedent("""\
        base: &base {interval: 1s, burst: 5}
        merged: {<<: *base, burst: 6}
        rates: [6e9, 1.5e9, 0x10, 1_000]
        on: yes
        inf: .inf
    """))
    assert doc == {"base": {"interval": "1s", "burst": 5}, "merged": {"interval": "1s", "burst": 6},
                   "rates": [6e9, 1.5e9, 16, 1000], True: True, "inf": float("inf")}
    assert yamlsafe.loads("") is None and yamlsafe.loads("# only a comment\n") is None


def test_config_file_with_hostile_values_exits_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "gpufeed.yml"
    cfg.write_text(HUGE_INT)
    assert main(["serve", "--config.file", str(cfg), "--web.listen-address", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err
    assert "web.max-requests" in err and "too large" in err and str(cfg) in err


# ---- the web config -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("", "empty: it would turn TLS and authentication off"),
        ("# managed by config management\n", "empty: it would turn TLS and authentication off"),
        ("{}\n", "empty"),
        ("tls_server_config:\n", "tls_server_config: empty"),
        ("basic_auth_users:\n", "basic_auth_users: empty"),
        ("rate_limit: {interval: 1s, burst: 1" + "0" * 400 + "}\n", "rate_limit.burst"),
        ("rate_limit: {interval: 1s, burst: 10000000000}\n", "rate_limit.burst: must be an integer from 0 to"),
        ("rate_limit: {interval: 1e400, burst: 2}\n", "rate_limit.interval"),
        ("basic_auth_users: {alice: '$2y$31$" + "a" * 53 + "'}\n", "bcrypt cost 31 out of range 4-17"),
        ("basic_auth_users: {alice: '$2y$18$" + "a" * 53 + "'}\n", "bcrypt cost 18 out of range"),
    ],
    ids=["empty", "comment only", "empty mapping", "tls section empty", "users empty", "burst 400 digits",
         "burst 1e10", "interval 1e400", "cost 31", "cost 18"],
)
def test_web_config_that_would_fail_open_or_overflow_is_refused(tmp_path: Path, body: str, says: str) -> None:
    path = tmp_path / "web.yml"
    path.write_text(body)
    with pytest.raises(WebConfigError) as e:
        webconfig.load(path)
    assert says in str(e.value), str(e.value)


def test_serve_with_an_empty_web_config_exits_2_and_never_listens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "web.yml"
    cfg.write_text("")
    assert main(["serve", "--web.config.file", str(cfg), "--web.listen-address", "127.0.0.1:0"]) == 2
    assert "empty: it would turn TLS and authentication off" in capsys.readouterr().err


def test_truncate_then_write_at_reload_keeps_tls_and_auth(pki: Pki, alice_hash: str, tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text(f"tls_server_config: {{cert_file: {pki.server_cert}, key_file: {pki.server_key}}}\n"
                    f"basic_auth_users: {{alice: '{alice_hash}'}}\n")
    mgr = WebConfigManager(path)
    for partial in ("", "# header\n", "tls_server_config:\n"):  # what config management leaves mid-write
        path.write_text(partial)
        with capture_logs() as logs:
            assert not mgr.reload(reason="file_changed")
        assert [e["event"] for e in logs] == ["web_config_reload_failed"]
        assert mgr.ssl_context() is not None and mgr.authenticates()


def test_loading_a_web_config_hashes_nothing_whatever_the_cost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The dummy hash for unknown users used to be bcrypt of a random password at the users' cost, computed on
    # the loop that reloads: a cost-16 user stalled sampling 3.5 s. Now it is built, not hashed.
    import bcrypt

    monkeypatch.setattr(bcrypt, "hashpw", lambda *a: pytest.fail("bcrypt ran at load"))
    monkeypatch.setattr(bcrypt, "checkpw", lambda *a: pytest.fail("bcrypt ran at load"))
    path = tmp_path / "web.yml"
    path.write_text("basic_auth_users: {alice: '$2y$17$" + "a" * 53 + "'}\n")
    cfg = webconfig.load(path)
    assert cfg.dummy_hash.startswith(b"$2b$17$") and len(cfg.dummy_hash) == 60


async def test_the_web_config_watcher_survives_an_error_logs_it_once_and_keeps_watching(
    alice_hash: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users: {{alice: '{alice_hash}'}}\n")
    mgr = WebConfigManager(path)
    real_changed = mgr.changed
    failures = iter([RecursionError("deep"), ValueError("4300 digits"), None, None, None, None, None, None])

    def flaky() -> bool:
        err = next(failures, None)
        if err is not None:
            raise err
        return real_changed()

    monkeypatch.setattr(mgr, "changed", flaky)
    with capture_logs() as logs:
        task = asyncio.create_task(mgr.watch(interval=0.02))
        await asyncio.sleep(0.2)
        path.write_text(f"basic_auth_users: {{alice: '{alice_hash}'}}\n"  # a later rotation
                        "http_server_config: {headers: {X-Frame-Options: deny}}\n")
        for _ in range(200):
            if mgr.reloads_ok:
                break
            await asyncio.sleep(0.02)
        task.cancel()
    assert mgr.reloads_ok == 1 and mgr.headers() == {"X-Frame-Options": "deny"}
    assert [e["event"] for e in logs].count("web_config_watch_failed") == 1


# ---- scenarios: accepted files must be playable -------------------------------------------------------------

SCENARIO = """\
version: 1
name: bounded
host: {cpus: 4}
gpus: [{pci_bus_id: "0000:01:00.0"}]
processes: [{pid: 100, gpus: [0], threads: 2}]
phases:
  - name: p
    duration_s: DURATION
    gpus: {0: {gpu_util: GPU_UTIL, pcie_tx_bytes_per_s: RATE}}
    processes: {100: {cpus_allowed: "CPUS"}}
"""


def _scn(**over: str) -> str:
    text = SCENARIO
    for key, default in (("DURATION", "60"), ("GPU_UTIL", "0.5"), ("RATE", "1.0e9"), ("CPUS", "0-3")):
        text = text.replace(key, over.get(key, default))
    return text


@pytest.mark.parametrize(
    ("over", "says"),
    [
        ({"GPU_UTIL": "{square: {high: 1, low: 0, period_s: 1.0e-6, duty: 0.5}}"}, "period_s: 1e-06 is below"),
        ({"DURATION": "1.0e300"}, "duration_s: 1e+300 out of range"),
        ({"DURATION": "86400", "GPU_UTIL": "{square: {high: 1, low: 0, period_s: 0.05, duty: 0.5}}"},
         "constant pieces"),
        ({"GPU_UTIL": "{noise: {mean: 0.5, sd: 1.0e308}}"}, "sd: 1e+308 out of range"),
        ({"RATE": "1.0e308"}, "pcie_tx_bytes_per_s: 1e+308 out of range"),
        ({"CPUS": ",".join(["0-3"] * 40000)}, "cpulist names more than"),
    ],
    ids=["period 1e-6", "duration 1e300", "too many pieces", "noise sd 1e308", "rate 1e308", "80 KB cpulist"],
)
def test_scenario_that_would_exhaust_memory_or_never_finish_is_refused_naming_the_key(
    over: dict[str, str], says: str
) -> None:
    with pytest.raises(scenario.ScenarioError) as e:
        scenario.loads(_scn(**over), "s.yaml")
    assert says in str(e.value), str(e.value)


def test_the_timeline_is_capped_at_a_week_in_all() -> None:
    text = _scn(DURATION="86400").replace("phases:\n", "phases:\n" + "".join(
        f"  - {{name: x{i}, duration_s: 86400}}\n" for i in range(7)))
    with pytest.raises(scenario.ScenarioError, match="more than 604800 s"):
        scenario.loads(text, "s.yaml")


def test_a_cpulist_repeating_every_cpu_is_refused_not_expanded() -> None:
    # 80 KB of "0-65535," took 30 s to expand into a set; the sum of the ranges is now bounded first.
    with pytest.raises(CpulistError, match="names more than"):
        parse_cpulist(",".join(["0-65535"] * 10000)[:80000])
    assert len(parse_cpulist(",".join(str(c) for c in range(0, 65536, 2)))) == 32768  # a real worst case
