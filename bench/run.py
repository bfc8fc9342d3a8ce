"""Run gpufeed's benchmarks and print (and, for a full run, save) the markdown table.

    python bench/run.py                     # everything, default durations (~25 min), writes docs/benchmarks.md
    python bench/run.py --only latency,series --no-write
    python bench/run.py --smoke             # seconds per benchmark: checks the harness, not the numbers
    python bench/run.py --soak-minutes 60   # the full one-hour soak

Every process a benchmark starts listens on 127.0.0.1 only and is stopped before the benchmark returns
(also on Ctrl-C / SIGTERM); every load is bounded in time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import fidelity, latency, overhead, samework, series, soak, verdicts, workload
from bench.common import Context, Options
from bench.report import Section, machine, markdown, write_doc

BENCHMARKS: dict[str, Callable[[Context, Options], Section]] = {
    "overhead": overhead.run,
    "latency": latency.run,
    "fidelity": fidelity.run,
    "samework": samework.run,
    "series": series.run,
    "soak": soak.run,
    "workload": workload.run,
    "verdicts": verdicts.run,
}
DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
MAX_SOAK_MINUTES = 60.0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/run.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(BENCHMARKS)}")
    p.add_argument("--skip", default="", help="comma-separated benchmarks to leave out")
    p.add_argument("--smoke", action="store_true", help="a second or two per benchmark (CI): harness check only")
    p.add_argument("--soak-minutes", type=float, default=None, help="soak length (default 10, at most 60)")
    p.add_argument("--soak-speed", type=float, default=None,
                   help="scenario speed of the soak (default 1: the daemon samples at its real rates; N > 1 ages "
                        "the scenario N times faster, every sampler running N times as often)")
    p.add_argument("--overhead-seconds", type=float, default=None, help="overhead window per setting (default 60)")
    p.add_argument("--latency-seconds", type=float, default=None, help="per concurrency level (default 5)")
    p.add_argument("--fidelity-seconds", type=float, default=None, help="burn per condition (default 20)")
    p.add_argument("--samework-seconds", type=float, default=None, help="side-by-side window (default 60)")
    p.add_argument("--scenario", action="append", default=[], type=Path,
                   help="scenario file for the series count (repeatable; default: all of them)")
    p.add_argument("--json", type=Path, default=None, help="also write the raw results here")
    w = p.add_mutually_exclusive_group()
    w.add_argument("--write", action="store_true", help=f"write {DOC.name} even for a partial run")
    w.add_argument("--no-write", action="store_true", help=f"do not write {DOC.name}")
    return p.parse_args(argv)


def options(ns: argparse.Namespace) -> Options:
    opts = Options.smoke_options() if ns.smoke else Options()
    if ns.soak_minutes is not None:
        if not 0 < ns.soak_minutes <= MAX_SOAK_MINUTES:
            raise SystemExit(f"--soak-minutes must be in (0, {MAX_SOAK_MINUTES:g}]")
        opts.soak_seconds = ns.soak_minutes * 60
        opts.soak_warmup = min(opts.soak_warmup, opts.soak_seconds / 3)
    if ns.soak_speed is not None:
        if not 1 <= ns.soak_speed <= 20:
            raise SystemExit("--soak-speed must be in [1, 20]")
        opts.soak_speed = ns.soak_speed
    for name in ("overhead", "latency", "fidelity", "samework"):
        value = getattr(ns, f"{name}_seconds")
        if value is not None:
            if not 0 < value <= 600:
                raise SystemExit(f"--{name}-seconds must be in (0, 600]")
            setattr(opts, f"{name}_seconds", value)
    opts.scenarios = list(ns.scenario)
    return opts


def selected(ns: argparse.Namespace) -> list[str]:
    only = [x.strip() for x in ns.only.split(",") if x.strip()] or list(BENCHMARKS)
    skip = {x.strip() for x in ns.skip.split(",") if x.strip()}
    unknown = [x for x in [*only, *skip] if x not in BENCHMARKS]
    if unknown:
        raise SystemExit(f"unknown benchmark(s): {', '.join(unknown)} (known: {', '.join(BENCHMARKS)})")
    return [x for x in only if x not in skip]


def _terminate(signum: int, frame: FrameType | None) -> None:
    # Unwind through every ``with`` block so the processes a benchmark started are stopped.
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    ns = parse_args(sys.argv[1:] if argv is None else argv)
    opts = options(ns)
    names = selected(ns)
    signal.signal(signal.SIGTERM, _terminate)
    started = dt.datetime.now(dt.timezone.utc)
    t0 = time.monotonic()
    env = machine()
    ctx = Context()
    sections: list[Section] = []
    for name in names:
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        b0 = time.monotonic()
        try:
            sec = BENCHMARKS[name](ctx, opts)
        except Exception as e:
            sec = Section(name, name, error=f"{type(e).__name__}: {e}")
            traceback.print_exc(file=sys.stderr)
        sec.raw["elapsed_s"] = time.monotonic() - b0
        sections.append(sec)
        print(f"bench: {name} done in {time.monotonic() - b0:.0f} s", file=sys.stderr, flush=True)
    argv_shown = list(sys.argv[1:] if argv is None else argv)
    text = markdown(sections, env, started, time.monotonic() - t0, argv_shown)
    print(text)
    full = set(names) == set(BENCHMARKS) and not ns.smoke
    if not ns.no_write and (full or ns.write):
        write_doc(DOC, text)
        print(f"bench: wrote {DOC}", file=sys.stderr)
    if ns.json is not None:
        ns.json.write_text(json.dumps({"machine": env, "simulator": ctx.simulate_detail,
                                       "sections": {s.key: {"rows": [r.__dict__ for r in s.rows], "notes": s.notes,
                                                            "error": s.error, "raw": s.raw} for s in sections}},
                                      indent=1, default=str))
    return 1 if any(s.error for s in sections) else 0


if __name__ == "__main__":
    raise SystemExit(main())
