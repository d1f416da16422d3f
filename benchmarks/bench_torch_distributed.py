"""torch.distributed on 'jax' tensors (the 'pjrt' backend) against the same
XLA collective called directly from jax on the same arrays, in the same run:
all_reduce bus bandwidth of 64 MB float32 tensors, and a DDP training step
against the same step written as one jitted data-parallel program and
against the same eager step with pjrt_host.spmd data parallelism (one
process over as many devices, printed first).

    python benchmarks/bench_torch_distributed.py [--nproc 2] [--mbytes 64] [--iters 20]

Launches itself on --nproc processes (python -m pjrt_host launch) on the
selected plugin; rank 0 prints the figures.  Bus bandwidth is torch's
definition for all-reduce: 2 (n - 1) / n x bytes / time.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def _timed(fn, sync, iters):
    fn()
    sync()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t) / iters)
    return best


def worker(mbytes: int, iters: int) -> None:
    import jax
    import jax.numpy as jnp
    import torch
    import torch.distributed as dist
    from jax.sharding import NamedSharding, PartitionSpec

    from pjrt_host._torch import _c10d, _tensor

    dist.init_process_group()
    r, n = dist.get_rank(), dist.get_world_size()
    numel = mbytes * 2**20 // 4
    x = torch.ones(numel, device="jax") * (r + 1)
    sync = torch.jax.synchronize
    t_dist = _timed(lambda: dist.all_reduce(x), sync, iters)

    # The same collective from jax: one jitted sum over a global array whose
    # shards are each process's array (what XLA emits for a psum).
    pg = dist.group.WORLD
    engine = pg._engine(x) if isinstance(pg, _c10d.ProcessGroupJax) else None
    mesh = engine.mesh
    local = _tensor.read(x)
    reduce = jax.jit(lambda g: jnp.sum(g, axis=0), out_shardings=NamedSharding(mesh, PartitionSpec()))

    def direct():
        g = jax.make_array_from_single_device_arrays((n, numel), NamedSharding(mesh, PartitionSpec("ranks")),
                                                     [local[None]])
        return reduce(g)

    holder = {}
    t_jax = _timed(lambda: holder.__setitem__("r", direct()), lambda: holder["r"].block_until_ready(), iters)

    # DDP step vs one jitted data-parallel step of the same MLP.
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024)).to("jax"))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(32, 1024).to("jax")

    def ddp_step():
        opt.zero_grad()
        model(batch).square().mean().backward()
        opt.step()

    t_ddp = _timed(ddp_step, sync, max(2, iters // 4))
    params = [_tensor.read(p.detach()) for p in model.module.parameters()]
    xb = _tensor.read(batch)
    repl = NamedSharding(mesh, PartitionSpec())

    def loss(ps, xl):
        w1, b1, w2, b2 = ps
        return jnp.mean(jnp.square(jax.nn.gelu(xl @ w1.T + b1, approximate=False) @ w2.T + b2))

    @jax.jit
    def grads_of(ps, g):
        per = jax.vmap(jax.grad(loss), in_axes=(None, 0))(ps, g)  # a gradient per rank's batch
        return [jnp.mean(p, axis=0) for p in per]

    sgd = jax.jit(lambda ps, gs: [p - 0.01 * g for p, g in zip(ps, gs)])
    state = {"ps": params}

    def jax_step():
        g = jax.make_array_from_single_device_arrays((n, *xb.shape), NamedSharding(mesh, PartitionSpec("ranks")),
                                                     [xb[None]])
        ps_global = [jax.make_array_from_single_device_arrays(p.shape, repl, [p]) for p in state["ps"]]
        new = sgd(ps_global, grads_of(ps_global, g))
        state["ps"] = [p.addressable_data(0) for p in new]

    t_spmd = _timed(jax_step, lambda: state["ps"][0].block_until_ready(), max(2, iters // 4))
    if r == 0:
        size = numel * 4
        bus = 2 * (n - 1) / n * size
        print(f"plugin devices: {jax.devices()[0].device_kind} x {n} processes")
        print(f"all_reduce {mbytes} MB float32: torch.distributed {t_dist * 1e3:.2f} ms "
              f"({bus / t_dist / 1e9:.2f} GB/s bus), jax direct {t_jax * 1e3:.2f} ms ({bus / t_jax / 1e9:.2f} GB/s bus); "
              f"ratio (bandwidth) {t_jax / t_dist:.2f}")
        print(f"DDP step (1024-wide MLP, batch 32/rank): {t_ddp * 1e3:.2f} ms; one jitted data-parallel step: "
              f"{t_spmd * 1e3:.2f} ms; ratio {t_ddp / t_spmd:.2f}")
    dist.destroy_process_group()


def spmd_worker(nproc: int, iters: int) -> None:
    """The same DDP step with pjrt_host.spmd data parallelism: one process
    over ``nproc`` devices, parameters replicated, the batch split."""
    import numpy as np
    import torch

    import pjrt_host.spmd as xs

    mesh = xs.Mesh(np.arange(nproc), (nproc,), ("data",))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024)).to("jax")
    for p in model.parameters():
        xs.mark_sharding(p, mesh, ())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(32 * nproc, 1024).to("jax")
    xs.mark_sharding(batch, mesh, ("data", None))

    def step():
        opt.zero_grad()
        model(batch).square().mean().backward()
        opt.step()

    t = _timed(step, torch.jax.synchronize, max(2, iters // 4))
    print(f"SPMD_STEP_MS {t * 1e3:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--mbytes", type=int, default=64)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--spmd-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.mbytes, args.iters)
        return
    if args.spmd_worker:
        spmd_worker(args.nproc, args.iters)
        return
    env = dict(os.environ)
    env.setdefault("PJRT_DEVICE", "cpu_ref")
    spmd_env = dict(env, PJRT_HOST_CPU_REF_DEVICES=str(args.nproc))
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--spmd-worker", "--nproc", str(args.nproc),
                          "--iters", str(args.iters)], env=spmd_env, capture_output=True, text=True)
    spmd_ms = [line.split()[1] for line in out.stdout.splitlines() if line.startswith("SPMD_STEP_MS")]
    print(f"the same step with pjrt_host.spmd data parallelism (one process, {args.nproc} devices): "
          f"{spmd_ms[0] if spmd_ms else 'failed: ' + out.stderr[-500:]} ms", flush=True)
    sys.exit(subprocess.call([sys.executable, "-m", "pjrt_host", "launch", "--nproc-per-node", str(args.nproc),
                              os.path.abspath(__file__), "--worker", "--mbytes", str(args.mbytes), "--iters",
                              str(args.iters)], env=env))


if __name__ == "__main__":
    main()
