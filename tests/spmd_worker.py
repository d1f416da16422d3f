"""The program each process of tests/test_spmd.py's multi-process test runs
(``python -m pjrt_host launch --nproc-per-node 2 tests/spmd_worker.py OUTDIR``
with ``PJRT_HOST_CPU_REF_DEVICES=4``): one mesh over both processes' devices,
a global tensor from each process's rows, data-parallel training on it.
Writes OUTDIR/rank<R>.txt; the test checks both files are the same."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

import pjrt_host.distributed as dist
import pjrt_host.spmd as xs


def main(outdir: str) -> None:
    dist.initialize()
    rank, nproc = dist.process_index(), dist.process_count()
    n = xs.global_device_count()
    assert torch.jax.device_count() == n // nproc, (torch.jax.device_count(), n)
    mesh = xs.get_1d_mesh("data")
    out = [str(n)]

    # One global (16, 4) tensor: each process contributes its 8 rows.
    whole = torch.arange(64, dtype=torch.float32).reshape(16, 4)
    local = whole[rank * 8:(rank + 1) * 8]
    t = xs.make_global_tensor(local, mesh, ("data", None))
    assert tuple(t.shape) == (16, 4) and xs.get_partition_spec(t) == ("data", None)
    assert len(xs.jax_array(t).addressable_shards) == n // nproc
    assert torch.equal(t.cpu(), whole), "the global tensor gathers to the whole"
    out.append(f"{(t * 2).sum().item():.6g}")
    # a tensor this process holds whole meets the global one
    out.append(f"{(t + torch.ones(16, 4).to('jax')).sum().item():.6g}")
    out.append(f"{(t @ torch.ones(4, 2).to('jax')).cpu().sum().item():.6g}")

    # Data-parallel training, batch split over the processes, against one device.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)
    ref = copy.deepcopy(model).to("jax")
    dp = copy.deepcopy(model).to("jax")
    for p in dp.parameters():
        xs.mark_sharding(p, mesh, ())
    xg = xs.make_global_tensor(x[rank * 8:(rank + 1) * 8], mesh, ("data", None))
    yg = xs.make_global_tensor(y[rank * 8:(rank + 1) * 8], mesh, ("data", None))
    for m, xb, yb in ((ref, x.to("jax"), y.to("jax")), (dp, xg, yg)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        losses = []
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(m(xb), yb)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        out.append(",".join(f"{v:.5f}" for v in losses))
    for p, q in zip(dp.parameters(), ref.parameters()):
        assert xs.get_sharding(p) is not None
        torch.testing.assert_close(p.detach().cpu(), q.detach().cpu(), rtol=1e-4, atol=1e-5)
    assert out[-1] == out[-2], out
    Path(outdir, f"rank{rank}.txt").write_text(" ".join(out) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
