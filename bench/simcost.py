"""What only the simulation costs the daemon: the fake NVML's calls next to the real binding's.

Under ``serve --simulate`` the GPU collector calls the strict fake NVML, a Python object; on a real host it calls
pynvml, whose wrappers marshal ctypes arguments and call the driver's library. Two parts of the simulated
daemon's CPU exist only under simulation:

- the fake's pick-up of the simulator's state (``FakeNvml._maybe_reload``), which bench/probe.py charges on a
  line of its own;
- the fake's own Python per call, beyond what the real binding's wrappers and their ctypes call cost.

This module measures the second. The real backend (exporter/gpu/backend.py) runs its fast, buffered and slow
paths over (a) the fake serving the benchmark host's state and (b) the installed pynvml over nvml_stub.c, a C
library answering every call at the cost of a C function; the CPU of each NVML function is charged per call
with the calling thread's CPU clock (the same wrapper around both, so its own cost cancels). Weighted by the
calls the daemon made in the overhead window, the difference is the fake's excess. The driver's own work is
taken as zero, so reload + excess bounds the simulation-only share from above: a real driver costs the
binding's floor or more.

Run in a child process (``python -m bench.simcost``): the stub replaces the binding's library for the whole
process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TICK_S = 0.1  # the fast path's interval while a GPU waits: every GPU read at every tick here
ROUNDS = 600  # fast-path ticks per implementation (60 s of sampling; buffered every 1 s, slow every 5 s)


class _Timed:
    """A module-like proxy whose ``nvml*`` functions charge their calling thread's CPU time per function name."""

    def __init__(self, module: Any, cpu: dict[str, list[float]]) -> None:
        self._module = module
        self._cpu = cpu
        self._wrapped: dict[str, Callable[..., Any]] = {}

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        if not (name.startswith("nvml") and callable(value)):
            return value
        fn = self._wrapped.get(name)
        if fn is None:
            acc = self._cpu.setdefault(name, [0, 0.0])

            def fn(*args: Any, _f: Callable[..., Any] = value, _acc: list[float] = acc, **kwargs: Any) -> Any:
                c0 = time.thread_time()
                try:
                    return _f(*args, **kwargs)
                finally:
                    _acc[0] += 1
                    _acc[1] += time.thread_time() - c0

            self._wrapped[name] = fn
        return fn


def _drive(module: Any, advance: Callable[[float], None], rounds: int) -> dict[str, float]:
    """The backend's three paths over ``module`` for ``rounds`` fast ticks; CPU seconds per call, by function."""
    from exporter.gpu.backend import NvmlBackend

    cpu: dict[str, list[float]] = {}
    proxy = _Timed(module, cpu)
    now = [1000.0]
    backend = NvmlBackend(lambda: proxy, clock=lambda: now[0], fast_interval=TICK_S, steady_interval=None)
    try:
        for i in range(rounds):
            backend.fast()
            if i % 10 == 0:
                backend.buffered()
            if i % 50 == 0:
                backend.slow()
            now[0] += TICK_S
            advance(TICK_S)
    finally:
        backend.close()
    return {name: seconds / calls for name, (calls, seconds) in cpu.items() if calls}


def measure_fake(rounds: int = ROUNDS) -> dict[str, float]:
    """CPU per call of the fake NVML serving the 8-GPU benchmark host, as the backend calls it."""
    from bench.common import STEADY
    from exporter.sim import exchange
    from exporter.sim.fakenvml import FakeNvml, normalize_state
    from exporter.sim.model import Model
    from exporter.sim.render import nvml_state
    from exporter.sim.scenario import load

    model = Model(load(STEADY))
    t = [60.0]
    fake = FakeNvml(nvml_state(model, t[0]))

    def advance(dt: float) -> None:
        """The simulator's new state, outside the timed calls, as the daemon's exchange brings it: the numbers
        assigned in place (a new shape only when the shape changed), so the fake's per-shape caches (field
        plans, indexes) live as long as they do in the daemon."""
        t[0] += dt
        new = normalize_state(nvml_state(model, t[0]))
        old_ints, old_floats, old_shape = exchange.walk(fake._state)
        new_ints, new_floats, new_shape = exchange.walk(new)
        if new_shape != old_shape:
            fake.set_state(new)
            return
        for (c, k), (nc, nk) in zip(old_ints + old_floats, new_ints + new_floats, strict=True):
            c[k] = nc[nk]

    return _drive(fake, advance, rounds)


def measure_real(rounds: int = ROUNDS) -> dict[str, float]:
    """CPU per call of the installed pynvml over the stub library (must run in a process of its own)."""
    from bench import nvmlstub

    return _drive(nvmlstub.load(nvmlstub.build()), nvmlstub.advance, rounds)


def per_call(rounds: int = ROUNDS, timeout: float = 300.0) -> dict[str, dict[str, float]]:
    """``{"fake": {function: CPU s per call}, "real": {...}}``, each measured in a fresh child process."""
    out: dict[str, dict[str, float]] = {}
    for which in ("fake", "real"):
        proc = subprocess.run([sys.executable, "-m", "bench.simcost", which, str(rounds)], cwd=REPO,
                              capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"bench.simcost {which} failed: {proc.stderr.strip()[-800:]}")
        out[which] = {k: float(v) for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}
    return out


def excess(calls: Mapping[str, int], costs: Mapping[str, Mapping[str, float]]) -> tuple[float, dict[str, float]]:
    """CPU seconds the fake spent beyond the real binding's floor for ``calls`` (function -> count): the total and
    each function's share. Bounded from above: a function cheaper in the fake counts as no excess (it does not
    offset the others); one the real binding was not measured for counts in full; one the fake was not measured
    for (the backend's runs here never called it) counts at the dearest per-call cost measured."""
    fake, real = costs["fake"], costs["real"]
    dearest = max(fake.values(), default=0.0)
    parts: dict[str, float] = {}
    for name, n in calls.items():
        if n > 0:
            parts[name] = n * max(0.0, fake.get(name, dearest) - real.get(name, 0.0))
    return sum(parts.values()), dict(sorted(parts.items(), key=lambda kv: -kv[1]))


def count_delta(after: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    """Calls made between two snapshots of a fake's ``calls`` counter."""
    return {k: int(v) - int(before.get(k, 0)) for k, v in after.items() if int(v) - int(before.get(k, 0)) > 0}


def snapshot_calls(counter: Counter[str]) -> dict[str, int]:
    """A copy of a counter another thread may be adding keys to (retried: a dict resized mid-copy raises)."""
    for _ in range(10):
        try:
            return dict(counter)
        except RuntimeError:
            threading.Event().wait(0.001)
    return dict(counter)


def main(argv: list[str]) -> int:
    which, rounds = argv[0], int(argv[1]) if len(argv) > 1 else ROUNDS
    result = measure_fake(rounds) if which == "fake" else measure_real(rounds)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    from exporter import log

    log.configure("error")
    raise SystemExit(main(sys.argv[1:]))
