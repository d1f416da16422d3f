"""timm models trained as their users train them: ``timm.create_model`` with
its default arguments (random weights, 10 classes; ViTs at 64x64 images),
SGD with momentum, batch 4, on torch CPU and on 'jax' in fused eager, op by
op and under ``torch.compile(backend='jax')``, each in a fresh process with
an empty program cache.

Prints per run the first step, the steady step (the median of the steps
after ``--warmup``), eager's steady step over the compiled one (the issue's
goal: within 1.2x) and the largest loss difference from CPU's (no random op
runs in these models' training steps, so the losses match to rounding).

    python benchmarks/bench_timm.py [--models resnet18 vit_tiny_patch16_224] [--steps 10]

Needs timm (and the torchvision it imports); not a dependency of pjrt_host.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

from bench_cold_start import fresh_process

CHILD = r"""
import json, sys, time
import torch, timm

name, mode, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.manual_seed(0)
kw = {"img_size": 64} if "vit" in name or "deit" in name else {}
model = timm.create_model(name, pretrained=False, num_classes=10, **kw)
device = "cpu" if mode == "cpu" else "jax"
model = model.to(device).train()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
g = torch.Generator().manual_seed(1)
xs = [torch.randn(4, 3, 64, 64, generator=g) for _ in range(2)]
ys = [torch.randint(0, 10, (4,), generator=g) for _ in range(2)]
forward = torch.compile(model, backend="jax") if mode == "compile" else model
losses, times = [], []
for i in range(steps):
    x, y = xs[i % 2].to(device), ys[i % 2].to(device)
    t = time.perf_counter()
    loss = torch.nn.functional.cross_entropy(forward(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())  # the host waits for the step
    times.append(time.perf_counter() - t)
print(json.dumps({"losses": losses, "times": times}))
"""

MODES = (("torch cpu", "cpu", {}), ("jax fused eager", "eager", {"PJRT_HOST_EAGER": "fused"}),
         ("jax op by op", "eager", {"PJRT_HOST_EAGER": "op"}), ("jax torch.compile", "compile", {}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["resnet18", "vit_tiny_patch16_224"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=4, help="steps left out of the steady median")
    args = parser.parse_args()
    for name in args.models:
        rows = {}
        for label, mode, env in MODES:
            with tempfile.TemporaryDirectory() as cache:
                rows[label] = fresh_process(CHILD, [name, mode, str(args.steps)], {**env, "PJRT_HOST_CACHE_DIR": cache})
        cpu, compiled = rows["torch cpu"], rows["jax torch.compile"]
        steady = {k: statistics.median(r["times"][args.warmup:]) for k, r in rows.items()}
        print(f"\n{name}: {args.steps} steps, steady = median of steps {args.warmup + 1}-{args.steps}")
        print(f"{'run':20s} {'first':>9s} {'steady':>10s} {'vs cpu':>7s} {'vs compiled':>12s} {'loss vs cpu':>12s}")
        for label, r in rows.items():
            diff = max(abs(a - b) for a, b in zip(r["losses"], cpu["losses"]))
            print(f"{label:20s} {r['times'][0]:8.2f}s {steady[label] * 1e3:8.1f}ms "
                  f"{steady[label] / steady['torch cpu']:6.2f}x {steady[label] / steady['jax torch.compile']:11.2f}x "
                  f"{diff:12.1e}")
        assert compiled["losses"], "no compiled steps"


if __name__ == "__main__":
    main()
