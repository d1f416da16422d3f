"""Cost of pjrt_host.config(checks=...) on indexing ops, eager and compiled.

    python benchmarks/bench_index_checks.py [--calls N] [--pairs P] [--only eager|compiled]

Eager: microseconds per call (best of 7 interleaved rounds) with the check off, deferred
(the default) and "sync", for a row gather (x[idx]), an embedding lookup and a gather along
dim 1, and for a small training step of an embedding model.

Compiled (torch.compile(backend='jax')): a step (forward + backward, synchronised) with the
checks off and on (deferred), as P interleaved pairs in the same run, and their ratio:
the embedding model above (also its forward alone under no_grad: the per-call cost, least
hidden), and a GPT-2 language model -- token and position embeddings, the
2 decoder blocks of bench_compile.py's (d) (width 768, 12 heads), tied LM head, cross
entropy -- at batch 2, 128 tokens; and bench_compile's (d) itself (the blocks alone, no
indexing op, so nothing is checked: its ratio is this machine's noise floor).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from torch import nn

import pjrt_host

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_compile import Block  # noqa: E402  (the reference GPT-2 block)


def per_call(fn, calls):
    fn()
    torch.jax.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.jax.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def per_call_with_host(fn, calls):
    """(wall us, this thread's CPU us) per call: the thread's CPU time is
    the host-side cost (dispatch, the checks' bookkeeping and reads), which
    another process's load barely moves; XLA:CPU computes in other threads."""
    fn()
    torch.jax.synchronize()
    start, cpu = time.perf_counter(), time.thread_time()
    for _ in range(calls):
        fn()
    torch.jax.synchronize()
    return (time.perf_counter() - start) / calls * 1e6, (time.thread_time() - cpu) / calls * 1e6


class GPT2(nn.Module):
    """A small GPT-2 language model: bench_compile's blocks between token /
    position embeddings and a head tied to the token embedding."""

    def __init__(self, vocab: int, seq: int, layers: int, dim: int = 768) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(seq, dim)
        self.blocks = nn.Sequential(*[Block(dim) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)

    def forward(self, tokens):
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.blocks(self.wte(tokens) + self.wpe(pos))
        return self.ln(x) @ self.wte.weight.T


def compiled_cases(calls: int, pairs: int) -> None:
    torch.manual_seed(0)
    cases = {}
    small = nn.Sequential(nn.Embedding(1000, 64), nn.Linear(64, 1000)).to("jax")
    small_c = torch.compile(small, backend="jax")
    small_tokens = torch.randint(0, 1000, (8, 16), device="jax")
    cases["embedding+linear inference (no_grad)"] = (small, small_c, small_tokens, calls)
    cases["embedding+linear fw+bw"] = (small, small_c, small_tokens, max(calls // 10, 5))
    vocab, seq = 8192, 128
    gpt = GPT2(vocab, seq, 2).to("jax")
    cases[f"GPT-2 LM x2 blocks, vocab {vocab}, b2 t{seq}, fw+bw"] = (
        gpt, torch.compile(gpt, backend="jax"), torch.randint(0, vocab, (2, seq), device="jax"), 3)

    blocks = nn.Sequential(*[Block() for _ in range(2)]).to("jax")
    cases["(d) GPT-2 blocks x2 alone (nothing checked)"] = (
        blocks, torch.compile(blocks, backend="jax"), torch.randn(2, seq, 768, device="jax"), 3)

    print(f"compiled step, {pairs} (off, on) pairs: medians, the median of the pairs' ratios, the ratio of the minima")
    print("  and the extra host CPU time per step (median, this thread), also as a share of the step")
    print(f"{'':48s}{'off ms':>10s}{'on ms':>10s}{'on/off':>8s}{'min/min':>8s}{'extra us':>10s}"
          f"{'host us':>10s}{'of step':>9s}")
    for name, (model, compiled, tokens, n) in cases.items():
        def step():
            if "inference" in name:
                with torch.no_grad():
                    return compiled(tokens)
            for p in model.parameters():
                p.grad = None
            out = compiled(tokens)
            if tokens.is_floating_point():  # the blocks alone: bench_compile's (d) loss
                out.square().mean().backward()
            else:
                nn.functional.cross_entropy(out.flatten(0, 1), tokens.flatten()).backward()

        for value in (False, True):  # compile both programs before timing
            with pjrt_host.config(checks=value):
                step()
                torch.jax.synchronize()
        # Pairs of (off, on) measurements, the order alternating: the noise of
        # a shared machine comes in bursts longer than one pair, so the median
        # of the pairs' ratios is steadier than a ratio of two minima.
        times: dict = {False: [], True: []}
        host: dict = {False: [], True: []}
        for r in range(pairs):
            for value in ((False, True) if r % 2 == 0 else (True, False)):
                with pjrt_host.config(checks=value):
                    wall, cpu = per_call_with_host(step, n)
                times[value].append(wall)
                host[value].append(cpu)
        ratios = sorted(on / off for off, on in zip(times[False], times[True]))
        off, on = statistics.median(times[False]), statistics.median(times[True])
        host_extra = statistics.median(host[True]) - statistics.median(host[False])
        print(f"{name:48s}{off / 1e3:10.2f}{on / 1e3:10.2f}{statistics.median(ratios):8.3f}"
              f"{min(times[True]) / min(times[False]):8.3f}{on - off:10.1f}{host_extra:10.1f}"
              f"{host_extra / off * 100:8.2f}%")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--pairs", type=int, default=21, help="(off, on) pairs per compiled case")
    parser.add_argument("--only", choices=("eager", "compiled"))
    args = parser.parse_args()
    calls = args.calls
    if args.only != "eager":
        compiled_cases(calls, args.pairs)
    if args.only == "compiled":
        return
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
                with pjrt_host.config(checks=value):
                    times[mode] = min(times[mode], per_call(fn, n))
        print(f"{name:32s}" + "".join(f"{t:12.1f}" for t in times.values())
              + f"{times['deferred'] / times['off']:14.2f}{times['sync'] / times['off']:10.2f}")


if __name__ == "__main__":
    main()
