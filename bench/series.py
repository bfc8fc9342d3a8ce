"""Series budget: how many series gpufeed exports per GPU and per host, scenario by scenario.

Each scenario runs under ``gpufeed serve --simulate`` at default settings until its GPUs are all
described and the series count has settled; then the text payload is counted. A series belongs to a
GPU when it carries that GPU's ``gpu`` label (non-empty), its PCI address as ``gpu_bdf`` (the PCIe
chain above it) or the address of one of that chain's hops as ``bdf``; everything else is host-level.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path

import yaml

from bench import procs, scrape
from bench.common import SCENARIOS, Context, Options, gpu_count, series_count
from bench.report import Section

BUDGET_PER_GPU = 60
BUDGET_PER_HOST = 200
REPO_SCENARIOS = Path(__file__).resolve().parent.parent / "tests" / "scenarios"
SHARED_SCENARIOS = Path(__file__).resolve().parent.parent.parent / "shared" / "scenarios"

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? \S+", re.M)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def default_scenarios() -> list[Path]:
    """The project's scenarios (tests/scenarios, else ../shared/scenarios) and the benchmark's own."""
    base = REPO_SCENARIOS if any(REPO_SCENARIOS.glob("*.yaml")) else SHARED_SCENARIOS
    return sorted(base.glob("*.yaml")) + sorted(SCENARIOS.glob("*.yaml"))


def _bdf(addr: str) -> str:
    # NVML writes an 8-digit PCI domain ("00000000:18:00.0"), sysfs a 4-digit one: compare the tail.
    return addr.lower()[-12:]


def attribute(body: str) -> tuple[Counter[str], int, int]:
    """(series per GPU index, host-level series, total) of a text exposition."""
    per, host, total, _ = attribute_families(body)
    return per, host, total


def attribute_families(body: str) -> tuple[Counter[str], int, int, dict[str, Counter[str]]]:
    """As :func:`attribute`, plus the series count per metric family for each GPU index ("" = host)."""
    lines = [(m.group(1), dict(_LABEL.findall(m.group(2) or ""))) for m in _LINE.finditer(body)]
    bdf_to_gpu = {_bdf(lb["pci_bus_id"]): lb["gpu"] for name, lb in lines
                  if name == "gpufeed_gpu_info" and "pci_bus_id" in lb and "gpu" in lb}
    # A hop of a GPU's PCIe chain (a series naming bdf and gpu_bdf) belongs to that GPU, and so do the
    # series that name only the hop's bdf (AER counters).
    hop_to_gpu = {_bdf(lb["bdf"]): bdf_to_gpu[_bdf(lb["gpu_bdf"])] for _, lb in lines
                  if "bdf" in lb and _bdf(lb.get("gpu_bdf", "")) in bdf_to_gpu}
    per: Counter[str] = Counter()
    fams: dict[str, Counter[str]] = {}
    host = 0
    for name, lb in lines:
        gpu = (lb.get("gpu") or bdf_to_gpu.get(_bdf(lb.get("gpu_bdf", "")))
               or hop_to_gpu.get(_bdf(lb.get("bdf", ""))) or "")
        fams.setdefault(gpu, Counter())[_family(name)] += 1
        if gpu:
            per[gpu] += 1
        else:
            host += 1
    return per, host, len(lines), fams


def _family(sample: str) -> str:
    for suffix in ("_bucket", "_count", "_sum"):
        if sample.endswith(suffix) and sample.startswith("gpufeed_gpu_idle_gap"):
            return sample[: -len(suffix)]
    return sample


def measure(path: Path, opts: Options) -> tuple[Counter[str], int, int, int, dict[str, Counter[str]]]:
    """Run one scenario; (per GPU, host, total, GPUs expected, families per GPU)."""
    expected = len(yaml.safe_load(path.read_text()).get("gpus") or [])
    port = procs.free_port()
    proc = procs.gpufeed(port, ["--simulate", str(path)], name="gpufeed-series")
    with proc:
        body = procs.wait_ready(proc, port, timeout=opts.series_timeout)
        deadline = time.monotonic() + opts.series_timeout
        last, stable_since = -1, time.monotonic()
        while time.monotonic() < deadline:
            proc.check_alive()
            _, body = procs.get(port, headers=scrape.TEXT_HEADERS)
            n = series_count(body)
            if n != last:
                last, stable_since = n, time.monotonic()
            elif gpu_count(body) >= expected and time.monotonic() - stable_since >= opts.series_settle:
                break
            time.sleep(0.5)
    per, host, total, fams = attribute_families(body.decode())
    return per, host, total, expected, fams


def run(ctx: Context, opts: Options) -> Section:
    sec = Section("series", "Series budget (default settings)")
    if not ctx.simulator_active(opts):
        port = procs.free_port()
        with procs.gpufeed(port, [], name="gpufeed-series") as proc:
            procs.wait_ready(proc, port)
            time.sleep(opts.series_settle)
            _, body = procs.get(port, headers=scrape.TEXT_HEADERS)
        per, host, total = attribute(body.decode())
        sec.add("this host (no simulator, no GPU)", f"{host} host series, {total} in all",
                f"<= {BUDGET_PER_HOST} per host", host <= BUDGET_PER_HOST)
        sec.note(ctx.simulate_detail)
        return sec
    worst_gpu = 0
    worst_host = 0
    worst_fams: tuple[str, Counter[str], Counter[str]] | None = None
    paths = opts.scenarios or default_scenarios()
    if opts.smoke and not opts.scenarios:
        paths = paths[:1]
    for path in paths:
        try:
            per, host, total, expected, fams = measure(path, opts)
        except (procs.BenchError, OSError, yaml.YAMLError) as e:
            sec.add(path.name, f"failed: {str(e)[:300]}", "", False)
            continue
        top = max(per.values(), default=0)
        if top > worst_gpu or worst_fams is None:
            gpu = max(per, key=lambda g: per[g]) if per else ""
            worst_fams = (path.name, fams.get(gpu, Counter()), fams.get("", Counter()))
        worst_gpu, worst_host = max(worst_gpu, top), max(worst_host, host)
        sec.raw[path.name] = {"per_gpu": dict(per), "host": host, "total": total, "gpus": expected}
        sec.add(path.name, f"{len(per)}/{expected} GPUs, max {top} per GPU, {host} host, {total} total")
        if len(per) < expected:
            sec.note(f"{path.name}: only {len(per)} of {expected} GPUs exported series.")
    sec.add("worst case per GPU (all scenarios)", str(worst_gpu), f"<= {BUDGET_PER_GPU}", worst_gpu <= BUDGET_PER_GPU)
    sec.add("worst case per host, host-level series (all scenarios)", str(worst_host), f"<= {BUDGET_PER_HOST}",
            worst_host <= BUDGET_PER_HOST)
    if worst_fams is not None:
        name, gpu_fams, host_fams = worst_fams
        sec.note(f"Where one GPU's series go ({name}): "
                 + ", ".join(f"{f} {n}" for f, n in gpu_fams.most_common()) + ".")
        top_host = ", ".join(f"{f} {n}" for f, n in host_fams.most_common(12))
        sec.note(f"Host-level series ({name}): {top_host}, ...")
    sec.note("A series counts for a GPU when it has a non-empty gpu label, that GPU's address as gpu_bdf, or the "
             "address of a hop of that GPU's PCIe chain as bdf (AER counters); histogram buckets count one series "
             "each.")
    return sec
