"""The workloads of bench/gpu_real.py: each one holds the GPU back for a cause known by construction.

    python bench/gpu_workloads.py NAME SECONDS MODE

NAME is one of ``WORKLOADS``; SECONDS is the length of its measured loop; MODE is ``cuda`` (PyTorch on cuda:0,
the real run) or ``cpu`` (the dry run: the same loops on CPU torch tensors where torch imports, else a
pure-Python stand-in of the same shape -- it exercises the harness and measures nothing).

Each prints one JSON line ``{"event": "start", "t": <wall clock>}`` when its measured loop begins (after imports,
allocation and one warm-up step) and one ``{"event": "result", ...}`` line at the end with its own ground truth:
steps and their wall latencies, the device time of its GPU work (CUDA events on the GPU; the host's
``perf_counter`` elsewhere), and what it moved or launched. Run as its own process with a deadline: the parent
kills it if it overruns.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import random
import sys
import time
from collections.abc import Callable
from typing import Any

# name -> the verdict gpufeed should reach for it (exporter/names.py VERDICTS).
WORKLOADS = {
    "idle": "idle",
    "matmul": "healthy",  # bf16 8192^3 products back to back: the GPU computes all the time
    "tiny_kernels": "launch_bound",  # one-element adds from a Python loop: the CPU cannot launch fast enough
    "dataloader": "input_bound",  # two DataLoader workers that each need 5 ms of CPU per sample
    "h2d_pinned": "transfer_bound",  # pinned host -> device copies of 256 MiB, nothing else
    "batch1": "latency_bound",  # batch-1 inference of a small MLP with pauses between requests
}
ITEM_CPU_S = 0.005  # CPU a dataloader worker burns per sample


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (0..100); None when empty."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(p / 100.0 * len(s)) - 1))]


def burn(seconds: float) -> None:
    """Busy the calling CPU for ``seconds`` (the dataloader's per-sample preprocessing)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class Device:
    """Where the work runs: cuda:0 through PyTorch, CPU tensors, or plain Python; times device work."""

    def __init__(self, mode: str) -> None:
        try:
            import torch
        except ImportError:
            torch = None
        if mode == "cuda" and (torch is None or not torch.cuda.is_available()):
            raise SystemExit("cuda mode needs PyTorch with a usable GPU")
        self.torch: Any = torch
        self.cuda = mode == "cuda"
        self.name = "torch-cuda" if self.cuda else ("torch-cpu" if torch is not None else "python")
        self.device = "cuda" if self.cuda else "cpu"

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def timed(self, step: Callable[[], object]) -> float:
        """Run ``step`` and return the device seconds it took (CUDA events on the GPU, waited for)."""
        if not self.cuda:
            t0 = time.perf_counter()
            step()
            return time.perf_counter() - t0
        start = self.torch.cuda.Event(enable_timing=True)
        end = self.torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / 1e3


def loop(dev: Device, seconds: float, step: Callable[[], object], *, pause: Callable[[], None] | None = None,
         warmed: Callable[[], None] | None = None) -> dict[str, Any]:
    """Warm ``step`` once (then call ``warmed``), announce the start, run it until ``seconds`` pass; latencies
    and device time."""
    dev.timed(step)
    if warmed is not None:
        warmed()
    emit("start", t=time.time())
    lat: list[float] = []
    busy = 0.0
    t0 = time.monotonic()
    end = t0 + seconds
    while time.monotonic() < end:
        s = time.perf_counter()
        busy += dev.timed(step)
        lat.append(time.perf_counter() - s)
        if pause is not None:
            pause()
    wall = time.monotonic() - t0
    return {"wall_s": round(wall, 3), "steps": len(lat), "device_busy_s": round(busy, 4),
            "busy_ratio": round(busy / wall, 4) if wall > 0 else None,
            "step_ms": {"p50": _ms(percentile(lat, 50)), "p99": _ms(percentile(lat, 99)),
                        "mean": _ms(sum(lat) / len(lat) if lat else None)}}


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1e3, 4)


def matmul(dev: Device, seconds: float) -> dict[str, Any]:
    t = dev.torch
    if t is None:
        def step() -> object:
            return sum(i * i for i in range(20000))
        out = loop(dev, seconds, step)
        return out | {"flop_per_step": 0}
    n = 8192 if dev.cuda else 256
    dtype = t.bfloat16 if dev.cuda else t.float32
    a = t.randn(n, n, dtype=dtype, device=dev.device)
    b = t.randn(n, n, dtype=dtype, device=dev.device)

    def tstep() -> object:
        c = a
        for _ in range(10):
            c = a @ b
        return c
    out = loop(dev, seconds, tstep)
    flop = 10 * 2 * n ** 3
    out["tflops"] = round(flop * out["steps"] / out["device_busy_s"] / 1e12, 1) if out["device_busy_s"] else None
    return out | {"flop_per_step": flop}


def tiny_kernels(dev: Device, seconds: float) -> dict[str, Any]:
    per_step = 1000
    t = dev.torch
    if t is None:
        acc = [0.0]

        def step() -> object:
            for _ in range(per_step):
                acc[0] += 1.0
            return acc
    else:
        x = t.zeros(1, device=dev.device)

        def step() -> object:
            for _ in range(per_step):
                x.add_(1.0)
            return x
    out = loop(dev, seconds, step)
    # The events bracket each 1000 launches: their span is mostly the gaps between tiny kernels, not kernel
    # time, so it is no busy ratio (kept as span_s); the launch rate is this workload's ground truth.
    out["span_s"] = out.pop("device_busy_s")
    out["busy_ratio"] = None
    kernels = out["steps"] * per_step
    out["kernels_launched"] = kernels
    out["kernels_per_s"] = round(kernels / out["wall_s"], 1) if out["wall_s"] else None
    return out


def _sample(i: int) -> list[float]:
    """One dataloader sample: ITEM_CPU_S of CPU, then 1024 floats (picklable: a worker calls it)."""
    burn(ITEM_CPU_S)
    return [float(i % 7)] * 1024


class _Slow:
    """A map-style dataset whose every item costs ITEM_CPU_S of CPU (torch's DataLoader calls it in workers)."""

    def __len__(self) -> int:
        return 10**7

    def __getitem__(self, i: int) -> Any:
        import torch

        return torch.tensor(_sample(i))


def dataloader(dev: Device, seconds: float) -> dict[str, Any]:
    """The loop waits for batches two workers cannot produce fast enough; a small matmul per batch."""
    batch, workers = 16, 2
    t = dev.torch
    wait = [0.0]
    if t is None:
        pool = multiprocessing.Pool(workers)
        it: Any = pool.imap(_sample, range(10**7), chunksize=1)

        def next_batch() -> Any:
            return [next(it) for _ in range(batch)]

        def compute(b: Any) -> object:
            return sum(sum(r) for r in b)
    else:
        dl = t.utils.data.DataLoader(_Slow(), batch_size=batch, num_workers=workers, pin_memory=dev.cuda,
                                     persistent_workers=True, prefetch_factor=2)
        it = iter(dl)
        w = t.randn(1024, 1024, device=dev.device)

        def next_batch() -> Any:
            return next(it).to(dev.device, non_blocking=True)

        def compute(b: Any) -> object:
            return b @ w

    gpu = [0.0]  # device time of the compute alone: the step's own span includes the wait for data

    def step() -> object:
        s = time.perf_counter()
        b = next_batch()
        wait[0] += time.perf_counter() - s
        gpu[0] += dev.timed(lambda: compute(b))
        return b

    def warmed() -> None:
        wait[0] = gpu[0] = 0.0
    try:
        out = loop(dev, seconds, step, warmed=warmed)
    finally:
        if t is None:
            pool.terminate()
    out["device_busy_s"] = round(gpu[0], 4)
    out["busy_ratio"] = round(gpu[0] / out["wall_s"], 4) if out["wall_s"] else None
    out["batches"] = out["steps"]
    out["data_wait_ratio"] = round(wait[0] / out["wall_s"], 4) if out["wall_s"] else None
    out["samples_per_s"] = round(out["steps"] * batch / out["wall_s"], 1) if out["wall_s"] else None
    return out


def h2d_pinned(dev: Device, seconds: float) -> dict[str, Any]:
    t = dev.torch
    if t is None:
        src = bytearray(b"\1" * (16 << 20))
        dst = bytearray(len(src))
        nbytes = len(src)

        def step() -> object:
            dst[:] = src
            return dst
    else:
        n = (256 << 20) if dev.cuda else (16 << 20)
        host = t.empty(n, dtype=t.uint8, pin_memory=dev.cuda)
        host.fill_(1)
        target = t.empty(n, dtype=t.uint8, device=dev.device)
        nbytes = n

        def step() -> object:
            return target.copy_(host, non_blocking=True)
    out = loop(dev, seconds, step)
    copied = out["steps"] * nbytes
    out["bytes_copied"] = copied
    out["h2d_bytes_per_s"] = round(copied / out["wall_s"]) if out["wall_s"] else None
    out["copy_gbps_device"] = round(copied / out["device_busy_s"] / 1e9, 2) if out["device_busy_s"] else None
    return out


def batch1(dev: Device, seconds: float) -> dict[str, Any]:
    rng = random.Random(1)
    t = dev.torch
    if t is None:
        def step() -> object:
            return sum(i * 0.5 for i in range(3000))
    else:
        layers: list[Any] = []
        for _ in range(4):
            layers += [t.nn.Linear(1024, 1024), t.nn.ReLU()]
        model = t.nn.Sequential(*layers).to(dev.device).eval()

        def step() -> object:
            with t.no_grad():
                return model(t.randn(1, 1024, device=dev.device))

    def pause() -> None:  # requests arrive 2..10 ms apart
        time.sleep(rng.uniform(0.002, 0.010))
    out = loop(dev, seconds, step, pause=pause)
    out["requests"] = out["steps"]
    return out


RUNNERS: dict[str, Callable[[Device, float], dict[str, Any]]] = {
    "matmul": matmul, "tiny_kernels": tiny_kernels, "dataloader": dataloader, "h2d_pinned": h2d_pinned,
    "batch1": batch1,
}


def main(argv: list[str]) -> int:
    name, seconds, mode = argv[0], float(argv[1]), argv[2]
    dev = Device(mode)
    result = RUNNERS[name](dev, seconds)
    dev.sync()
    emit("result", workload=name, device=dev.name, **result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
