"""The devices of a process group as a one-axis jax mesh, and the
collectives compiled over it.

Each rank's tensor is one shard of a global jax array over the mesh (one
device per rank, in group-rank order); one jitted program per (collective,
shape, dtype) gives each rank its result -- NCCL on GPUs, ICI on TPUs,
XLA:CPU's collectives on cpu_ref.  Before a collective of a new signature
first runs, the ranks compare it through the group's store, so a mismatch
raises on every rank instead of ending a process inside the transport.
The results a synchronous call runs are held for it (``holding_results``)
and waited for (``wait_for``, bounded by the group's timeout); one that
failed or timed out raises, naming the collective and, from a roll call in
the store, the ranks that did not answer.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import functools
import threading
import time
import weakref
from typing import Any, Iterator

from ... import _program_cache
from . import _waiting

__all__ = ["GroupMesh", "holding_results", "is_holding", "wait_for"]

# The results of the collectives a synchronous call runs, held (only) for
# the call: a reference kept past it would stop eager in-place writes from
# donating the tensor's buffer (they count references).
_held = threading.local()


@contextlib.contextmanager
def holding_results() -> Iterator[list]:
    """Within: every collective run on this thread adds (mesh, run,
    signature, result) to the list yielded, for :func:`wait_for`."""
    _held.results = held = []
    try:
        yield held
    finally:
        _held.results = None


#: The collectives issued last (mesh, run, signature, weak reference to the
#: result), for :func:`named_failure`.
_recent: "collections.deque[tuple]" = collections.deque(maxlen=64)


def named_failure(err: BaseException) -> RuntimeError | None:
    """For an error that surfaced where a device value was read: the named
    error of the collective it came from -- the earliest of the collectives
    issued last whose result failed -- or None when none did."""
    if isinstance(err, RuntimeError) and str(err).startswith("pjrt_host: "):
        return None  # named already
    for mesh, run, key, ref in list(_recent):
        result = ref()
        if result is None or not result.is_ready():
            continue
        try:
            result.block_until_ready()
        except Exception as cause:
            _recent.clear()
            return mesh._failure(run, key, cause)
    return None


#: Whether a collective of any group of this process has failed.
_any_failed = False


def known_failure(err: BaseException) -> bool:
    """Whether ``err``, raised where a device value was waited for, repeats
    a collective failure this process was told of before: a failure named
    again after its group had raised one, or an unnamed error of a program
    that took a failed collective's result, once one has failed."""
    if getattr(err, "pjrt_known_failure", False):
        return True
    return _any_failed and not str(err).startswith("pjrt_host: ")


def is_holding() -> bool:
    """Whether this thread is inside :func:`holding_results`."""
    return getattr(_held, "results", None) is not None


def wait_for(held: list) -> None:
    """Wait for the held results, all of them within the group's timeout
    from now (one deadline for the call, not one per collective); a failed
    or timed-out collective raises, naming itself and the ranks that did
    not answer."""
    started = time.monotonic()
    while held:
        mesh, run, key, result = held.pop(0)
        mesh.wait(run, key, result, started)
        del result


# Collectives run in the order this process issues them.  The device
# would not keep it by itself: XLA:CPU runs programs dispatched from two
# threads (autograd's device thread issues DDP's bucket all_reduce, the main
# thread the next collective) side by side, so two collectives met another
# rank's in the other order -- a gloo abort, or, at equal sizes, each rank
# reducing the wrong tensor.  Every collective program takes an order token
# and returns the next: the last one issued over the same devices, until
# that collective has finished.  The lock makes "take the token, dispatch,
# keep the new one" one step between threads.
_order_lock = threading.Lock()
_last_token: dict[frozenset, Any] = {}  # the devices of a group -> the token its last collective returned
_fresh_tokens: dict[Any, Any] = {}  # device -> a token nothing waits on


def _debug_detail() -> bool:
    import torch.distributed as dist

    return dist.get_debug_level() == dist.DebugLevel.DETAIL


def _ordered(body: Any) -> Any:
    def program(g: Any, token: Any) -> tuple:
        return body(g), token + 1

    return program


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
        self._generation = generation
        self._runs = 0  # collectives run so far: the same count on every rank
        self._failed: dict[int, str] = {}  # run -> its named error, once known (one roll call per failure)
        self.global_ranks: list[int] | None = None  # the job's rank of each group rank (set by the group)
        # TORCH_DISTRIBUTED_DEBUG=DETAIL: every collective is compared across
        # the ranks before it runs, not only a new signature (as torch's
        # wrapper group checks each collective's fingerprint then), so
        # collectives called in another order raise instead of ending a
        # process inside the transport.  A round trip through the store each.
        self._agree_each = _debug_detail()

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
            absent = self._absent(keys) or "not all came"
            raise RuntimeError(
                f"pjrt_host: rank {self.rank} of a process group of {self.size} reached {key[0]} (shape {key[-2]}, "
                f"dtype {key[-1]}) and waited {self._timeout} for the other ranks: {absent} "
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
        if self._agree_each and n:
            # every rank has set key n, so every rank has read all of n - 1
            self._store.delete_key(f"{self._prefix}/{n - 1}/{self.rank}")

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
        from jax.sharding import NamedSharding, PartitionSpec

        key = kind + (tuple(local.shape), str(local.dtype))
        fn = self._cache.get(key)
        if fn is None or self._agree_each:
            self._agree(key)
        if fn is None:
            spec = PartitionSpec("ranks") if split else PartitionSpec()
            fn = self._cache[key] = _program_cache.jit(
                _ordered(body), keep_unused=True,
                out_shardings=(NamedSharding(self.mesh, spec), NamedSharding(self.mesh, PartitionSpec())))
        with _order_lock:
            run = self._runs
            self._runs += 1
            try:
                result, token = fn(self._global(local), self._token())
                _last_token[self._clique] = token.addressable_data(0)
                failed = None
            except Exception as err:
                failed = err
        if failed is not None:
            raise self._failure(run, key, failed) from failed
        result = result.addressable_data(0)
        held = getattr(_held, "results", None)
        if held is not None:
            held.append((self, run, key, result))
        _recent.append((self, run, key, weakref.ref(result)))
        return result

    @functools.cached_property
    def _clique(self) -> frozenset:
        return frozenset(d.id for d in self.mesh.devices.flat)

    def _token(self) -> Any:
        """The order token for the next collective over this group's
        devices: the last one's, while that collective may still be running
        (so the next waits for it), else a fresh one (nothing to wait for,
        and a failed collective's error is not passed on to the next)."""
        import jax
        import numpy as np
        from jax.sharding import NamedSharding, PartitionSpec

        last = _last_token.get(self._clique)
        if last is None or last.is_deleted() or last.is_ready():
            last = _fresh_tokens.get(self.local_device)
            if last is None:
                last = _fresh_tokens[self.local_device] = jax.device_put(np.zeros((), np.int32), self.local_device)
        return jax.make_array_from_single_device_arrays((), NamedSharding(self.mesh, PartitionSpec()), [last])

    def wait(self, run: int, key: tuple, result: Any, started: float | None = None) -> None:
        """Wait for collective number ``run``'s result, at most the group's
        timeout since ``started`` (``time.monotonic()``; default now; the
        roll call after a failure fits in it too)."""
        budget = None if self._timeout is None else self._timeout - self._roll_call_time()
        if budget is not None and started is not None:
            spent = datetime.timedelta(seconds=time.monotonic() - started)
            budget = max(budget - spent, datetime.timedelta(0))
        error = _waiting.wait_ready(result, budget)
        if error is not None:
            raise self._failure(run, key, error) from error

    def _failure(self, run: int, key: tuple, err: BaseException) -> RuntimeError:
        """The error for collective number ``run`` failing with ``err``:
        which ranks are gone, found by a roll call in the group's store."""
        # Whether this group had raised a failure before this one (or this
        # one before): synchronize() does not raise it again -- a survivor
        # that caught it saves its state, and DCP's writer synchronizes.
        global _any_failed
        known, _any_failed = bool(self._failed), True
        if run in self._failed:  # named before (a value computed from it read again): no second roll call
            error = RuntimeError(self._failed[run])
        else:
            error = self._name_failure(run, key, err)
            self._failed[run] = str(error)
        error.pjrt_known_failure = known
        return error

    def _name_failure(self, run: int, key: tuple, err: BaseException) -> RuntimeError:
        from .. import _sync

        # The failure is reported here, by name: the device's synchronize()
        # (which DCP's writer and torch.save of device tensors call) must
        # not raise it again for a survivor that saves its state.
        _sync.forget_results()
        what = (f"{key[0]} of a 'jax' tensor of shape {key[-2]} and dtype {key[-1]} on rank {self.rank} of a "
                f"process group of {self.size}")
        cause = f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
        absent = self._roll_call(run)
        from ... import _peers

        heard = _peers.describe()  # from the coordination service's process: exact, and the store may be gone
        if heard:
            absent = f"{absent} ({heard})" if absent else heard
        if absent:
            how = (f"did not complete within the process group's timeout ({self._timeout})"
                   if isinstance(err, TimeoutError) else "failed")
            return RuntimeError(
                f"pjrt_host: {what} {how}: {absent}. Cause: {cause}. The job cannot go on without that rank: "
                "restart it (torchrun --max-restarts, from a checkpoint); init_process_group(timeout=...) bounds "
                "how long a rank waits for the others.")
        from ... import _runtime

        plugin = _runtime.runtime().record.name
        return RuntimeError(
            f"pjrt_host: {what} failed: {cause}. Every rank answered after the failure, and the ranks agreed on "
            "this collective, shape and dtype before it first ran, so the device's collective itself failed: "
            f"`python -m pjrt_host check {plugin} --only collectives` tests the plugin's collectives.")

    def _roll_call(self, run: int) -> str:
        """'' when every rank of the group answers in the store after
        collective ``run`` failed; else which did not."""
        if self._store is None or self.size == 1:
            return ""
        keys = [f"pjrt_failed/{self._generation}/{run}/{r}" for r in range(self.size)]
        try:
            self._store.set(keys[self.rank], "1")
            # Wait for the ranks not known to be dead (pjrt_host._peers hears
            # of a death at once), in slices, so a death heard of meanwhile
            # ends the wait too.
            deadline = time.monotonic() + self._roll_call_time().total_seconds()
            while True:
                dead = self._dead_group_ranks()
                waiting = [k for r, k in enumerate(keys) if r not in dead]
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    self._store.wait(waiting, datetime.timedelta(seconds=min(left, 0.25)))
                    break
                except Exception as err:
                    if type(err).__name__ == "DistNetworkError":  # the store is gone (below)
                        break
                    # not all yet: look again for deaths heard of meanwhile
            return self._absent(keys)
        except Exception as err:  # the store is gone: its host (the job's rank 0) has stopped
            return _STORE_GONE.format(type(err).__name__)

    def _dead_group_ranks(self) -> set[int]:
        """The group ranks whose processes the coordination service's process
        reported dead."""
        from ... import _peers

        dead = set(_peers.dead_ranks())
        if not dead:
            return set()
        ranks = self.global_ranks or list(range(self.size))
        return {r for r, g in enumerate(ranks) if g in dead}

    def _roll_call_time(self) -> datetime.timedelta:
        # The ranks that are left see the same failure within moments of one
        # another (the transport fails on all of them): a few seconds, at
        # most a quarter of the group's timeout, keeps the error prompt.
        return _ROLL_CALL if self._timeout is None else min(_ROLL_CALL, self._timeout / 4)

    def _absent(self, keys: list[str]) -> str:
        """Which ranks have not set their key, in words ('' if none)."""
        try:
            missing = [r for r, k in enumerate(keys) if not self._store.check([k])]
        except Exception as err:
            return _STORE_GONE.format(type(err).__name__)
        if not missing:
            return ""
        ranks = ", ".join(map(str, missing))
        return (f"rank{'s' if len(missing) > 1 else ''} {ranks} of the group did not answer (died, stuck, or "
                "calling another collective)")

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


_STORE_GONE = ("the process group's store does not answer ({}): the job's rank 0, which holds it "
               "(MASTER_ADDR), has died")

#: At most how long a rank waits for the others to answer a roll call after
#: a collective failed.
_ROLL_CALL = datetime.timedelta(seconds=5)


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
    return _program_cache.jit(_reducer(op))


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
