"""A training loop that blocks in a sync-like call every step: it launches, then waits for the device."""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib", "site-packages"))
import fakecuda  # type: ignore[import-not-found]


def train(seconds: float) -> None:
    fakecuda.start_device(0.02)
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        fakecuda.launch(i)
        fakecuda.synchronize()  # loss.item() every step
        i += 1


if __name__ == "__main__":
    print("ready", flush=True)
    train(float(sys.argv[1]) if len(sys.argv) > 1 else 60.0)
