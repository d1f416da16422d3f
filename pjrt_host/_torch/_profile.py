"""``with pjrt_host.profile(logdir):`` -- a jax profiler trace of the 'jax'
device with torch's names on it.

Inside the block, jax's profiler records (``jax.profiler.trace``: a
TensorBoard / Perfetto trace under ``logdir/plugins/profile/<run>/``), and:

- every ATen op the device runs is a trace event named after the op
  (``aten::addmm.default``), and a ``jax.named_scope`` of the same name, so
  ops compiled inside the block carry it in their XLA metadata too;
- every ``nn.Module`` forward is an enclosing event named
  ``nn.<ClassName>`` (torch's global forward hooks), so an op's time is
  seen under the layer that ran it.

Outside the block the dispatcher pays one flag read per op.  Cheap to
import: jax is imported when a block starts.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["active", "op_scope", "profile"]

#: Whether a profile block is open (read by the dispatcher on every op).
active = False
_lock = threading.Lock()
_local = threading.local()


@contextlib.contextmanager
def op_scope(name: str) -> Iterator[None]:
    import jax

    with jax.profiler.TraceAnnotation(name), jax.named_scope(name):
        yield


def _module_pre(module: Any, args: Any) -> None:
    import jax

    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    ann = jax.profiler.TraceAnnotation(f"nn.{type(module).__name__}")
    ann.__enter__()
    stack.append(ann)


def _module_post(module: Any, args: Any, output: Any) -> None:
    stack = getattr(_local, "stack", None)
    if stack:
        stack.pop().__exit__(None, None, None)


@contextlib.contextmanager
def profile(logdir: str | os.PathLike, *, create_perfetto_link: bool = False) -> Iterator[str]:
    """Record a device trace into ``logdir`` (TensorBoard's profile plugin or
    https://ui.perfetto.dev open it), with torch op and module names::

        with pjrt_host.profile("/tmp/trace"):
            loss = model(x).sum(); loss.backward()

    Work queued in the block is waited for before the trace is written."""
    global active
    import jax
    import torch

    logdir = os.fspath(logdir)
    with _lock:
        if active:
            raise RuntimeError("pjrt_host.profile: a profile is already being recorded (blocks do not nest)")
        active = True
    pre = torch.nn.modules.module.register_module_forward_pre_hook(_module_pre)
    post = torch.nn.modules.module.register_module_forward_hook(_module_post)
    try:
        with jax.profiler.trace(logdir, create_perfetto_link=create_perfetto_link):
            try:
                yield logdir
            finally:
                from . import _sync

                _sync.synchronize()
    finally:
        pre.remove()
        post.remove()
        _local.stack = []
        active = False
