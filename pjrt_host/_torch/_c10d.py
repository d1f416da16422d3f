"""torch.distributed on 'jax' tensors: the ``pjrt`` c10d backend.

``dist.init_process_group()`` (no backend: it is the 'jax' accelerator's
default) or ``init_process_group('pjrt')`` makes a :class:`ProcessGroupJax`.
Collectives on 'jax' tensors run as XLA collectives on the plugin's devices,
the engine SPMD uses: each rank's tensor is one shard of a global jax array
over a mesh of the group's devices (one per rank, in group-rank order), and
one jitted program per (collective, shape, dtype, group) gives each rank its
result -- NCCL on GPUs, ICI on TPUs, XLA:CPU's collectives on cpu_ref.
Collectives on CPU tensors go to a gloo process group built beside it, so a
program mixing both (or a CPU-only program, which gets this backend by
default once the 'jax' device is torch's accelerator) works as with
``cpu:gloo``.

The ranks' devices are exchanged through the group's store the first time a
group meets on 'jax' (each rank says which device its tensors are on), so a
rank may use any of its process's devices.  Results are written into the
tensors torch passed (views included) and the returned ``Work`` is complete:
the device runs the collective in issue order, so any later op sees its
result; ``wait()`` returns at once.

Also served here: torch's functional collectives
(``torch.ops._c10d_functional.*``, what DTensor and FSDP2 call) on 'jax'
tensors, through the process group registered under their group name.
"""

from __future__ import annotations

import datetime
import functools
import threading
from typing import Any

import torch
import torch.distributed as dist

from .._jax_settings import x64_if_loaded as _x64_if_loaded, x64_scope as _x64_scope
from ._devices import DEVICE_NAME

__all__ = ["BACKEND_NAME", "ProcessGroupJax", "register"]

#: The name for ``init_process_group(backend=...)``.
BACKEND_NAME = "pjrt"

_registered = False


def register() -> None:
    """Register the backend for the 'jax' device and make it the device's
    default (``init_process_group()`` with no backend).  Cheap: nothing of
    jax is imported until a group meets on 'jax' tensors.  Idempotent."""
    global _registered
    if _registered:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=[DEVICE_NAME, "cpu"])
    dist.Backend.default_device_backend_map[DEVICE_NAME] = BACKEND_NAME
    _registered = True


def _create(options: Any, backend_options: Any) -> "ProcessGroupJax":
    return ProcessGroupJax(options.store, options.group_rank, options.group_size, options.timeout,
                           list(options.global_ranks_in_group or range(options.group_size)))


def _work(result: Any = None) -> Any:
    future = torch.futures.Future()
    future.set_result(result)
    return torch._C._distributed_c10d._create_work_from_future(future)


def _is_jax(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == DEVICE_NAME


_REDUCE_NAMES = {
    "SUM": "sum", "AVG": "avg", "PRODUCT": "prod", "MIN": "min", "MAX": "max",
    "BAND": "band", "BOR": "bor", "BXOR": "bxor",
}


def _reduce_name(op: Any) -> str:
    """'sum', 'avg' ... for a ReduceOp, a RedOpType or a functional
    collective's string."""
    if isinstance(op, torch.ScriptObject):  # the dispatcher's boxed c10d.ReduceOp
        op = op.op() if callable(getattr(op, "op", None)) else op
    if isinstance(op, int):  # a RedOpType's value
        op = {int(v): v for v in dist.ReduceOp.RedOpType.__members__.values()}.get(op, op)
    if isinstance(op, str):
        name = op.upper()
    else:
        kind = getattr(op, "op", op)  # ReduceOp holds a RedOpType
        name = getattr(kind, "name", str(kind)).split(".")[-1].upper()
    if name not in _REDUCE_NAMES:
        raise ValueError(f"pjrt_host: the '{BACKEND_NAME}' backend has no reduction {name} "
                         f"(it has {', '.join(sorted(_REDUCE_NAMES))})")
    return _REDUCE_NAMES[name]


class ProcessGroupJax(dist.ProcessGroup):
    """A c10d process group whose collectives on 'jax' tensors are XLA
    collectives, and on CPU tensors gloo's."""

    def __init__(self, store: Any, rank: int, size: int, timeout: datetime.timedelta,
                 global_ranks: list[int] | None = None) -> None:
        super().__init__(rank, size)
        self._rank = rank
        self._size = size
        self._store = store
        self._timeout = timeout
        self._global_ranks = global_ranks or list(range(size))
        self._cpu = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), rank, size, timeout)
        self._meshes: dict[int, Any] = {}  # local device index -> the group's _GroupMesh
        self._pairs: dict[tuple, Any] = {}  # (peer rank, local device index) -> their two-device _GroupMesh
        self._p2p: list[tuple] = []  # queued sends and receives of 'jax' tensors, see send()
        self._lock = threading.Lock()

    # ------------------------------------------------------------ identity

    def getBackendName(self) -> str:
        return BACKEND_NAME

    # torch names groups after creation; a Python group keeps its own name
    # (the C++ base would look for it on a C++ backend).
    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupName(self) -> str:
        return getattr(self, "_group_name", "")

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return getattr(self, "_group_desc", "")

    def getRank(self) -> int:
        return self._rank

    def getSize(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"ProcessGroupJax(rank={self._rank}, size={self._size}, global ranks={self._global_ranks})"

    # ------------------------------------------------------------ collectives

    @_x64_if_loaded
    def allreduce(self, tensors: list, opts: Any = None) -> Any:
        if not any(_is_jax(t) for t in tensors):
            return self._cpu.allreduce(tensors, opts) if opts is not None else self._cpu.allreduce(tensors)
        op = _reduce_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        for t in tensors:
            self._write(t, self._engine(t).reduce(self._read(t), op))
        return _work(tensors)

    @_x64_if_loaded
    def allreduce_coalesced(self, tensors: list, opts: Any = None) -> Any:
        if not any(_is_jax(t) for t in tensors):
            return self._cpu.allreduce_coalesced(tensors, opts)
        return self.allreduce(tensors, opts)

    @_x64_if_loaded
    def broadcast(self, tensors: list, opts: Any) -> Any:
        if not any(_is_jax(t) for t in tensors):
            return self._cpu.broadcast(tensors, opts)
        for t in tensors:
            self._write(t, self._engine(t).broadcast(self._read(t), opts.rootRank))
        return _work(tensors)

    @_x64_if_loaded
    def allgather(self, output_lists: list, inputs: list, opts: Any = None) -> Any:
        if not any(_is_jax(t) for t in inputs):
            return self._cpu.allgather(output_lists, inputs, opts) if opts is not None else \
                self._cpu.allgather(output_lists, inputs)
        for outputs, t in zip(output_lists, inputs):
            gathered = self._engine(t).gather(self._read(t))
            for i, out in enumerate(outputs):
                self._write(out, gathered[i])
        return _work(output_lists)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        if not _is_jax(input):
            return self._cpu._allgather_base(output, input, opts) if opts is not None else \
                self._cpu._allgather_base(output, input)
        gathered = self._engine(input).gather(self._read(input))
        self._write(output, gathered.reshape(tuple(output.shape)))
        return _work(output)

    @_x64_if_loaded
    def allgather_into_tensor_coalesced(self, outputs: list, inputs: list, opts: Any = None) -> Any:
        for output, t in zip(outputs, inputs):
            self._allgather_base(output, t, opts)
        return _work(outputs)

    @_x64_if_loaded
    def reduce_scatter(self, outputs: list, input_lists: list, opts: Any) -> Any:
        if not any(_is_jax(t) for t in outputs):
            return self._cpu.reduce_scatter(outputs, input_lists, opts)
        op = _reduce_name(opts.reduceOp)
        import jax.numpy as jnp

        for out, inputs in zip(outputs, input_lists):
            stacked = jnp.stack([self._read(t) for t in inputs])
            self._write(out, self._engine(out).reduce_scatter(stacked, op)[0])
        return _work(outputs)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any:
        if not _is_jax(input):
            return self._cpu._reduce_scatter_base(output, input, opts)
        op = _reduce_name(opts.reduceOp)
        chunks = self._read(input).reshape((self._size, *tuple(output.shape)))
        self._write(output, self._engine(input).reduce_scatter(chunks, op)[0])
        return _work(output)

    @_x64_if_loaded
    def reduce_scatter_tensor_coalesced(self, outputs: list, inputs: list, opts: Any) -> Any:
        for output, t in zip(outputs, inputs):
            self._reduce_scatter_base(output, t, opts)
        return _work(outputs)

    @_x64_if_loaded
    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list,
                      input_split_sizes: list, opts: Any = None) -> Any:
        if not _is_jax(input):
            return self._cpu.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)
        n = self._size
        if (output_split_sizes and len(set(output_split_sizes)) > 1) or \
                (input_split_sizes and len(set(input_split_sizes)) > 1):
            return self._uneven_alltoall(output, input, list(output_split_sizes), list(input_split_sizes))
        chunks = self._read(input).reshape((n, input.shape[0] // n, *tuple(input.shape[1:])))
        self._write(output, self._engine(input).all_to_all(chunks).reshape(tuple(output.shape)))
        return _work(output)

    def _uneven_alltoall(self, output: torch.Tensor, input: torch.Tensor, out_splits: list,
                         in_splits: list) -> Any:
        """all_to_all_single with splits of different sizes: XLA's
        all-to-all has static shapes, so every chunk is padded to the
        largest chunk any rank sends (agreed by a max all-reduce), exchanged
        in one all-to-all, and cut back to the sizes this rank receives."""
        import jax.numpy as jnp

        n = self._size
        rest = tuple(input.shape[1:])
        in_splits = in_splits or [input.shape[0] // n] * n
        out_splits = out_splits or [output.shape[0] // n] * n
        engine = self._engine(input)
        widest = int(engine.reduce(jnp.asarray([max(in_splits)], dtype=jnp.int64), "max")[0])
        values = self._read(input)
        starts = [sum(in_splits[:i]) for i in range(n)]
        chunks = jnp.stack([jnp.pad(values[a:a + k], [(0, widest - k)] + [(0, 0)] * len(rest))
                            for a, k in zip(starts, in_splits)])
        received = engine.all_to_all(chunks)  # (n, widest, *rest), row s from rank s
        self._write(output, jnp.concatenate([received[s, :k] for s, k in enumerate(out_splits)]))
        return _work(output)

    @_x64_if_loaded
    def reduce(self, tensors: list, opts: Any) -> Any:
        if not any(_is_jax(t) for t in tensors):
            return self._cpu.reduce(tensors, opts)
        return _reduce_(self, {"tensors": tensors, "reduce_op": opts.reduceOp, "root_rank": opts.rootRank})

    @_x64_if_loaded
    def gather(self, output_lists: list, inputs: list, opts: Any) -> Any:
        if not any(_is_jax(t) for t in inputs):
            return self._cpu.gather(output_lists, inputs, opts)
        return _gather_(self, {"output_tensors": output_lists, "input_tensors": inputs, "root_rank": opts.rootRank})

    @_x64_if_loaded
    def scatter(self, outputs: list, input_lists: list, opts: Any) -> Any:
        if not any(_is_jax(t) for t in outputs):
            return self._cpu.scatter(outputs, input_lists, opts)
        return _scatter_(self, {"output_tensors": outputs, "input_tensors": input_lists,
                                "root_rank": opts.rootRank})[1]

    @_x64_if_loaded
    def alltoall(self, outputs: list, inputs: list, opts: Any = None) -> Any:
        if not any(_is_jax(t) for t in inputs):
            return self._cpu.alltoall(outputs, inputs, opts) if opts is not None else \
                self._cpu.alltoall(outputs, inputs)
        import jax.numpy as jnp

        if len({tuple(t.shape) for t in inputs}) > 1:
            raise NotImplementedError(f"pjrt_host: all_to_all of 'jax' tensors of different shapes is not supported "
                                      f"by the '{BACKEND_NAME}' backend")
        received = self._engine(inputs[0]).all_to_all(jnp.stack([self._read(t) for t in inputs]))
        for i, out in enumerate(outputs):
            self._write(out, received[i])
        return _work(outputs)

    @_x64_if_loaded
    def allgather_coalesced(self, output_lists: list, inputs: list, opts: Any = None) -> Any:
        if not any(_is_jax(t) for t in inputs):
            return self._cpu.allgather_coalesced(output_lists, inputs, opts)
        return self.allgather(output_lists, inputs, opts)

    @_x64_if_loaded
    def barrier(self, opts: Any = None) -> Any:
        return self._cpu.barrier(opts) if opts is not None else self._cpu.barrier()

    # send/recv of 'jax' tensors: an XLA transfer is a collective of its two
    # devices, so both ends must run it together.  isend/irecv are queued
    # and run when one of their Works is waited on (or before the group's
    # next collective), in an order every rank derives alike: by pair of
    # ranks, then direction (lower rank to higher first), then call order.
    # Ring exchanges and batch_isend_irecv, in which every rank sends before
    # it receives, then cannot deadlock (each rank runs its pairs in the
    # same global order).

    @_x64_if_loaded
    def send(self, tensors: list, dst: int, tag: int = 0) -> Any:
        if not any(_is_jax(t) for t in tensors):
            return self._cpu.send(tensors, dst, tag)
        return self._queue_p2p(tensors, src=self._rank, dst=dst)

    @_x64_if_loaded
    def recv(self, tensors: list, src: int, tag: int = 0) -> Any:
        if src is None or src < 0:
            raise NotImplementedError(
                f"pjrt_host: recv from any source is not supported by the '{BACKEND_NAME}' backend for 'jax' "
                "tensors (an XLA transfer names both ends); pass src=")
        if not any(_is_jax(t) for t in tensors):
            return self._cpu.recv(tensors, src, tag)
        return self._queue_p2p(tensors, src=src, dst=self._rank)

    def _queue_p2p(self, tensors: list, src: int, dst: int) -> Any:
        peer = dst if src == self._rank else src
        if not 0 <= peer < self._size or peer == self._rank:
            raise ValueError(f"pjrt_host: send/recv between group rank {self._rank} and rank {peer} of a group of "
                             f"{self._size}: the peer must be another rank of the group")
        for t in tensors:
            low, high = sorted((src, dst))
            self._p2p.append(((low, high, 0 if src == low else 1, len(self._p2p)), t, src, dst))
        return _P2PWork(self, tensors)

    def _flush_p2p(self) -> None:
        """Run the queued sends and receives (see above)."""
        queued, self._p2p = sorted(self._p2p, key=lambda q: q[0]), []
        for _, t, src, dst in queued:
            peer = dst if src == self._rank else src
            sender = 0 if src < dst else 1
            value = self._pair(t, peer).transfer(self._read(t), sender)
            if dst == self._rank:
                self._write(t, value)

    def _pair(self, t: torch.Tensor, peer: int) -> "_GroupMesh":
        """The two-device mesh of this rank and ``peer`` (group ranks), met
        once per pair and local device: send/recv run on it as an XLA
        transfer between the two devices (a collective of those two only)."""
        index = t.device.index or 0
        low, high = sorted((self._rank, peer))
        key = (peer, index)
        found = self._pairs.get(key)
        if found is None:
            with self._lock:
                found = self._pairs.get(key)
                if found is None:
                    store = dist.PrefixStore(f"pjrt_p2p/{low}/{high}/{index}", self._store)
                    found = self._pairs[key] = _GroupMesh.meet(store, 0 if self._rank == low else 1, 2, index,
                                                                self._timeout, 0)
        return found

    # ------------------------------------------------------------ plumbing

    @staticmethod
    def _read(t: torch.Tensor) -> Any:
        from . import _tensor

        return _tensor.read(t.detach())

    @staticmethod
    def _write(t: torch.Tensor, value: Any) -> None:
        from . import _tensor

        _tensor.write(t.detach() if t.requires_grad else t, value)

    def _engine(self, t: torch.Tensor) -> "_GroupMesh":
        if self._p2p:
            self._flush_p2p()  # the group's operations run in the order they were called
        index = t.device.index or 0
        found = self._meshes.get(index)
        if found is None:
            with self._lock:
                found = self._meshes.get(index)
                if found is None:
                    # The n-th meeting of each rank pairs with the others' n-th
                    # (ranks may use different local device indices).
                    found = self._meshes[index] = _GroupMesh.meet(self._store, self._rank, self._size, index,
                                                                  self._timeout, len(self._meshes))
        return found


class _P2PWork(dist.Work):
    """The Work of a queued send or receive: waiting runs the queue."""

    def __init__(self, group: ProcessGroupJax, tensors: list) -> None:
        super().__init__()
        self._group = group
        self._tensors = tensors

    def wait(self, timeout: Any = None) -> bool:
        if self._group._p2p:
            _x64_if_loaded(ProcessGroupJax._flush_p2p)(self._group)
        return True

    def is_completed(self) -> bool:
        return not self._group._p2p

    def get_future(self) -> Any:
        self.wait()
        future = torch.futures.Future()
        future.set_result(self._tensors)
        return future


class _GroupMesh:
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
             generation: int) -> "_GroupMesh":
        """Each rank publishes the global id of its device (the one its
        tensors are on) in the group's store and reads the others'."""
        import jax
        import numpy as np
        from jax.sharding import Mesh

        from ._devices import jax_device

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
            from .. import _runtime

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


# ---------------------------------------------------------------- c10d dispatcher ops


@_x64_scope
def run_op(func: Any, args: tuple, kwargs: dict) -> Any:
    """A ``c10d::*`` op on 'jax' tensors (torch.distributed calls some
    collectives through the dispatcher): run by the process group it
    names, which must be a 'pjrt' one."""
    schema = func._schema
    bound = dict(zip((a.name for a in schema.arguments), args))
    bound.update(kwargs)
    name = schema.name.split("::", 1)[1]
    pg = bound.get("process_group")
    if isinstance(pg, torch.ScriptObject):
        pg = dist.ProcessGroup.unbox(pg)
    if not isinstance(pg, ProcessGroupJax):
        backend = pg.name() if hasattr(pg, "name") else type(pg).__name__
        raise RuntimeError(
            f"pjrt_host: torch.distributed's {name} got 'jax' tensors on a process group of backend {backend!r}, "
            f"which cannot hold them. Use the '{BACKEND_NAME}' backend: dist.init_process_group() with no backend "
            f"(it is the 'jax' device's default), backend='{BACKEND_NAME}', or 'cpu:gloo,{DEVICE_NAME}:"
            f"{BACKEND_NAME}'.")
    handler = _OPS.get(name)
    if handler is None:
        raise NotImplementedError(f"pjrt_host: torch.distributed's {name} is not supported on 'jax' tensors by the "
                                  f"'{BACKEND_NAME}' backend")
    return _boxed(handler(pg, bound))


def _boxed(result: Any) -> Any:
    """Work objects as the dispatcher's IValues (``Work.boxed()``)."""
    if isinstance(result, dist.Work):
        return result.boxed()
    if isinstance(result, tuple):
        return tuple(_boxed(r) for r in result)
    return result


def _options(cls: Any, **values: Any) -> Any:
    """What ProcessGroupJax's methods read of c10d's option objects (the
    dispatcher hands a boxed ReduceOp that those objects do not take)."""
    import types

    return types.SimpleNamespace(**values)


def _reduce_(pg: ProcessGroupJax, b: dict) -> Any:
    op = _reduce_name(b["reduce_op"])
    for t in b["tensors"]:
        result = pg._engine(t).reduce(pg._read(t), op)
        if pg.getRank() == b["root_rank"]:
            pg._write(t, result)
    return _work()


def _gather_(pg: ProcessGroupJax, b: dict) -> Any:
    for outputs, t in zip(b["output_tensors"] or [[]] * len(b["input_tensors"]), b["input_tensors"]):
        gathered = pg._engine(t).gather(pg._read(t))
        if pg.getRank() == b["root_rank"]:
            for i, out in enumerate(outputs):
                pg._write(out, gathered[i])
    return _work()


def _scatter_(pg: ProcessGroupJax, b: dict) -> Any:
    import jax.numpy as jnp

    outputs, inputs = b["output_tensors"], b["input_tensors"]
    for i, out in enumerate(outputs):
        engine = pg._engine(out)
        if pg.getRank() == b["root_rank"]:
            stacked = jnp.stack([pg._read(t) for t in inputs[i]])
        else:
            stacked = jnp.zeros((pg.getSize(), *tuple(out.shape)), dtype=pg._read(out).dtype)
        stacked = _put(stacked, engine.local_device)
        pg._write(out, engine.broadcast(stacked, b["root_rank"])[pg.getRank()])
    return outputs, _work()


def _put(array: Any, device: Any) -> Any:
    import jax

    return jax.device_put(array, device)


_OPS = {
    "allreduce_": lambda pg, b: (b["tensors"], pg.allreduce(
        b["tensors"], _options(dist.AllreduceOptions, reduceOp=b["reduce_op"]))),
    "allreduce_coalesced_": lambda pg, b: pg.allreduce(
        b["tensors"], _options(dist.AllreduceOptions, reduceOp=b["reduce_op"])),
    "allgather_": lambda pg, b: (b["output_tensors"], pg.allgather(b["output_tensors"], b["input_tensors"])),
    "_allgather_base_": lambda pg, b: (b["output_tensor"], pg._allgather_base(b["output_tensor"],
                                                                             b["input_tensor"])),
    "allgather_coalesced_": lambda pg, b: pg.allgather(b["output_lists"], b["input_list"]),
    "allgather_into_tensor_coalesced_": lambda pg, b: pg.allgather_into_tensor_coalesced(b["outputs"], b["inputs"]),
    "reduce_scatter_": lambda pg, b: (b["output_tensors"], pg.reduce_scatter(
        b["output_tensors"], b["input_tensors"], _options(dist.ReduceScatterOptions, reduceOp=b["reduce_op"]))),
    "_reduce_scatter_base_": lambda pg, b: (b["output_tensor"], pg._reduce_scatter_base(
        b["output_tensor"], b["input_tensor"], _options(dist.ReduceScatterOptions, reduceOp=b["reduce_op"]))),
    "reduce_scatter_tensor_coalesced_": lambda pg, b: pg.reduce_scatter_tensor_coalesced(
        b["outputs"], b["inputs"], _options(dist.ReduceScatterOptions, reduceOp=b["reduce_op"])),
    "broadcast_": lambda pg, b: (b["tensors"], pg.broadcast(
        b["tensors"], _options(dist.BroadcastOptions, rootRank=b["root_rank"], rootTensor=b["root_tensor"]))),
    "alltoall_base_": lambda pg, b: pg.alltoall_base(b["output"], b["input"], b["output_split_sizes"],
                                                     b["input_split_sizes"]),
    "barrier": lambda pg, b: pg.barrier(),
    "reduce_": _reduce_,
    "gather_": _gather_,
    "scatter_": _scatter_,
    "send": lambda pg, b: pg.send(b["tensors"], b["dst"], b["tag"]),
    "recv_": lambda pg, b: pg.recv(b["tensors"], b["src"], b["tag"]),
}


# ---------------------------------------------------------------- functional collectives


@_x64_scope
def run_functional(func: Any, args: tuple, kwargs: dict) -> Any:
    """``torch.ops._c10d_functional.*`` on 'jax' tensors (DTensor, FSDP2 and
    compiled graphs call these): new result tensors, computed by the 'pjrt'
    group named by ``group_name``; ``wait_tensor`` returns its input (the
    work is complete on return)."""
    schema = func._schema
    name = schema.name.split("::", 1)[1]
    bound = dict(zip((a.name for a in schema.arguments), args))
    bound.update(kwargs)
    if name == "wait_tensor":
        return bound["tensor"]
    if name == "_wrap_tensor_autograd":  # a new tensor with the input's values (shares the array until written)
        return bound["input"].clone()
    if "group_name" not in bound:
        raise NotImplementedError(f"pjrt_host: functional collective {name} ({schema}) is not supported on 'jax' tensors")
    pg = _group(bound["group_name"], name)
    handler = _FUNCTIONAL.get(name)
    if handler is None:
        raise NotImplementedError(f"pjrt_host: the functional collective {name} is not supported on 'jax' tensors "
                                  f"by the '{BACKEND_NAME}' backend")
    return handler(pg, bound)


def _group(group_name: Any, op: str) -> ProcessGroupJax:
    from torch.distributed.distributed_c10d import _resolve_process_group

    pg = group_name if isinstance(group_name, dist.ProcessGroup) else _resolve_process_group(group_name)
    if isinstance(pg, torch.ScriptObject):
        pg = dist.ProcessGroup.unbox(pg)
    if not isinstance(pg, ProcessGroupJax):
        raise RuntimeError(
            f"pjrt_host: the functional collective {op} got 'jax' tensors on group {group_name!r} of backend "
            f"{pg.name() if hasattr(pg, 'name') else type(pg).__name__!r}, which cannot hold them. Use the "
            f"'{BACKEND_NAME}' backend (dist.init_process_group() with no backend, or init_device_mesh('jax', ...)).")
    return pg


def _new_like(t: torch.Tensor, array: Any) -> torch.Tensor:
    from . import _tensor

    return _tensor.wrap_array(array, t.device.index or 0, t.dtype)


def _f_all_reduce(pg: ProcessGroupJax, b: dict) -> Any:
    t = b["input"]
    return _new_like(t, pg._engine(t).reduce(pg._read(t), _reduce_name(b["reduce_op"])))


def _f_all_reduce_(pg: ProcessGroupJax, b: dict) -> Any:
    t = b["input"]
    pg._write(t, pg._engine(t).reduce(pg._read(t), _reduce_name(b["reduce_op"])))
    return t


def _f_all_gather(pg: ProcessGroupJax, t: torch.Tensor) -> Any:
    gathered = pg._engine(t).gather(pg._read(t))  # (ranks, *shape): dim 0 of the result joins them
    return gathered.reshape((gathered.shape[0] * (t.shape[0] if t.dim() else 1), *tuple(t.shape[1:])))


def _f_reduce_scatter(pg: ProcessGroupJax, t: torch.Tensor, op: str) -> Any:
    size = pg.getSize()
    chunks = pg._read(t).reshape((size, t.shape[0] // size, *tuple(t.shape[1:])))
    return pg._engine(t).reduce_scatter(chunks, _reduce_name(op))[0]


def _f_all_to_all(pg: ProcessGroupJax, b: dict) -> Any:
    t = b["input"]
    size = pg.getSize()
    splits = [int(s) for s in (b["input_split_sizes"] or [])] + [int(s) for s in (b["output_split_sizes"] or [])]
    if splits and len(set(splits)) > 1:
        raise NotImplementedError(
            f"pjrt_host: all_to_all_single with uneven splits is not supported by the '{BACKEND_NAME}' backend "
            "(XLA collectives have static shapes)")
    chunks = pg._read(t).reshape((size, t.shape[0] // size, *tuple(t.shape[1:])))
    return _new_like(t, pg._engine(t).all_to_all(chunks).reshape(tuple(t.shape)))


_FUNCTIONAL = {
    "all_reduce": _f_all_reduce,
    "all_reduce_": _f_all_reduce_,
    "all_reduce_coalesced": lambda pg, b: [_f_all_reduce(pg, {"input": t, "reduce_op": b["reduce_op"]})
                                           for t in b["inputs"]],
    "all_gather_into_tensor": lambda pg, b: _new_like(b["input"], _f_all_gather(pg, b["input"])),
    "all_gather_into_tensor_coalesced": lambda pg, b: [_new_like(t, _f_all_gather(pg, t)) for t in b["inputs"]],
    "all_gather_into_tensor_out": lambda pg, b: _write_out(pg, b["out"], _f_all_gather(pg, b["input"])),
    "reduce_scatter_tensor": lambda pg, b: _new_like(b["input"], _f_reduce_scatter(pg, b["input"], b["reduce_op"])),
    "reduce_scatter_tensor_coalesced": lambda pg, b: [_new_like(t, _f_reduce_scatter(pg, t, b["reduce_op"]))
                                                      for t in b["inputs"]],
    "all_to_all_single": _f_all_to_all,
    "broadcast": lambda pg, b: _new_like(b["input"], pg._engine(b["input"]).broadcast(pg._read(b["input"]), b["src"])),
    "broadcast_": lambda pg, b: _write_out(pg, b["input"], pg._engine(b["input"]).broadcast(pg._read(b["input"]),
                                                                                          b["src"])),
}


def _write_out(pg: ProcessGroupJax, out: torch.Tensor, array: Any) -> torch.Tensor:
    pg._write(out, array.reshape(tuple(out.shape)))
    return out
