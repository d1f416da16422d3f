"""Per-op eager cost on the 'jax' device against plain JAX's own eager
dispatch of the same op at the same sizes, in the same process; prints the
ratio (1.00 = as fast as jax eager).

    python benchmarks/bench_eager.py [--sizes 16 256 1024] [--calls 500]

The first figures are the fixed cost per op: ``x * 1.0001 + 0.0001`` on 128
floats (two ops, too small for the arithmetic to matter), each call
reading the last one's result (a chain: a result nobody reads is still
computed, but a loop of independent calls measures the replay of one-op
segments, not a chain's), measured as
interleaved minimums: the device and plain jax alternate for several rounds
and each keeps its best round, so load on the machine hits both alike.  It
is measured op by op and in fused eager, where 500 calls in a row are a
chain of 1000 recorded ops that run as segments of the repeated block (the
issue's "chain of 100 small elementwise ops").  The table after it is op by
op.
"""

from __future__ import annotations

import argparse
import time

import torch

import pjrt_host  # noqa: F401  (the device, even with autoload off)


def per_call(fn, sync, n):
    for _ in range(20):
        fn()
    sync(fn())
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            r = fn()
        sync(r)
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e6


def fixed_cost(rounds: int, calls: int, eager: str) -> tuple[float, float]:
    """(device us, jax us) per ``x * 1.0001 + 0.0001`` on 128 floats, each
    the minimum over interleaved rounds; the device in eager mode
    ``eager``."""
    import jax
    import jax.numpy as jnp

    x_t = torch.randn(128, device="jax")
    x_j = jax.device_put(jnp.asarray(x_t.cpu().numpy()), pjrt_host.devices()[0])

    def round_of(fn, x) -> float:
        with pjrt_host.config(eager=eager):
            t = time.perf_counter()
            r = x
            for _ in range(calls):  # each call reads the last one's result: a chain
                r = fn(r)
            jax.block_until_ready(r if not isinstance(r, torch.Tensor) else None)
            torch.jax.synchronize()
            return (time.perf_counter() - t) / calls * 1e6

    def step(v):
        return v * 1.0001 + 0.0001

    for _ in range(3):
        round_of(step, x_t), round_of(step, x_j)
    best_t = best_j = float("inf")
    for _ in range(rounds):
        best_t = min(best_t, round_of(step, x_t))
        best_j = min(best_j, round_of(step, x_j))
    return best_t, best_j


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 256, 1024])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds of the fixed-cost case")
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp

    torch.zeros(1, device="jax")  # creates the client, enables x64 as the device does

    for eager in ("op", "fused"):
        t_dev, t_jax = fixed_cost(args.rounds, 500, eager)
        print(f"fixed cost, x * 1.0001 + 0.0001 on 128 floats (interleaved minimums), {eager:5s}: "
              f"device {t_dev:.1f} us, jax eager {t_jax:.1f} us, ratio {t_dev / t_jax:.2f}")
    print()

    def sync_t(t):
        if isinstance(t, torch.Tensor):
            torch.jax.synchronize()

    def sync_j(x):
        jax.block_until_ready(x)

    print(f"{'op':18}{'size':>6}{'jax eager us':>14}{'jax device us':>15}{'ratio':>8}")
    ratios = []
    for n in args.sizes:
        calls = args.calls if n <= 256 else max(args.calls // 10, 20)
        a_t, b_t = torch.randn(n, n, device="jax"), torch.randn(n, n, device="jax")
        dev = pjrt_host.devices()[0]
        a_j = jax.device_put(jnp.asarray(a_t.cpu().numpy()), dev)
        b_j = jax.device_put(jnp.asarray(b_t.cpu().numpy()), dev)
        cases = [
            ("add", lambda: a_t + b_t, lambda: a_j + b_j),
            ("mul scalar", lambda: a_t * 2.0, lambda: a_j * 2.0),
            ("matmul", lambda: a_t @ b_t, lambda: jnp.matmul(a_j, b_j, precision="highest")),
            ("relu", lambda: torch.relu(a_t), lambda: jax.nn.relu(a_j)),
            ("exp", lambda: a_t.exp(), lambda: jnp.exp(a_j)),
            ("sum dim", lambda: a_t.sum(1), lambda: a_j.sum(1)),
            ("softmax", lambda: torch.softmax(a_t, -1), lambda: jax.nn.softmax(a_j, -1)),
            ("slice row", lambda: a_t[1], lambda: a_j[1]),
            ("transpose+add", lambda: a_t.t() + b_t, lambda: a_j.T + b_j),
            ("add_ in place", lambda: a_t.add_(b_t), lambda: a_j + b_j),
        ]
        for name, torch_fn, jax_fn in cases:
            tj = per_call(jax_fn, sync_j, calls)
            tt = per_call(torch_fn, sync_t, calls)
            ratios.append(tt / tj)
            print(f"{name:18}{n:6d}{tj:14.1f}{tt:15.1f}{tt / tj:8.2f}")
    ratios.sort()
    print(f"median ratio: {ratios[len(ratios) // 2]:.2f}")


if __name__ == "__main__":
    main()
