"""A training loop whose main thread waits on a multiprocessing queue fed by slow workers (input-bound)."""

import multiprocessing as mp
import sys
import time
from typing import Any


def produce(q: Any) -> None:
    while True:
        x = 0
        for i in range(400_000):  # a slow transform: the workers cannot keep up
            x += i
        q.put(x)


def next_batch(q: Any) -> int:
    return int(q.get())


def train(q: Any, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        batch = next_batch(q)
        _ = batch + 1  # the step itself is quick


if __name__ == "__main__":
    queue: Any = mp.Queue(2)
    for _ in range(2):
        mp.Process(target=produce, args=(queue,), daemon=True).start()
    print("ready", flush=True)
    train(queue, float(sys.argv[1]) if len(sys.argv) > 1 else 60.0)
