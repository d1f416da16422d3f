"""Loading a state_dict onto the 'jax' device: ``torch.load(path,
map_location='jax')`` against the usual two steps, ``torch.load(path)`` to
the CPU then ``.to('jax')`` per tensor, in the same run.  Prints seconds and
peak host memory (max RSS) of each, each path in a fresh process, and the
ratios (goal: map_location='jax' no slower, and no more host memory).

    python benchmarks/bench_checkpoint_load.py [--gib 1.0] [--tensors 64] [--mmap]

The checkpoint is written once to a temporary file: ``--tensors`` float32
tensors adding up to ``--gib``.  Each child first loads a tiny checkpoint
the same way, so one-time costs are left out (the first storage set on
'jax' makes torch import torch.distributed.tensor, ~0.9 s).  On a plugin whose device memory is host
memory (cpu_ref), max RSS counts the device copy too, for both paths alike.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, resource, sys, time
import torch
path, how, mmap = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
torch.zeros(1, device="jax")  # the client exists before timing
# One small load first, by the same path: one-time costs (torch imports
# torch.distributed.tensor on the first set_ of a storage through Python
# dispatch, about 0.9 s here; jit compiles) are not what a checkpoint costs.
small = path + ".small"
torch.save({"w": torch.ones(4)}, small)
if how == "map_location":
    torch.load(small, map_location="jax")
else:
    torch.load(small)["w"].to("jax")
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
if how == "map_location":
    sd = torch.load(path, map_location="jax", mmap=mmap)
else:
    sd = {k: v.to("jax") for k, v in torch.load(path, mmap=mmap).items()}
torch.jax.synchronize()
elapsed = time.perf_counter() - t
assert all(v.device.type == "jax" for v in sd.values())
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": elapsed, "peak_rss_gib": peak / 2**20, "rss_at_start_gib": base / 2**20}))
"""


def run(path: str, how: str, mmap: bool) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, path, how, "1" if mmap else "0"], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--tensors", type=int, default=64)
    parser.add_argument("--mmap", action="store_true", help="torch.load(..., mmap=True) on both paths")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    import torch

    numel = int(args.gib * 2**30 / 4 / args.tensors)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "state.pt")
        torch.save({f"w{i}": torch.randn(numel) for i in range(args.tensors)}, path)
        size = os.path.getsize(path) / 2**30
        results: dict[str, list[dict]] = {"map_location": [], "cpu_then_to": []}
        for _ in range(args.rounds):  # interleaved, so machine load hits both alike
            for how in results:
                results[how].append(run(path, how, args.mmap))
    best = {how: min(r, key=lambda x: x["seconds"]) for how, r in results.items()}
    peak = {how: max(x["peak_rss_gib"] for x in r) for how, r in results.items()}
    print(f"checkpoint: {size:.2f} GiB in {args.tensors} float32 tensors, mmap={args.mmap}")
    for how in results:
        print(f"  {how:<13} {best[how]['seconds']:7.3f} s   peak RSS {peak[how]:6.2f} GiB")
    print(f"time ratio map_location / cpu_then_to: {best['map_location']['seconds'] / best['cpu_then_to']['seconds']:.2f}")
    print(f"peak RSS ratio map_location / cpu_then_to: {peak['map_location'] / peak['cpu_then_to']:.2f}")


if __name__ == "__main__":
    main()
