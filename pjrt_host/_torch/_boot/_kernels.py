"""The device key's kernels: what torch calls for 'jax' work that carries no
'jax' tensor (factories) or runs with Python dispatch off (``_to_copy``,
``copy_``), and the fallback for every other such op.

Registered inside ``import torch``: cheap, no jax, no op tables.  Each kernel
loads the device on its first call (``_loader``).  Names, not
``torch.ops.aten`` attributes: an overload a torch release drops is skipped,
never an import error.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch

from .. import _loader

__all__ = ["AUTOGRAD_KERNEL_OPS", "CPU_FACTORY_OPS", "DEVICE_OPS", "FACTORY_OPS", "aten_op", "never_traced", "register"]

logger = logging.getLogger(__name__)

#: Kept alive: dropping a library unregisters its kernels.
_libraries: list[torch.library.Library] = []

# Factory ops that get a kernel of their own on the device key.  Without one,
# torch runs its composite kernel (e.g. zeros = empty + zero_), which works
# but costs an extra op.  Exactly the overloads the lowering table marks
# ``factory`` (tests/test_torch_factories.py keeps them equal; this list cannot
# read the table, which imports jax).
FACTORY_OPS = (
    "empty.memory_format",
    "empty_strided",
    "zeros",
    "ones",
    "full",
    "scalar_tensor",
    "arange",
    "arange.start",
    "arange.start_step",
    "linspace",
    "eye",
    "eye.m",
    "randn",
    "rand",
    "randint",
    "randint.low",
    "randperm",
    # With generator= (torch.Generator(device='jax') or a CPU one): drawn on
    # the device, the key seeded from the generator.
    "randn.generator",
    "rand.generator",
    "randint.generator",
    "randint.low_generator",
    "randperm.generator",
)

# Factories whose kernel for other devices is a composite that cannot run on
# the device: kaiser_window's calls a DispatchStub only CPU and CUDA fill,
# range's calls range.out, whose out= handler calls range again.  Computed on
# torch CPU and moved, as the device-key fallback computes the factories
# without a kernel (exact: torch CPU's own values).
CPU_FACTORY_OPS = (
    "kaiser_window",
    "kaiser_window.periodic",
    "kaiser_window.beta",
    "range",
    "range.step",
)

# Ops torch runs on the device key itself, with Python dispatch turned off
# (``torch.tensor(data, device='jax')`` calls ``_to_copy`` that way).
DEVICE_OPS = ("_to_copy", "copy_")

# Ops with a kernel and an autograd formula of their own on CPU and cuda, and
# a composite (math) kernel for other devices: a device key without a kernel
# for them gets that composite on its autograd key, so they never reached the
# device as themselves.  SiLU's backward then ran as 7 ops, each rounded to
# bfloat16 / float16 where CPU's kernel rounds once (a bfloat16 SiLU
# gradient off by a bfloat16 step and more, where CPU is within half of
# one).  A kernel here gives the autograd key torch's own autograd kernel;
# the op then reaches the device's lowering (tests/test_torch_factories.py
# reads torch's dispatch tables so that no lowered op is left out).
AUTOGRAD_KERNEL_OPS = ("silu_backward", "mish_backward", "native_channel_shuffle")


def never_traced(fn: Callable) -> Callable:
    # C++ -> Python entry points: dynamo must never trace them, also when a
    # compiled function's graph break runs an op eagerly.
    from .. import _hiding

    return _hiding.never_traced(fn)


def aten_op(name: str) -> Any:
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def register() -> torch.library.Library:
    """Register the fallback and the kernels of :data:`FACTORY_OPS` and
    :data:`DEVICE_OPS`; returns the ``aten`` library other kernels join."""
    from ... import _jax_settings

    scoped = _jax_settings.x64_scope
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(never_traced(scoped(_factory_fallback)), "PrivateUse1")
    # torch.autocast('jax'): ops pass through, except those _autocast lists.
    fallback.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    _libraries.append(fallback)
    aten = torch.library.Library("aten", "IMPL")
    _libraries.append(aten)
    for names, make_kernel in ((FACTORY_OPS, _factory_kernel), (CPU_FACTORY_OPS, _cpu_factory_kernel),
                               (DEVICE_OPS + AUTOGRAD_KERNEL_OPS, _device_kernel)):
        for name in names:
            try:
                aten.impl(name, never_traced(scoped(make_kernel(name))), "PrivateUse1")
            except Exception as err:  # a renamed overload must not stop the device
                logger.debug("no PrivateUse1 kernel for aten::%s: %s", name, err)
    return aten


def _factory_kernel(name: str) -> Callable:
    return _kernel(name, lambda op, args, kwargs: _loader.factories().run_factory(op, name, args, kwargs))


def _cpu_factory_kernel(name: str) -> Callable:
    return _kernel(name, lambda op, args, kwargs: _loader.factories().run(op, args, kwargs))


def _device_kernel(name: str) -> Callable:
    return _kernel(name, lambda op, args, kwargs: _loader.device()(op, args, kwargs))


def _kernel(name: str, run: Callable) -> Callable:
    """The kernel of overload ``name``: ``run(op, args, kwargs)``, the op
    looked up from its name at the first call (registering imports nothing
    more)."""
    op = None

    def kernel(*args, **kwargs):
        nonlocal op
        if op is None:
            op = aten_op(name)
        return run(op, args, kwargs)

    kernel.__name__ = f"jax_{name.replace('.', '_')}"
    return never_traced(kernel)


def _factory_fallback(op, *args, **kwargs):
    # Reached by ops dispatched on the device key with no tensor of ours among
    # their inputs: factories without a kernel of their own.
    return _loader.factories().run(op, args, kwargs)


never_traced(_factory_fallback)
