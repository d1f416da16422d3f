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
shapes torch's meta kernel gives (zeros), so the engine finishes; the
wrapper around ``torch.autograd._engine_run_backward`` (through which
``Tensor.backward`` and ``torch.autograd.grad`` run the engine) then raises
the stored exception.  As after any failed backward, ``.grad`` may hold
partial sums.  Both hooks are torch internals; tests/test_torch_errors.py
pins them (in a child process, as a regression would end the process).
"""

from __future__ import annotations

import functools
import threading
import warnings
from typing import Any

import torch

__all__ = ["defer", "wrap_engine_run_backward"]

_lock = threading.Lock()
_pending: BaseException | None = None


def defer(err: BaseException, func: Any, args: tuple, kwargs: dict) -> Any:
    """Keep ``err`` for the caller of the backward; return ``func``'s
    placeholder results (or raise ``err`` when torch cannot say their shapes)."""
    global _pending
    from torch.utils._pytree import tree_leaves, tree_map

    from . import _meta
    from ._tensor import JaxTensor, new_tensor

    index = next((t._storage.device_index for t in tree_leaves((args, kwargs)) if isinstance(t, JaxTensor)), 0)
    try:
        known, meta = _meta.run_meta(func, args, kwargs)
    except Exception:
        known = False
    if known:
        placeholder = tree_map(
            lambda m: new_tensor(tuple(m.shape), m.dtype, index) if isinstance(m, torch.Tensor) else m, meta)
    else:  # no meta kernel: torch CPU's results give the shapes (their values are never used)
        from ._cpu_fallback import run_on_cpu

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                placeholder = run_on_cpu(func, args, kwargs)
        except Exception:
            raise err from None
    with _lock:
        if _pending is None:  # the first error is the cause; later ones follow from it
            _pending = err
    return placeholder


def _take() -> BaseException | None:
    global _pending
    with _lock:
        err, _pending = _pending, None
    return err


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
        if args:
            _memory.note_backward(args[0])  # the forward's activations are all alive now: a peak
        try:
            with _config.lent_to_other_threads():
                result = run(*args, **kwargs)
        except Exception as err:
            pending = _take()
            if pending is None:
                if "device_ready_queues_" in str(err):
                    raise _one_device_only(err) from err
                raise
            raise pending from None
        pending = _take()
        if pending is not None:
            raise pending
        return result

    return _engine_run_backward
