"""JAX functions named by a number, so that a torch op can carry one.

``call_jax`` inside a traced torch program (``@assume_pure``,
``torch.compile``) becomes the op ``pjrt_host::call_jax(tensors, handle)``;
the handle names a :class:`JaxCall`: the user's jax function with the
argument structure and the non-tensor arguments of that call site fixed, as
a function of the flat list of tensor values.  A handle, once given, stays
valid for the life of the process (graphs keep it).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

__all__ = ["JaxCall", "get", "handle_for"]


class JaxCall:
    """``fn(*args, **kwargs)`` with the tensor leaves of (args, kwargs) taken
    from a flat list: ``flat(arrays) -> list of output arrays``."""

    def __init__(self, fn: Callable, treedef: Any, statics: tuple) -> None:
        self.fn = fn
        self.treedef = treedef  # jax treedef of (args, kwargs)
        self.statics = statics  # (position, value) of each non-tensor leaf
        self.out_treedef: Any = None  # set on first trace

    def call(self, arrays: list) -> Any:
        """The function's result (a pytree) on these tensor values."""
        import jax

        leaves: list[Any] = [None] * self.treedef.num_leaves
        fixed = dict(self.statics)
        it = iter(arrays)
        for pos in range(len(leaves)):
            leaves[pos] = fixed[pos] if pos in fixed else next(it)
        args, kwargs = jax.tree_util.tree_unflatten(self.treedef, leaves)
        return self.fn(*args, **kwargs)

    def flat(self, arrays: list) -> list:
        import jax

        out, treedef = jax.tree_util.tree_flatten(self.call(arrays))
        self.out_treedef = treedef
        return out

    def vjp(self, primals: list, cotangents: list) -> list:
        """Gradients of the float outputs' cotangents for every primal (zeros
        for integer primals, which have no gradient)."""
        import jax
        import jax.numpy as jnp

        floating = [i for i, p in enumerate(primals) if jnp.issubdtype(p.dtype, jnp.inexact)]

        def f(fl: list) -> Any:
            full = list(primals)
            for i, a in zip(floating, fl):
                full[i] = a
            outs = self.flat(full)
            kept = [o for o in outs if jnp.issubdtype(o.dtype, jnp.inexact)]
            return kept

        outs, pullback = jax.vjp(f, [primals[i] for i in floating])
        cts = [c.astype(o.dtype) for c, o in zip(cotangents, outs)]
        grads = pullback(cts)[0]
        result = [jnp.zeros(p.shape, p.dtype) for p in primals]
        for i, g in zip(floating, grads):
            result[i] = g
        return result

    @property
    def name(self) -> str:
        return getattr(self.fn, "__qualname__", None) or getattr(self.fn, "__name__", None) or type(self.fn).__name__


_lock = threading.Lock()
_by_key: dict[Any, int] = {}
_calls: list[JaxCall] = []


def handle_for(fn: Callable, treedef: Any, statics: tuple) -> int:
    key = (fn, treedef, statics)
    with _lock:
        h = _by_key.get(key)
        if h is None:
            h = _by_key[key] = len(_calls)
            _calls.append(JaxCall(fn, treedef, statics))
    return h


def get(handle: int) -> JaxCall:
    return _calls[handle]
