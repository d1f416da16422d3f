"""Collectives across the processes of a job, on the selected plugin.

Each process contributes one array of the same shape and dtype; the
contributions are laid out along a global mesh that has one device per
process (each process's first local device), and a jitted reduction over that
axis with a replicated result makes XLA emit the cross-process collective
(all-reduce, all-gather) for whatever the plugin is.  Nothing here knows the
device: the plugin and jax's coordinator provide the transport.

Arrays in and out.  Besides jax arrays (and anything ``jax.numpy.asarray``
takes), a collective accepts objects that wrap a jax array, such as the torch
'jax' device's tensors, in two ways:

* a type registered with :func:`register_array_type` (converters both ways);
* jax's own protocol: a ``__jax_array__()`` method; the result is given back
  through the type's ``from_jax(array)`` class method when it has one.

(Not a ``jax()`` method: torch gives every tensor one, meaning "move to the
'jax' device", once that device is registered.)  Otherwise the result is a
jax array on this process's device.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any, Callable

from ._jax_settings import x64_scope as _x64_scope
from . import _env, _process, _program_cache, _runtime
from ._errors import PjrtHostError, cause_text

__all__ = ["CollectiveError", "REDUCE_OPS", "all_gather", "all_reduce", "barrier", "broadcast", "register_array_type"]


class CollectiveError(PjrtHostError):
    """A collective could not be run (bad arguments, a peer that did not
    arrive in time, no coordinator with several processes)."""


#: Reductions :func:`all_reduce` knows, by name.
REDUCE_OPS = ("sum", "mean", "max", "min", "prod")

_AXIS = "processes"


@_x64_scope
def all_reduce(value: Any, op: str = "sum") -> Any:
    """Reduce ``value`` over every process with ``op`` (one of
    :data:`REDUCE_OPS`); every process gets the result.  ``mean`` of an
    integer array is a floating-point array, as in ``jax.numpy.mean``."""
    if op not in REDUCE_OPS:
        raise CollectiveError(f"pjrt_host: all_reduce(op={op!r}): unknown reduction; choose one of {', '.join(REDUCE_OPS)}.")
    array, rewrap = _unwrap(value)
    return rewrap(_run(("reduce", op), array))


@_x64_scope
def all_gather(value: Any) -> Any:
    """Every process's ``value``, stacked along a new first axis in process
    order: shape ``(process_count(), *value.shape)``, on every process."""
    array, rewrap = _unwrap(value)
    return rewrap(_run(("gather",), array))


@_x64_scope
def broadcast(value: Any, src: int = 0) -> Any:
    """Process ``src``'s ``value``, on every process.  Every process passes
    an array of the same shape and dtype (the others' values are ignored)."""
    count = _layout_size()
    if not 0 <= src < count:
        raise CollectiveError(f"pjrt_host: broadcast(src={src}): there are {count} processes; src must be in [0, {count}).")
    array, rewrap = _unwrap(value)
    return rewrap(_run(("broadcast", src), array))


_barrier_counter = itertools.count()


def barrier(name: str = "", timeout: float | None = None) -> None:
    """Wait until every process has reached the same barrier (the n-th call
    on each process meets the n-th on the others).  ``timeout``: seconds,
    default ``PJRT_HOST_COORDINATOR_TIMEOUT``; a peer that does not arrive
    in time raises :class:`CollectiveError` instead of waiting for ever."""
    if _layout_size() == 1:
        return
    from jax._src import distributed as jax_distributed

    client = jax_distributed.global_state.client
    if client is None:
        raise CollectiveError(
            "pjrt_host: barrier(): there are several processes but no coordinator "
            "(PJRT_HOST_XLA_COORDINATOR=off); unset it to use pjrt_host's collectives.")
    seconds = timeout if timeout is not None else _env.coordinator_timeout()
    barrier_id = f"pjrt_host_barrier_{next(_barrier_counter)}_{name}"
    try:
        client.wait_at_barrier(barrier_id, max(1, int(seconds * 1000)))
    except Exception as err:
        raise CollectiveError(
            f"pjrt_host: barrier {barrier_id!r}: not every process arrived within {seconds:g} s: "
            f"{cause_text(err, 300)}. A process has died or is stuck; "
            "see its log.") from err


# -- the seam for wrapped arrays ------------------------------------------------


# type -> (to_jax(value) -> jax array, from_jax(array, like=value) -> value's type)
_ARRAY_TYPES: dict[type, tuple[Callable[[Any], Any], Callable[[Any, Any], Any]]] = {}


def register_array_type(
    cls: type, to_jax: Callable[[Any], Any], from_jax: Callable[[Any, Any], Any]
) -> None:
    """Let the collectives take instances of ``cls`` (and its subclasses):
    ``to_jax(value)`` gives the jax array a value holds, and
    ``from_jax(array, value)`` wraps a result like ``value`` (same device,
    same type).  For the torch 'jax' device's tensors."""
    _ARRAY_TYPES[cls] = (to_jax, from_jax)


def _unwrap(value: Any) -> tuple[Any, Callable[[Any], Any]]:
    for cls, (to_jax, from_jax) in _ARRAY_TYPES.items():
        if isinstance(value, cls):
            return to_jax(value), functools.partial(_rewrap, from_jax, value)
    accessor = getattr(value, "__jax_array__", None)
    if not callable(accessor):
        return value, _identity
    array = accessor()
    from_jax = getattr(type(value), "from_jax", None)
    return array, from_jax if callable(from_jax) else _identity


def _identity(array: Any) -> Any:
    return array


def _rewrap(from_jax: Callable[[Any, Any], Any], like: Any, array: Any) -> Any:
    return from_jax(array, like)


# -- the engine -----------------------------------------------------------------


def _layout_size() -> int:
    _runtime.runtime()  # the layout is final once the client exists
    layout = _process.current_layout()
    return 1 if layout is None else layout.world_size


class _Mesh:
    __slots__ = ("mesh", "local_device", "count", "index")

    def __init__(self, mesh: Any, local_device: Any, count: int, index: int) -> None:
        self.mesh = mesh  #: one device per process, in process order
        self.local_device = local_device  #: this process's device in the mesh
        self.count = count  #: number of processes
        self.index = index  #: this process's position in the mesh


@functools.lru_cache(maxsize=1)
def _process_mesh() -> _Mesh:
    import jax
    import numpy as np
    from jax.sharding import Mesh

    rt = _runtime.runtime()
    if _layout_size() > 1 and not _process.is_coordinated():
        raise CollectiveError(
            "pjrt_host: collectives need jax.distributed's coordinator with several processes, and "
            "PJRT_HOST_XLA_COORDINATOR=off; unset it.")
    first: dict[int, Any] = {}
    for device in sorted(jax.devices(rt.backend), key=lambda d: (d.process_index, d.id)):
        first.setdefault(device.process_index, device)
    order = sorted(first)
    me = jax.process_index(rt.backend)
    return _Mesh(Mesh(np.array([first[p] for p in order]), (_AXIS,)), first[me], len(order), order.index(me))


@functools.lru_cache(maxsize=None)
def _compiled(kind: tuple[Any, ...]) -> Callable[[Any], Any]:
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = _process_mesh().mesh
    if kind[0] == "reduce":
        op = kind[1]
        if op == "mean":
            body = lambda g: jnp.mean(g, axis=0)  # noqa: E731
        elif op == "sum":
            body = lambda g: jnp.sum(g, axis=0, dtype=g.dtype)  # noqa: E731
        elif op == "prod":
            body = lambda g: jnp.prod(g, axis=0, dtype=g.dtype)  # noqa: E731
        else:
            body = getattr(jnp, op)
            body = functools.partial(body, axis=0)
    elif kind[0] == "gather":
        body = _identity
    else:
        src = kind[1]
        body = lambda g: g[src]  # noqa: E731
    return _program_cache.jit(body, out_shardings=NamedSharding(mesh, PartitionSpec()))


def _run(kind: tuple[Any, ...], value: Any) -> Any:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    pm = _process_mesh()
    local = jax.device_put(jnp.asarray(value)[None], pm.local_device)
    global_shape = (pm.count, *local.shape[1:])
    sharding = NamedSharding(pm.mesh, PartitionSpec(_AXIS))
    try:
        stacked = jax.make_array_from_single_device_arrays(global_shape, sharding, [local])
        result = _compiled(kind)(stacked)
    except Exception as err:
        raise CollectiveError(
            f"pjrt_host: {kind[0]} of an array of shape {tuple(local.shape[1:])} and dtype {local.dtype} "
            f"failed on process {pm.index} of {pm.count}: "
            f"{cause_text(err, 300)}. Every process must pass the same shape and dtype.") from err
    return result.addressable_data(0)
