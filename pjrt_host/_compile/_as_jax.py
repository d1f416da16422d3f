"""A torch function as a JAX function: ``call_torch`` and ``extract_jax``.

The function is traced once per argument signature (:mod:`._trace`, on fake
'jax' tensors shaped like the jax arguments) and evaluated on the jax values
themselves, so the result is ordinary jax code: it runs under ``jax.jit``,
``jax.grad``, ``jax.vmap`` and friends, and costs nothing extra there.

JAX arrays are immutable, so a torch function that writes into an argument
(``x.add_()``, a BatchNorm's running statistics in train mode) is refused
with an error naming the argument, never silently dropped.  Random ops need
a key: the ``rng`` argument when given (under a JAX transformation it must
be), else the device's generator.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable

import jax
import torch

from .._lowerings._dtypes import torch_dtype
from . import _checks, _door
from ._pure import PurityError, _describe
from ._trace import NotTraceable, Traced, call_with_leaves, fake_tensors, trace

__all__ = ["TorchAsJax"]


class TorchAsJax:
    """``fn`` (a torch function) callable with jax values."""

    def __init__(self, fn: Callable, name: str, *, maxsize: int = 128, what: str = "call_torch") -> None:
        self.fn = fn
        self.name = name
        self.what = what
        self.maxsize = maxsize
        self._cache: collections.OrderedDict[Any, Traced] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.traces = 0

    def __call__(self, args: tuple, kwargs: dict, rng: Any = None) -> Any:
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        arrays = []
        parts = []
        for pos, leaf in enumerate(leaves):
            if isinstance(leaf, torch.Tensor):
                raise TypeError(f"pjrt_host.interop.{self.what}({self.name}): {_describe(leaves, treedef, pos)} is "
                                f"a torch tensor; this function takes JAX values (use jax_view(t) to pass a 'jax' "
                                f"tensor's array).")
            if isinstance(leaf, jax.Array):
                arrays.append(leaf)
                parts.append((tuple(leaf.shape), leaf.dtype))
            else:
                parts.append((type(leaf), leaf))
        sig = (treedef, tuple(parts))
        try:
            traced = self._cache.get(sig)
        except TypeError:
            raise TypeError(f"pjrt_host.interop.{self.what}({self.name}): a non-tensor argument is not hashable; "
                            f"non-array arguments are static (part of the trace's key)") from None
        if traced is None:
            traced = self._trace(sig, leaves, treedef, arrays)
        else:
            with self._lock:
                if sig in self._cache:
                    self._cache.move_to_end(sig)
        key = None
        if traced.needs_rng:
            key = _key(rng, arrays, f"pjrt_host.interop.{self.what}({self.name})")
        cfg = _door.config()
        ctx = _door.lowering_context(cfg)
        rows: list | None = [] if cfg.check_mode and traced.program.sites else None
        outs, _ = traced.run(list(arrays), key, ctx, rows)
        if rows:
            self._check(rows, traced, cfg.check_mode)
        return traced.unflatten(outs)

    def _check(self, rows: list, traced: Traced, mode: Any) -> None:
        """The index checks of one call: queued with eager's deferred checks
        when the call ran on values, ``checkify.debug_check``s under a JAX
        transformation (no host code runs per call there)."""
        where = f"in pjrt_host.interop.{self.what}({self.name})"
        if any(isinstance(r, jax.core.Tracer) for _, _, r in rows):
            _checks.debug_checks(rows, traced.program.sites, where)
        else:
            _checks.report(_checks.stack(rows), traced.program.sites, mode, where)

    def _trace(self, sig: Any, leaves: list, treedef: Any, arrays: list) -> Traced:
        positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.Array)]
        index = _door.current_index()
        fakes = fake_tensors([(tuple(a.shape), torch_dtype(a.dtype), index) for a in arrays])
        flat_fn = call_with_leaves(self.fn, leaves, treedef, positions)

        what = f"pjrt_host.interop.{self.what}({self.name})"
        try:
            traced = trace(flat_fn, fakes, what)
        except NotTraceable as err:
            raise PurityError(f"{err}. A torch function run as JAX must be one graph of torch ops for each argument "
                              f"signature (see docs/interop.md).") from err.__cause__
        if traced.mutated:
            where = ", ".join(_describe(leaves, treedef, positions[n]) for n in traced.mutated)
            raise PurityError(self.mutation_message(where))
        with self._lock:
            self.traces += 1
            self._cache[sig] = traced
            while len(self._cache) > self.maxsize:
                self._cache.popitem(last=False)
        return traced

    def mutation_message(self, where: str) -> str:
        return (f"pjrt_host.interop.{self.what}({self.name}) writes in place into {where}; JAX arrays are "
                f"immutable, so the write would be lost. Write into a copy (x = x.clone()) inside the function, "
                f"or run it on 'jax' tensors with pjrt_host.assume_pure, which writes arguments back.")


def _key(rng: Any, arrays: list, what: str) -> Any:
    if rng is not None:
        dtype = getattr(rng, "dtype", None)
        if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            return rng  # a typed key: jax.random.key(seed)
        if dtype == "uint32" and tuple(rng.shape) == (2,):
            return jax.random.wrap_key_data(rng, impl="threefry2x32")  # raw key data: jax.random.PRNGKey(seed)
        return jax.random.key(rng)  # a seed
    if any(isinstance(a, jax.core.Tracer) for a in arrays):
        raise PurityError(
            f"{what} draws random numbers (dropout, randn, ...) inside a JAX transformation (jit, grad, vmap), where "
            f"a key from the device's generator would be fixed at trace time and every call would draw the same "
            f"numbers. Pass a key: rng=jax.random.key(seed) (a fresh one per step), or put the module in eval mode.")
    kd, counter = _door.next_key_args(_door.current_index())
    return _door.draw_key(kd, counter)
