"""The 'pjrt' c10d process group: :class:`ProcessGroupJax`.

Collectives on 'jax' tensors run as XLA collectives over the group's mesh
(``_mesh``); send / recv of 'jax' tensors are queued and run in pairs
(``_p2p``); collectives on CPU tensors go to a gloo process group built
beside it, so a program mixing both (or a CPU-only program, which gets this
backend by default once the 'jax' device is torch's accelerator) works as
with ``cpu:gloo``.

The ranks' devices are exchanged through the group's store the first time a
group meets on 'jax' (each rank says which device its tensors are on), so a
rank may use any of its process's devices.  Results are written into the
tensors torch passed (views included) and the returned ``Work`` is complete:
the device runs the collective in issue order, so any later op sees its
result; ``wait()`` returns at once.  A synchronous call (``async_op=False``,
the default) first waits for its result, at most the group's timeout, so a
collective that failed or timed out raises there, naming itself and the
ranks that did not answer.
"""

from __future__ import annotations

import datetime
import functools
import os
import inspect
import threading
import weakref
from typing import Any

import torch
import torch.distributed as dist

from ..._jax_settings import x64_if_loaded as _x64_if_loaded
from .._devices import DEVICE_NAME
from . import _mesh, _tensors
from ._mesh import GroupMesh
from ._p2p import PointToPoint
from ._tensors import is_jax as _is_jax

__all__ = ["BACKEND_NAME", "CheckedWork", "ProcessGroupJax", "completed_work", "is_async", "reduce_name"]

#: The name for ``init_process_group(backend=...)``.
BACKEND_NAME = "pjrt"


def completed_work(result: Any = None) -> Any:
    """A c10d Work that is already complete, holding ``result``."""
    future = torch.futures.Future()
    future.set_result(result)
    return torch._C._distributed_c10d._create_work_from_future(future)


class CheckedWork(dist.Work):
    """The Work of an asynchronous collective: complete at once (its future
    holds the result; the device runs collectives in issue order), and its
    ``wait()`` waits for the collectives' results, at most the group's
    timeout, so that one that failed raises there -- a dead peer, a timeout
    -- naming the collective and the ranks that did not answer, as a
    synchronous call does.  The results are held weakly (a strong
    reference would keep eager in-place writes from donating the tensors'
    buffers); one already dropped has nothing left to check."""

    def __init__(self, work: Any, held: list) -> None:
        super().__init__()
        self._work = work
        self._held = [(mesh, run, key, weakref.ref(result)) for mesh, run, key, result in held]

    def wait(self, timeout: Any = None) -> bool:
        held, self._held = self._held, []
        _mesh.wait_for([(mesh, run, key, result) for mesh, run, key, ref in held
                        if (result := ref()) is not None])
        return True

    def get_future(self) -> Any:
        return self._work.get_future()

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> Any:
        return None

    def result(self) -> Any:
        return self._work.result()

    def synchronize(self) -> None:
        pass


def is_async(opts: Any) -> bool:
    """Whether the caller asked for an asynchronous collective (c10d's
    options say so; without options, as c10d's default: yes)."""
    return bool(getattr(opts, "asyncOp", True))


def _waits_if_synchronous(fn: Any) -> Any:
    """A collective method that, called synchronously (its ``opts`` say
    ``asyncOp=False``), returns only once the collectives it ran are done:
    one that failed or timed out raises there, naming itself and the ranks
    that did not answer (``_mesh``).  Called asynchronously it returns at
    once: the device runs collectives in issue order, so any later op sees
    their results (and a failure shows where they are read)."""
    position = list(inspect.signature(fn).parameters).index("opts")

    @functools.wraps(fn)
    def method(*args: Any, **kwargs: Any) -> Any:
        opts = kwargs["opts"] if "opts" in kwargs else (args[position] if len(args) > position else None)
        if _mesh.is_holding():  # inside a synchronous call already
            return fn(*args, **kwargs)
        if is_async(opts):
            with _mesh.holding_results() as held:
                work = fn(*args, **kwargs)
            return CheckedWork(work, held) if held else work
        with _mesh.holding_results() as held:
            work = fn(*args, **kwargs)
            _mesh.wait_for(held)
        return work

    return method


_REDUCE_NAMES = {
    "SUM": "sum", "AVG": "avg", "PRODUCT": "prod", "MIN": "min", "MAX": "max",
    "BAND": "band", "BOR": "bor", "BXOR": "bxor",
}


def reduce_name(op: Any) -> str:
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
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
        if attempt and attempt != "0":
            # torchrun hands a restarted group the store of the attempt
            # before, which still holds that attempt's keys: gloo's addresses
            # of processes now dead (connecting to them fails), the
            # collectives' signatures, roll calls.  Each attempt keeps to
            # its own keys.
            store = dist.PrefixStore(f"pjrt_attempt{attempt}", store)
        self._rank = rank
        self._size = size
        self._store = store
        self._timeout = timeout
        self._global_ranks = global_ranks or list(range(size))
        self._cpu = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), rank, size, timeout)
        self._meshes: dict[int, GroupMesh] = {}  # local device index -> the group's mesh
        self._p2p = PointToPoint(store, rank, size, timeout)  # queued sends and receives of 'jax' tensors
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

    #: torch splits new groups from a bound device's backend only where it
    #: says so; this group makes each new group itself.
    supports_splitting = False

    def _get_backend(self, device: Any) -> Any:
        """The backend of ``device``'s collectives: this group for 'jax'
        tensors, its gloo group for CPU ones.  torch asks it of a group
        made with ``init_process_group(..., device_id=torch.device('jax',
        0))`` (as Lightning passes on torch >= 2.3: to connect that device
        eagerly, and to split new groups from it); the C++ base knows no
        backend of a group written in Python, and raised "No backend type
        associated with device type jax"."""
        device = torch.device(device)
        if device.type == "cpu":
            return self._cpu
        if device.type == DEVICE_NAME:
            return self
        raise RuntimeError(f"No backend type associated with device type {device.type}: the 'pjrt' process group "
                           f"runs collectives of '{DEVICE_NAME}' and 'cpu' tensors; pass "
                           f"device_id=torch.device('{DEVICE_NAME}', index)")

    # ------------------------------------------------------------ collectives

    @_x64_if_loaded
    @_waits_if_synchronous
    def allreduce(self, tensors: list, opts: Any = None) -> Any:
        if not any(_is_jax(t) for t in tensors):
            return self._cpu.allreduce(tensors, opts) if opts is not None else self._cpu.allreduce(tensors)
        op = reduce_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        for t in tensors:
            self._write(t, self._engine(t).reduce(self._read(t), op))
        return completed_work(tensors)

    @_x64_if_loaded
    @_waits_if_synchronous
    def allreduce_coalesced(self, tensors: list, opts: Any = None) -> Any:
        if not any(_is_jax(t) for t in tensors):
            return self._cpu.allreduce_coalesced(tensors, opts)
        return self.allreduce(tensors, opts)

    @_x64_if_loaded
    @_waits_if_synchronous
    def broadcast(self, tensors: list, opts: Any) -> Any:
        if not any(_is_jax(t) for t in tensors):
            return self._cpu.broadcast(tensors, opts)
        for t in tensors:
            self._write(t, self._engine(t).broadcast(self._read(t), opts.rootRank))
        return completed_work(tensors)

    @_x64_if_loaded
    @_waits_if_synchronous
    def allgather(self, output_lists: list, inputs: list, opts: Any = None) -> Any:
        if not any(_is_jax(t) for t in inputs):
            return self._cpu.allgather(output_lists, inputs, opts) if opts is not None else \
                self._cpu.allgather(output_lists, inputs)
        for outputs, t in zip(output_lists, inputs):
            gathered = self._engine(t).gather(self._read(t))
            for i, out in enumerate(outputs):
                self._write(out, gathered[i])
        return completed_work(output_lists)

    @_waits_if_synchronous
    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        if not _is_jax(input):
            return self._cpu._allgather_base(output, input, opts) if opts is not None else \
                self._cpu._allgather_base(output, input)
        gathered = self._engine(input).gather(self._read(input))
        self._write(output, gathered.reshape(tuple(output.shape)))
        return completed_work(output)

    @_x64_if_loaded
    @_waits_if_synchronous
    def allgather_into_tensor_coalesced(self, outputs: list, inputs: list, opts: Any = None) -> Any:
        for output, t in zip(outputs, inputs):
            self._allgather_base(output, t, opts)
        return completed_work(outputs)

    @_x64_if_loaded
    @_waits_if_synchronous
    def reduce_scatter(self, outputs: list, input_lists: list, opts: Any) -> Any:
        if not any(_is_jax(t) for t in outputs):
            return self._cpu.reduce_scatter(outputs, input_lists, opts)
        op = reduce_name(opts.reduceOp)
        import jax.numpy as jnp

        for out, inputs in zip(outputs, input_lists):
            stacked = jnp.stack([self._read(t) for t in inputs])
            self._write(out, self._engine(out).reduce_scatter(stacked, op)[0])
        return completed_work(outputs)

    @_waits_if_synchronous
    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any:
        if not _is_jax(input):
            return self._cpu._reduce_scatter_base(output, input, opts)
        op = reduce_name(opts.reduceOp)
        chunks = self._read(input).reshape((self._size, *tuple(output.shape)))
        self._write(output, self._engine(input).reduce_scatter(chunks, op)[0])
        return completed_work(output)

    @_x64_if_loaded
    @_waits_if_synchronous
    def reduce_scatter_tensor_coalesced(self, outputs: list, inputs: list, opts: Any) -> Any:
        for output, t in zip(outputs, inputs):
            self._reduce_scatter_base(output, t, opts)
        return completed_work(outputs)

    @_x64_if_loaded
    @_waits_if_synchronous
    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list,
                      input_split_sizes: list, opts: Any = None) -> Any:
        if not _is_jax(input):
            return self._cpu.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)
        n = self._size
        if (output_split_sizes and len(set(output_split_sizes)) > 1) or \
                (input_split_sizes and len(set(input_split_sizes)) > 1):
            return self._uneven_alltoall(output, input, list(output_split_sizes), list(input_split_sizes), opts)
        chunks = self._read(input).reshape((n, input.shape[0] // n, *tuple(input.shape[1:])))
        self._write(output, self._engine(input).all_to_all(chunks).reshape(tuple(output.shape)))
        return completed_work(output)

    def _uneven_alltoall(self, output: torch.Tensor, input: torch.Tensor, out_splits: list,
                         in_splits: list, opts: Any) -> Any:
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
        return completed_work(output)

    @_x64_if_loaded
    @_waits_if_synchronous
    def reduce(self, tensors: list, opts: Any) -> Any:
        if not any(_is_jax(t) for t in tensors):
            return self._cpu.reduce(tensors, opts)
        return self.reduce_to_root(tensors, opts.reduceOp, opts.rootRank, opts)

    @_x64_if_loaded
    @_waits_if_synchronous
    def gather(self, output_lists: list, inputs: list, opts: Any) -> Any:
        if not any(_is_jax(t) for t in inputs):
            return self._cpu.gather(output_lists, inputs, opts)
        return self.gather_to_root(output_lists, inputs, opts.rootRank, opts)

    @_x64_if_loaded
    @_waits_if_synchronous
    def scatter(self, outputs: list, input_lists: list, opts: Any) -> Any:
        if not any(_is_jax(t) for t in outputs):
            return self._cpu.scatter(outputs, input_lists, opts)
        return self.scatter_from_root(outputs, input_lists, opts.rootRank, opts)

    @_x64_if_loaded
    @_waits_if_synchronous
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
        return completed_work(outputs)

    @_x64_if_loaded
    @_waits_if_synchronous
    def allgather_coalesced(self, output_lists: list, inputs: list, opts: Any = None) -> Any:
        if not any(_is_jax(t) for t in inputs):
            return self._cpu.allgather_coalesced(output_lists, inputs, opts)
        return self.allgather(output_lists, inputs, opts)

    @_x64_if_loaded
    def barrier(self, opts: Any = None) -> Any:
        return self._cpu.barrier(opts) if opts is not None else self._cpu.barrier()

    # send/recv of 'jax' tensors: queued, and run in an order every rank
    # derives alike (see _p2p).

    @_x64_if_loaded
    def send(self, tensors: list, dst: int, tag: int = 0) -> Any:
        if not any(_is_jax(t) for t in tensors):
            return self._cpu.send(tensors, dst, tag)
        return self._p2p.queue(tensors, src=self._rank, dst=dst)

    @_x64_if_loaded
    def recv(self, tensors: list, src: int, tag: int = 0) -> Any:
        if src is None or src < 0:
            raise NotImplementedError(
                f"pjrt_host: recv from any source is not supported by the '{BACKEND_NAME}' backend for 'jax' "
                "tensors (an XLA transfer names both ends); pass src=")
        if not any(_is_jax(t) for t in tensors):
            return self._cpu.recv(tensors, src, tag)
        return self._p2p.queue(tensors, src=src, dst=self._rank)

    # ------------------------------------------------------------ rooted collectives
    # (also what the dispatcher's c10d::reduce_ / gather_ / scatter_ run)

    @_waits_if_synchronous
    def reduce_to_root(self, tensors: list, reduce_op: Any, root: int, opts: Any = None) -> Any:
        op = reduce_name(reduce_op)
        for t in tensors:
            result = self._engine(t).reduce(self._read(t), op)
            if self._rank == root:
                self._write(t, result)
        return completed_work()

    @_waits_if_synchronous
    def gather_to_root(self, output_lists: list | None, inputs: list, root: int, opts: Any = None) -> Any:
        for outputs, t in zip(output_lists or [[]] * len(inputs), inputs):
            gathered = self._engine(t).gather(self._read(t))
            if self._rank == root:
                for i, out in enumerate(outputs):
                    self._write(out, gathered[i])
        return completed_work()

    @_waits_if_synchronous
    def scatter_from_root(self, outputs: list, input_lists: list, root: int, opts: Any = None) -> Any:
        import jax
        import jax.numpy as jnp

        for i, out in enumerate(outputs):
            engine = self._engine(out)
            if self._rank == root:
                stacked = jnp.stack([self._read(t) for t in input_lists[i]])
            else:
                stacked = jnp.zeros((self._size, *tuple(out.shape)), dtype=self._read(out).dtype)
            stacked = jax.device_put(stacked, engine.local_device)
            self._write(out, engine.broadcast(stacked, root)[self._rank])
        return completed_work()

    # ------------------------------------------------------------ plumbing

    _read = staticmethod(_tensors.read)
    _write = staticmethod(_tensors.write)

    def _engine(self, t: torch.Tensor) -> GroupMesh:
        if self._p2p.pending:
            self._p2p.flush()  # the group's operations run in the order they were called
        index = t.device.index or 0
        found = self._meshes.get(index)
        if found is None:
            with self._lock:
                found = self._meshes.get(index)
                if found is None:
                    # The n-th meeting of each rank pairs with the others' n-th
                    # (ranks may use different local device indices).
                    found = GroupMesh.meet(self._store, self._rank, self._size, index, self._timeout,
                                           len(self._meshes))
                    found.global_ranks = self._global_ranks
                    self._meshes[index] = found
        return found
