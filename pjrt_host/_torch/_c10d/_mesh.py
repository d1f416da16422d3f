"""The devices of a process group as a one-axis jax mesh, and the
collectives compiled over it.

Each rank's tensor is one shard of a global jax array over the mesh (one
device per rank, in group-rank order); one jitted program per (collective,
shape, dtype) gives each rank its result -- NCCL on GPUs, ICI on TPUs,
XLA:CPU's collectives on cpu_ref.  Before a collective of a new signature
first runs, the ranks compare it through the group's store, so a mismatch
raises on every rank instead of ending a process inside the transport.
"""

from __future__ import annotations

import datetime
import functools
from typing import Any

__all__ = ["GroupMesh"]


class GroupMesh:
    """The group's devices as a one-axis mesh, and its compiled collectives."""

    def __init__(self, mesh: Any, local_device: Any, size: int, rank: int, store: Any = None,
                 timeout: datetime.timedelta | None = None, generation: int = 0) -> None:
        self.mesh = mesh
        self.local_device = local_device
        self.size = size
        self.rank = rank
        self._cache: dict[tuple, Any] = {}
        self._store = store
        self._timeout = timeout
        self._prefix = f"pjrt_signature/{generation}"
        self._signatures = 0

    @classmethod
    def meet(cls, store: Any, rank: int, size: int, index: int, timeout: datetime.timedelta,
             generation: int) -> "GroupMesh":
        """Each rank publishes the global id of its device (the one its
        tensors are on) in the group's store and reads the others'."""
        import jax
        import numpy as np
        from jax.sharding import Mesh

        from .._devices import jax_device

        device = jax_device(index)
        store.set(f"pjrt_device/{generation}/{rank}", str(device.id))
        keys = [f"pjrt_device/{generation}/{r}" for r in range(size)]
        try:
            store.wait(keys, timeout)
        except Exception as err:
            raise RuntimeError(
                f"pjrt_host: rank {rank} of a process group of {size} waited {timeout} for the other ranks' first "
                f"collective on 'jax' tensors; not all came ({type(err).__name__}: {str(err)[:200]}). A rank has "
                "died, or the ranks do not call the same collectives.") from err
        ids = [int(store.get(k)) for k in keys]
        by_id = {d.id: d for d in jax.devices(device.platform) + jax.devices()}
        missing = [i for i in ids if i not in by_id]
        if missing or len(set(ids)) != size:
            raise RuntimeError(
                f"pjrt_host: the ranks of this process group are on devices {ids}, which are not {size} distinct "
                f"devices of one jax runtime. Each rank needs its own device, and the processes must share "
                "jax.distributed's coordinator (launch with torchrun or python -m pjrt_host launch).")
        return cls(Mesh(np.array([by_id[i] for i in ids]), ("ranks",)), device, size, rank, store, timeout,
                   generation)

    def _agree(self, key: tuple) -> None:
        """Before a collective of a new signature runs: every rank's n-th new
        signature must be the others' n-th.  A mismatch (another shape,
        dtype or collective on one rank) raises on every rank, naming it --
        launched, it would end a process inside the device's transport."""
        if self._store is None or self.size == 1:
            return
        n = self._signatures
        self._signatures += 1
        mine = repr(key)
        self._store.set(f"{self._prefix}/{n}/{self.rank}", mine)
        keys = [f"{self._prefix}/{n}/{r}" for r in range(self.size)]
        try:
            self._store.wait(keys, self._timeout)
        except Exception as err:
            raise RuntimeError(
                f"pjrt_host: rank {self.rank} of a process group of {self.size} reached {key[0]} (shape {key[-2]}, "
                f"dtype {key[-1]}) and waited {self._timeout} for the other ranks: not all came "
                f"({type(err).__name__}). A rank has died or is stuck, or the ranks call different collectives; "
                "init_process_group(timeout=...) bounds the wait.") from err
        theirs = [self._store.get(k).decode() for k in keys]
        differing = [(r, t) for r, t in enumerate(theirs) if t != mine]
        if differing:
            r, t = differing[0]
            raise RuntimeError(
                f"pjrt_host: the ranks of a process group called different collectives: rank {self.rank} called "
                f"{mine} and rank {r} called {t} ((collective, ..., shape, dtype)). Every rank must call the same "
                "collectives in the same order with the same shapes and dtypes.")

    def _global(self, local: Any) -> Any:
        import jax
        from jax.sharding import NamedSharding, PartitionSpec

        shard = local[None]
        return jax.make_array_from_single_device_arrays(
            (self.size, *local.shape), NamedSharding(self.mesh, PartitionSpec("ranks")), [shard])

    def _run(self, kind: tuple, local: Any, body: Any, split: bool = False) -> Any:
        """``body`` over the global array of every rank's ``local`` (shape
        (ranks, *local.shape)); this rank's part of the result: all of it
        (replicated), or with ``split`` its row of axis 0, shape (1, ...)."""
        import jax
        from jax.sharding import NamedSharding, PartitionSpec

        key = kind + (tuple(local.shape), str(local.dtype))
        fn = self._cache.get(key)
        if fn is None:
            self._agree(key)
            spec = PartitionSpec("ranks") if split else PartitionSpec()
            fn = self._cache[key] = jax.jit(body, out_shardings=NamedSharding(self.mesh, spec))
        try:
            result = fn(self._global(local))
        except Exception as err:
            from ... import _runtime

            plugin = _runtime.runtime().record.name
            raise RuntimeError(
                f"pjrt_host: {kind[0]} of a 'jax' tensor of shape {tuple(local.shape)} and dtype {local.dtype} "
                f"failed on group rank {self.rank} of {self.size}: {type(err).__name__}: {str(err)[:300]}. The "
                "ranks agreed on this collective, shape and dtype before it first ran, so the device's collective "
                f"itself failed: `python -m pjrt_host check {plugin} --only collectives` tests the plugin's "
                "collectives.") from err
        return result.addressable_data(0)

    def reduce(self, local: Any, op: str) -> Any:
        if op in _BITWISE:
            # Bitwise reductions are not collectives every XLA backend has
            # (XLA:CPU refuses them): gather, then reduce on this device.
            return _local_reduce(op)(self.gather(local))
        return self._run(("all_reduce", op), local, _reducer(op))

    def gather(self, local: Any) -> Any:
        """(ranks, *local.shape): every rank's value in rank order."""
        return self._run(("all_gather",), local, _identity)

    def broadcast(self, local: Any, root: int) -> Any:
        return self._run(("broadcast", root), local, functools.partial(_take, root))

    def reduce_scatter(self, chunks: Any, op: str) -> Any:
        """``chunks``: (ranks, *chunk), row r meant for rank r; the reduction
        over every rank of their row for this rank: (1, *chunk)."""
        return self._run(("reduce_scatter", op), chunks, _reducer(op), split=True)

    def transfer(self, local: Any, sender: int) -> Any:
        """A two-rank mesh: the ``sender``'s (0 or 1) value, on both."""
        return self._run(("send/recv", sender), local, functools.partial(_take, sender))

    def all_to_all(self, chunks: Any) -> Any:
        """``chunks``: (ranks, *chunk), row r for rank r; returns (ranks,
        *chunk), row s from rank s."""
        return self._run(("all_to_all",), chunks, _swap01, split=True)[0]


def _identity(g: Any) -> Any:
    return g


def _take(root: int, g: Any) -> Any:
    return g[root]


def _swap01(g: Any) -> Any:
    import jax.numpy as jnp

    return jnp.swapaxes(g, 0, 1)  # (src, dst, ...) -> (dst, src, ...), split by dst


_BITWISE = ("band", "bor", "bxor")


@functools.lru_cache(maxsize=None)
def _local_reduce(op: str) -> Any:
    import jax

    return jax.jit(_reducer(op))


def _reducer(op: str) -> Any:
    import jax.numpy as jnp

    def body(g):
        if op == "sum":
            return jnp.sum(g, axis=0, dtype=g.dtype) if g.dtype != jnp.bool_ else jnp.any(g, axis=0)
        if op == "avg":
            return (jnp.sum(g, axis=0) / g.shape[0]).astype(g.dtype)
        if op == "prod":
            return jnp.prod(g, axis=0, dtype=g.dtype) if g.dtype != jnp.bool_ else jnp.all(g, axis=0)
        if op == "min":
            return jnp.min(g, axis=0)
        if op == "max":
            return jnp.max(g, axis=0)
        bitwise = {"band": jnp.bitwise_and, "bor": jnp.bitwise_or, "bxor": jnp.bitwise_xor}[op]
        return bitwise.reduce(g, axis=0)

    return body
