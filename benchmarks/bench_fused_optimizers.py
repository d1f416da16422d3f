"""AdamW steps on 'jax': ``fused=True`` against ``foreach=True``.

The fused step is one device op (``_fused_adamw_``: one compiled program over
all parameters, plus the step count's ``_foreach_add_``); the foreach step is
a dozen ``_foreach_*`` ops, each its own program and its own round of
write-backs.  Plain foreach (``capturable=False``, torch's default) keeps
the step count on the CPU and passes the bias corrections as lists of
Python floats that change every step; ``capturable=True`` keeps them on
the device.  Both optimizers step the same model (a small transformer
encoder with an embedding: ``--width`` 256, ``--layers`` 4 is 7.4M parameters
in 51 tensors) with fixed random gradients, in the same process, warmed up
first (compiles excluded), alternating rounds so that both see the same
machine.  Prints the median step time of each, its ratio to fused, how many
ATen ops each step sends to the device and how many programs each timed
step compiled.

``--schedule`` gives every step a new lr (LambdaLR), as transformers'
Trainer does: compiles/step then shows whether the steps keep compiling.

    python benchmarks/bench_fused_optimizers.py [--width 256] [--layers 4] [--steps 20] [--schedule]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import pjrt_host  # noqa: F401


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += func.namespace == "aten"
        return func(*args, **(kwargs or {}))


def make_model(width: int, layers: int, vocab: int = 8192) -> torch.nn.Module:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=4 * width, batch_first=True)
    return torch.nn.Sequential(torch.nn.Embedding(vocab, width), torch.nn.TransformerEncoder(layer, layers),
                               torch.nn.Linear(width, vocab))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per optimizer")
    parser.add_argument("--schedule", action="store_true",
                        help="a new lr every step (LambdaLR), as Trainer's default linear schedule gives")
    args = parser.parse_args()

    base = make_model(args.width, args.layers)
    n_params = sum(p.numel() for p in base.parameters())
    n_tensors = len(list(base.parameters()))
    runs = {}
    variants = (("fused", {"fused": True}), ("foreach", {"foreach": True}),
                ("foreach, capturable", {"foreach": True, "capturable": True}))
    for name, impl in variants:
        model = copy.deepcopy(base).to("jax")
        g = torch.Generator().manual_seed(1)
        for p in model.parameters():
            p.grad = (torch.randn(p.shape, generator=g) * 1e-3).to("jax")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, **impl)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s)) if args.schedule else None

        def step(opt=opt, sched=sched):
            opt.step()
            if sched is not None:
                sched.step()

        for _ in range(3):  # compiles, state allocation
            step()
        torch.jax.synchronize()
        with _Count() as count:
            step()
        torch.jax.synchronize()
        runs[name] = {"step": step, "model": model, "times": [], "ops": count.ops}

    rounds = 4
    per_round = max(1, args.steps // rounds)
    for _ in range(rounds):
        for run in runs.values():
            step = run["step"]
            before = torch.jax.program_cache_stats()["programs"]
            for _ in range(per_round):
                t0 = time.perf_counter()
                step()
                torch.jax.synchronize()
                run["times"].append(time.perf_counter() - t0)
            run["compiles"] = run.get("compiles", 0) + torch.jax.program_cache_stats()["programs"] - before

    # Same updates: both took the same number of steps from the same start.
    fused_p = [p.detach().cpu() for p in runs["fused"]["model"].parameters()]
    diff = max(float((a - b.detach().cpu()).abs().max())
               for run in runs.values() for a, b in zip(fused_p, run["model"].parameters()))

    device = torch.jax.get_device_name(0) if hasattr(torch.jax, "get_device_name") else "jax:0"
    print(f"AdamW step on 'jax' ({device}): {n_params / 1e6:.1f}M parameters in {n_tensors} tensors, "
          f"median of {rounds * per_round} steps each{', lr schedule' if args.schedule else ''}")
    med = {}
    steps = rounds * per_round
    for name, run in runs.items():
        med[name] = statistics.median(run["times"]) * 1e3
        print(f"  {name:20s} {med[name]:8.2f} ms/step  {run['ops']:4d} ATen ops/step  "
              f"{run['compiles'] / steps:4.1f} compiles/step  {med[name] / med['fused']:6.2f}x fused")
    print(f"  max |param difference| between the three after {3 + 1 + steps} steps: {diff:.1e}")


if __name__ == "__main__":
    main()
