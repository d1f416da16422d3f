"""Lowering quality at XLA's limit: a training step (forward + backward)
compiled with ``torch.compile(backend='jax')`` against the same network
hand-written in ``jax.numpy`` / ``lax`` and run as one
``jax.jit(jax.value_and_grad(...))``, on the same device, in the same run; and the last of
those again as two programs (forward with the vjp's residuals, then backward), the structure
torch.compile's forward and backward graphs have.

- ResNet-18 (convolutions, batch norm in training mode with its running
  statistics updated, max pooling, a linear head, cross entropy);
- a GPT-2-style block (layer norms, causal self-attention through
  ``scaled_dot_product_attention``, a tanh-GELU MLP, residuals).

Both sides compute the same function from the same parameters: each
benchmark first checks that the losses and one gradient agree, so a ratio
compares two ways of running one network.  Goal (issue 19): compiled torch
<= 1.1x hand-written JAX.

    python benchmarks/bench_lowering.py [--rounds 5] [--steps 5] [--only resnet|block]
"""

from __future__ import annotations

import argparse
import copy
import math
import time

import torch
import torch.nn.functional as F

import pjrt_host
import pjrt_host._runtime
from bench_compile import Block  # the GPT-2 decoder block bench_compile times

nn = torch.nn


# ---------------------------------------------------------------- ResNet-18 (torch)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    """torchvision's resnet18, written out (torchvision is not a dependency)."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        x = self.layers(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# ---------------------------------------------------------------- ResNet-18 (jax)


def jax_resnet(jnp, lax, matmul_positions=0):
    """The network in jax; convolutions with at most ``matmul_positions``
    output positions per image are written as patches x kernel (the form the
    plugin's ``conv_as_matmul_max_positions`` asks of pjrt_host)."""
    def conv(x, w, stride, pad):
        n, c, h, _ = x.shape
        o, _, k, _ = w.shape
        ho = (h + 2 * pad - k) // stride + 1
        if k > 1 and ho * ho <= matmul_positions:
            xp = jnp.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
            taps = [xp[:, :, i:i + stride * (ho - 1) + 1:stride, j:j + stride * (ho - 1) + 1:stride]
                    for i in range(k) for j in range(k)]
            patches = jnp.stack(taps, axis=2).reshape(n, c * k * k, ho * ho)
            return jnp.einsum("ok,nkp->nop", w.reshape(o, c * k * k), patches).reshape(n, o, ho, ho)
        return lax.conv_general_dilated(x, w, (stride, stride), [(pad, pad), (pad, pad)],
                                        dimension_numbers=("NCHW", "OIHW", "NCHW"))

    def bn(x, p, name, stats):
        mean = x.mean((0, 2, 3))
        var = x.var((0, 2, 3))
        n = x.size // x.shape[1]
        stats[name + ".running_mean"] = 0.9 * p[name + ".running_mean"] + 0.1 * mean
        stats[name + ".running_var"] = 0.9 * p[name + ".running_var"] + 0.1 * var * n / (n - 1)
        inv = lax.rsqrt(var + 1e-5) * p[name + ".weight"]
        return (x - mean[None, :, None, None]) * inv[None, :, None, None] + p[name + ".bias"][None, :, None, None]

    def block(x, p, name, stride, stats):
        out = jnp.maximum(bn(conv(x, p[name + ".conv1.weight"], stride, 1), p, name + ".bn1", stats), 0)
        out = bn(conv(out, p[name + ".conv2.weight"], 1, 1), p, name + ".bn2", stats)
        if name + ".down.0.weight" in p:
            x = bn(conv(x, p[name + ".down.0.weight"], stride, 0), p, name + ".down.1", stats)
        return jnp.maximum(out + x, 0)

    def loss(params, buffers, x, y):
        p = {**params, **buffers}
        stats: dict = {}
        h = jnp.maximum(bn(conv(x, p["conv1.weight"], 2, 3), p, "bn1", stats), 0)
        h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 1, 3, 3), (1, 1, 2, 2), [(0, 0), (0, 0), (1, 1), (1, 1)])
        for i, stride in enumerate((1, 2, 2, 2)):
            h = block(h, p, f"layers.{i}.0", stride, stats)
            h = block(h, p, f"layers.{i}.1", 1, stats)
        logits = h.mean((2, 3)) @ p["fc.weight"].T + p["fc.bias"]
        logp = logits - jax_logsumexp(jnp, logits)
        return -jnp.take_along_axis(logp, y[:, None], 1).mean(), stats

    return loss


def jax_logsumexp(jnp, x):
    m = x.max(-1, keepdims=True)
    return m + jnp.log(jnp.exp(x - m).sum(-1, keepdims=True))


# ---------------------------------------------------------------- GPT-2 block (jax; torch's is bench_compile.Block)


def jax_block(jnp, heads):
    def ln(x, p, name):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + 1e-5) * p[name + ".weight"] + p[name + ".bias"]

    def lin(x, p, name):
        return x @ p[name + ".weight"].T + p[name + ".bias"]

    def loss(params, buffers, x, y):
        p = params
        b, t, c = x.shape
        d = c // heads
        q, k, v = jnp.split(lin(ln(x, p, "ln1"), p, "qkv"), 3, axis=2)
        q, k, v = (z.reshape(b, t, heads, d).transpose(0, 2, 1, 3) for z in (q, k, v))
        s = (q @ k.transpose(0, 1, 3, 2)) / math.sqrt(d)
        s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -jnp.inf)
        s = s - s.max(-1, keepdims=True)
        w = jnp.exp(s)
        a = (w / w.sum(-1, keepdims=True)) @ v
        h = x + lin(a.transpose(0, 2, 1, 3).reshape(b, t, c), p, "proj")
        g = lin(ln(h, p, "ln2"), p, "fc")
        g = 0.5 * g * (1 + jnp.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
        out = h + lin(g, p, "out")
        return ((out - y) ** 2).mean(), {}

    return loss


# ---------------------------------------------------------------- running both


def _compare(name, model, x, y, torch_loss, jax_loss_fns, rounds, steps):
    import jax
    import numpy as np

    from pjrt_host._torch._tensor import read

    model = model.to("jax")
    xj, yj = x.to("jax"), y.to("jax")

    def torch_step(x, y):
        loss = torch_loss(model(x), y)
        loss.backward()
        return loss

    compiled = torch.compile(torch_step, backend="jax")

    def run_torch():
        for p in model.parameters():
            p.grad = None
        loss = compiled(xj, yj)
        torch.jax.synchronize()
        return loss

    params = {k: read(v.detach()) for k, v in model.named_parameters()}
    buffers = {k: read(v) for k, v in model.named_buffers() if "num_batches" not in k}
    xa, ya = read(xj), read(yj)
    cpu_model = copy.deepcopy(model).to("cpu")

    def run_cpu():
        for p in cpu_model.parameters():
            p.grad = None
        torch_loss(cpu_model(x), y).backward()

    def jax_runner(fn):
        grad_step = jax.jit(jax.value_and_grad(fn, has_aux=True))

        def run_jax():
            (loss, stats), grads = grad_step(params, buffers, xa, ya)
            jax.block_until_ready((loss, grads, stats))
            return loss, grads

        return run_jax

    def jax_split_runner(fn):
        # torch.compile's structure, written in JAX: the forward (with the
        # vjp's residuals as outputs) and the backward as two programs.
        fwd = jax.jit(lambda params, buffers, x, y: jax.vjp(lambda p: fn(p, buffers, x, y), params, has_aux=True))
        bwd = jax.jit(lambda pullback, ct: pullback(ct)[0])

        def run_jax():
            loss, pullback, stats = fwd(params, buffers, xa, ya)
            grads = bwd(pullback, jax.numpy.ones_like(loss))
            jax.block_until_ready((loss, grads, stats))
            return loss, grads

        return run_jax

    split = {f"{label}, as two programs": fn for label, fn in list(jax_loss_fns.items())[-1:]}
    runs = {"torch": run_torch, "torch CPU eager": run_cpu}
    runs.update({label: jax_runner(fn) for label, fn in jax_loss_fns.items()})
    runs.update({label: jax_split_runner(fn) for label, fn in split.items()})
    jax_loss_fns = {**jax_loss_fns, **split}
    t0 = time.perf_counter()
    torch_value = run_torch().item()
    t_compile_torch = time.perf_counter() - t0
    first = next(iter(params))
    got = np.asarray(read(dict(model.named_parameters())[first].grad))
    for label in jax_loss_fns:
        jax_value, jax_grads = runs[label]()
        want = np.asarray(jax_grads[first])
        grad_err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-12))
        assert abs(torch_value - float(jax_value)) <= 1e-3 * max(1.0, abs(float(jax_value))), (torch_value, jax_value)
        assert grad_err < 1e-2, grad_err
    run_cpu()

    best = {label: float("inf") for label in runs}
    for _ in range(rounds):  # interleaved rounds, best of each
        for label, fn in runs.items():
            t = time.perf_counter()
            for _ in range(steps):
                fn()
            best[label] = min(best[label], (time.perf_counter() - t) / steps)
    print(f"{name}: loss {torch_value:.5f} (jax {float(jax_value):.5f}), {first} grad rel. err {grad_err:.1e}; "
          f"first call of the compiled step {t_compile_torch:.1f} s")
    print(f"  fwd+bwd step, torch.compile(backend='jax'): {best['torch'] * 1e3:.2f} ms; torch CPU eager "
          f"{best['torch CPU eager'] * 1e3:.2f} ms")
    for label in jax_loss_fns:
        print(f"  hand-written jax.jit ({label}): {best[label] * 1e3:.2f} ms; torch.compile / it "
              f"{best['torch'] / best[label]:.2f} (goal <= 1.1)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--image", type=int, default=64)
    parser.add_argument("--only", choices=("resnet", "block"))
    args = parser.parse_args()
    import jax.numpy as jnp
    from jax import lax

    torch.manual_seed(0)
    if args.only in (None, "resnet"):
        x = torch.randn(args.batch, 3, args.image, args.image)
        y = torch.randint(0, 1000, (args.batch,))
        positions = int(getattr(pjrt_host._runtime.plugin(), "conv_as_matmul_max_positions", 0) or 0)
        fns = {"lax.conv everywhere": jax_resnet(jnp, lax)}
        if positions:
            fns[f"convolutions of <= {positions} positions as matmuls, as the plugin asks"] = \
                jax_resnet(jnp, lax, positions)
        _compare(f"ResNet-18 (batch {args.batch}, {args.image}x{args.image})", ResNet18(), x, y, F.cross_entropy,
                 fns, args.rounds, args.steps)
    if args.only in (None, "block"):
        width, heads = 256, 4
        x = torch.randn(8, 128, width)
        y = torch.randn(8, 128, width)
        _compare(f"GPT-2 block (batch 8, 128 tokens, width {width}, {heads} heads)", Block(width, heads), x, y,
                 F.mse_loss, {"jnp": jax_block(jnp, heads)}, args.rounds, args.steps)


if __name__ == "__main__":
    main()
