"""Soak: many eager training steps of a small model on 'jax' with batch
shapes that vary, and what grows.

An MLP (64 -> 256 -> 256 -> 10) with AdamW trains on batches whose size
cycles through a few values (as a last partial batch and a bucketing
sampler give them), op by op or in fused eager.  After a warm-up (every
batch size seen twice) the script samples, every ``--every`` steps:

- the process's resident memory (``/proc/self/statm``),
- the device's allocated bytes (``torch.jax.memory_allocated()``),
- the in-memory caches: compiled op signatures (every op's programs),
  fused segment programs, view read / write programs.

It prints the growth of each from the first sample after warm-up to the
last, in percent (the goal: under 2 % for memory; the caches flat), and
the loss against the same steps on torch CPU for the first steps.

    python benchmarks/bench_soak.py [--steps 5000] [--every 500] [--eager op|fused]
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import pjrt_host

SIZES = (32, 48, 64, 17, 32, 64, 5)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def cache_sizes() -> dict[str, int]:
    """Entries of the device's in-memory caches (private: a benchmark's look inside)."""
    from pjrt_host._torch import _dispatch, _fused, _tensor

    signatures = 0
    for handler in list(_dispatch._handlers.values()):
        op = getattr(handler, "__self__", None)
        cache = getattr(op, "cache", None)
        if isinstance(cache, dict):
            signatures += len(cache)
    return {"op signatures": signatures, "fused programs": len(_fused._programs),
            "view programs": len(_tensor._read_cache) + len(_tensor._write_cache)}


def model(device: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 256), torch.nn.GELU(),
                              torch.nn.Linear(256, 10)).to(device)
    return net, torch.optim.AdamW(net.parameters(), lr=1e-3)


def step(net: torch.nn.Module, opt: torch.optim.Optimizer, i: int, device: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(i)
    n = SIZES[i % len(SIZES)]
    x = torch.randn(n, 64, generator=g).to(device)
    y = torch.randint(0, 10, (n,), generator=g).to(device)
    loss = torch.nn.functional.cross_entropy(net(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--every", type=int, default=500)
    parser.add_argument("--eager", choices=("op", "fused"), default="op")
    args = parser.parse_args()

    cpu_net, cpu_opt = model("cpu")
    net, opt = model("jax")
    worst = 0.0
    for i in range(20):  # the numbers first: the same steps as torch CPU
        a, b = step(cpu_net, cpu_opt, i, "cpu").item(), step(net, opt, i, "jax").item()
        worst = max(worst, abs(a - b) / max(abs(a), 1e-6))
    print(f"first 20 steps against torch CPU: largest relative loss difference {worst:.2e}")

    warmup = 2 * len(SIZES)
    samples = []
    start = time.perf_counter()
    with pjrt_host.config(eager=args.eager):
        for i in range(20, 20 + args.steps):
            loss = step(net, opt, i, "jax")
            done = i - 20 + 1
            if done >= warmup and (done - warmup) % args.every == 0:
                loss.item()
                torch.jax.synchronize()
                samples.append((done, rss_bytes(), torch.jax.memory_allocated(), cache_sizes()))
        loss.item()
    seconds = time.perf_counter() - start
    torch.jax.synchronize()
    samples.append((args.steps, rss_bytes(), torch.jax.memory_allocated(), cache_sizes()))

    print(f"{args.steps} steps, eager={args.eager}, batch sizes {sorted(set(SIZES))}: "
          f"{seconds / args.steps * 1e3:.1f} ms a step")
    print(f"{'step':>6} {'RSS MiB':>9} {'device MiB':>11}  caches")
    for done, rss, dev, caches in samples:
        print(f"{done:>6} {rss / 2**20:>9.1f} {dev / 2**20:>11.2f}  {caches}")
    (_, rss0, dev0, c0), (_, rss1, dev1, c1) = samples[0], samples[-1]
    print(f"growth after warm-up: RSS {100 * (rss1 - rss0) / rss0:+.2f} %, device bytes "
          f"{100 * (dev1 - dev0) / max(dev0, 1):+.2f} %, caches " +
          ", ".join(f"{k} {c0[k]} -> {c1[k]}" for k in c0))


if __name__ == "__main__":
    main()
