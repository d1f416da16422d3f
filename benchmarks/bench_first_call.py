"""First call vs steady state, per op: what a program pays the first time it
meets a new shape on 'jax' (an XLA compile of the op's program), beside the
same call once compiled and beside torch CPU, all in one run.

Each op runs on a sequence of shapes it has not seen yet in this process
(sizes ``base + i``), so every first call compiles; the steady-state time
is the same call repeated on its last shape.  PyTorch's own device-generic
tests meet new shapes at almost every call, which is why they run 30-100x
slower on 'jax' than on CPU.

    python benchmarks/bench_first_call.py [--shapes 4]
"""

from __future__ import annotations

import argparse
import time

import torch

import pjrt_host  # noqa: F401


def _ops():
    def rand(n, d):
        return lambda: torch.rand(n, 4, 5, device=d)

    def randint(n, d):
        return lambda: torch.randint(0, 3, (n,), device=d)

    def add(n, d):
        a, b = torch.ones(n, 4, 5, device=d), torch.ones(n, 4, 5, device=d)
        return lambda: a + b

    def matmul(n, d):
        a, b = torch.ones(n, 16, device=d), torch.ones(16, n, device=d)
        return lambda: a @ b

    def sum_dim(n, d):
        a = torch.ones(n, 4, 5, device=d)
        return lambda: a.sum(1)

    def index_select(n, d):
        a, i = torch.ones(n + 3, 5, device=d), torch.zeros(n, dtype=torch.long, device=d)
        return lambda: a.index_select(0, i)

    def sort(n, d):
        a = torch.arange(n * 5, 0, -1, device=d, dtype=torch.float32)
        return lambda: a.sort()

    def index_reduce(n, d):
        dest, src = torch.ones(3, 4, 5, device=d), torch.ones(n, 4, 5, device=d)
        idx = torch.zeros(n, dtype=torch.long, device=d)
        return lambda: dest.index_reduce(0, idx, src, "prod")

    return dict(rand=rand, randint=randint, add=add, matmul=matmul, sum_dim=sum_dim, index_select=index_select,
                sort=sort, index_reduce=index_reduce)


def _sync(d):
    if d == "jax":
        torch.jax.synchronize()


def _timed(fn, d):
    t = time.perf_counter()
    out = fn()
    _sync(d)
    del out
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=int, default=4, help="new shapes per op")
    args = parser.parse_args()
    print(f"{'op':14s} {'jax first (ms)':>15s} {'jax steady (us)':>16s} {'cpu (us)':>9s} {'first/steady':>13s}")
    for k, (name, make) in enumerate(_ops().items()):
        firsts, steady, cpu = [], None, None
        for i in range(args.shapes):
            n = 7 + 10 * k + i  # sizes no other op here uses
            fn = make(n, "jax")
            firsts.append(_timed(fn, "jax"))
            if i == args.shapes - 1:
                steady = min(_timed(fn, "jax") for _ in range(20))
                c = make(n, "cpu")
                cpu = min(_timed(c, "cpu") for _ in range(20))
        first = sorted(firsts)[len(firsts) // 2]
        print(f"{name:14s} {first * 1e3:15.1f} {steady * 1e6:16.1f} {cpu * 1e6:9.1f} {first / steady:13.0f}")


if __name__ == "__main__":
    main()
