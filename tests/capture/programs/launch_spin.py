"""A training loop that spins launching tiny work from Python: the main thread is always on a CPU."""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib", "site-packages"))
import fakecuda  # type: ignore[import-not-found]


def step(i: int) -> None:
    for k in range(64):
        fakecuda.launch(i + k)


def train(seconds: float) -> None:
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        step(i)
        i += 1


if __name__ == "__main__":
    print("ready", flush=True)
    train(float(sys.argv[1]) if len(sys.argv) > 1 else 60.0)
