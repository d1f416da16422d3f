"""Vision models at changing batch sizes (the last batch of an epoch, a
serving queue's batches): convolutions, poolings and batch norm run padded
along the batch (docs/dynamic-shapes.md, "Which ops run padded").

Each model (random weights, nothing downloaded) runs at the batch sizes
given (the default: 2, 3, 5, 7, 6, 4, 9, 11, 13, 10: from the third size on
the batch is dynamic, and every size after it falls in the bucket of 16),
inference and training (SGD):
- ``cnn``: conv, batch norm, ReLU, max pool, conv, avg pool, adaptive avg
  pool, linear (images 32x32);
- ``vit``: transformers' ViT (2 layers, width 64, patches of 8 on 32x32);
- ``swin``, ``mobilevit``, ``segformer``: transformers' Swin (windows of 4),
  MobileViT (every weight drawn at random: its initialisation zeroes the
  features at this size) and SegFormer's segmentation model (its map
  averaged into class logits), small configurations on 32x32.
torch CPU eager first, then 'jax' in the default eager mode, each in a
fresh process with an empty program cache, with dynamic shapes on and off.

It prints per row the programs each step compiled and the ratio that
matters: the median 'jax' step at the batch sizes after the third over
CPU's median step (every one of them is a new size for the exact run).

``--compile``: on 'jax', the forward (inference) and the forward and
backward (training) under ``torch.compile(backend='jax')``, SGD eager;
dynamo makes the batch symbolic at its second size, and a symbolic graph
runs one program per bucket of its sizes.

    python benchmarks/bench_dynamic_batches.py [--models cnn vit] [--batches 2,3,5,...] [--compile]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

MODELS = ("cnn", "vit", "swin", "mobilevit", "segformer")

#: The checkout this script is in: its children (``python -c``) import pjrt_host from
#: their working directory first, so they run there, and a benchmark measures its own tree.
TREE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import copy, json, sys, time
import torch
import torch.nn as nn
import torch.nn.functional as F

name, device, batches = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3].split(",")]
compiled = sys.argv[4] == "compile" and device != "cpu"


def make():
    torch.manual_seed(0)
    if name == "cnn":
        return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(16, 32, 3, stride=2), nn.BatchNorm2d(32), nn.ReLU(), nn.AvgPool2d(2),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    import transformers as t
    if name == "swin":
        model = t.SwinForImageClassification(t.SwinConfig(image_size=32, patch_size=2, embed_dim=16, depths=[1, 1],
                                                          num_heads=[2, 2], window_size=4, num_labels=10))
    elif name == "mobilevit":
        model = t.MobileViTForImageClassification(t.MobileViTConfig(
            image_size=32, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64], num_labels=10))
        with torch.no_grad():  # (its initialisation zeroes the features at this size)
            for p in model.parameters():
                p.normal_(0, 0.2)
    elif name == "segformer":  # the segmentation model, its map averaged into class logits
        model = t.SegformerForSemanticSegmentation(t.SegformerConfig(
            num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], num_attention_heads=[1, 2],
            decoder_hidden_size=32, num_labels=10))
        return lambda x: model(pixel_values=x).logits.mean((2, 3)), model
    else:
        model = t.ViTForImageClassification(t.ViTConfig(image_size=32, patch_size=8, hidden_size=64,
                                                        num_hidden_layers=2, num_attention_heads=4,
                                                        intermediate_size=128, num_labels=10))
    return lambda x: model(pixel_values=x).logits, model


built = make()
forward, model = built if isinstance(built, tuple) else (built, built)
model.to(device)
made = lambda: 0
if device == "jax":
    stats = torch.jax.program_cache_stats
    made = lambda: stats()["compiled"] + stats()["disk_hits"]
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def loss_backward(x, y):
    loss = F.cross_entropy(forward(x), y)
    loss.backward()
    return loss


def infer(x):
    return forward(x).sum()


if compiled:
    loss_backward = torch.compile(loss_backward, backend="jax")
    infer = torch.compile(infer, backend="jax")
g = torch.Generator().manual_seed(1)
rows = []
for train in (False, True):
    model.train(train)
    for b in batches:
        x = torch.randn(b, 3, 32, 32, generator=g).to(device)
        y = torch.randint(0, 10, (b,), generator=g).to(device)
        before = made()
        start = time.perf_counter()
        if train:
            loss = loss_backward(x, y)
            opt.step()
            opt.zero_grad()
            value = float(loss)
        else:
            with torch.no_grad():
                value = float(infer(x))
        rows.append({"train": train, "batch": b, "seconds": time.perf_counter() - start,
                     "programs": made() - before, "value": value})
extra = {}
if device == "jax":
    s = torch.jax.dynamic_shape_stats()
    extra = {"cuts": s["cuts_by_op"], "fallbacks": s["fallbacks_by_reason"]}
print("RESULT " + json.dumps({"rows": rows, **extra}))
"""


def run(name: str, device: str, batches: list[int], dynamic: str, compiled: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, PJRT_HOST_CACHE_DIR=cache, PJRT_HOST_DYNAMIC_SHAPES=dynamic)
        out = subprocess.run([sys.executable, "-c", CHILD, name, device, ",".join(map(str, batches)),
                              "compile" if compiled else "eager"], cwd=TREE,
                             capture_output=True, text=True, env=env, timeout=1800)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{name} on {device} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--batches", default="2,3,5,7,6,4,9,11,13,10")
    parser.add_argument("--compile", action="store_true", help="the forward and backward under torch.compile")
    args = parser.parse_args()
    batches = [int(x) for x in args.batches.split(",")]
    for name in args.models:
        cpu = run(name, "cpu", batches, "1")
        for dynamic in ("1", "0"):
            dev = run(name, "jax", batches, dynamic, args.compile)
            for train in (False, True):
                c = [r for r in cpu["rows"] if r["train"] == train]
                d = [r for r in dev["rows"] if r["train"] == train]
                later_cpu = statistics.median(r["seconds"] for r in c[3:])
                later = statistics.median(r["seconds"] for r in d[3:])
                diff = max(abs(a["value"] - b["value"]) / max(1.0, abs(b["value"])) for a, b in zip(d, c))
                print(f"{name} {'training' if train else 'inference'}{', compiled' if args.compile else ''}, dynamic shapes {'on' if dynamic == '1' else 'off'}: "
                      f"programs per batch {[r['programs'] for r in d]}; batches after the third: median "
                      f"{later * 1e3:.1f} ms against CPU's {later_cpu * 1e3:.1f} ms ({later / later_cpu:.1f}x); "
                      f"largest relative difference from CPU {diff:.1e}")
            if dynamic == "1":
                print(f"{name}: cuts {dev['cuts']}, fallbacks {dev['fallbacks']}")


if __name__ == "__main__":
    main()
