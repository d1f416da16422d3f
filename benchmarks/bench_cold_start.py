"""Cold start of a real training step: transformers GPT-2 (random weights,
4 layers, width 128, vocabulary 1000), AdamW, batch 4 x 64, on 'jax' eager
beside torch CPU eager, each in a fresh process.

For each it prints the first step (everything compiles), the steady step,
and the first step at a new sequence length (48).  The 'jax' runs go twice
over one program-cache directory: a cold one (an empty cache) and a second
process that finds the first one's programs on disk (and a third that
loads them only as they are asked for, without the prefetch thread).  A third 'jax' run
with the cache off shows what the disk cache costs a cold process.  The
last run compiles the model with ``torch.compile(backend='jax')`` (the
optimizer steps eagerly), in a cold cache of its own: the steady step that
eager mode aims at.  Beside it, the same compile on torch CPU with
``backend='aot_eager'`` (dynamo and AOTAutograd, no compiler): the part of
a compiled first step that no backend can remove.

    python benchmarks/bench_cold_start.py [--steps 5]

Ratios: cold first step / CPU first step, new length / CPU new length,
the warm second process's first step / its own steady step, and eager's
steady step / the compiled one's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

#: The checkout this script is in: its children (``python -c``) import pjrt_host from
#: their working directory first, so they run there, and a benchmark measures its own tree.
TREE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, sys, time
import torch
import transformers

device, steps = sys.argv[1], int(sys.argv[2])
backend = {"compile": "jax", "aot_eager": "aot_eager"}.get(sys.argv[3] if len(sys.argv) > 3 else "eager")
transformers.set_seed(0)
config = transformers.GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=1000, n_positions=128)
model = transformers.GPT2LMHeadModel(config).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
forward = torch.compile(model, backend=backend) if backend else model  # forward and backward compiled

def step(length):
    ids = torch.randint(0, 1000, (4, length), device=device)
    loss = forward(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()  # the host waits for the step

def timed(length):
    t = time.perf_counter()
    step(length)
    return time.perf_counter() - t

first = timed(64)
for _ in range(2):
    timed(64)
steady = min(timed(64) for _ in range(steps))
new_length = timed(48)
out = {"first": first, "steady": steady, "new_length": new_length}
if device == "jax":
    out["programs"] = torch.jax.program_cache_stats()
    out["programs"]["fused_segments"] = torch.jax.fused_eager_stats()["segments"]
print(json.dumps(out))
"""


def fresh_process(child: str, argv: list[str], env: dict[str, str]) -> dict:
    """Run ``child`` (code printing a JSON line last) in a new Python
    process with ``argv`` and ``env`` added to this one's; its JSON."""
    proc = subprocess.run([sys.executable, "-c", child, *argv], cwd=TREE, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"the run {argv} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(device: str, steps: int, env: dict[str, str], mode: str = "eager") -> dict:
    return fresh_process(CHILD, [device, str(steps), mode], env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--compile-only", action="store_true",
                        help="only torch CPU eager and the two torch.compile runs")
    args = parser.parse_args()
    if args.compile_only:
        cpu = run("cpu", args.steps, {})
        aot = run("cpu", args.steps, {}, "aot_eager")
        with tempfile.TemporaryDirectory() as compile_cache:
            compiled = run("jax", args.steps, {"PJRT_HOST_CACHE_DIR": compile_cache}, "compile")
        _print([("torch cpu", cpu), ("torch.compile(backend='aot_eager'), cpu", aot),
                ("torch.compile(backend='jax'), cold", compiled)])
        _print_compile(compiled, aot)
        return
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as fused_cache:
        on = {"PJRT_HOST_CACHE_DIR": cache, "PJRT_HOST_EAGER": "op"}
        fused = {"PJRT_HOST_CACHE_DIR": fused_cache, "PJRT_HOST_EAGER": "fused"}
        cpu = run("cpu", args.steps, {})
        cold = run("jax", args.steps, on)
        warm = run("jax", args.steps, on)
        # the same, each program loaded only as it is asked for
        warm_lazy = run("jax", args.steps, {**on, "PJRT_HOST_CACHE_PREFETCH": "0"})
        off = run("jax", args.steps, {"PJRT_HOST_PROGRAM_CACHE": "0", "PJRT_HOST_EAGER": "op"})
        fused_cold = run("jax", args.steps, fused)
        fused_warm = run("jax", args.steps, fused)
        with tempfile.TemporaryDirectory() as compile_cache:
            compiled = run("jax", args.steps, {"PJRT_HOST_CACHE_DIR": compile_cache}, "compile")
        aot = run("cpu", args.steps, {}, "aot_eager")
    _print([("torch cpu", cpu), ("jax, cold cache", cold), ("jax, warm cache (2nd process)", warm),
            ("jax, warm cache, no prefetch", warm_lazy),
            ("jax, cache off", off), ("jax fused, cold cache", fused_cold),
            ("jax fused, warm cache (2nd process)", fused_warm), ("torch.compile(backend='jax'), cold", compiled),
            ("torch.compile(backend='aot_eager'), cpu", aot)])
    print(f"cold first step / cpu first step:          {cold['first'] / cpu['first']:8.1f}x")
    print(f"cold new length / cpu new length:          {cold['new_length'] / cpu['new_length']:8.1f}x")
    print(f"warm 2nd process first step / its steady:  {warm['first'] / warm['steady']:8.1f}x")
    print(f"warm first step, prefetch / none:          {warm['first'] / warm_lazy['first']:8.2f}x")
    print(f"cold first step, cache on / cache off:     {cold['first'] / off['first']:8.2f}x")
    print(f"fused cold first step / cpu first step:    {fused_cold['first'] / cpu['first']:8.1f}x")
    print(f"fused cold new length / cpu new length:    {fused_cold['new_length'] / cpu['new_length']:8.1f}x")
    print(f"fused warm 2nd process first / its steady: {fused_warm['first'] / fused_warm['steady']:8.1f}x")
    print(f"fused steady / op-by-op steady:            {fused_cold['steady'] / cold['steady']:8.2f}x")
    print(f"op-by-op steady / compiled steady:         {cold['steady'] / compiled['steady']:8.2f}x")
    print(f"fused steady / compiled steady:            {fused_cold['steady'] / compiled['steady']:8.2f}x")
    _print_compile(compiled, aot)


def _print(rows: list[tuple[str, dict]]) -> None:
    print(f"{'run':40s} {'first step':>11s} {'steady':>9s} {'new length':>11s}")
    for name, r in rows:
        print(f"{name:40s} {r['first']:10.3f}s {r['steady'] * 1e3:7.1f}ms {r['new_length']:10.3f}s")
    for name, r in rows:
        if "programs" in r:
            print(f"{name:40s} programs: {r['programs']}")


def _print_compile(compiled: dict, aot: dict) -> None:
    """How much of a compiled first step and recompile is dynamo's and
    AOTAutograd's own (the aot_eager run on CPU) and how much the backend's."""
    for what in ("first", "new_length"):
        print(f"compiled {what.replace('_', ' '):10s} / dynamo+AOTAutograd alone: {compiled[what] / aot[what]:8.2f}x "
              f"(the backend's part: {compiled[what] - aot[what]:.2f}s)")


if __name__ == "__main__":
    main()
