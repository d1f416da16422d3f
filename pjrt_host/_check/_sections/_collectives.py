"""The ``collectives`` section: pjrt_host.spmd collectives over the local
devices, and torch.distributed with spmd in two processes."""

from __future__ import annotations

from typing import Any

from ._recorder import Recorder, Skip
from ._support import close_to_cpu, plugin_record
from ._two_processes import launch_workers

__all__ = ["collectives"]


def collectives(rec: Recorder, name: str, quick: bool, **_: Any) -> None:
    import torch

    from pjrt_host import spmd

    n = torch.jax.device_count()
    with rec.check(f"all-reduce / all-gather / reduce-scatter over {n} local device(s) (pjrt_host.spmd)") as info:
        mesh = spmd.get_1d_mesh("x")
        base = torch.arange(n * 8.0).reshape(n * 2, 4)
        t = base.to("jax")
        spmd.mark_sharding(t, mesh, ("x", None))
        close_to_cpu(torch, t.sum(), base.sum(), "all-reduce (sum of a sharded tensor)")
        gathered = t * 1.0
        spmd.mark_sharding(gathered, mesh, (None, None))
        close_to_cpu(torch, gathered, base, "all-gather (replicating a sharded tensor)")
        rows = torch.arange(n * 4.0 * n).reshape(n, 4 * n)
        r = rows.to("jax")
        spmd.mark_sharding(r, mesh, ("x", None))
        scattered = spmd.with_sharding_constraint(r.sum(0), mesh, ("x",))
        close_to_cpu(torch, scattered, rows.sum(0), "reduce-scatter (sum over the sharded dim, result sharded)")
        info["detail"] = f"{n} device(s): values as torch CPU"

    chips = plugin_record(name).plugin.physical_chip_count()
    with rec.check("2 processes: torch.distributed and pjrt_host.spmd collectives") as info:
        result = launch_workers("collectives", timeout=300 if quick else 600)
        if "error" in result:
            if chips < 2:
                raise Skip(f"2 processes on a host with {chips} device(s) did not start: {result['error']}")
            raise AssertionError(result["error"])
        ranks = result["ranks"]
        info["detail"] = (f"world of 2, backend {ranks['0'].get('backend')!r}: all_reduce, all_gather_into_tensor, "
                          "reduce_scatter_tensor, broadcast; spmd sum over both processes' devices")
