"""Command line: ``gpufeed serve`` (the daemon), ``gpufeed diagnose`` (a one-shot report), ``gpufeed check-config``
(validate settings without starting anything), ``gpufeed examples`` (what the installation ships) and
``gpufeed report`` (the fleet capacity review from Prometheus).

The contract for every command: bad input is one line on stderr naming the flag, key or file, exit status 2,
and nothing started; a file operation the system refuses (a read-only filesystem) is one line naming the path,
exit status 74; no input produces a Python traceback.
"""

from __future__ import annotations

import argparse
import itertools
import re
import sys
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from exporter import buildinfo, examples, log
from exporter.capture.options import DIAGNOSE_DIR
from exporter.config import GLOBAL_OPTIONS, ConfigError, Settings, collector_options, load_file, resolve
from exporter.durations import format_duration
from exporter.pipeline import registry
from exporter.sampling import Option, Stage
from exporter.sources import blind_reason

_UNSET = object()
EXIT_USAGE = 2
EXIT_BLIND = 3  # the host cannot be seen through --path.procfs / --path.sysfs (diagnose's exit 3 too)
EXIT_INTERNAL = 70  # EX_SOFTWARE (sysexits.h): a bug, not the input
EXIT_IOERR = 74  # EX_IOERR: the system refused a file operation (a read-only filesystem); the message names the path
# No gpufeed flag starts with a digit, so "-5s" or "-1" after a flag is its (bad) value, not another flag;
# argparse would otherwise answer "expected one argument" and never say what is wrong with the value.
_DASH_VALUE = re.compile(r"^-\.?\d")

DIAGNOSE_EPILOG = """\
exit status:
  0  every GPU is healthy or idle and no finding was raised (in every phase of a scenario)
  1  a GPU waits, is throttled or inefficient, has no verdict, or a finding was raised;
     with --check: an expectation of the scenario failed
  2  usage: a bad flag, value or scenario file
  3  the host could not be seen: no procfs at --path.procfs, or no source could be read

The JSON (--json) is described by the JSON Schema exporter/diagnose/report.schema.json (docs/derived.md).
Shipped scenarios (--scenario NAME): {shipped}."""


class _Parser(argparse.ArgumentParser):
    """argparse with node_exporter's habit: a usage error is one line that says what is wrong, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _OnOff(argparse.Action):
    """``--x`` and ``--no-x`` as one option, both listed in --help (argparse's BooleanOptionalAction would print
    the internal "unset" default)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kw: Any) -> None:
        super().__init__([*option_strings, *(f"--no-{o[2:]}" for o in option_strings)], dest, nargs=0, **kw)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, not (option_string or "").startswith("--no-"))


def _with_default(help_text: str, default: str) -> str:
    """The help text and its default, once: a help that states its own default keeps it."""
    return help_text if "(default:" in help_text else f"{help_text} (default: {default})"


def _add_option(p: Any, flag: str, opt: Option) -> None:
    if opt.kind == "bool":
        p.add_argument(f"--{flag}", dest=flag, action=_OnOff, default=_UNSET,
                       help=_with_default(opt.help, "on" if opt.default else "off"))
    elif flag == "web.listen-address":
        p.add_argument(f"--{flag}", dest=flag, action="append", default=None, metavar="ADDRESS",
                       help=_with_default(opt.help, ", ".join(opt.default)))
    else:
        default = format_duration(opt.default) if opt.kind == "duration" else opt.default
        p.add_argument(f"--{flag}", dest=flag, default=_UNSET, metavar=opt.kind.upper(),
                       help=_with_default(opt.help, repr(default)))


def _settings_parser(sub: Any, name: str, collectors: Mapping[str, type[Stage]], **kw: Any) -> argparse.ArgumentParser:
    """``serve`` and ``check-config`` take the same settings."""
    p: argparse.ArgumentParser = sub.add_parser(name, allow_abbrev=False, **kw)
    p.add_argument("--config.file", dest="config.file", default=None, metavar="FILE",
                   help="YAML file with the same settings as the flags; flags override it.")
    for opt in GLOBAL_OPTIONS:
        _add_option(p, opt.name, opt)
    for cname, cls in collectors.items():
        g = p.add_argument_group(f"collector {cname}", cls.help)
        g.add_argument(f"--collector.{cname}", dest=f"collector.{cname}", action="store_const", const=True,
                       default=_UNSET, help=f"Enable the {cname} collector (default: "
                       f"{'enabled' if cls.default_enabled else 'disabled'}).")
        g.add_argument(f"--no-collector.{cname}", dest=f"collector.{cname}", action="store_const", const=False,
                       default=_UNSET, help=f"Disable the {cname} collector.")
        for opt in collector_options(cls):
            _add_option(g, f"collector.{cname}.{opt.name}", opt)
    return p


def _diagnose_parser(sub: Any) -> argparse.ArgumentParser:
    shipped = ", ".join(p.stem for p in examples.files("scenarios")) or "none in this installation"
    p: argparse.ArgumentParser = sub.add_parser(
        "diagnose", help="sample this host (or play a scenario) and report each GPU's verdict",
        allow_abbrev=False, description="One-shot diagnosis of every GPU: working, or waiting on what; and the "
        "next command to run for each.", epilog=DIAGNOSE_EPILOG.format(shipped=shipped),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--scenario", metavar="FILE|NAME",
                   help="play a scenario (a file, or the name of a shipped one) in virtual time instead of the host")
    p.add_argument("--duration", default=None, metavar="DURATION",
                   help="how long to sample the live host, e.g. 30s, 1m30s (default 30s)")
    p.add_argument("--json", action="store_true",
                   help="print the report as JSON (schema: exporter/diagnose/report.schema.json)")
    p.add_argument("--check", action="store_true",
                   help="with --scenario: exit 1 when one of its expect entries fails, 0 when all hold")
    p.add_argument("--timeline", action="store_true", help="with --scenario: also list each change of a verdict")
    p.add_argument("--stacks", action="store_true",
                   help="after sampling, capture the stacks of every waiting GPU's processes with py-spy (needs "
                   "ptrace on them) and write a bundle per GPU; the report names what each capture shows")
    p.add_argument("--stacks.dir", dest="stacks.dir", default=DIAGNOSE_DIR, metavar="DIR",
                   help=f"with --stacks: the folder the bundles are written to (default {DIAGNOSE_DIR})")
    p.add_argument("--path.procfs", dest="path.procfs", default="/proc", metavar="PATH", help="procfs mountpoint")
    p.add_argument("--path.sysfs", dest="path.sysfs", default="/sys", metavar="PATH", help="sysfs mountpoint")
    p.add_argument("--log.level", dest="log.level", default=None, choices=log.LEVELS,
                   help="also log to stderr at this level (default: no log; failures are in the report)")
    return p


def build_parser(collectors: Mapping[str, type[Stage]]) -> argparse.ArgumentParser:
    """The full argument parser (the settings flags are generated from the collector registry)."""
    parser = _Parser(prog="gpufeed", allow_abbrev=False, description=__doc__.split("\n\n")[0].replace("``", ""),
                     formatter_class=argparse.RawDescriptionHelpFormatter,
                     epilog="gpufeed COMMAND --help describes each command.")
    parser.add_argument("--version", action="version", version=buildinfo.version_text())
    sub = parser.add_subparsers(dest="command", metavar="{serve,diagnose,check-config,examples,report}",
                                parser_class=_Parser)
    _settings_parser(sub, "serve", collectors, help="run the exporter daemon",
                     description="Run the gpufeed exporter daemon.")
    _diagnose_parser(sub)
    _settings_parser(sub, "check-config", collectors, help="check settings (config file, flags, web config, "
                     "scenario) without starting anything",
                     description="Check a config file and flags as `gpufeed serve` would read them, and the "
                     "web config and scenario they name, without starting anything (like promtool check "
                     "config). Exit 0 when valid, 2 with the first problem named otherwise.")
    ex = sub.add_parser("examples", help="list the scenarios, rules, dashboards and runbooks this installation ships",
                        description="List the shipped examples with their paths (copy the rules and dashboards "
                        "from there; pass a scenario's name to diagnose --scenario or serve --simulate).")
    ex.add_argument("kind", nargs="?", choices=sorted(examples.SOURCES), help="only this kind")
    from exporter.fleet.command import add_parser as report_parser

    report_parser(sub)
    return parser


def join_dash_values(argv: Sequence[str]) -> list[str]:
    """``--flag -5s`` -> ``--flag=-5s``, so that a negative value reaches the option's own check."""
    out: list[str] = []
    for arg in argv:
        if out and _DASH_VALUE.match(arg) and out[-1].startswith("--") and "=" not in out[-1]:
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def settings_from_args(ns: argparse.Namespace, collectors: Mapping[str, type[Stage]]) -> Settings:
    """Merge the config file (if any) and the given flags; ConfigError on any bad key or value."""
    flags = {k: v for k, v in vars(ns).items()
             if v is not _UNSET and v is not None and k not in ("command", "config.file")}
    cfg = getattr(ns, "config.file", None)
    if cfg and "\x00" in cfg:
        raise ConfigError("--config.file: a file name cannot contain a NUL character")
    file_values = load_file(Path(cfg)) if cfg else {}
    return resolve(collectors, file_values, flags, source=f"config file {cfg}" if cfg else "config file")


def check_simulation(settings: Settings) -> None:
    """The scenario ``--simulate`` names must load; ConfigError with the loader's message otherwise."""
    if not settings["simulate"]:
        return
    from exporter.sim.scenario import ScenarioError, load

    try:
        load(settings["simulate"])
    except ScenarioError as e:
        raise ConfigError(f"--simulate: {e}") from e


def check_simulated_gpu(settings: Settings) -> None:
    """The GPU file ``--simulate-gpu`` names must load; ConfigError with the loader's message otherwise."""
    if not settings["simulate-gpu"]:
        return
    from exporter.sim import realgpu
    from exporter.sim.scenario import ScenarioError

    try:
        realgpu.load(settings["simulate-gpu"])
    except ScenarioError as e:
        raise ConfigError(f"--simulate-gpu: {e}") from e


def _examples(kind: str | None) -> int:
    for k in sorted(examples.SOURCES) if kind is None else [kind]:
        for f in examples.files(k):
            print(f"{k:<11} {f.stem if k == 'scenarios' else f.name:<28} {f}")
    return 0


def _run(argv: Sequence[str] | None) -> int:
    collectors = registry()
    parser = build_parser(collectors)
    ns = parser.parse_args(join_dash_values(sys.argv[1:] if argv is None else argv))
    if ns.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if ns.command == "diagnose":
        from exporter.diagnose.command import run_diagnose

        return run_diagnose(ns)
    if ns.command == "examples":
        return _examples(ns.kind)
    if ns.command == "report":
        from exporter.fleet.command import run_report

        return run_report(ns)
    try:
        settings = settings_from_args(ns, collectors)
        check_simulation(settings)
        check_simulated_gpu(settings)
    except ConfigError as e:
        print(f"gpufeed {ns.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    blind = None if settings["simulate"] else blind_reason(Path(settings["path.procfs"]), Path(settings["path.sysfs"]))
    if blind is not None:  # a container without the host's /proc mounted: fail fast, not a 200 /healthz
        print(f"gpufeed {ns.command}: error: cannot see the host: {blind}", file=sys.stderr)
        return EXIT_BLIND
    if ns.command == "check-config":
        cfg = getattr(ns, "config.file", None)
        print(f"SUCCESS: {cfg if cfg else 'the flags'} {'is a' if cfg else 'are a'} valid gpufeed configuration "
              f"(listening on {', '.join(settings['web.listen-address'])})")
        return 0
    from exporter.daemon import run_daemon

    if settings["simulate-gpu"]:
        # A real host, a simulated GPU: the fake NVML, its state driven from the file (exporter.sim.realgpu).
        from exporter.sim import realgpu

        fake, driver = realgpu.start(settings["simulate-gpu"])
        return run_daemon(settings, nvml=fake, cleanup=driver.stop)
    if not settings["simulate"]:
        return run_daemon(settings)
    # --simulate: child processes render the scenario's host; the daemon only reads it (exporter.sim.live).
    from exporter.sim.live import LiveSimulation, SimulationError

    log.configure(settings["log.level"], settings["log.format"])
    try:
        sim = LiveSimulation.start(settings, collectors)
    except SimulationError as e:
        print(f"gpufeed serve: error: --simulate: {e}", file=sys.stderr)
        return EXIT_USAGE
    return run_daemon(sim.settings, nvml=sim.nvml, cleanup=sim.stop, clock=sim.clock)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gpufeed`` console script."""
    try:
        return _run(argv)
    except KeyboardInterrupt:
        return 130
    except OSError as e:  # the environment, not a bug: strerror and the path say what to fix
        print(f"gpufeed: error: {e}", file=sys.stderr)
        return EXIT_IOERR
    except Exception as e:  # a bug: one line that can be reported, never a traceback for an operator to parse
        args = sys.argv[1:] if argv is None else list(argv)
        if "--log.level=debug" in args or any(pair == ("--log.level", "debug") for pair in itertools.pairwise(args)):
            traceback.print_exc()
        print(f"gpufeed: internal error: {type(e).__name__}: {e} (please report this; --log.level=debug shows "
              "where)", file=sys.stderr)
        return EXIT_INTERNAL
