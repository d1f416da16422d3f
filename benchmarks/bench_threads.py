"""Threads training different models at once: each thread trains its own
model (eager, torch.compile(backend='jax'), or assume_pure) with its own
data, and its losses and weights must equal the same training run alone in
one thread.  Prints the time of the threaded run against the same work run
thread after thread.

    python benchmarks/bench_threads.py [--threads 8] [--steps 200]

tests/test_threads.py runs the same function with fewer steps.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import torch

import pjrt_host

KINDS = ("eager", "compiled", "assume_pure")


def make(kind: str, seed: int) -> tuple[Any, Any, list]:
    torch.manual_seed(seed)
    width = 8 + 4 * (seed % 3)  # models of different shapes
    model = torch.nn.Sequential(torch.nn.Linear(6, width), torch.nn.Tanh(), torch.nn.Linear(width, 1)).to("jax")
    params = list(model.parameters())
    if kind == "compiled":
        model = torch.compile(model, backend="jax")
    elif kind == "assume_pure":
        model = pjrt_host.assume_pure(model)
    gen = torch.Generator().manual_seed(seed)
    data = [(torch.randn(4, 6, generator=gen), torch.randn(4, 1, generator=gen)) for _ in range(5)]
    return model, params, data


def train(kind: str, seed: int, steps: int, made: Any = None) -> tuple[list[float], list[torch.Tensor]]:
    model, params, data = made or make(kind, seed)
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    losses = []
    for i in range(steps):
        x, y = data[i % len(data)]
        loss = (model(x.to("jax")) - y.to("jax")).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in params]


def run_threads(n: int, steps: int) -> tuple[list, list[BaseException]]:
    results: list = [None] * n
    errors: list[BaseException] = []
    # Models are made here: torch.compile() called while another thread
    # traces an assume_pure function returns the model uncompiled (torch's
    # export flag is one per process; docs/torch-device.md, threads).
    made = [make(KINDS[i % len(KINDS)], i) for i in range(n)]

    def work(i: int) -> None:
        try:
            results[i] = train(KINDS[i % len(KINDS)], i, steps, made[i])
        except BaseException as err:  # noqa: BLE001 - reported by the caller
            errors.append(err)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    alone = [train(KINDS[i % len(KINDS)], i, args.steps) for i in range(args.threads)]  # compiles everything
    start = time.perf_counter()
    again = [train(KINDS[i % len(KINDS)], i, args.steps) for i in range(args.threads)]
    t_alone = time.perf_counter() - start
    start = time.perf_counter()
    together, errors = run_threads(args.threads, args.steps)
    t_together = time.perf_counter() - start
    assert all(a[0] == b[0] for a, b in zip(alone, again))
    if errors:
        raise SystemExit(f"{len(errors)} threads failed: {errors[0]!r}")
    same = sum(a[0] == b[0] and all(torch.equal(p, q) for p, q in zip(a[1], b[1]))
               for a, b in zip(alone, together))
    print(f"{args.threads} threads x {args.steps} steps ({', '.join(KINDS)} in turn)")
    print(f"one after another (warm): {t_alone:7.2f} s")
    print(f"all at once (warm):       {t_together:7.2f} s   ratio {t_together / t_alone:.2f}")
    print(f"threads whose losses and weights equal their run alone: {same}/{args.threads}")
    if same != args.threads:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
