"""Settings from defaults, an optional YAML file (``--config.file``) and flags, in that order of precedence.

Every flag ``--a.b-c`` has the config key ``a: {b-c: ...}``; ``--collector.<name>`` /
``--no-collector.<name>`` is ``collector: {<name>: {enabled: true|false}}``. Unknown keys and bad values
are errors that name the key.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter import yamlsafe
from exporter.capture import options as capture_options
from exporter.durations import format_duration
from exporter.log import FORMATS, LEVELS
from exporter.names import DERIVED
from exporter.sampling import BUFFER_MAX_SAMPLES, HISTORY_DEFAULT, Option, Stage


class ConfigError(Exception):
    """A bad setting; the message names the key (and file) and says what is wrong."""


# RFC 1123 host name: dot-separated labels of letters, digits and inner hyphens.
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*\.?$")
MAX_SIMULATE_SPEED = 100.0


def parse_listen_address(addr: str) -> tuple[str, int]:
    """``host:port``, ``:port`` or ``[v6]:port`` -> (host, port), the host an IP address, a host name or empty
    (every interface); ValueError with a reason otherwise. Checked when the settings are read, so a bad
    address is exit 2 before anything starts, not a failed bind."""
    from exporter.web import parse_address

    host, port = parse_address(addr)
    if host:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            if not _HOSTNAME.match(host) or host.replace(".", "").isdigit():
                raise ValueError(f"bad listen address {addr!r}: {host!r} is neither an IP address nor a host name") \
                    from None
    return host, port


class ListenAddressOption(Option):
    """One or more listen addresses: the flag repeated (as node_exporter's), or a string or list in the file."""

    def parse(self, value: object) -> tuple[str, ...]:
        items = list(value) if isinstance(value, list | tuple) else [value]
        if not items:
            raise ValueError("at least one address is required (e.g. :9842)")
        out: list[str] = []
        for item in items:
            if not isinstance(item, str):
                raise ValueError(f"bad listen address {item!r}: expected host:port or :port (e.g. :9842)")
            _, port = parse_listen_address(item.strip())
            if item.strip() in out and port != 0:  # port 0: each listener gets its own free port
                raise ValueError(f"listen address {item.strip()!r} given twice")
            out.append(item.strip())
        return tuple(out)


GLOBAL_OPTIONS: tuple[Option, ...] = (
    ListenAddressOption("web.listen-address", "list", (":9842",),
                        "Address to listen on for the web interface and telemetry; repeat to listen on several."),
    Option("web.telemetry-path", "str", "/metrics", "Path under which to expose metrics."),
    Option("web.max-requests", "int", 40, "Maximum number of requests served at once (excess gets 503)."),
    Option("web.max-connections", "int", 512, "Maximum number of open client connections."),
    Option("web.read-timeout", "duration", 10.0, "Time allowed to receive a request head."),
    Option("web.idle-timeout", "duration", 60.0, "Time a keep-alive connection may sit idle."),
    Option("web.config.file", "str", "", "Web configuration file (TLS, basic auth), exporter-toolkit format."),
    Option("web.render-interval", "duration", 1.0,
           "Least time between two renders of the metrics payload; it is rendered shortly before each "
           "scraper's next scrape, and a scrape that finds it older than twice this renders it first."),
    Option("path.procfs", "str", "/proc", "procfs mountpoint."),
    Option("path.sysfs", "str", "/sys", "sysfs mountpoint."),
    Option("log.level", "str", "info", "Only log messages with the given severity or above: " + "|".join(LEVELS)),
    Option("log.format", "str", "logfmt", "Output format of log messages: " + "|".join(FORMATS)),
    Option("engine.history", "duration", HISTORY_DEFAULT, "How many seconds of samples each sampler keeps in "
           f"memory (at most {BUFFER_MAX_SAMPLES} samples: as many as its fastest rate fills them with); at least "
           "--collector.derived.window, which reads them (raise both together)."),
    Option("simulate", "str", "", "Serve a scenario's simulated host instead of the real one: a file, or the name "
           "of a shipped scenario (gpufeed examples)."),
    Option("simulate-gpu", "str", "", "Serve this real host with a simulated GPU: utilisation phases and NVML's "
           "process list (pids of real processes) from this file, through the strict fake NVML "
           "(docs/simulator.md, \"A simulated GPU on a real host\")."),
    Option("simulate-speed", "float", 1.0, "Play the simulated scenario this many times faster than real time "
           f"(at most {MAX_SIMULATE_SPEED:g}); intervals, rates and windows stay in scenario time."),
    *capture_options.CAPTURE_OPTIONS,
)

_CHOICES = {"log.level": LEVELS, "log.format": FORMATS}


def collector_options(cls: type[Stage]) -> tuple[Option, ...]:
    """The settings every collector has (interval) plus its own."""
    base = Option("interval", "duration", cls.default_interval, f"Sampling interval of the {cls.name} collector.")
    own = tuple(o for o in cls.options if o.name != "interval")
    return (base, *own)


@dataclass
class Settings:
    """Resolved settings."""

    values: dict[str, Any]
    enabled: dict[str, bool]
    collector: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    @property
    def procfs(self) -> Path:
        return Path(self.values["path.procfs"])

    @property
    def sysfs(self) -> Path:
        return Path(self.values["path.sysfs"])


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{a: {b: 1}}`` -> ``{"a.b": 1}``; lists and scalars are leaves."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        if not isinstance(k, str):
            raise ConfigError(f"key {prefix}{k!r}: keys must be strings")
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def load_file(path: Path) -> dict[str, Any]:
    """Read and flatten a YAML config file; ConfigError naming the file (and the key) on any problem.

    Read through :mod:`exporter.yamlsafe`: size, nesting and numbers bounded, duplicate keys refused.
    """
    try:
        data = yamlsafe.load(path)
    except yamlsafe.YamlError as e:
        raise ConfigError(f"config file {path}: {e}") from e
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"config file {path}: top level must be a mapping")
    try:
        return flatten(data)
    except ConfigError as e:
        raise ConfigError(f"config file {path}: {e}") from e


def resolve(
    collectors: Mapping[str, type[Stage]],
    file_values: Mapping[str, Any],
    flag_values: Mapping[str, Any],
    source: str = "config file",
) -> Settings:
    """Merge defaults < file < flags and validate every key and value."""
    known = {o.name: o for o in GLOBAL_OPTIONS}
    per: dict[str, dict[str, Option]] = {n: {o.name: o for o in collector_options(c)} for n, c in collectors.items()}

    def option_for(key: str) -> tuple[Option, str | None]:
        if key in known:
            return known[key], None
        if key.startswith("collector."):
            rest = key[len("collector."):]
            name, _, opt = rest.partition(".")
            if name not in collectors:
                raise KeyError(f"unknown collector {name!r} (known: {', '.join(sorted(collectors))})")
            if opt in ("", "enabled"):
                return Option(key, "bool", collectors[name].default_enabled, ""), name
            if opt in per[name]:
                return per[name][opt], name
            raise KeyError(f"unknown option {opt!r} of collector {name!r} (known: {', '.join(sorted(per[name]))})")
        raise KeyError("unknown setting")

    values: dict[str, Any] = {o.name: o.default for o in GLOBAL_OPTIONS}
    enabled = {n: c.default_enabled for n, c in collectors.items()}
    copts: dict[str, dict[str, Any]] = {n: {o.name: o.default for o in per[n].values()} for n in collectors}
    for where, layer in ((source, file_values), ("flag", flag_values)):
        for key, raw in layer.items():
            try:
                opt, cname = option_for(key)
                value = opt.parse(raw)
            except (KeyError, ValueError) as e:
                msg = e.args[0] if e.args else str(e)
                shown = f"--{key}" if where == "flag" else f"key {key!r}"
                raise ConfigError(f"{where}: {shown}: {msg}") from e
            if any("\x00" in v for v in (value if isinstance(value, tuple) else (value,)) if isinstance(v, str)):
                # No path, address or pattern has one, and the OS refuses it in a file name.
                shown = f"--{key}" if where == "flag" else f"key {key!r}"
                raise ConfigError(f"{where}: {shown}: contains a NUL character")
            choices = _CHOICES.get(key)
            if choices is not None and value not in choices:
                shown = f"--{key}" if where == "flag" else f"key {key!r}"
                raise ConfigError(f"{where}: {shown}: must be one of {', '.join(choices)}, not {value!r}")
            if cname is None:
                values[key] = value
            elif key.count(".") == 1 or key.endswith(".enabled"):
                enabled[cname] = bool(value)
            else:
                copts[cname][key.split(".", 2)[2]] = value
    if values["web.max-requests"] < 1:
        raise ConfigError("--web.max-requests must be at least 1")
    if values["web.max-connections"] < 1:
        raise ConfigError("--web.max-connections must be at least 1")
    if not str(values["web.telemetry-path"]).startswith("/"):
        raise ConfigError("--web.telemetry-path must start with '/'")
    window = copts.get(DERIVED, {}).get("window")
    if window is not None and values["engine.history"] < window:
        # The verdicts, burstiness and findings read the classifier window from the buffers: a shorter history
        # would judge on less than the window their help texts and the dashboards say.
        raise ConfigError(f"--engine.history ({format_duration(values['engine.history'])}) must be at least "
                          f"--collector.derived.window ({format_duration(window)})")
    try:
        capture_options.check(values)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    speed = values["simulate-speed"]
    if not 0 < speed <= MAX_SIMULATE_SPEED:  # NaN fails this too
        # Above this the daemon would sample a 100 ms source every millisecond of wall time: its sampling, not
        # the scenario, would decide what it sees.
        raise ConfigError(f"--simulate-speed must be above 0 and at most {MAX_SIMULATE_SPEED:g}, not {speed!r}")
    if speed != 1.0 and not values["simulate"]:
        # Ignored, it served the real host at its own pace while the operator believed in a 10x replay.
        raise ConfigError("--simulate-speed: needs --simulate (the speed of a simulated scenario; the real host "
                          "runs in real time)")
    if values["simulate"] and values["simulate-gpu"]:
        raise ConfigError("--simulate and --simulate-gpu exclude each other (the first simulates the whole host, "
                          "the second only its GPU)")
    if values["simulate"]:
        from exporter.examples import ExampleError, scenario

        try:
            values["simulate"] = str(scenario(str(values["simulate"])))
        except ExampleError as e:
            raise ConfigError(f"--simulate: {e}") from e
    if values["web.config.file"]:
        # Validate (and load the certificates of) the web config now, so a bad file fails `gpufeed serve` with
        # exit 2 and a message naming the key, instead of serving without the TLS or auth the operator asked for.
        from exporter.webconfig import WebConfigError, load

        try:
            load(Path(values["web.config.file"]))
        except WebConfigError as e:
            raise ConfigError(f"--web.config.file: {e}") from e
    return Settings(values=values, enabled=enabled, collector=copts)
