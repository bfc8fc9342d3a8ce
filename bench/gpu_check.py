"""Real-hardware check of the GPU collector: run on a host with an NVIDIA GPU, driver and PyTorch.

    python -m bench.gpu_check [--seconds 15] [--budget 300] [--out tests/fixtures/real]

It starts ``gpufeed serve`` (real NVML) on a free localhost port, then runs three PyTorch workloads one
after the other, each in its own process and bounded in time:

(a) ``matmul``  -- a large bf16 matmul loop (GPU busy, SMs and tensor pipes active),
(b) ``tiny``    -- a loop of tiny kernels launched from one Python thread (launch-bound: GPU mostly idle),
(c) ``h2d``     -- pageable host-to-device copies (PCIe RX traffic, GPU compute idle),

plus an ``idle`` baseline. For each it scrapes ``/metrics`` twice (after a warm-up and at the end) and
writes the second scrape to ``<out>/<workload>.prom``; ``<out>/summary.json`` holds the rates derived from
the two scrapes (busy, SM active, PCIe RX/TX bytes/s, throttle), the daemon's CPU use, and
``<out>/nvml_calls.json`` what every NVML call the backend makes returned and cost (µs, mean and max),
measured in this process with the real backend at its default rates, plus the value type and raw
readings of the PCIe byte counters (fields 197/198) next to GPM's PCIe rates -- whether those counters
are 32- or 64-bit decides how often they can wrap.

Everything is bounded: each workload has a deadline and is killed if it overruns, the daemon is stopped
with SIGTERM (then SIGKILL), and the whole run stops at ``--budget`` seconds. Without PyTorch or CUDA the
workloads are skipped (recorded in the summary) and the idle scrape and NVML costs are still captured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from exporter.gpu.backend import NvmlBackend
from exporter.gpu.binding import CallStats, describe

WORKLOADS: dict[str, str] = {
    "matmul": """
import sys, time, torch
deadline = time.monotonic() + float(sys.argv[1])
a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
n = 0
while time.monotonic() < deadline:
    for _ in range(10):
        c = a @ b
    torch.cuda.synchronize()
    n += 10
print(f"matmuls={n}")
""",
    "tiny": """
import sys, time, torch
deadline = time.monotonic() + float(sys.argv[1])
x = torch.zeros(1, device="cuda")
n = 0
while time.monotonic() < deadline:
    for _ in range(1000):
        x.add_(1.0)
    torch.cuda.synchronize()
    n += 1000
print(f"kernels={n}")
""",
    "h2d": """
import sys, time, torch
deadline = time.monotonic() + float(sys.argv[1])
host = torch.empty(256 << 20, dtype=torch.uint8)  # pageable (not pinned) on purpose
host.fill_(1)
dev = torch.empty_like(host, device="cuda")
n = 0
while time.monotonic() < deadline:
    dev.copy_(host)
    torch.cuda.synchronize()
    n += 1
print(f"copied_bytes={n * host.numel()}")
""",
}

RATE_SERIES = (
    "gpufeed_gpu_busy_seconds_total",
    "gpufeed_gpu_sm_active_seconds_total",
    "gpufeed_gpu_pcie_rx_bytes_total",
    "gpufeed_gpu_pcie_tx_bytes_total",
    "gpufeed_gpu_pcie_replays_total",
    "gpufeed_gpu_throttle_seconds_total",
)
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(url: str, timeout: float = 5.0) -> str:
    """The /metrics text."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return str(resp.read().decode("utf-8"))


def parse(text: str) -> dict[str, float]:
    """``name{labels}`` -> value for every sample line."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and not line.startswith("#"):
            try:
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
            except ValueError:
                continue
    return out


def rates(a: dict[str, float], b: dict[str, float], dt: float) -> dict[str, float]:
    """Per-second increase of the counters of interest between two scrapes."""
    return {k: round((b[k] - a[k]) / dt, 6) for k in sorted(b)
            if k in a and k.split("{")[0] in RATE_SERIES and dt > 0}


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process from /proc/<pid>/stat (clock ticks per sysconf)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_ready(url: str, deadline: float) -> bool:
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if "gpufeed_build_info" in scrape(url, timeout=1.0):
                return True
        time.sleep(0.2)
    return False


@contextlib.contextmanager
def daemon(port: int, log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``gpufeed serve`` on 127.0.0.1:<port>, stopped with SIGTERM (then SIGKILL) on exit."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "exporter", "serve", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            yield proc
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def torch_ok() -> str | None:
    """None when PyTorch with CUDA is usable, else why not."""
    try:
        out = subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available(); print('ok')"],
                             capture_output=True, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        return "importing torch timed out"
    if out.returncode != 0:
        return (out.stderr.decode(errors="replace").strip().splitlines() or ["torch unavailable"])[-1]
    return None


class BackendProbe:
    """The real NVML backend in this process, at the collector's default rates, with per-call timing."""

    def __init__(self) -> None:
        import pynvml

        self.backend = NvmlBackend(lambda: pynvml, profile=True)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpu-probe", daemon=True)
        self.errors: list[str] = []

    def _loop(self) -> None:
        nxt = {"fast": 0.0, "buffered": 0.0, "slow": 0.0}
        period = {"fast": 0.1, "buffered": 1.0, "slow": 5.0}
        while not self._stop.is_set():
            now = time.monotonic()
            for path, due in nxt.items():
                if now >= due:
                    try:
                        getattr(self.backend, path)()
                    except Exception as e:
                        self.errors.append(f"{path}: {e!r}")
                    nxt[path] = max(due + period[path], now)
            self._stop.wait(max(0.0, min(nxt.values()) - time.monotonic()))

    def __enter__(self) -> BackendProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.backend.close()

    def report(self) -> dict[str, Any]:
        def row(st: CallStats) -> dict[str, Any]:
            return {"calls": st.calls, "mean_us": round(st.total_us / st.calls, 1) if st.calls else None,
                    "max_us": round(st.max_us, 1), "errors": st.errors, "last_returned": st.last}

        return {"driver": self.backend.driver_version,
                "identities": {i: describe(v) for i, v in self.backend.identities.items()},
                "calls": {name: row(st) for name, st in sorted(self.backend.stats.items())},
                "errors": self.errors[:20]}


def pcie_counter_probe(seconds: float = 2.0) -> dict[str, Any]:
    """Value type and two raw readings of fields 197/198, with GPM's PCIe rates over the same span."""
    import pynvml

    out: dict[str, Any] = {}
    pynvml.nvmlInit()
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            fields = [pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES]

            def read(h: Any = h, fields: list[int] = fields) -> list[dict[str, Any]]:
                vals = pynvml.nvmlDeviceGetFieldValues(h, fields)
                return [{"field": int(v.fieldId), "ret": int(v.nvmlReturn), "type": int(v.valueType),
                         "ui": int(v.value.uiVal), "ull": int(v.value.ullVal), "ts_us": int(v.timestamp)}
                        for v in vals]

            t0, r0 = time.monotonic(), read()
            time.sleep(seconds)
            t1, r1 = time.monotonic(), read()
            out[str(i)] = {"dt": round(t1 - t0, 4), "first": r0, "second": r1}
    finally:
        pynvml.nvmlShutdown()
    return out


def run(seconds: float, budget: float, out: Path) -> dict[str, Any]:
    t_end = time.monotonic() + budget
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"seconds": seconds, "workloads": {}}
    why_not = torch_ok()
    summary["torch"] = why_not or "ok"
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    with daemon(port, out / "daemon.log") as proc, BackendProbe() as probe:
        if not wait_ready(url, time.monotonic() + 30):
            summary["error"] = "daemon did not serve /metrics within 30 s (see daemon.log)"
            return summary
        cpu0, w0 = cpu_seconds(proc.pid), time.monotonic()
        for name in ("idle", *WORKLOADS):
            if time.monotonic() + seconds + 10 > t_end:
                summary["workloads"][name] = {"skipped": "budget exhausted"}
                continue
            if name != "idle" and why_not is not None:
                summary["workloads"][name] = {"skipped": why_not}
                continue
            try:
                summary["workloads"][name] = measure(name, seconds, url, out)
            except (OSError, subprocess.SubprocessError) as e:
                summary["workloads"][name] = {"error": repr(e)}
        cpu1, w1 = cpu_seconds(proc.pid), time.monotonic()
        if cpu0 is not None and cpu1 is not None:
            summary["daemon_cpu_core_fraction"] = round((cpu1 - cpu0) / (w1 - w0), 4)
        summary["nvml"] = probe.report()
    if time.monotonic() + 5 < t_end:
        try:
            summary["pcie_counters"] = pcie_counter_probe()
        except Exception as e:
            summary["pcie_counters"] = {"error": repr(e)}
    (out / "nvml_calls.json").write_text(json.dumps(summary.pop("nvml"), indent=1, sort_keys=True) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    return summary


def measure(name: str, seconds: float, url: str, out: Path) -> dict[str, Any]:
    """Run one workload (or idle) for ``seconds``; scrape after a warm-up and at the end."""
    warm = min(3.0, seconds / 3)
    child = None
    if name in WORKLOADS:
        child = subprocess.Popen([sys.executable, "-c", WORKLOADS[name], str(seconds + warm + 2)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(warm)
        t0, a = time.monotonic(), scrape(url)
        time.sleep(seconds)
        t1, b = time.monotonic(), scrape(url)
    finally:
        result: dict[str, Any] = {}
        if child is not None:
            try:
                so, se = child.communicate(timeout=warm + 30)
            except subprocess.TimeoutExpired:
                child.kill()
                so, se = child.communicate(timeout=10)
            result["workload_rc"] = child.returncode
            result["workload_out"] = (so.decode(errors="replace").strip() or se.decode(errors="replace")[-500:])
    (out / f"{name}.prom").write_text(b)
    result["rates"] = rates(parse(a), parse(b), t1 - t0)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=15.0, help="measured seconds per workload (default 15)")
    ap.add_argument("--budget", type=float, default=300.0, help="stop everything after this many seconds")
    ap.add_argument("--out", type=Path, default=Path("tests/fixtures/real"), help="where captures go")
    ns = ap.parse_args(argv)
    summary = run(ns.seconds, ns.budget, ns.out)
    print(json.dumps(summary, indent=1, sort_keys=True))
    return 1 if "error" in summary else 0


if __name__ == "__main__":
    raise SystemExit(main())
