"""Cost of pjrt_host.config(check_indices=...) on indexing ops, eager.

    python benchmarks/bench_index_checks.py [--calls N]

Prints microseconds per call (best of 7 interleaved rounds) with the check off, deferred
(the default) and "sync",
for a row gather (x[idx]), an embedding lookup and a gather along dim 1,
and for a small training step of an embedding model.
"""

from __future__ import annotations

import argparse
import time

import torch

import pjrt_host


def per_call(fn, calls):
    fn()
    torch.jax.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.jax.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    calls = parser.parse_args().calls
    x = torch.randn(1000, 64, device="jax")
    idx = torch.randint(0, 1000, (32,), device="jax")
    emb = torch.nn.Embedding(1000, 64).to("jax")
    tokens = torch.randint(0, 1000, (8, 16), device="jax")
    g_idx = torch.randint(0, 64, (1000, 4), device="jax")
    model = torch.nn.Sequential(torch.nn.Embedding(1000, 64), torch.nn.Linear(64, 1000)).to("jax")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
        loss.backward()
        opt.step()

    cases = {
        "x[idx] (1000x64, 32 rows)": lambda: x[idx],
        "embedding (8x16 tokens)": lambda: emb(tokens),
        "gather dim 1": lambda: x.gather(1, g_idx),
        "embedding+linear train step": step,
    }
    modes = {"off": False, "deferred": True, "sync": "sync"}
    print(f"{'op':32s}" + "".join(f"{m + ' us':>12s}" for m in modes) + f"{'deferred/off':>14s}{'sync/off':>10s}")
    for name, fn in cases.items():
        n = calls if "step" not in name else max(calls // 10, 5)
        times = {m: float("inf") for m in modes}
        for _ in range(7):  # modes interleaved, best of 7: a shared machine's noise hits all alike
            for mode, value in modes.items():
                with pjrt_host.config(check_indices=value):
                    times[mode] = min(times[mode], per_call(fn, n))
        print(f"{name:32s}" + "".join(f"{t:12.1f}" for t in times.values())
              + f"{times['deferred'] / times['off']:14.2f}{times['sync'] / times['off']:10.2f}")


if __name__ == "__main__":
    main()
