"""Command line: ``gpufeed serve`` (the daemon) and ``gpufeed diagnose`` (a one-shot report)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from exporter import __version__, log
from exporter.config import GLOBAL_OPTIONS, ConfigError, Settings, collector_options, load_file, resolve
from exporter.pipeline import registry
from exporter.sampling import Option, Stage

_UNSET = object()


def _add_option(p: argparse.ArgumentParser, flag: str, opt: Option) -> None:
    if opt.kind == "bool":
        p.add_argument(f"--{flag}", dest=flag, action="store_const", const=True, default=_UNSET,
                       help=f"{opt.help} (default: {opt.default})")
        p.add_argument(f"--no-{flag}", dest=flag, action="store_const", const=False, default=_UNSET,
                       help=argparse.SUPPRESS)
    else:
        p.add_argument(f"--{flag}", dest=flag, default=_UNSET, metavar=opt.kind.upper(),
                       help=f"{opt.help} (default: {opt.default!r})")


def _serve_parser(sub: Any, collectors: Mapping[str, type[Stage]]) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve", help="run the exporter daemon", allow_abbrev=False,
        description="Run the gpufeed exporter daemon.",
    )
    p.add_argument("--config.file", dest="config.file", default=None, metavar="FILE",
                   help="YAML file with the same settings as the flags; flags override it.")
    for opt in GLOBAL_OPTIONS:
        _add_option(p, opt.name, opt)
    for name, cls in collectors.items():
        g = p.add_argument_group(f"collector {name}", cls.help)
        g.add_argument(f"--collector.{name}", dest=f"collector.{name}", action="store_const", const=True,
                       default=_UNSET, help=f"Enable the {name} collector (default: "
                       f"{'enabled' if cls.default_enabled else 'disabled'}).")
        g.add_argument(f"--no-collector.{name}", dest=f"collector.{name}", action="store_const", const=False,
                       default=_UNSET, help=f"Disable the {name} collector.")
        for opt in collector_options(cls):
            _add_option(g, f"collector.{name}.{opt.name}", opt)  # type: ignore[arg-type]
    return p


def _diagnose_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "diagnose", help="sample this host (or play a scenario) and report each GPU's verdict",
        allow_abbrev=False, description="One-shot diagnosis of every GPU: working, or waiting on what.",
    )
    p.add_argument("--scenario", metavar="FILE", help="play a scenario file in virtual time instead of the host")
    p.add_argument("--duration", default="30s", help="how long to sample the live host (default 30s)")
    p.add_argument("--json", action="store_true", help="print JSON (the schema in SPEC.md)")
    p.add_argument("--check", action="store_true", help="with --scenario: evaluate its expect list, exit 1 on failure")
    p.add_argument("--timeline", action="store_true", help="include the verdict at every evaluation")
    p.add_argument("--path.procfs", dest="path.procfs", default="/proc", help="procfs mountpoint")
    p.add_argument("--path.sysfs", dest="path.sysfs", default="/sys", help="sysfs mountpoint")
    return p


def build_parser(collectors: Mapping[str, type[Stage]]) -> argparse.ArgumentParser:
    """The full argument parser (flags are generated from the collector registry)."""
    parser = argparse.ArgumentParser(prog="gpufeed", allow_abbrev=False, description=__doc__)
    parser.add_argument("--version", action="version", version=f"gpufeed {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{serve,diagnose}")
    _serve_parser(sub, collectors)
    _diagnose_parser(sub)
    return parser


def settings_from_args(ns: argparse.Namespace, collectors: Mapping[str, type[Stage]]) -> Settings:
    """Merge the config file (if any) and the given flags; ConfigError on any bad key or value."""
    flags = {k: v for k, v in vars(ns).items() if v is not _UNSET and k not in ("command", "config.file")}
    cfg = getattr(ns, "config.file", None)
    file_values = load_file(Path(cfg)) if cfg else {}
    return resolve(collectors, file_values, flags, source=f"config file {cfg}" if cfg else "config file")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gpufeed`` console script."""
    collectors = registry()
    parser = build_parser(collectors)
    ns = parser.parse_args(argv)
    if ns.command is None:
        parser.print_help(sys.stderr)
        return 2
    if ns.command == "diagnose":
        from exporter.diagnose import run_diagnose

        return run_diagnose(ns)
    try:
        settings = settings_from_args(ns, collectors)
    except ConfigError as e:
        print(f"gpufeed: error: {e}", file=sys.stderr)
        return 2
    from exporter.daemon import run_daemon

    if not settings["simulate"]:
        return run_daemon(settings)
    # --simulate: child processes render the scenario's host; the daemon only reads it (exporter.sim.live).
    from exporter.sim.live import LiveSimulation, SimulationError

    log.configure(settings["log.level"], settings["log.format"])
    try:
        sim = LiveSimulation.start(settings, collectors)
    except SimulationError as e:
        log.get_logger(component="daemon").error("simulation_failed", error=str(e))
        return 2
    return run_daemon(sim.settings, nvml=sim.nvml, cleanup=sim.stop, clock=sim.clock)
