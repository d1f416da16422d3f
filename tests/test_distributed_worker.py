"""The program the processes of tests/test_distributed.py run (not a test
module: it defines no tests; pytest imports it and finds nothing).

    python tests/test_distributed_worker.py MODE OUTDIR

MODE:
  collectives   set up (``plain``: through pjrt_host.devices() alone), run
                every collective, write OUTDIR/rank<R>.json
  crash         rank 1 exits with code 7 once every rank is up; the others
                keep meeting at barriers and must be stopped
  broken        select a plugin whose configure_multiprocess raises
  spawn N       pjrt_host.spawn(collectives_fn, N)
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def _collectives(outdir: str, plain: bool = False) -> None:
    import pjrt_host
    import pjrt_host.distributed as dist

    if plain:
        devices = pjrt_host.devices()  # the runtime sets the process up by itself
    else:
        dist.initialize()
        devices = pjrt_host.devices()
    import jax
    import jax.numpy as jnp
    import numpy as np

    rank, n = dist.process_index(), dist.process_count()
    x = jnp.arange(3, dtype=jnp.float32) + 10.0 * rank
    result = {
        "rank": rank,
        "process_count": n,
        "world_size": dist.world_size(),
        "local_rank": dist.local_rank(),
        "local_world_size": dist.local_world_size(),
        "host_index": dist.host_index(),
        "host_count": dist.host_count(),
        "jax_process_index": jax.process_index(),
        "jax_process_count": jax.process_count(),
        "global_devices": len(jax.devices()),
        "local_devices": len(devices),
        "sum": np.asarray(dist.all_reduce(x, "sum")).tolist(),
        "mean": np.asarray(dist.all_reduce(x, "mean")).tolist(),
        "max": np.asarray(dist.all_reduce(jnp.int32(rank * 7 % 5), "max")).tolist(),
        "gather": np.asarray(dist.all_gather(jnp.array([rank, rank * rank], dtype=jnp.int32))).tolist(),
        "broadcast": np.asarray(dist.broadcast(x, src=n - 1)).tolist(),
        "wrapped": _wrapped_sum(dist, rank),
        **_torch_collectives(dist, rank),
    }
    dist.barrier("done", timeout=60)
    Path(outdir, f"rank{rank}.json").write_text(json.dumps(result))


class _Wrapped:
    """Stands in for a type that wraps a jax array (jax's protocol)."""

    def __init__(self, array) -> None:
        self._elem = array

    def __jax_array__(self):
        return self._elem

    @classmethod
    def from_jax(cls, array) -> "_Wrapped":
        return cls(array)


def _wrapped_sum(dist, rank: int) -> list:
    import jax.numpy as jnp
    import numpy as np

    out = dist.all_reduce(_Wrapped(jnp.full((2,), rank + 1, dtype=jnp.int32)), "sum")
    assert isinstance(out, _Wrapped), type(out)
    return np.asarray(out._elem).tolist()


def _torch_collectives(dist, rank: int) -> dict:
    """The same collectives on torch tensors of the 'jax' device."""
    import torch

    t = torch.arange(3, dtype=torch.float32, device="jax") + 10.0 * rank
    total = dist.all_reduce(t, "sum")
    gathered = dist.all_gather(torch.tensor([rank], device="jax"))
    return {
        "torch_sum": total.tolist(),
        "torch_sum_device": str(total.device),
        "torch_gather": gathered.tolist(),
        "torch_gather_dtype": str(gathered.dtype),
    }


def spawned(local_rank: int, outdir: str) -> None:
    _collectives(outdir)


def _crash() -> None:
    import pjrt_host.distributed as dist

    dist.initialize()
    dist.barrier("up", timeout=60)
    if dist.process_index() == 1:
        print("rank 1: crashing on purpose", flush=True)
        os._exit(7)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # a hang the launcher must end
        time.sleep(0.2)
    print(f"rank {dist.process_index()}: was not stopped", flush=True)


def _broken() -> None:
    import pjrt_host
    import pjrt_host.distributed as dist

    class BrokenMultiprocess(pjrt_host.DevicePlugin):
        def configure_multiprocess(self, local_rank: int, local_world_size: int) -> None:
            raise RuntimeError("no topology for this many processes")

    pjrt_host.register_plugin("broken_mp", BrokenMultiprocess)
    pjrt_host.select("broken_mp")
    dist.initialize()


def main(argv: list[str]) -> int:
    mode = argv[0]
    if mode in ("collectives", "plain"):
        _collectives(argv[1], plain=mode == "plain")
    elif mode == "crash":
        _crash()
    elif mode == "broken":
        _broken()
    elif mode == "spawn":
        import pjrt_host

        sys.path.insert(0, str(Path(__file__).parent))
        from test_distributed_worker import spawned

        pjrt_host.spawn(spawned, int(argv[2]), args=(argv[1],))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
