"""Peak device memory of a small transformer training step, op-by-op eager
beside fused eager, each mode in a fresh process.

The model: token embedding, 2 ``nn.TransformerEncoderLayer`` (width 256, 4
heads, feed-forward 1024, dropout 0.1), a vocabulary head of 2000; AdamW;
batch 8 x 128.  After warm-up steps, each process measures a few steps:

- ``sampled peak``: the bytes of the live arrays on the device, counted
  after every ATen op (a dispatch mode that only counts) -- the memory
  tensors hold between ops.  A program's temporaries inside one op or one
  fused segment are not seen (on cpu_ref nothing else reports them).
- ``device peak``: the device's own ``peak_bytes_in_use`` where its PJRT
  client reports memory statistics (GPU, TPU): the true high-water mark,
  temporaries included.  cpu_ref reports none.
- ``after step``: live bytes once the step has returned (parameters, their
  gradients set to None, the optimizer state).

    python benchmarks/bench_eager_memory.py [--steps 3] [--width 256]

Prints each mode's figures and the ratios fused / op (at most 1.0 is the
goal: fusing must not cost memory).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

#: The checkout this script is in: its children (``python -c``) import pjrt_host from
#: their working directory first, so they run there, and a benchmark measures its own tree.
TREE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, sys
import torch
from torch.utils._python_dispatch import TorchDispatchMode
import jax

steps, width = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
vocab, batch, length = 2000, 8, 128


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        layer = torch.nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.1, batch_first=True)
        self.body = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, ids):
        return self.head(self.body(self.embed(ids), is_causal=False))


model = Model().to("jax")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
device = jax.devices()[0]


def live_bytes():
    return sum(a.nbytes for a in device.client.live_arrays() if not a.is_deleted())


class Count(TorchDispatchMode):
    # Counts the live bytes after every op; changes nothing.
    peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        Count.peak = max(Count.peak, live_bytes())
        return out


def step(ids, labels):
    loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), labels.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


def batch_():
    ids = torch.randint(0, vocab, (batch, length), device="jax")
    return ids, ids.roll(-1, 1)


for _ in range(2):  # warm-up: compiled programs, optimizer state
    step(*batch_())
losses = []
with Count():
    for _ in range(steps):
        losses.append(step(*batch_()))
stats = device.memory_stats() or {}
print(json.dumps({"sampled_peak": Count.peak, "device_peak": stats.get("peak_bytes_in_use"),
                  "after_step": live_bytes(), "losses": losses,
                  "params": sum(p.numel() * p.element_size() for p in model.parameters())}))
"""


def run(mode: str, steps: int, width: int) -> dict:
    env = dict(os.environ, PJRT_HOST_EAGER=mode)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(steps), str(width)], cwd=TREE, env=env, capture_output=True,
                          text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"the {mode} run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args()
    results = {mode: run(mode, args.steps, args.width) for mode in ("op", "fused")}
    print(f"parameters: {mib(results['op']['params'])} MiB")
    print(f"{'mode':<8}{'sampled peak MiB':>18}{'device peak MiB':>17}{'after step MiB':>16}")
    for mode, r in results.items():
        print(f"{mode:<8}{mib(r['sampled_peak']):>18}{mib(r['device_peak']):>17}{mib(r['after_step']):>16}")
    op, fused = results["op"], results["fused"]
    print(f"fused / op: sampled peak {fused['sampled_peak'] / op['sampled_peak']:.3f}", end="")
    if op["device_peak"] and fused["device_peak"]:
        print(f", device peak {fused['device_peak'] / op['device_peak']:.3f}", end="")
    print(f", after step {fused['after_step'] / op['after_step']:.3f}")
    print("losses op:   ", " ".join(f"{v:.5f}" for v in op["losses"]))
    print("losses fused:", " ".join(f"{v:.5f}" for v in fused["losses"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
