"""The device inside autograd's backward: its errors delivered intact, and
the caller's ``pjrt_host.config`` settings in force.

Settings: autograd's engine runs the backward of 'jax' tensors in its own
thread, where the caller's ``with pjrt_host.config(...)`` (thread-local) is
not set; the wrapper below hands the caller's settings to threads that have
set none of their own for the duration of the backward.

Errors:

When a C++ autograd node (``MaskedSoftmaxBackward0``, ``GridSampler2DBackward0``
...) runs on the 'jax' device, autograd's engine holds a stream guard of
torch's Python-backend device guard around it.  If the device raises a
Python exception there, the guard's destructor calls back into Python while
that exception is still pending; CPython refuses the call, and the C++
destructor's failure ends the process (``terminate called without an active
exception``) -- a missing lowering or an out-of-memory in a backward killed
the program instead of raising.

No exception may leave the device inside a backward, then (and returning
``NotImplemented``, for torch to raise its own error, ends the same way).
Inside a backward (``torch._C._current_graph_task_id() != -1``) the
dispatcher stores its exception here and returns placeholder results of the
shapes torch's meta kernel gives (zeros; the schema's where torch refuses
the call itself, as atan2's backward formula negating a bool tensor), so
the engine finishes; every later op of that backward is skipped the same
way (nothing computed, nothing written), since CPU's engine stops at the
failing node.  The wrapper around ``torch.autograd._engine_run_backward``
(through which ``Tensor.backward`` and ``torch.autograd.grad`` run the
engine) then unsets each leaf's ``.grad`` that is a placeholder and raises
the stored exception: the leaves hold what they hold on CPU, the sums of
the nodes before the failing one.  Both hooks are torch internals;
tests/test_torch_errors.py pins them (in a child process, as a regression
would end the process).

Exceptions that do not come from the device (a hook's, a fake kernel's
while torch.compile traces a backward) unwind the engine as they are: the
device guard's ``type_`` (``_boot._privateuse1``) takes the pending one
from CPython when the stream guard's destructor calls it, keeps it here
(:func:`unwinding`), and the same wrapper raises it.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import torch

__all__ = ["CANNOT", "defer", "failed_here", "skip", "unwinding", "wrap_engine_run_backward"]

_lock = threading.Lock()
_pending: BaseException | None = None
#: the graph task (``torch._C._current_graph_task_id()``) whose op failed
_pending_task = -1
#: the placeholders' storages handed out since that error, by id (kept
#: alive, so the ids stay theirs): a leaf's ``.grad`` holding one is unset
_made: dict[int, Any] = {}
#: ``_placeholders``' answer where the schema says nothing it can give
CANNOT = object()
#: an exception that was unwinding autograd's engine when torch's device
#: guard called into Python (taken from CPython there: ``_privateuse1``)
_unwound: BaseException | None = None


def unwinding(err: BaseException) -> None:
    """Keep ``err``, the exception a C++ frame was unwinding with (a hook's,
    a fake kernel's), for backward() to raise: the first one is the cause."""
    global _unwound
    with _lock:
        if _unwound is None:
            _unwound = err


def _take_unwound() -> BaseException | None:
    global _unwound
    with _lock:
        err, _unwound = _unwound, None
    return err


#: set while this thread makes placeholders (the ops that making them takes run unskipped)
_making = threading.local()


def failed_here() -> bool:
    """Whether an op of the backward this thread runs has failed already."""
    return _pending is not None and torch._C._current_graph_task_id() == _pending_task \
        and not getattr(_making, "on", False)


def defer(err: BaseException, func: Any, args: tuple, kwargs: dict) -> Any:
    """Keep ``err`` for the caller of the backward; return ``func``'s
    placeholder results (or raise ``err`` when torch cannot say their shapes)."""
    global _pending, _pending_task
    with _lock:
        if _pending is None:  # the first error is the cause; later ones follow from it
            _pending, _pending_task = err, torch._C._current_graph_task_id()
    placeholder = _placeholders(func, args, kwargs, cpu=True)
    if placeholder is CANNOT:
        raise err from None
    return placeholder


def skip(func: Any, args: tuple, kwargs: dict) -> Any:
    """An op of a backward after its first error: placeholders, nothing run
    and nothing written.  CPU's engine stops at the failing node, so no later
    node adds to a leaf's ``.grad`` or writes anywhere; skipping them leaves
    what CPU leaves.  ``CANNOT`` where the placeholders cannot be made (the
    op then runs)."""
    return _placeholders(func, args, kwargs)


def _placeholders(func: Any, args: tuple, kwargs: dict, cpu: bool = False) -> Any:
    """Results standing in for ``func``'s, whose values are never used: the
    written argument for each result that aliases one, else tensors of the
    shapes and dtypes torch's meta kernel gives (with ``cpu``, its CPU
    kernel's results where it has none; the schema's where they refuse the
    call)."""
    before, _making.on = getattr(_making, "on", False), True
    try:
        return _make_placeholders(func, args, kwargs, cpu)
    finally:
        _making.on = before


def _make_placeholders(func: Any, args: tuple, kwargs: dict, cpu: bool) -> Any:
    from torch.utils._pytree import tree_leaves, tree_map

    from . import _meta
    from ._tensor import JaxTensor, new_tensor

    index = next((t._storage.device_index for t in tree_leaves((args, kwargs)) if isinstance(t, JaxTensor)), 0)
    written = _written_results(func, args, kwargs)
    if written is not CANNOT:
        return written
    try:
        known, meta = _meta.run_meta(func, args, kwargs)
    except Exception:
        known = False
    if known:
        placeholder = tree_map(
            lambda m: _made_here(new_tensor(tuple(m.shape), m.dtype, index)) if isinstance(m, torch.Tensor) else m,
            meta)
    elif not cpu:  # an op after the error: nothing runs, on the device or on CPU
        placeholder = _by_schema(func, args, kwargs, index)
    else:  # no meta kernel: torch CPU's results give the shapes (their values are never used)
        from ._cpu_fallback import run_on_cpu

        try:
            placeholder = _meta.without_warnings(lambda: run_on_cpu(func, args, kwargs))
        except Exception:
            # torch refuses the call itself (a backward formula's ``-self``
            # of a bool tensor: atan2's): its schema says what to return
            placeholder = _by_schema(func, args, kwargs, index)
    return placeholder


def _made_here(t: Any) -> Any:
    with _lock:
        _made[id(t._storage)] = t._storage
    return t


def _written_results(func: Any, args: tuple, kwargs: dict) -> Any:
    """The arguments an in-place or out= op returns, unwritten; ``CANNOT``
    for other ops."""
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.returns or not schema.is_mutable:
        return CANNOT
    bound = dict(zip((a.name for a in schema.arguments), args))
    bound.update(kwargs)
    results = []
    for ret in schema.returns:
        alias = ret.alias_info
        if alias is None or not alias.is_write:
            return CANNOT
        arg = next((a for a in schema.arguments
                    if a.alias_info is not None and a.alias_info.before_set == alias.before_set), None)
        if arg is None or not isinstance(bound.get(arg.name), torch.Tensor):
            return CANNOT
        results.append(bound[arg.name])
    return results[0] if len(results) == 1 else tuple(results)


def _by_schema(func: Any, args: tuple, kwargs: dict, index: int) -> Any:
    """Placeholder results read from ``func``'s schema where neither torch's
    meta kernel nor its CPU kernel accepts the call: a tensor of the tensor
    arguments' broadcast shape and the first one's dtype for each result;
    ``CANNOT`` where a result is no tensor.  They only have to let the
    engine finish; backward() then raises the stored error."""
    from torch.utils._pytree import tree_leaves

    from ._tensor import new_tensor

    schema = getattr(func, "_schema", None)
    tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if schema is None or not tensors or not schema.returns \
            or not all(isinstance(r.type, torch.TensorType) for r in schema.returns):
        return CANNOT
    try:
        shape = tuple(torch.broadcast_shapes(*(t.shape for t in tensors)))
    except RuntimeError:
        shape = tuple(tensors[0].shape)
    results = [_made_here(new_tensor(shape, tensors[0].dtype, index)) for _ in schema.returns]
    return results[0] if len(results) == 1 else tuple(results)


def _take(roots: Any = ()) -> BaseException | None:
    """The pending error, cleared; with it, every leaf reached from
    ``roots`` whose ``.grad`` is a placeholder gets none again (CPU's engine
    never reached its AccumulateGrad)."""
    global _pending, _pending_task
    with _lock:
        err, _pending, _pending_task = _pending, None, -1
        made = dict(_made)
        _made.clear()
    if err is not None and made:
        _forget_placeholder_grads(roots, made)
    return err


def _forget_placeholder_grads(roots: Any, made: dict[int, Any]) -> None:
    if isinstance(roots, torch.Tensor):
        roots = (roots,)
    stack = [getattr(t, "grad_fn", None) for t in roots or ()]
    seen: dict[int, Any] = {}  # the nodes kept alive, so that their ids stay theirs
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        leaf = getattr(node, "variable", None)  # an AccumulateGrad node
        if isinstance(leaf, torch.Tensor) and id(getattr(leaf.grad, "_storage", None)) in made:
            leaf.grad = None
        stack.extend(n for n, _ in node.next_functions)


def _one_device_only(err: BaseException) -> RuntimeError:
    """torch's message when a backward runs on a 'jax' device other than
    jax:0: its autograd engine keeps one queue per device, and the device
    guard torch gives a Python-registered accelerator reports one device
    (``PythonDeviceGuard::deviceCount`` returns 1 in torch/csrc/acc)."""
    return RuntimeError(
        "backward() over tensors on a 'jax' device other than jax:0 is not possible in one process: torch's "
        "autograd engine keeps a queue per device and counts one device for a Python-registered accelerator "
        "(torch's INTERNAL ASSERT on device_ready_queues_ was: "
        f"{str(err).splitlines()[0][:160]}). Train on jax:0 and give each device its own process "
        "(python -m pjrt_host launch or torchrun: each process's jax:0 is its own device), or shard one model "
        "over all devices with pjrt_host.spmd.")


def wrap_engine_run_backward(run: Any) -> Any:
    """torch's engine entry point raising a pending device error at
    backward() (``_patches`` installs it: one Python frame per backward
    call; nothing changes when no device error is pending)."""
    from . import _config, _memory

    @functools.wraps(run)
    def _engine_run_backward(*args: Any, **kwargs: Any) -> Any:
        _take()  # nothing stale from an earlier call
        _take_unwound()
        if args:
            _memory.note_backward(args[0])  # the forward's activations are all alive now: a peak
        try:
            with _config.lent_to_other_threads():
                result = run(*args, **kwargs)
        except Exception as err:
            pending = _take(args[0] if args else ())
            unwound = _take_unwound()
            if pending is None and unwound is not None:
                # what torch reports for it has lost it (the device guard took it from CPython)
                raise unwound.with_traceback(unwound.__traceback__)
            if pending is None:
                if "device_ready_queues_" in str(err):
                    raise _one_device_only(err) from err
                raise
            raise pending from None
        pending = _take(args[0] if args else ())
        if pending is not None:
            raise pending
        return result

    return _engine_run_backward
