"""What each of the 2 processes of ``check``'s multi-process checks runs
(``python -m pjrt_host launch --nproc-per-node 2 -m pjrt_host._check._mp_worker
MODE OUTDIR [MiB]``).  Each rank writes OUTDIR/rank<R>.json; a failed
comparison is written there as ``error...`` before the rank exits non-zero.

MODE ``collectives``: torch.distributed collectives on 'jax' tensors (the
default backend for the device) and one pjrt_host.spmd sum over both
processes' devices, each checked against the value every rank can compute.
MODE ``bandwidth``: all_reduce bus bandwidth of a MiB-sized float32 tensor.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def _collectives(out: dict) -> None:
    import torch
    import torch.distributed as dist

    import pjrt_host.spmd as xs

    r, n = dist.get_rank(), dist.get_world_size()
    ranks = torch.arange(float(n))
    x = (torch.arange(4.0) + 10 * r).to("jax")
    dist.all_reduce(x)
    want = sum(torch.arange(4.0) + 10 * k for k in range(n))
    assert torch.equal(x.cpu(), want), f"all_reduce gave {x.cpu().tolist()}, expected {want.tolist()}"
    g = torch.empty(4 * n, device="jax")
    dist.all_gather_into_tensor(g, (torch.arange(4.0) + 10 * r).to("jax"))
    want = torch.cat([torch.arange(4.0) + 10 * k for k in range(n)])
    assert torch.equal(g.cpu(), want), f"all_gather_into_tensor gave {g.cpu().tolist()}"
    rs = torch.empty(2, device="jax")
    dist.reduce_scatter_tensor(rs, (torch.arange(2.0 * n) * (r + 1)).to("jax"))
    want = (torch.arange(2.0 * n) * (ranks + 1).sum())[2 * r:2 * r + 2]
    assert torch.equal(rs.cpu(), want), f"reduce_scatter_tensor gave {rs.cpu().tolist()}, expected {want.tolist()}"
    b = torch.full((3,), float(r), device="jax")
    dist.broadcast(b, src=n - 1)
    assert b.cpu().tolist() == [float(n - 1)] * 3, f"broadcast gave {b.cpu().tolist()}"
    dist.barrier()
    out["backend"] = str(dist.get_backend())

    mesh = xs.get_1d_mesh("data")
    devices = xs.global_device_count()
    whole = torch.arange(8.0 * devices).reshape(2 * devices, 4)
    per = whole.shape[0] // n
    t = xs.make_global_tensor(whole[r * per:(r + 1) * per], mesh, ("data", None))
    total = (t * 2).sum().item()
    assert total == float(whole.sum() * 2), f"spmd sum over {devices} devices gave {total}"
    out["spmd_devices"] = devices


def _bandwidth(out: dict, mib: int) -> None:
    import torch
    import torch.distributed as dist

    n = dist.get_world_size()
    x = torch.ones(mib * 2**20 // 4, device="jax")
    for _ in range(3):
        dist.all_reduce(x)
    torch.jax.synchronize()
    dist.barrier()
    steps = 10
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(steps):
            dist.all_reduce(x)
        torch.jax.synchronize()
        best = min(best, (time.perf_counter() - t0) / steps)
    nbytes = x.numel() * 4
    out["busbw_gbs"] = 2 * (n - 1) / n * nbytes / best / 1e9
    out["seconds_per_call"] = best


def main(argv: list[str]) -> int:
    import torch.distributed as dist

    mode, outdir = argv[0], Path(argv[1])
    dist.init_process_group()
    out: dict = {}
    rank = dist.get_rank()
    code = 0
    try:
        if mode == "collectives":
            _collectives(out)
        else:
            _bandwidth(out, int(argv[2]))
    except Exception as err:
        out["error"] = f"{type(err).__name__}: {err}"
        code = 1
    (outdir / f"rank{rank}.json").write_text(json.dumps(out))
    if code == 0:
        dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
