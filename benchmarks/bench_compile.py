"""torch.compile(backend='jax') against hand-written JAX on the same weights,
measured in one run (interleaved rounds, the best round of each):

(a) MLP inference, batch 64, width 512, depth 4: time ratio to ``jax.jit``;
(b) the same MLP at batch 1, width 64: the fixed per-call cost in us above
    ``jax.jit``'s;
(c) a training step of (a)'s MLP (forward, loss, backward, AdamW): time
    ratio to one ``jax.jit`` of ``value_and_grad`` + an AdamW update;
(d) a stack of GPT-2-sized decoder blocks (width 768, 12 heads), forward +
    backward: compiled 'jax' against torch CPU eager and inductor on CPU.

    python benchmarks/bench_compile.py [--rounds 5] [--layers 2] [--seq 128] [--no-inductor]
"""

from __future__ import annotations

import argparse
import math
import time

import torch

import pjrt_host  # noqa: F401  (the device, even with autoload off)
from pjrt_host._compile import _door

nn = torch.nn


def best_per_call(fns: dict, calls: int, rounds: int) -> dict:
    """Per-call seconds of each fn (which returns something to wait on),
    rounds interleaved so that machine noise hits all alike."""
    best = {k: float("inf") for k in fns}
    for fn in fns.values():  # warm up (compiles)
        for _ in range(3):
            fn()
    for _ in range(rounds):
        for k, fn in fns.items():
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            best[k] = min(best[k], (time.perf_counter() - t) / calls)
    return best


def block(x):
    """Wait for a torch 'jax' tensor, a CPU tensor or jax arrays."""
    import jax

    if isinstance(x, torch.Tensor):
        if x.device.type == "jax":
            _door.storage_of(x)[1].block_until_ready()
        return x
    return jax.block_until_ready(x)


# ------------------------------------------------------------ MLP


def make_mlp(width: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = []
    for i in range(depth):
        layers.append(nn.Linear(width, width))
        if i < depth - 1:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def jax_params(model: nn.Module) -> list:
    """The model's weights as the jax arrays the 'jax' tensors hold (no copy)."""
    return [(_door.storage_of(m.weight)[1], _door.storage_of(m.bias)[1])
            for m in model if isinstance(m, nn.Linear)]


def jax_mlp(params, x):
    import jax
    import jax.numpy as jnp

    for i, (w, b) in enumerate(params):
        x = jnp.matmul(x, w.T, precision=jax.lax.Precision.HIGHEST) + b
        if i < len(params) - 1:
            x = jax.nn.relu(x)
    return x


def bench_inference(batch: int, width: int, depth: int, calls: int, rounds: int) -> tuple[float, float]:
    import jax

    torch.manual_seed(0)
    model = make_mlp(width, depth).to("jax")
    x = torch.randn(batch, width, device="jax")
    compiled = torch.compile(model, backend="jax", fullgraph=True)
    params = jax_params(model)
    xj = _door.storage_of(x)[1]
    jitted = jax.jit(jax_mlp)

    def run_torch():
        with torch.no_grad():
            return block(compiled(x))

    with torch.no_grad():
        got = compiled(x).cpu()
    want = torch.from_dlpack(jax.device_get(jitted(params, xj)).copy())
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    best = best_per_call({"jax.jit": lambda: block(jitted(params, xj)), "compiled": run_torch}, calls, rounds)
    return best["jax.jit"], best["compiled"]


def bench_training(batch: int, width: int, depth: int, calls: int, rounds: int) -> tuple[float, float]:
    import jax
    import jax.numpy as jnp

    torch.manual_seed(0)
    model = make_mlp(width, depth).to("jax")
    x = torch.randn(batch, width, device="jax")
    y = torch.randn(batch, width, device="jax")
    lr, betas, eps, wd = 1e-3, (0.9, 0.999), 1e-8, 0.01
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, eps=eps, weight_decay=wd)

    @torch.compile(backend="jax")
    def loss_of(x, y):
        return nn.functional.mse_loss(model(x), y)

    @torch.compile(backend="jax")
    def opt_step():
        opt.step()

    def torch_step():
        opt.zero_grad(set_to_none=True)
        loss = loss_of(x, y)
        loss.backward()
        opt_step()
        return block(loss)

    # Hand-written: params as a pytree, one jit of value_and_grad + AdamW.
    params = [(jnp.array(w), jnp.array(b)) for w, b in jax_params(model)]
    state = (jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.int32))
    xj, yj = _door.storage_of(x)[1], _door.storage_of(y)[1]

    def loss_fn(p, x, y):
        return jnp.mean((jax_mlp(p, x) - y) ** 2)

    @jax.jit
    def jax_step(p, state, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        m, v, t = state
        t = t + 1
        m = jax.tree.map(lambda m, g: betas[0] * m + (1 - betas[0]) * g, m, g)
        v = jax.tree.map(lambda v, g: betas[1] * v + (1 - betas[1]) * g * g, v, g)
        c1 = 1 - betas[0] ** t
        c2 = 1 - betas[1] ** t
        p = jax.tree.map(lambda p, m, v: p * (1 - lr * wd) - lr * (m / c1) / (jnp.sqrt(v / c2) + eps), p, m, v)
        return loss, p, (m, v, t)

    carry = [params, state]

    def run_jax():
        loss, carry[0], carry[1] = jax_step(carry[0], carry[1], xj, yj)
        return block(loss)

    best = best_per_call({"jax.jit": run_jax, "compiled": torch_step}, calls, rounds)
    return best["jax.jit"], best["compiled"]


# ------------------------------------------------------------ GPT-2 blocks


class Block(nn.Module):
    """A GPT-2 decoder block: pre-norm causal self-attention and a 4x GELU MLP."""

    def __init__(self, dim: int = 768, heads: int = 12) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.out(nn.functional.gelu(self.fc(self.ln2(x)), approximate="tanh"))


def bench_gpt2(layers: int, batch: int, seq: int, calls: int, rounds: int, inductor: bool) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(*[Block() for _ in range(layers)])
    x = torch.randn(batch, seq, 768)

    def step_for(m, inp):
        def step():
            for p in m.parameters():
                p.grad = None
            out = m(inp)
            out.square().mean().backward()
            return block(next(iter(m.parameters())).grad)
        return step

    jax_model = torch.compile(__import__("copy").deepcopy(model).to("jax"), backend="jax")
    fns = {"torch CPU eager": step_for(model, x), "compiled 'jax'": step_for(jax_model, x.to("jax"))}
    if inductor:
        fns["inductor CPU"] = step_for(torch.compile(__import__("copy").deepcopy(model)), x)
    return best_per_call(fns, calls, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--no-inductor", action="store_true")
    args = parser.parse_args()

    torch.zeros(1, device="jax")  # creates the client
    print(f"torch {torch.__version__}, device {pjrt_host.devices()[0]}")

    j, c = bench_inference(64, 512, 4, 50, args.rounds)
    print(f"(a) MLP inference b64 w512 d4: jax.jit {j * 1e6:9.1f} us  compiled {c * 1e6:9.1f} us  "
          f"ratio {c / j:5.3f}  (target <= 1.02)")
    j, c = bench_inference(1, 64, 4, 500, args.rounds)
    print(f"(b) MLP inference b1 w64 d4:   jax.jit {j * 1e6:9.1f} us  compiled {c * 1e6:9.1f} us  "
          f"extra {(c - j) * 1e6:6.1f} us  (target <= 20)")
    j, c = bench_training(64, 512, 4, 20, args.rounds)
    print(f"(c) MLP train step (AdamW):    jax.jit {j * 1e6:9.1f} us  compiled {c * 1e6:9.1f} us  "
          f"ratio {c / j:5.3f}  (target <= 1.15)")
    res = bench_gpt2(args.layers, args.batch, args.seq, 3, max(2, args.rounds // 2), not args.no_inductor)
    base = res["torch CPU eager"]
    print(f"(d) GPT-2 blocks x{args.layers} (768 wide, 12 heads), batch {args.batch}, seq {args.seq}, fw+bw:")
    for k, v in res.items():
        print(f"      {k:16} {v * 1e3:9.1f} ms   {base / v:5.2f}x torch CPU eager's speed")


if __name__ == "__main__":
    main()
