"""Per-op eager cost on the 'jax' device against plain JAX's own eager
dispatch of the same op at the same sizes, in the same process; prints the
ratio (1.00 = as fast as jax eager).

    python benchmarks/bench_eager.py [--sizes 16 256 1024] [--calls 500]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 256, 1024])
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp

    torch.zeros(1, device="jax")  # creates the client, enables x64 as the device does

    def sync_t(t):
        if isinstance(t, torch.Tensor):
            torch.jax.synchronize()
            from pjrt_host._torch import _dispatch

            _dispatch.read(t).block_until_ready()

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
