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


# ---- the contract for every command: one line naming the flag, exit 2, nothing started, no traceback ----------


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("addr", ["9842", "127.0.0.1", "notanaddress", ":99999", "foo bar:80", "[::1:9842"])
def test_a_wrong_listen_address_is_one_line_naming_the_flag_and_exit_2(addr: str,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _main(capsys, "--web.listen-address", addr)
    line = _one_line(err)
    assert rc == 2 and "--web.listen-address" in line and repr(addr) in line


def test_a_wrong_listen_address_in_the_config_file_names_the_key_and_file(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "gpufeed.yml"
    cfg.write_text("web:\n  listen-address: [':9842', '127.0.0.1']\n")
    rc, err = _main(capsys, "--config.file", str(cfg))
    line = _one_line(err)
    assert rc == 2 and str(cfg) in line and "web.listen-address" in line and "'127.0.0.1'" in line


def test_a_second_listen_address_adds_a_listener_instead_of_replacing_the_first(tmp_path: Path) -> None:
    assert _settings("--web.listen-address", "127.0.0.1:9842", "--web.listen-address", "[::1]:9842")[
        "web.listen-address"] == ("127.0.0.1:9842", "[::1]:9842")
    cfg = tmp_path / "gpufeed.yml"
    cfg.write_text("web:\n  listen-address: ['127.0.0.1:1', '127.0.0.1:2']\n")
    assert _settings("--config.file", str(cfg))["web.listen-address"] == ("127.0.0.1:1", "127.0.0.1:2")
    assert _settings()["web.listen-address"] == (":9842",)


def test_the_same_listen_address_twice_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _main(capsys, "--web.listen-address", ":9842", "--web.listen-address", ":9842")
    assert rc == 2 and "given twice" in _one_line(err)


@pytest.mark.parametrize("value", ["garbage", "0000:41:00.0=", "=4242", "0=-1", "0=12x"])
def test_a_bad_numa_pids_map_is_exit_2_not_a_daemon_without_the_numa_collector(
        value: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _main(capsys, f"--collector.numa.pids={value}")
    assert rc == 2 and "--collector.numa.pids" in _one_line(err)


def test_a_negative_duration_after_its_flag_is_named_not_taken_for_another_flag(
        capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _main(capsys, "--collector.cpu.interval", "-5s")
    assert rc == 2 and "--collector.cpu.interval" in err and "cannot be negative" in _one_line(err)
    assert cli.main(["diagnose", "--duration", "-5s"]) == 2
    assert "--duration: a duration cannot be negative: '-5s'" in _one_line(capsys.readouterr().err)


def test_go_style_durations_are_taken_by_every_duration_flag() -> None:
    s = _settings("--web.read-timeout", "1m30s", "--engine.history", "2h45m", "--collector.proc.threads-interval",
                  "1m", "--collector.cpu.interval", "250ms")
    assert (s["web.read-timeout"], s["engine.history"]) == (90.0, 9900.0)
    assert (s.collector["proc"]["threads-interval"], s.collector["cpu"]["interval"]) == (60.0, 0.25)


def test_a_bare_number_is_not_a_duration_and_the_error_says_which_unit_to_add(
        capsys: pytest.CaptureFixture[str]) -> None:
    # P9: --web.read-timeout 10 was taken as 10 s; Prometheus and Go refuse it (10 what?).
    rc, err = _main(capsys, "--web.read-timeout", "10")
    assert rc == 2 and "--web.read-timeout" in _one_line(err) and "use 10s for 10 seconds" in err, err
    rc, err = _main(capsys, "--collector.cpu.interval", "0.5")
    assert rc == 2 and "use 500ms" in _one_line(err), err


def test_simulate_speed_without_simulate_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    # P9: it was ignored, and the real host served; check-config said SUCCESS.
    for command in ("serve", "check-config"):
        assert cli.main([command, "--simulate-speed", "10"]) == 2
        assert "--simulate-speed: needs --simulate" in _one_line(capsys.readouterr().err)
    assert cli.main(["check-config", "--simulate", "launch_bound", "--simulate-speed", "10"]) == 0


def test_a_history_shorter_than_the_classifier_window_is_refused_naming_both_flags(
        capsys: pytest.CaptureFixture[str]) -> None:
    # The buffers keep --engine.history seconds; verdicts judge --collector.derived.window of them.
    rc, err = _main(capsys, "--engine.history=10s")
    assert rc == 2
    assert "--engine.history (10s) must be at least --collector.derived.window (15s)" in _one_line(err)
    assert cli.main(["check-config", "--engine.history=10s", "--collector.derived.window=10s"]) == 0
    assert cli.main(["check-config", "--engine.history=10s"]) == 2


def test_a_window_longer_than_the_default_history_asks_for_both_flags(capsys: pytest.CaptureFixture[str]) -> None:
    # The default history (30 s) is twice the default window: nothing reads further back. A longer window needs a
    # longer history, and the refusal names the flag to raise.
    assert _settings()["engine.history"] == 30.0
    rc, err = _main(capsys, "--collector.derived.window=1m")
    assert rc == 2
    assert "--engine.history (30s) must be at least --collector.derived.window (1m)" in _one_line(err)
    assert cli.main(["check-config", "--collector.derived.window=1m", "--engine.history=2m"]) == 0


def test_argparse_errors_are_one_line_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["serve", "--nope"], ["diagnose", "--duration"], ["frobnicate"], ["diagnose", "--json=1"]):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2
        assert "error:" in _one_line(capsys.readouterr().err)


@pytest.mark.parametrize("speed", ["0", "-1", "nan", "inf", "1000", "fast"])
def test_simulate_speed_must_be_a_sane_positive_number(speed: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _main(capsys, f"--simulate-speed={speed}")
    assert rc == 2 and "--simulate-speed" in _one_line(err)


def test_help_points_at_files_that_exist_and_states_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    repo = Path(__file__).resolve().parents[1]
    for argv in (["--help"], ["serve", "--help"], ["diagnose", "--help"], ["check-config", "--help"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        out = capsys.readouterr().out
        assert "SPEC.md" not in out
        for ref in re_paths(out):
            assert (repo / ref).exists(), f"gpufeed {' '.join(argv)} names {ref}, which is not in the repository"
    with pytest.raises(SystemExit):
        cli.main(["diagnose", "--help"])
    out = capsys.readouterr().out
    for code in ("0  every GPU is healthy or idle", "1  a GPU waits", "2  usage", "3  the host could not be seen"):
        assert code in out
    assert "transfer_bound_riser" in out  # the shipped scenarios, by name


def re_paths(text: str) -> list[str]:
    import re

    return re.findall(r"\b((?:docs|exporter|deploy|alerts|tests)/[\w./-]+\.(?:md|json|yml|yaml))", text)


def test_version_names_version_revision_and_python(capsys: pytest.CaptureFixture[str]) -> None:
    import platform

    from exporter import __version__

    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"gpufeed, version {__version__} (revision: ") and platform.python_version() in out


# ---- gpufeed check-config ----------------------------------------------------------------------------------------


def test_check_config_accepts_a_valid_file_and_starts_nothing(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "gpufeed.yml"
    cfg.write_text("web:\n  listen-address: ['127.0.0.1:9842', '[::1]:9842']\n  read-timeout: 1m30s\n"
                   "collector:\n  numa:\n    pids: ['0000:41:00.0=4242']\n")
    assert cli.main(["check-config", "--config.file", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"SUCCESS: {cfg} is a valid gpufeed configuration") and "[::1]:9842" in out


@pytest.mark.parametrize(("body", "named"), [
    ("collector:\n  cpu:\n    per_core: true\n", "collector.cpu.per_core"),
    ("web:\n  listen-address: '9842'\n", "web.listen-address"),
    ("collector:\n  numa:\n    pids: [nonsense]\n", "collector.numa.pids"),
    ("simulate: no-such-scenario\n", "--simulate"),
    ("web:\n  config:\n    file: /nonexistent/web.yml\n", "--web.config.file"),
])
def test_check_config_names_the_first_problem_with_exit_2(body: str, named: str, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "gpufeed.yml"
    cfg.write_text(body)
    assert cli.main(["check-config", "--config.file", str(cfg)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("gpufeed check-config: error:") and named in line


def test_check_config_loads_the_scenario_serve_would_simulate(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nname: x\nhost: {cpus: 4}\ngpus: []\nphases: []\n")
    assert cli.main(["check-config", "--simulate", str(bad)]) == 2
    assert f"{bad}: phases: at least one phase is required" in _one_line(capsys.readouterr().err)
    assert cli.main(["check-config", "--simulate", "transfer_bound_riser"]) == 0  # a shipped scenario by name


@pytest.mark.parametrize("flag", ["--path.procfs", "--path.sysfs"])
@pytest.mark.parametrize("command", ["serve", "check-config"])
def test_a_root_the_host_cannot_be_seen_through_is_refused_at_start_with_exit_3(
        command: str, flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A container started without the /proc:/host/proc mount used to serve, /healthz 200, and check-config said
    # SUCCESS; diagnose already said "cannot see the host" (exit 3). Every command now says it, at start.
    for root, why in ((tmp_path / "nowhere", "no such directory"), (tmp_path, "not a procfs")):
        if flag == "--path.sysfs" and why == "not a procfs":
            continue  # any directory may be a sysfs (a host without the classes a collector reads)
        assert cli.main([command, flag, str(root)]) == 3
        line = _one_line(capsys.readouterr().err)
        assert line.startswith(f"gpufeed {command}: error: cannot see the host: {flag} {root}: {why}"), line
    (tmp_path / "stat").write_text("cpu  1 2 3 4 5 6 7 0 0 0\n")
    assert cli.main(["check-config", "--path.procfs", str(tmp_path)]) == 0  # a procfs: taken


# ---- YAML the bounded loader (exporter/yamlsafe.py) rejects -----------------------------------------------------


def test_a_non_utf8_config_file_is_exit_2_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "gpufeed.yml"
    cfg.write_bytes(b"web:\n  listen-address: '\xff\xfe:9842'\n")
    rc, err = _main(capsys, "--config.file", str(cfg))
    assert rc == 2 and str(cfg) in _one_line(err)


def test_a_duplicated_key_in_the_config_file_is_exit_2_not_a_silently_dropped_block(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "gpufeed.yml"
    # The second `web:` used to replace the first: the daemon then listened on :9842 on every interface.
    cfg.write_text("web:\n  listen-address: 127.0.0.1:9842\nweb:\n  max-requests: 10\n")
    rc, err = _main(capsys, "--config.file", str(cfg))
    line = _one_line(err)
    assert rc == 2 and str(cfg) in line and "web" in line


# ---- no traceback on any input -------------------------------------------------------------------------------------

GARBAGE = ["", "-5s", "garbage", "\x00", "9" * 400, "1e309", "nan", "-1", "0", ":99999", "\U0001f4a5", "a=b,c",
           "[", "{x", "%s%n", "../../../etc/passwd", "1m30s"]


def _value_flags(parser: Any) -> list[str]:
    """Every --flag of a (sub)parser that takes a value."""
    return sorted({opt for action in parser._actions for opt in action.option_strings
                   if opt.startswith("--") and action.nargs is None and action.const is None
                   and action.__class__.__name__ in ("_StoreAction", "_AppendAction")})


def _subparsers(parser: Any) -> dict[str, Any]:
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            return dict(action.choices)
    return {}


def test_every_flag_of_every_command_given_garbage_answers_without_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import exporter.daemon
    import exporter.diagnose.command

    def started(*_a: Any, **_k: Any) -> int:
        return 0  # a garbage value that is a valid setting "starts" the daemon: fine, it was taken

    monkeypatch.setattr(exporter.daemon, "run_daemon", started)
    monkeypatch.setattr(exporter.diagnose.command, "_sample_live", _no_sampling)
    commands = _subparsers(build_parser(load_all()))
    tried = 0
    for command in ("serve", "check-config", "diagnose"):
        for flag in _value_flags(commands[command]):
            for value in GARBAGE:
                argv = [command, flag, value]
                if command == "diagnose" and flag not in ("--path.procfs", "--path.sysfs"):
                    argv += ["--path.procfs", str(tmp_path / "none")]  # a valid value answers 3, quickly
                try:
                    rc = cli.main(argv)
                except SystemExit as e:
                    rc = int(e.code or 0)
                err = capsys.readouterr().err
                assert "Traceback" not in err and "internal error" not in err, (argv, err)
                assert rc in (0, 1, 2, 3), (argv, rc, err)
                tried += 1
    assert tried > 500


async def _no_sampling(engine: Any, duration: float, tty: Any) -> None:
    """diagnose's sampling, without the wait: the fuzz run only asks whether an input is taken or refused."""
    engine.start()
    await engine.stop(timeout=0.1)


def test_help_is_plain_text_with_one_default_each_and_every_no_form_listed(capsys: pytest.CaptureFixture[str]) -> None:
    # P10: reStructuredText markup in --help, "(default: ...)" twice, and --no-... forms that worked but were hidden.
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    top = capsys.readouterr().out
    assert "``" not in top and "gpufeed serve" in top
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split()).split(" options: ", 1)[1]  # past the usage lines
    for flag in ("collector.pcie.feeders", "collector.derived.quiet-host", "collector.workload.container-env"):
        assert f"--{flag}, --no-{flag}" in text, flag
    for flag in ("collector.gpu.hostname", "collector.workload.cgroupfs"):
        help_text = text.split(f"--{flag} STR", 1)[1].split(" --", 1)[0]
        assert help_text.count("(default:") == 1, help_text
