"""CLI and config file: one clear error naming the key and exit 2 with nothing started; flags override the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from exporter import cli
from exporter.cli import build_parser, settings_from_args
from exporter.collectors import load_all


@pytest.fixture(autouse=True)
def _never_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """A configuration error must stop before anything starts: fail loudly if the daemon is launched."""
    import exporter.daemon

    def boom(*_a: Any, **_k: Any) -> int:
        raise AssertionError("daemon started despite a configuration error")

    monkeypatch.setattr(exporter.daemon, "run_daemon", boom)


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        rc = cli.main(["serve", *argv])
    except SystemExit as e:  # argparse exits itself on unknown flags
        rc = int(e.code or 0)
    return rc, capsys.readouterr().err


def _settings(*argv: str) -> Any:
    collectors = load_all()
    return settings_from_args(build_parser(collectors).parse_args(["serve", *argv]), collectors)


def test_unknown_flag_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _main(capsys, "--collector.cpu.percore")
    assert rc == 2 and "--collector.cpu.percore" in err


def test_bad_flag_value_exits_2_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _main(capsys, "--collector.cpu.interval", "fast")
    assert rc == 2 and "--collector.cpu.interval" in err and "fast" in err


def test_negative_interval_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _main(capsys, "--collector.proc.threads-interval", "-1s")
    assert rc == 2 and "--collector.proc.threads-interval" in err


def test_bad_log_level_exits_2_with_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _main(capsys, "--log.level", "loud")
    assert rc == 2 and "--log.level" in err and "debug" in err


def test_unknown_config_key_exits_2_naming_key_and_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "gpufeed.yml"
    cfg.write_text("collector:\n  cpu:\n    per_core: true\n")
    rc, err = _main(capsys, "--config.file", str(cfg))
    assert rc == 2 and "collector.cpu.per_core" in err and str(cfg) in err and "per-core" in err


def test_unknown_collector_in_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "gpufeed.yml"
    cfg.write_text("collector:\n  cpuu:\n    enabled: false\n")
    rc, err = _main(capsys, "--config.file", str(cfg))
    assert rc == 2 and "unknown collector 'cpuu'" in err


def test_bad_config_value_exits_2_naming_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "gpufeed.yml"
    cfg.write_text("collector:\n  proc:\n    pids: [12, twelve]\n")
    rc, err = _main(capsys, "--config.file", str(cfg))
    assert rc == 2 and "collector.proc.pids" in err and "twelve" in err


def test_invalid_yaml_and_missing_file_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("collector: [unclosed\n")
    rc, err = _main(capsys, "--config.file", str(bad))
    assert rc == 2 and "invalid YAML" in err
    rc, err = _main(capsys, "--config.file", str(tmp_path / "nope.yml"))
    assert rc == 2 and "cannot read" in err


def test_flags_override_the_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "gpufeed.yml"
    cfg.write_text(
        "web:\n  listen-address: 127.0.0.1:29999\n"
        "collector:\n  cpu:\n    interval: 2s\n    per-core: true\n  nfs:\n    enabled: false\n"
        "  disk:\n    device-exclude: '^sd'\n"
    )
    s = _settings("--config.file", str(cfg), "--collector.cpu.interval", "100ms", "--no-collector.cpu.per-core",
                  "--collector.nfs")
    assert s.collector["cpu"]["interval"] == 0.1
    assert s.collector["cpu"]["per-core"] is False
    assert s.enabled["nfs"] is True
    assert s.collector["disk"]["device-exclude"] == "^sd"  # from the file, no flag given
    assert s["web.listen-address"] == ("127.0.0.1:29999",)


def test_host_collector_defaults() -> None:
    s = _settings()
    assert s.collector["cpu"] == {"interval": 0.25, "per-core": False}
    assert s.collector["proc"] == {"interval": 1.0, "pids": (), "threads-interval": 5.0}
    assert s.collector["pressure"]["interval"] == 0.25
    assert all(s.enabled[c] for c in ("cpu", "proc", "cpufreq", "memory", "disk", "nfs", "pressure"))


def test_pids_flag_feeds_the_proc_collector() -> None:
    s = _settings("--collector.proc.pids", "1,22", "--collector.proc.threads-interval", "500ms")
    assert s.collector["proc"]["pids"] == (1, 22) and s.collector["proc"]["threads-interval"] == 0.5
