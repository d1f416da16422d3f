"""Keeping dynamo out of the 'jax' device's Python code, and letting it see
'jax' tensors as plain tensors while it compiles.

Two mechanisms, both cheap enough to install at ``import torch`` (neither
imports ``torch._dynamo`` or jax):

* :func:`never_traced` marks a function that C++ calls into (the
  ``__torch_dispatch__`` handler, the PrivateUse1 kernels, hooks and device
  guard) so that dynamo's frame hook runs it, and everything it calls, as
  plain Python -- the frame-level effect of ``torch.compiler.disable``, set
  on the code object itself, so it costs nothing per call and needs no
  wrapper frame (which dynamo would itself intercept).

* :class:`DispatchDescriptor` is ``JaxTensor.__torch_dispatch__``.  Dynamo
  wraps a tensor subclass as a plain tensor only if
  ``type(t).__torch_dispatch__ is torch.Tensor.__torch_dispatch__``
  (torch/_dynamo/variables/builder.py); while *this thread* is inside a
  dynamo compile the descriptor answers that, so the 'jax' tensors are traced
  as plain tensors of device 'jax' and the backend receives them as they
  are.  Every other thread, and this one outside a compile, gets the real
  handler: a compile never breaks eager 'jax' ops elsewhere.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import types
from typing import Any, Callable

import torch

__all__ = ["DispatchDescriptor", "compiling_in_this_thread", "dynamo_compiling", "never_traced", "our_trace"]

logger = logging.getLogger("pjrt_host")

_set_strategy: Any = None
_SKIP_ALL: Any = None


def _frame_skipper() -> bool:
    global _set_strategy, _SKIP_ALL
    if _set_strategy is None:
        try:
            from torch._C._dynamo import eval_frame as ef

            action = ef._FrameAction.SKIP
            _SKIP_ALL = ef._FrameExecStrategy(action, action)
            _set_strategy = ef.set_code_exec_strategy
        except Exception as err:  # pragma: no cover - depends on the torch build
            logger.warning("pjrt_host: torch %s has no per-code dynamo skip (%s); torch.compile may trace the "
                           "'jax' device's own code after a graph break", torch.__version__, err)
            _set_strategy = False
    return bool(_set_strategy)


def never_traced(fn: Callable) -> Callable:
    """Mark ``fn`` (called from C++) so that dynamo never compiles its frame
    or any frame it calls.  Returns ``fn`` itself."""
    code = getattr(fn, "__code__", None)
    if code is not None and _frame_skipper():
        _set_strategy(code, _SKIP_ALL)
    return fn


_compile_context = None

#: How many of pjrt_host's own traces (assume_pure, call_torch: AOT export,
#: as under torch.export) are running, in any thread.  They turn
#: ``torch.compiler.is_compiling()`` on process-wide for library code.
traces_running = 0


def dynamo_compiling() -> bool:
    """``torch.compiler.is_compiling()``, less pjrt_host's own traces: true
    while dynamo traces (the question ``assume_pure``, ``call_jax`` and
    ``mark_sharding`` ask to choose their in-graph form).  Inside one of our
    traces the arguments themselves (fake tensors) say so, and another
    thread's eager calls must not take the in-graph form."""
    return torch.compiler.is_compiling() and not traces_running


@contextlib.contextmanager
def our_trace() -> Any:
    """Counts one of pjrt_host's own traces (see ``traces_running``) for
    its length."""
    global traces_running
    traces_running += 1
    try:
        yield
    finally:
        traces_running -= 1


def compiling_in_this_thread() -> bool:
    """Whether this thread is inside a dynamo compile.

    ``torch.compiler.is_compiling()`` is a process-wide flag (set for the
    length of every dynamo compile, in any thread); dynamo's compile context
    is thread-local.  Both together say "this thread is compiling"."""
    global _compile_context
    if not torch.compiler.is_compiling():
        return False
    if _compile_context is None:
        from torch._guards import CompileContext

        _compile_context = CompileContext
    return _compile_context.try_get() is not None


_PLAIN = torch.Tensor.__torch_dispatch__
_local = threading.local()


@contextlib.contextmanager
def creating_tensors():
    """Make 'jax' tensors while this thread compiles (dynamo runs some code
    for real while tracing, e.g. an optimizer's state initialisation):
    torch's wrapper-subclass constructor asks the class for its
    ``__torch_dispatch__``, which this thread otherwise sees hidden."""
    _local.creating = getattr(_local, "creating", 0) + 1
    try:
        yield
    finally:
        _local.creating -= 1


class DispatchDescriptor:
    """``JaxTensor.__torch_dispatch__``: the real handler
    (``handler(cls, func, types, args, kwargs)``), except that a thread
    compiling with dynamo sees ``torch.Tensor.__torch_dispatch__`` when it
    asks the *class* (dynamo's check).  Ops on real 'jax' tensors (the C++
    dispatcher asks the instance) always reach the handler: dynamo runs some
    code for real while it traces (an optimizer's state initialisation)."""

    def __init__(self, handler: Callable) -> None:
        self.handler = never_traced(handler)
        self._bound: dict[type, Any] = {}

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        # The hot path (every eager op: the C++ dispatcher asks the instance)
        # is one dict lookup.
        owner = type(obj) if obj is not None else owner
        if obj is None and torch.compiler.is_compiling() and compiling_in_this_thread() \
                and not getattr(_local, "creating", 0):
            _check_backend(owner)
            if not _first_compile_seen:
                _first_compile(owner)
            return _PLAIN
        try:
            return self._bound[owner]
        except KeyError:
            bound = self._bound[owner] = types.MethodType(self.handler, owner)
            return bound


never_traced(DispatchDescriptor.__get__)


#: Called once, with the tensor class, the first time a thread compiles with
#: a 'jax' tensor (torch._dynamo is loaded by then): set at ``import torch``
#: by ``_patches`` (its ``dynamo_attributes`` row), which replaces dynamo's
#: method with :func:`attributes_under_modes`'s wrapper then.
at_first_compile: Callable[[type], None] | None = None
_first_compile_seen = False


def _first_compile(owner: type) -> None:
    global _first_compile_seen
    _first_compile_seen = True
    if at_first_compile is not None:
        at_first_compile(owner)


def attributes_under_modes(owner: type) -> Callable[[Callable], Callable]:
    """The maker of dynamo's ``TensorWithTFOverrideVariable.var_getattr``
    for 'jax' tensors (class ``owner``): lets dynamo read a 'jax' tensor's
    attributes while a torch-function mode is active -- ``with
    torch.device('jax'):`` around a compiled call, or the mode
    ``torch.set_default_device`` leaves on the stack (even after
    ``set_default_device('cpu')``).

    Dynamo wraps a 'jax' tensor as a ``TensorWithTFOverrideVariable`` (its
    class is a subclass).  Reading an attribute such as ``x.device`` under a
    mode, dynamo calls the *subclass's* ``__torch_function__`` directly --
    ours is torch's disabled one, which dynamo cannot trace ("Unsupported
    tensor subclass overridden attribute access").  Python itself would call
    the mode, then (the subclass's being disabled) the plain getter; this
    does that: a tensor attribute is dispatched as dynamo dispatches a
    function call (modes, then subclasses that have a ``__torch_function__``),
    and a Python property (``is_jax``) is traced as on a plain tensor.  It
    applies only to 'jax' tensors, and only to attributes dynamo would
    otherwise refuse.  ``_patches`` installs it; tests/test_compile.py pins
    the dynamo internals used here (a torch upgrade that moves them fails
    there, loudly)."""
    import inspect

    from torch._dynamo.variables import torch_function as tf
    from torch._dynamo.variables.tensor import TensorVariable

    def make(original: Callable) -> Callable:
        def var_getattr(self: Any, tx: Any, name: str) -> Any:
            if issubclass(self.class_type, owner) and hasattr(torch.Tensor, name) \
                    and not tf._is_attr_overridden(tx, self, name) \
                    and not inspect.ismethoddescriptor(getattr(torch.Tensor, name)) \
                    and tf.can_dispatch_torch_function(tx, [self], {}):
                if isinstance(inspect.getattr_static(torch.Tensor, name), property):
                    return TensorVariable.var_getattr(self, tx, name)
                getter = tf.VariableTracker.build(tx, getattr(torch.Tensor, name).__get__)
                return tf.dispatch_torch_function(tx, getter, [self], {})
            return original(self, tx, name)

        var_getattr.__wrapped__ = original  # type: ignore[attr-defined]
        return var_getattr

    return make


#: A comparison's dunder (as dynamo passes it, the tensor's side: ``0 < x``
#: reaches ``x``'s ``__gt__``) -> torch's function.
_COMPARISONS = {"__gt__": "gt", "__lt__": "lt", "__ge__": "ge", "__le__": "le", "__eq__": "eq", "__ne__": "ne"}


def comparisons_as_functions(owner: type) -> Callable[[Callable], Callable]:
    """The maker of dynamo's ``TensorWithTFOverrideVariable.richcompare_impl``
    for 'jax' tensors (class ``owner``): ``x > 0``, ``mask == 0``, ``0 < x``
    are traced as ``torch.gt(x, 0)``, ``torch.eq(mask, 0)``, ``torch.gt(x, 0)``.

    Dynamo's own (``TensorVariable.richcompare_impl``) wraps the result with
    the type of the operand's variable, a ``TensorWithTFOverrideVariable``
    for a subclass, without installing the class it names as a global: the
    compiled frame then raised ``NameError: name '__subclass_Tensor_..._c1'
    is not defined`` (any backend; a subclass of torch.Tensor with torch's
    disabled ``__torch_function__`` meets it without pjrt_host: torch's bug,
    tests/test_compile.py pins it).  The function forms trace.  It applies
    only to 'jax' tensors; every other comparison takes dynamo's own."""

    def make(original: Callable) -> Callable:
        def richcompare_impl(self: Any, tx: Any, other: Any, op: str) -> Any:
            name = _COMPARISONS.get(op)
            if name is not None and issubclass(self.class_type, owner):
                from torch._dynamo.variables import ConstantVariable, SymNodeVariable, TensorVariable
                from torch._dynamo.variables.torch import TorchInGraphFunctionVariable

                if isinstance(other, (SymNodeVariable, ConstantVariable, TensorVariable)):
                    return TorchInGraphFunctionVariable(getattr(torch, name)).call_function(tx, [self, other], {})
            return original(self, tx, other, op)

        richcompare_impl.__wrapped__ = original  # type: ignore[attr-defined]
        return richcompare_impl

    return make


#: Backends that run real ops on the graph's devices while compiling, which
#: 'jax' tensors cannot take (inductor generates code per device type).
_NEEDS_REAL_DEVICE = ("inductor",)


def _check_backend(owner: type) -> None:
    """Raise a clear error when the backend compiling in this thread is one
    that cannot compile 'jax' tensors (asked while dynamo wraps a 'jax'
    tensor as a graph input, before it fails somewhere inside)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
        name = getattr(tx.output.compiler_fn, "__name__", None) if tx is not None else None
    except Exception:
        return
    if name in _NEEDS_REAL_DEVICE:
        raise BackendCannotCompile(name)


class BackendCannotCompile(RuntimeError):
    def __init__(self, backend: str) -> None:
        super().__init__(
            f"pjrt_host: torch.compile's {backend!r} backend cannot compile tensors on the 'jax' device (it generates "
            f"code for the devices it knows). Use torch.compile(model, backend='jax'), which compiles each graph with "
            f"jax.jit on the device's plugin; backend='eager' or 'aot_eager' also work, for debugging.")
        self.backend = backend


def compile_session(original: Callable) -> Callable:
    """``torch._dynamo.aot_compile.aot_compile_fullgraph`` (torch's AOT
    path: ``torch.compile(...).aot_compile``) inside torch's compile
    session, as dynamo's own compile path runs: there
    ``torch.compiler.is_compiling()`` holds for the whole compile, so a
    'jax' tensor is hidden from dynamo while it traces; the AOT path's
    capture does not enter the session, and dynamo would see a 'jax' tensor
    as an unknown Python object."""
    import functools

    @functools.wraps(original)
    def aot_compile_fullgraph(*args: Any, **kwargs: Any) -> Any:
        with torch.compiler._compile_session_context():
            return original(*args, **kwargs)

    return aot_compile_fullgraph
