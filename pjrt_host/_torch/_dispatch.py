"""Routing: which handler runs an ATen op on 'jax' tensors.

For each op the dispatcher picks a handler once, in this order:

1. a storage op (``_storage_ops``: copies, ``_to_copy``, ``item``, ``clone``,
   ``set_``, ``*_like`` ...), which the device runs itself;
2. an in-place view op (``transpose_`` ...) or a view op (``view``, ``t``,
   slicing, ``expand`` ...): never computes (``_view_ops``);
3. an op with a lowering (``_lowerings``): compiled per signature by the
   engine (``_engine.CompiledOp``); an in-place op with its own lowering
   writes its result back into self;
4. an in-place or ``out=`` op without one: its functional op's lowering,
   written back through the target's view in the same compiled function, or
   the functional op's decomposition followed by a copy; an op writing into
   another argument: its ``X_functional`` twin, then copies;
5. an op without a lowering: torch's decomposition (each piece re-dispatched
   here); for an op outside ``aten`` (a ``torch.library.custom_op``), its
   device-generic implementation (CompositeExplicitAutograd), run on the
   'jax' tensors like a decomposition;
6. otherwise torch CPU under ``pjrt_host.config(cpu_fallback=True)``, else
   NotImplementedError naming the op and the ways on.

Ops are looked up by name, never by ``torch.ops.aten`` attribute, so a
torch release that drops an overload cannot break import.
"""

from __future__ import annotations

import functools
import importlib
import logging
import warnings
from typing import Any, Callable

import torch

from .. import _lowerings
from .._lowerings._dtypes import dtype_name
from .._errors import user_stacklevel
from . import (_backward, _config, _dynamic_dims, _fused, _index_checks, _memory, _meta, _profile, _sdpa, _sequences,
               _storage_ops, _sync, _tensor, _value_checks)
from ._cpu_fallback import run_on_cpu
from ._engine import CompiledOp, missing_lowering, op_name
from ._view_ops import run_inplace_view, run_same_view, run_view

__all__ = ["custom_op_kernel", "dispatch", "handler_for"]

logger = logging.getLogger(__name__)

Handler = Callable[[tuple, dict], Any]

_handlers: dict[Any, Handler] = {}
#: The view ops (their handlers make tensors over their input's storage and
#: record nothing): fused eager's replay lane never takes them, so their
#: calls skip its look at the script (a decoding step runs ~80 a token)
_views: set = set()


def dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
    """Run ATen op ``func`` on arguments holding 'jax' tensors."""
    if _backward._pending is not None and _backward.failed_here():  # CPU's engine stopped at that op
        skipped = _backward.skip(func, args, kwargs)
        if skipped is not _backward.CANNOT:
            return skipped
    handler = _handlers.get(func)
    if handler is None:
        handler = _handlers[func] = handler_for(func)
    if _fused.replaying and not _profile.active and func not in _views:
        # fused eager replays a script: the call it recorded here, if this is it
        replayed = _fused.replay(func, args, kwargs)
        if replayed is not None:
            return replayed
    try:
        try:
            if _profile.active:
                with _profile.op_scope(op_name(func)):
                    result = handler(args, kwargs)
            else:
                result = handler(args, kwargs)
            if _config.sync_used and _config.current().eager == "sync":
                _tensor.finish_op(result)  # the debugging mode: errors raise at the op that caused them
            return result
        except (MemoryError, RuntimeError) as err:  # free when nothing is raised
            oom = _memory.as_out_of_memory(err, op_name(func), args, kwargs)
            if oom is None:
                raise
            raise oom from err
    except Exception as err:
        if _meta.inside_backward():  # raising here would end the process
            return _backward.defer(err, func, args, kwargs)
        raise


_BYTE_MASK_OPS = ("aten::index.Tensor", "aten::_unsafe_index.Tensor", "aten::index_put", "aten::index_put_",
                  "aten::_index_put_impl_", "aten::_unsafe_index_put")


def _indices_as_torch_reads_them(handler: Handler, name: str) -> Handler:
    """The indices of an indexing op as torch reads them, before the op's
    own checks: a uint8 index tensor is a boolean mask (deprecated, with its
    warning, once per such mask), and an index tensor on the CPU is moved to
    the indexed tensor's device (torch's accelerators take CPU indices and
    masks: ``x[torch.tensor([0, 2])]``, ``x[cpu_mask] = 0``).  Malformed
    indices raise CPU's IndexError (``_index_checks.check_structure``), not
    the meta kernels' RuntimeError."""
    def handle(args: tuple, kwargs: dict) -> Any:
        indices = args[1] if len(args) > 1 else kwargs.get("indices")
        if isinstance(indices, (list, tuple)) and isinstance(args[0], _tensor.JaxTensor):
            _index_checks.check_structure(args[0], indices, reads=name.endswith("index.Tensor"))
            if any(isinstance(i, torch.Tensor) and (i.dtype == torch.uint8 or not isinstance(i, _tensor.JaxTensor))
                   for i in indices):
                moved = []
                for i in indices:
                    if isinstance(i, torch.Tensor):
                        if i.dtype == torch.uint8:
                            warnings.warn("indexing with dtype torch.uint8 is now deprecated, please use a dtype "
                                          "torch.bool instead.", UserWarning, stacklevel=user_stacklevel())
                            i = i.bool()
                        if not isinstance(i, _tensor.JaxTensor) and i.device.type == "cpu":
                            i = i.to(args[0].device)
                    moved.append(i)
                args = (args[0], moved, *args[2:])
        return handler(args, kwargs)

    return handle


def handler_for(func: Any) -> Handler:
    """The handler of ``func`` (uncached)."""
    name = op_name(func)
    if name in _HOST_ANSWERS:
        return _HOST_ANSWERS[name]
    if name in _sequences.HANDLERS:  # torch ops on the device, around CPU's own checks
        outs = _out_names(func)
        return _outs_on_the_device(_sequences.HANDLERS[name], outs) if outs else _sequences.HANDLERS[name]
    handler = _handler_for(func)
    check = _index_checks.checker_for(name)
    if check is not None:
        handler = _checked(func, handler,
                           lambda mode, args, kwargs: _index_checks.check(name, check, mode, args, kwargs))
    value_check = _value_checks.checker_for(name)
    if value_check is not None:
        handler = _checked(func, handler, value_check)
    setting_check = _SETTING_CHECKS.get(name)
    if setting_check is not None:
        handler = _after(setting_check, handler)
    if name in _BYTE_MASK_OPS:  # outermost: the index checks see the indices as the op reads them
        handler = _indices_as_torch_reads_them(handler, name)
    elif name in _MASKED_INDEX_OPS:
        handler = _mask_as_aten_reads_it(handler)
    elif name in _EMBEDDING_BAG_OPS:
        handler = _bag_indices_promoted(handler)
    elif name in _CTC_OPS:
        handler = _lengths_moved_to_device(handler, _CTC_OPS[name])
    elif name == "aten::roll":
        handler = _empty_rolled(handler)
    elif _index_checks.indexes_along_dim(name):
        handler = _index_moved_to_device(handler)
        base = name.split("::")[-1].split(".")[0].rstrip("_")
        if base in ("index_add", "index_copy", "index_fill"):
            handler = _self_and_source_on_the_device(handler, base)
    elif _draws_per_element(func):
        handler = _drawn_in_buckets(handler)
    elif name in _FILLS:
        handler = _filled_out(handler, _FILLS[name])
    kernel_dtypes = _KERNEL_DTYPES.get(name.split(".")[0])
    if kernel_dtypes is not None:
        handler = _dtypes_of_the_kernel(handler, name, *kernel_dtypes)
    outs = _out_names(func)
    if outs:
        handler = _outs_on_the_device(handler, outs)
    # nothing around the engine's call (for a call of exact inputs, which is
    # all the replay lane takes): fused eager may replay it
    engine_call = getattr(handler, "unpadded", handler)
    if getattr(engine_call, "__func__", None) is CompiledOp.__call__:
        engine_call.__self__.replayable = True
        # (and its padded calls, where nothing around it handles them)
        engine_call.__self__.padded_replayable = handler is engine_call
    return handler


_FLOATS = (torch.float32, torch.float64)
#: Ops whose kernels (CPU's and cuda's alike) have code for these dtypes of
#: their first tensor only, where the device's lowering computes any: torch
#: CPU's kernel name and the dtypes.  The probe of CPU's kernel cannot find
#: these: its zeros are refused first for their values (lengths of 0).
_KERNEL_DTYPES: dict[str, tuple[str, tuple]] = {
    "aten::_ctc_loss": ("ctc_loss_cpu", _FLOATS),
    "aten::segment_reduce": ("_segment_reduce_cpu", (*_FLOATS, torch.float16, torch.bfloat16)),
}
#: torch's names of dtypes in its kernels' refusals.
_SCALAR_TYPE_NAMES = {torch.bool: "Bool", torch.uint8: "Byte", torch.int8: "Char", torch.int16: "Short",
                      torch.int32: "Int", torch.int64: "Long", torch.float16: "Half", torch.bfloat16: "BFloat16",
                      torch.float32: "Float", torch.float64: "Double", torch.complex64: "ComplexFloat",
                      torch.complex128: "ComplexDouble"}


def _dtypes_of_the_kernel(handler: Handler, name: str, kernel: str, dtypes: tuple) -> Handler:
    """torch's NotImplementedError for a dtype its kernel has no code for
    (``"ctc_loss_cpu" not implemented for 'Half'``); the device's lowering
    would compute it (float16, complex) or fail inside jax (bool, int64)."""
    def handle(args: tuple, kwargs: dict) -> Any:
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        if first is not None and first.dtype not in dtypes:
            type_name = _SCALAR_TYPE_NAMES.get(first.dtype, str(first.dtype))
            raise NotImplementedError(
                f'"{kernel}" not implemented for \'{type_name}\' (torch\'s kernel has code for '
                f"{', '.join(str(d).removeprefix('torch.') for d in dtypes)} only; pjrt_host refuses {name} of "
                f"{str(first.dtype).removeprefix('torch.')} as it does: cast the input to float32)")
        return handler(args, kwargs)

    return handle


#: Factories whose out= kernel on CPU is ``out.fill_(value)``: their value.
_FILLS: dict[str, Callable[[tuple, dict], Any]] = {
    "aten::ones.out": lambda args, kwargs: 1,
    "aten::zeros.out": lambda args, kwargs: 0,
    "aten::full.out": lambda args, kwargs: args[1] if len(args) > 1 else kwargs["fill_value"],
}


def _filled_out(handler: Handler, value: Callable[[tuple, dict], Any]) -> Handler:
    """``ones`` / ``zeros`` / ``full`` into an out= of the result's shape
    as CPU's kernel writes it: a fill_, which an expanded out= takes (torch's
    decomposition copies, and copy_ refuses overlapping memory).  Another
    shape is resized by the handler."""
    def handle(args: tuple, kwargs: dict) -> Any:
        out = kwargs.get("out")
        size = args[0] if args else kwargs.get("size")
        if isinstance(out, _tensor.JaxTensor) and size is not None and tuple(out.shape) == tuple(size):
            return out.fill_(value(args, kwargs))
        return handler(args, kwargs)

    return handle


def _out_names(func: Any) -> tuple[str, ...]:
    schema = getattr(func, "_schema", None)
    return tuple(a.name for a in schema.arguments if getattr(a, "is_out", False)) if schema is not None else ()


def _outs_on_the_device(handler: Handler, outs: tuple[str, ...]) -> Handler:
    """torch's refusal, on every accelerator, of an out= tensor on CPU among
    the device's inputs (ops the device runs through a decomposition or its
    own handler wrote the result into the CPU tensor)."""
    def handle(args: tuple, kwargs: dict) -> Any:
        for k in outs:
            value = kwargs.get(k)
            for t in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(t, torch.Tensor) and not isinstance(t, _tensor.JaxTensor):
                    here = next((u.device for u in (*args, *kwargs.values(), *(v for a in args if isinstance(a, (list, tuple))
                                                                                  for v in a))
                                 if isinstance(u, _tensor.JaxTensor)), None)
                    if here is not None:
                        raise RuntimeError(f"Expected out tensor to have device {here}, but got {t.device} instead "
                                           "(out= tensors must be on the same device as the inputs)")
        return handler(args, kwargs)

    return handle


#: Ops that reach the device undecomposed in inference mode and first check
#: a torch setting (with autograd on, registration's kernel checks it).
_SETTING_CHECKS: dict[str, Callable[[], None]] = {"aten::scaled_dot_product_attention": _sdpa.check_backends}


#: Ops about the device that the host answers from torch's settings.
_HOST_ANSWERS: dict[str, Handler] = {"aten::_fused_sdp_choice": lambda args, kwargs: _sdpa.choice()}


def _after(check: Callable[[], None], handler: Handler) -> Handler:
    def checked(args: tuple, kwargs: dict) -> Any:
        check()
        return handler(args, kwargs)

    return checked


def _draws_per_element(func: Any) -> bool:
    """An in-place random op that fills self with draws independent of its
    values and of its shape (``Lowering.per_element``): ``nn.init`` and
    ``empty(n).uniform_()``."""
    lowering = _lowerings.lookup(func)
    return lowering is not None and lowering.per_element and not lowering.factory


def _drawn_in_buckets(handler: Handler) -> Handler:
    """A draw into a small tensor of a new shape is made in a power-of-two
    bucket of elements and copied into it, so the random program (about
    0.4 s to compile on XLA:CPU) compiles per bucket, not per shape (the
    copy compiles per shape, cheaply).  Initialising a model's parameters
    on the device meets a new shape per layer.  A padded tensor (an
    ``empty_like`` of a padded activation: in-place dropout's mask) is drawn
    in its own bucket instead (``CompiledOp._padded_in_place``)."""
    from ._factories import bucket

    def handle(args: tuple, kwargs: dict) -> Any:
        self = args[0] if args else None
        if isinstance(self, _tensor.JaxTensor) and type(self._storage.place) is int and self._storage.padded is None:
            n = self.numel()
            size = bucket(n)
            if size is not None and (size != n or self._view is not None):
                stand_in = _tensor.new_tensor((size,), self.dtype, self._storage.device_index)
                handler((stand_in, *args[1:]), kwargs)
                with torch.no_grad():
                    self.copy_(stand_in[:n].view(self.shape))
                return self
        return handler(args, kwargs)

    return handle


_MASKED_INDEX_OPS = ("aten::_unsafe_masked_index", "aten::_unsafe_masked_index_put_accumulate")


def _mask_as_aten_reads_it(handler: Handler) -> Handler:
    """``_unsafe_masked_index(self, mask, ...)`` and its put: ATen's kernel
    (the same on CPU and cuda) reads the mask as ``logical_not(mask)``, so a
    mask of any dtype is its elements' truth; torch's decomposition, which
    the device runs, refuses all but bool.  A mask of another dtype is made
    bool first."""
    def handle(args: tuple, kwargs: dict) -> Any:
        if len(args) > 1 and isinstance(args[1], torch.Tensor) and args[1].dtype != torch.bool:
            args = (args[0], args[1] != 0, *args[2:])
        elif isinstance(kwargs.get("mask"), torch.Tensor) and kwargs["mask"].dtype != torch.bool:
            kwargs = {**kwargs, "mask": kwargs["mask"] != 0}
        return handler(args, kwargs)

    return handle


_EMBEDDING_BAG_OPS = ("aten::_embedding_bag", "aten::_embedding_bag_forward_only")


def _bag_indices_promoted(handler: Handler) -> Handler:
    """``_embedding_bag(weight, indices, offsets, ...)``: torch's CPU and
    cuda kernels first promote indices and offsets to their common dtype
    (``promoteIndicesAndOffsets``: bool indices with int64 offsets are
    int64), then check it; torch's meta kernel checks each as given."""
    def handle(args: tuple, kwargs: dict) -> Any:
        if len(args) > 2 and isinstance(args[1], torch.Tensor) and isinstance(args[2], torch.Tensor) \
                and args[1].dtype != args[2].dtype:
            common = torch.promote_types(args[1].dtype, args[2].dtype)
            args = (args[0], args[1].to(common), args[2].to(common), *args[3:])
        return handler(args, kwargs)

    return handle


def _empty_rolled(handler: Handler) -> Handler:
    """``roll`` of an empty tensor as torch's CPU and cuda kernels have it:
    the shifts must be given, one per dimension (or one for the flattened
    tensor), and then a copy is returned before any dimension is read.
    torch's meta kernel checks the dims first and returns the copy before
    the counts (an empty tensor rolled by an out-of-range dim was refused,
    one with more shifts than dims was a value)."""
    def handle(args: tuple, kwargs: dict) -> Any:
        self = args[0] if args else kwargs.get("self")
        if not (isinstance(self, _tensor.JaxTensor) and self.numel() == 0):
            return handler(args, kwargs)
        shifts = args[1] if len(args) > 1 else kwargs.get("shifts", ())
        dims = args[2] if len(args) > 2 else kwargs.get("dims", ())
        if len(shifts) == 0:
            raise RuntimeError("`shifts` required")
        if len(dims) != len(shifts) and not (len(dims) == 0 and len(shifts) == 1):
            raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shifts)}, dims:{len(dims)}")
        return self.clone(memory_format=torch.preserve_format)

    return handle


#: CTC ops with length tensors: the positions of input_lengths and target_lengths
_CTC_OPS = {"aten::_ctc_loss.Tensor": (2, 3), "aten::_ctc_loss_backward.Tensor": (3, 4)}


def _lengths_moved_to_device(handler: Handler, positions: tuple[int, ...]) -> Handler:
    """``ctc_loss`` with its lengths in CPU tensors and log_probs on 'jax'
    (the usual call: torch's cuda kernels take lengths from the CPU): the
    lengths moved to log_probs' device."""
    def handle(args: tuple, kwargs: dict) -> Any:
        if args and isinstance(args[0], _tensor.JaxTensor):
            moved = list(args)
            for i in positions:
                v = moved[i] if i < len(moved) else None
                if isinstance(v, torch.Tensor) and not isinstance(v, _tensor.JaxTensor) and v.device.type == "cpu":
                    moved[i] = v.to(args[0].device)
            args = tuple(moved)
        return handler(args, kwargs)

    return handle


def _index_moved_to_device(handler: Handler) -> Handler:
    """``index_fill(dim, index, v)``, ``gather`` ... with ``index`` on the
    CPU and self on 'jax': the index moved to self's device, as torch's CPU
    kernels read an index wherever it lives."""
    def handle(args: tuple, kwargs: dict) -> Any:
        if len(args) > 2:
            index = args[2]
            if isinstance(index, torch.Tensor) and not isinstance(index, _tensor.JaxTensor) \
                    and index.device.type == "cpu" and isinstance(args[0], _tensor.JaxTensor):
                args = (*args[:2], index.to(args[0].device), *args[3:])
        else:
            index = kwargs.get("index")
            if isinstance(index, torch.Tensor) and not isinstance(index, _tensor.JaxTensor) \
                    and index.device.type == "cpu" and args and isinstance(args[0], _tensor.JaxTensor):
                kwargs = {**kwargs, "index": index.to(args[0].device)}
        return handler(args, kwargs)

    return handle


def _self_and_source_on_the_device(handler: Handler, base: str) -> Handler:
    """``index_add`` / ``index_copy`` / ``index_fill`` with self or source
    on the CPU (a 0-dim tensor among 'jax' ones): torch's structured meta
    function, which every accelerator runs, refuses it (an index on the CPU
    is moved, ``_index_moved_to_device``; index_fill's 0-dim value is read
    as a number)."""
    def handle(args: tuple, kwargs: dict) -> Any:
        self_ = args[0] if args else kwargs.get("self")
        source = (args[3] if len(args) > 3 else kwargs.get("source")) if base != "index_fill" else None
        index = args[2] if len(args) > 2 else kwargs.get("index")
        if any(isinstance(t, torch.Tensor) and not isinstance(t, _tensor.JaxTensor) for t in (self_, source)):
            where = [getattr(t, "device", "-") for t in (self_, index, source if source is not None else self_)]
            raise RuntimeError(f"{base}(): self, index and source expected to be in the same device, but got "
                               f"(self) {where[0]}, (index) {where[1]}, and (source) {where[2]} (move the CPU "
                               "tensor to the 'jax' device)")
        return handler(args, kwargs)

    return handle


def _checked(func: Any, handler: Handler, run_check: Callable[[Any, tuple, dict], None]) -> Handler:
    """``handler`` after ``run_check(mode, args, kwargs)`` (an index or value
    check, deferred or at the op by ``checks``).  Where the check
    fails, the op's own refusal of its arguments comes first (torch CPU's,
    then the meta kernel's: an ``embedding`` weight of no dimensions is
    "'weight' must be 2-D", not the check's failure to read its size)."""
    def checked(args: tuple, kwargs: dict) -> Any:
        mode = _config.current().check_mode
        if not mode:
            return handler(args, kwargs)
        before = len(_sync._deferred)
        try:
            run_check(mode, args, kwargs)
        except Exception:
            _sync.withdraw_checks(_sync._deferred[before:])
            _meta.check_cpu_kernel(func, args, kwargs)
            _meta.run_meta(func, args, kwargs)
            raise
        queued = _sync._deferred[before:]
        try:
            return handler(args, kwargs)
        except Exception:
            _sync.withdraw_checks(queued)  # the op's own error stands; its checks would repeat it later
            raise

    return checked


def _handler_for(func: Any) -> Handler:
    storage_handler = _storage_ops.lookup(op_name(func))
    if storage_handler is not None:
        return lambda args, kwargs: storage_handler(func, args, kwargs)
    schema = func._schema
    try:
        inplace_view = torch.Tag.inplace_view in func.tags
    except Exception:
        inplace_view = False
    if inplace_view:
        _views.add(func)
        return lambda args, kwargs: run_inplace_view(func, args, kwargs)
    if op_name(func) in _SAME_VIEW_OPS:
        _views.add(func)
        return run_same_view
    if func.is_view or _returns_alias(schema):
        _views.add(func)
        # Composite ops that may return their input (to, reshape, narrow ...)
        # reach the device undecomposed below autograd (inference mode, or
        # inside another handler): their composite kernel is what autograd runs.
        if _has_composite_kernel(func):
            return lambda args, kwargs: func.decompose(*args, **kwargs)
        return lambda args, kwargs: run_view(func, args, kwargs)
    mutable = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    lowering = _eager_lowering(func)
    if not mutable:
        if lowering is not None:
            if op_name(func) in _MEANS:
                return _summed_when_padded(CompiledOp(func, lowering).__call__)
            if op_name(func) == "aten::cat":
                return _joined_when_padded(func, CompiledOp(func, lowering).__call__)
            if op_name(func) == "aten::slice_backward":
                return _placed_when_padded(CompiledOp(func, lowering).__call__)
            if op_name(func) == "aten::select_backward":
                return _selected_when_padded(CompiledOp(func, lowering).__call__)
            if op_name(func) == "aten::constant_pad_nd":
                return _grown_when_padded(CompiledOp(func, lowering).__call__)
            if op_name(func) == "aten::type_as":
                return _cast_when_padded(CompiledOp(func, lowering).__call__)
            if op_name(func) in _COPYING_VIEWS:
                return _viewed_when_padded(func, CompiledOp(func, lowering).__call__)
            if op_name(func) in _dynamic_dims.RESAMPLING_BACKWARDS:
                return _whole_batch_when_padded(CompiledOp(func, lowering).__call__)
            return CompiledOp(func, lowering).__call__
    else:
        first = schema.arguments[0]
        if lowering is not None and mutable[0] is first and not first.kwarg_only:
            # An in-place op with a lowering of its own: it returns self's new value.
            return CompiledOp(func, lowering, inplace=0).__call__
        functional = _functional_of(func, schema, mutable)
        writes_list = any(str(a.type).startswith("List[") or str(a.type).endswith("[]") for a in mutable)
        if functional is not None and (writes_list or (len(mutable) > 1 and not functional[1])):
            # An in-place op writing several arguments (GradScaler's
            # _amp_update_scale_, _amp_foreach_non_finite_check_and_unscale_)
            # or a list (_foreach_copy_): its functional twin returns their
            # new values, in order.
            write_back = functools.partial(_write_back_each, func, functional[0], schema, mutable,
                                           _kernel_counts_writes(op_name(func)))
            # out= lists (split_with_sizes_copy's) are probed; GradScaler's and
            # the _foreach_ in-place ops, called every step with many tensors, are not
            return _probed(func, write_back) if all(a.kwarg_only for a in mutable) else write_back
        if functional is not None:
            functional_op, out_names = functional
            functional_lowering = _eager_lowering(functional_op)
            if functional_lowering is not None:
                if out_names:
                    return CompiledOp(func, functional_lowering, out_names=out_names, meta_op=functional_op).__call__
                return CompiledOp(func, functional_lowering, inplace=0, meta_op=functional_op).__call__
            decomposition = _decomposition(functional_op)
            if decomposition is not None:
                return _probed(func, lambda args, kwargs: _via_functional(decomposition, out_names, args, kwargs))
        by_name = _functional_by_name(schema)
        if by_name is not None:
            return _probed(func, functools.partial(_inplace_by_name, by_name, schema))
        twin = _functional_twin(schema)
        if twin is not None:
            return _probed(func, functools.partial(_via_functional_twin, twin, schema, mutable))
    decomposition = _decomposition(func)
    if decomposition is not None:
        return _probed(func, lambda args, kwargs: decomposition(*args, **kwargs))
    factory = _factory_of(schema, mutable)
    if factory is not None:
        return functools.partial(_factory_into_out, factory, mutable[0].name)
    return lambda args, kwargs: _last_resort(func, args, kwargs)


#: Reshapes that return a new tensor (matmul's ``_unsafe_view`` of its mm):
#: of a padded tensor that is its whole storage, a view of it instead, as
#: torch CPU makes them (a copy would cut the padding: _dynamic_dims).
_COPYING_VIEWS = frozenset({"aten::_unsafe_view"})


def _unpadded_is(handler: Handler, handle: Handler) -> Handler:
    """``handle``, a wrapper that does what ``handler`` (an engine op's
    call) does for a call none of whose inputs is padded, marked so: such
    a call may be replayed as the engine op's (``handler_for``)."""
    handle.unpadded = handler  # type: ignore[attr-defined]
    return handle


def _viewed_when_padded(func: Any, handler: Handler) -> Handler:
    def handle(args: tuple, kwargs: dict) -> Any:
        x = args[0] if args else None
        if type(x) is _tensor.JaxTensor and x._storage.padded is not None and x._view is None:
            return run_view(func, args, kwargs)
        return handler(args, kwargs)
    return _unpadded_is(handler, handle)


#: A mean of a padded tensor: its sum (which knows padding) over the count of
#: logical elements, a run-time scalar (the count changes with every size).
#: ``aten::mean`` (all elements, ``loss.mean()``) takes no dims: all of them.
_MEANS = frozenset({"aten::mean.dim", "aten::mean"})
_HALVES = (torch.float16, torch.bfloat16)


def _summed_when_padded(handler: Handler) -> Handler:
    def handle(args: tuple, kwargs: dict) -> Any:
        x = args[0] if args else None
        if type(x) is _tensor.JaxTensor and x._storage.padded is not None and x.dtype.is_floating_point:
            dims = args[1] if len(args) > 1 else kwargs.get("dim")
            keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
            dtype = args[3] if len(args) > 3 else kwargs.get("dtype")
            reduced = range(x.dim()) if not dims else [d % max(x.dim(), 1) for d in dims]
            count = 1
            for d in set(reduced):
                count *= x.shape[d]
            out = dtype if dtype is not None else x.dtype
            if out in _HALVES:
                # as torch CPU's mean of a 16-bit float: summed in float32,
                # divided, rounded once (a sum in the 16-bit dtype overflows
                # where the mean does not, and rounds twice)
                total = torch.ops.aten.sum.dim_IntList(x, dims, keepdim, dtype=torch.float32)
                return torch.ops.aten.div.Tensor(total, float(count)).to(out)
            total = torch.ops.aten.sum.dim_IntList(x, dims, keepdim, dtype=dtype)
            return torch.ops.aten.div.Tensor(total, float(count))
        return handler(args, kwargs)
    return _unpadded_is(handler, handle)


def _whole_batch_when_padded(handler: Handler) -> Handler:
    """A resampling's backward of a gradient padded along the batch only:
    exact over the bucket's whole batch (``_dynamic_dims.whole_batch``)."""
    def handle(args: tuple, kwargs: dict) -> Any:
        g = args[0] if args else None
        if type(g) is _tensor.JaxTensor and g._storage.padded is not None and not kwargs and len(args) > 2:
            run = _dynamic_dims.whole_batch(g, args[2])
            if run is not None:
                whole, sizes, finish = run
                return finish(handler((whole, args[1], sizes, *args[3:]), {}))
        return handler(args, kwargs)
    return _unpadded_is(handler, handle)


def _cast_when_padded(handler: Handler) -> Handler:
    """``type_as`` of a padded tensor: its padded cast (a new tensor sharing
    its array when the dtype is already the other's).  Of an exact tensor
    as a padded one on the same device: the same, without cutting the
    other, of which only the dtype is read (torch's dropout backward,
    ``mask.type_as(grad_output)``, cut a padded gradient so at every step
    of a BERT fine-tuning whose mask was exact)."""
    def handle(args: tuple, kwargs: dict) -> Any:
        x = args[0] if args else kwargs.get("self")
        other = args[1] if len(args) > 1 else kwargs.get("other")
        if type(x) is _tensor.JaxTensor and isinstance(other, torch.Tensor) and (
                x._storage.padded is not None or type(other) is _tensor.JaxTensor
                and other._storage.padded is not None and other.device == x.device):
            if x.dtype == other.dtype:
                return torch.ops.aten.clone.default(x)  # a new tensor sharing the padded array
            return x.to(other.dtype)  # the padded cast
        return handler(args, kwargs)
    return _unpadded_is(handler, handle)


def _joined_when_padded(func: Any, handler: Handler) -> Handler:
    """cat along a dim its tensors hold padded: placed at run-time offsets
    in the bucket of the joined length (``_dynamic_dims.join``); in fused
    eager recorded with a replay lane of its own (``_dynamic_dims.JoinLane``)."""
    def handle(args: tuple, kwargs: dict) -> Any:
        tensors = args[0] if args else kwargs.get("tensors")
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        if type(tensors) not in (list, tuple):
            return handler(args, kwargs)
        place = None
        if not any(type(t) is _tensor.JaxTensor and t._storage.padded is not None for t in tensors):
            grown, place = _dynamic_dims.grows(tensors, dim)
            if not grown:
                if place is None:
                    return handler(args, kwargs)
                _fused.forget_recorded()
                result = handler(args, kwargs)
                _dynamic_dims.joined(result, place)  # (fed back next time: an accumulator)
                lane = _fused.recorded_lane()
                if lane is not None:  # a replay of the recorded cat notes its result so too
                    _dynamic_dims.note_on_replay(lane, place)
                return result
        record = functools.partial(_record_join, func=func) if _config.current().eager == "fused" else None
        joined = _dynamic_dims.join(list(tensors), dim, record)
        if joined is not None:
            return joined
        return handler(args, kwargs)
    # fused eager's replay lane may take an exact cat recorded at its place
    # in a script (rotary embeddings' halves, every token): its sizes are
    # the recorded ones, which the place has seen; a growing tensor is a
    # call of new sizes, which takes this way.  A replayed result is noted
    # at the place as a recorded one is (``Lane.noted``): a second
    # generate() replayed its prefill's cat onto the empty cache, and
    # without the note the first token's cat ran exact, not joined --
    # programs the first call never needed.
    return _unpadded_is(handler, handle)


def _placed_when_padded(handler: Handler) -> Handler:
    """slice_backward of a gradient padded along the sliced dim: placed at
    the slice's run-time start in the bucket of the input's length
    (``_dynamic_dims.place_gradient``)."""
    names = ("grad_output", "input_sizes", "dim", "start", "end", "step")

    def handle(args: tuple, kwargs: dict) -> Any:
        grad = args[0] if args else kwargs.get("grad_output")
        if type(grad) is _tensor.JaxTensor and grad._storage.padded is not None:
            grad, sizes, dim, start, _, step = (args[i] if i < len(args) else kwargs[names[i]] for i in range(6))
            placed = _dynamic_dims.place_gradient(grad, sizes, dim, start, step)
            if placed is not None:
                return placed
        return handler(args, kwargs)
    return _unpadded_is(handler, handle)


def _selected_when_padded(handler: Handler) -> Handler:
    """select_backward of a gradient padded along other dims (a ViT's class
    token, ``x[:, 0]``, of a batch padded to its bucket): the gradient
    with the selected dim put back, zeros around it there, its padding
    kept elsewhere (``_dynamic_dims.place_gradient``, as a slice's of
    length 1); of an exact gradient whose input was padded along the
    selected dim (BERT's pooler), placed in that bucket
    (``_dynamic_dims.select_into_bucket``)."""
    names = ("grad_output", "input_sizes", "dim", "index")

    def handle(args: tuple, kwargs: dict) -> Any:
        grad, sizes, dim, index = (args[i] if i < len(args) else kwargs[names[i]] for i in range(4))
        sizes = tuple(sizes)
        # torch CPU's errors (the lowering would place the gradient anywhere)
        if not -len(sizes) <= dim < len(sizes):
            raise IndexError(f"Dimension out of range (expected to be in range of [{-len(sizes)}, {len(sizes) - 1}], "
                             f"but got {dim})")
        if not -sizes[dim] <= index < sizes[dim]:
            raise IndexError(f"select(): index {index} out of range for tensor of size {list(sizes)} at dimension "
                             f"{dim % len(sizes)}")
        if type(grad) is _tensor.JaxTensor:
            dim %= len(sizes)
            if grad._storage.padded is not None:
                placed = _dynamic_dims.place_gradient(grad.unsqueeze(dim), sizes, dim, index % sizes[dim], 1)
            else:  # (an exact gradient of a padded input's select: BERT's pooler)
                placed = _dynamic_dims.select_into_bucket(grad, sizes, dim, index % sizes[dim])
            if placed is not None:
                return placed
        return handler(args, kwargs)
    return _unpadded_is(handler, handle)


def _grown_when_padded(handler: Handler) -> Handler:
    """constant_pad_nd growing a dim its input holds padded, or one whose
    size keeps changing at the line (``_dynamic_dims.pad_grows``), at its
    end: in the bucket of the new length (``_dynamic_dims.pad_end``)."""
    def handle(args: tuple, kwargs: dict) -> Any:
        x = args[0] if args else kwargs.get("self")
        if type(x) is _tensor.JaxTensor:
            pad = args[1] if len(args) > 1 else kwargs["pad"]
            if x._storage.padded is not None or _dynamic_dims.pad_grows(x, pad):
                value = args[2] if len(args) > 2 else kwargs.get("value", 0)
                record = _record_pad_end if _config.current().eager == "fused" else None
                grown = _dynamic_dims.pad_end(x, pad, value, record)
                if grown is not None:
                    return grown
        return handler(args, kwargs)
    return _unpadded_is(handler, handle)


_join_ops: dict = {}
_pad_end_ops: dict = {}


def _record_join(body: Callable, key: tuple, inputs: list, shape: tuple, physical: tuple, padded: tuple,
                 dtype: torch.dtype, index: int, name: str = "pjrt_host.join", table: dict = _join_ops,
                 func: Any = None) -> Any:
    """Fused eager: a join of pending values (``_dynamic_dims.join``)
    recorded into the segment instead of running it first, as one op whose
    traceable function is the join's (one per key, so that the segments
    of a bucket repeat).  ``func``: the cat it is, whose later calls at
    this place in a replayed script take the op's lane."""
    op = _fused.host_op(table, name, key, lambda: (body, None))
    plan = _meta.OutputPlan("single", (_meta.OutputSpec("tensor", shape, dtype),))
    joined = _fused.record(op, inputs, plan, index, index, padded=[(shape, physical, padded)])
    if joined is not None and func is not None:
        _dynamic_dims.JoinLane.of(op, func, key, index, dtype)
    return joined


def _record_pad_end(body: Callable, key: tuple, inputs: list, shape: tuple, physical: tuple, padded: tuple,
                    dtype: torch.dtype, index: int) -> Any:
    """Fused eager: ``_dynamic_dims.pad_end`` (a causal LM's labels padded
    at their end) recorded into the segment, where it ran a program of its
    own at every call."""
    return _record_join(body, key, inputs, shape, physical, padded, dtype, index, "pjrt_host.pad_end", _pad_end_ops)


_TENSOR_OPTIONS = frozenset({"dtype", "layout", "device", "pin_memory"})


def _factory_of(schema: Any, mutable: list) -> Any:
    """The factory an out= op without a decomposition fills its one out=
    tensor with (``ones(size, out=t)``: ``ones(size, dtype=, device=)``), or None."""
    if len(mutable) != 1 or not mutable[0].kwarg_only:
        return None
    inputs = [(a.name, str(a.type)) for a in schema.arguments if a is not mutable[0]]
    try:
        packet = getattr(torch.ops.aten, schema.name.split("::", 1)[1])
        for candidate_name in packet.overloads():
            candidate = getattr(packet, candidate_name)
            arguments = [(a.name, str(a.type)) for a in candidate._schema.arguments if a.name not in _TENSOR_OPTIONS]
            if arguments == inputs and any(a.name == "dtype" for a in candidate._schema.arguments):
                return candidate
    except (AttributeError, RuntimeError):
        return None
    return None


def _factory_into_out(factory: Any, out_name: str, args: tuple, kwargs: dict) -> Any:
    out = kwargs[out_name]
    result = factory(*args, **{k: v for k, v in kwargs.items() if k != out_name}, dtype=out.dtype,
                     device=out.device)
    _write_out(out, result)
    return out


#: Signatures a decomposed op remembers having probed (then it forgets them all).
_PROBED_SIGNATURES = 4096


def _probed(func: Any, handler: Handler) -> Handler:
    """``handler`` (torch's decomposition of an ATen op) after torch CPU's
    own refusal of the op as a whole, once per signature
    (``_meta.check_cpu_kernel``): a decomposition's pieces accept what the
    op's CPU kernel refuses (``_log_softmax`` of bool: its pieces raise
    another error, or none) and its out= form's dtype checks are the
    kernel's, not the pieces'.  Ops outside aten are not probed: their
    kernels may do more than compute (a collective)."""
    if not op_name(func).startswith("aten::"):
        return handler
    seen: set = set()

    def probed(args: tuple, kwargs: dict) -> Any:
        key = _meta.probe_key(args, kwargs)
        try:
            probe = key not in seen
        except TypeError:  # an argument of no value identity
            return handler(args, kwargs)
        if probe:
            _meta.check_cpu_kernel(func, args, kwargs)
            if len(seen) >= _PROBED_SIGNATURES:
                seen.clear()
            seen.add(key)
        return handler(args, kwargs)

    return probed


def _eager_lowering(func: Any) -> Any:
    """The lowering the engine compiles for ``func``: none for a factory,
    which the device makes itself (``_factories``: placed on its device, a
    small draw bucketed); one that reaches here (an ``out=`` form, a factory
    given tensor bounds) is decomposed."""
    lowering = _lowerings.lookup(func)
    return None if lowering is None or lowering.factory else lowering


#: View ops whose result reads exactly what self reads (autograd's
#: AccumulateGrad detaches every gradient it stores: once per parameter and step).
_SAME_VIEW_OPS = frozenset({"aten::detach", "aten::alias"})


def _returns_alias(schema: Any) -> bool:
    rets = schema.returns
    return bool(rets) and all(r.alias_info is not None and not r.alias_info.is_write for r in rets)


def _functional_of(func: Any, schema: Any, mutable: list) -> tuple[Any, tuple[str, ...]] | None:
    """(functional overload, names of out= arguments or ()) for an in-place or
    out= op, or None."""
    name = schema.name.split("::", 1)[1]
    overload = schema.overload_name
    first = schema.arguments[0]
    try:
        if mutable[0] is first and not first.kwarg_only and name.endswith("_"):
            packet = getattr(torch.ops.aten, name[:-1])
            functional = getattr(packet, overload or "default")
            if [a.name for a in functional._schema.arguments] != [a.name for a in schema.arguments]:
                return None  # its arguments in another order (polygamma_(self, n), polygamma(n, self))
            return functional, ()
        out_names = tuple(a.name for a in mutable)
        if all(a.kwarg_only for a in mutable):
            packet = getattr(torch.ops.aten, name)
            inputs = [(a.name, str(a.type)) for a in schema.arguments if not a.kwarg_only or a.name not in out_names]
            for candidate_name in packet.overloads():
                candidate = getattr(packet, candidate_name)
                arguments = candidate._schema.arguments
                if any(a.alias_info is not None and a.alias_info.is_write for a in arguments):
                    continue
                if [(a.name, str(a.type)) for a in arguments] == inputs:
                    return candidate, out_names
    except (AttributeError, RuntimeError):  # no functional overload in this torch
        return None
    return None


def _functional_by_name(schema: Any) -> Any:
    """The functional form of an in-place op that takes the same arguments in
    another order (``polygamma_(self, n)``, ``polygamma(n, self)``), or None."""
    name = schema.name.split("::", 1)[1]
    if not name.endswith("_") or not schema.arguments:
        return None
    try:
        functional = getattr(getattr(torch.ops.aten, name[:-1]), schema.overload_name or "default")
    except (AttributeError, RuntimeError):
        return None
    names = [a.name for a in functional._schema.arguments]
    return functional if sorted(names) == sorted(a.name for a in schema.arguments) else None


def _inplace_by_name(functional: Any, schema: Any, args: tuple, kwargs: dict) -> Any:
    """self.op_(...) as self = op(...) with the arguments passed by name; the
    result must fit self as torch's in-place ops require."""
    bound = dict(zip((a.name for a in schema.arguments), args))
    bound.update(kwargs)
    self = bound[schema.arguments[0].name]
    result = functional(**bound)
    _meta.check_inplace(result, self)
    self.copy_(result)
    return self


def _functional_twin(schema: Any) -> Any:
    """``aten::X_functional``: the form torch gives an op that writes into an
    argument other than self or out= (``rrelu_with_noise``'s noise); it
    returns the op's results followed by the written values."""
    name = schema.name.split("::", 1)[1]
    try:
        return getattr(getattr(torch.ops.aten, name + "_functional"), schema.overload_name or "default")
    except (AttributeError, RuntimeError):
        return None


def _via_functional_twin(twin: Any, schema: Any, mutable: list, args: tuple, kwargs: dict) -> Any:
    results = twin(*args, **kwargs)
    count = len(schema.returns)
    positions = {a.name: i for i, a in enumerate(schema.arguments)}
    for argument, value in zip(mutable, results[count:]):
        i = positions[argument.name]
        target = args[i] if i < len(args) else kwargs[argument.name]
        target.copy_(value)
    return results[0] if count == 1 else tuple(results[:count])


_decomposition_table: dict | None = None


def _decomposition(func: Any) -> Callable | None:
    """torch's own way to run ``func`` with other ops: its
    CompositeImplicitAutograd kernel (reached here in inference mode, where
    autograd does not decompose it first), else the Python decomposition
    tables of torch._decomp."""
    global _decomposition_table
    if _has_composite_kernel(func):
        return func.decompose
    if _decomposition_table is None:
        try:
            decomp = importlib.import_module("torch._decomp")
            try:
                importlib.import_module("torch._refs")  # registers more decompositions
            except Exception:
                pass
            _decomposition_table = dict(decomp.decomposition_table)
        except Exception as err:  # pragma: no cover - torch internals moved
            logger.warning("torch's decomposition table is unavailable: %s", err)
            _decomposition_table = {}
    found = _decomposition_table.get(func)
    return found if found is not None else custom_op_kernel(func)


def custom_op_kernel(func: Any) -> Callable | None:
    """The implementation of an op outside ``aten`` registered for this
    device's key (PrivateUse1) or for every device (``torch.library.custom_op``
    without device_types, or CompositeExplicitAutograd): written in torch
    ops, it runs on 'jax' tensors as they are, eagerly and -- as a
    decomposition -- in compiled graphs.  None for aten ops (their such kernels often just call their
    ``out=`` form, which the device runs through the functional op: that
    would go round in circles) and for ops without one."""
    try:
        name = func.name()
        if name.startswith("aten::"):
            return None
        # A kernel registered for this device's own key by the op's library
        # (FSDP2's fsdp::all_gather_copy_in / chunk_cat / split_with_sizes_copy
        # register one for PrivateUse1, written in torch ops) comes first.
        for key in ("PrivateUse1", "CompositeExplicitAutograd"):
            if torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
                # OpOverload._op_dk: the kernel of one dispatch key (what
                # OpOverload.decompose uses; pinned by a test)
                return functools.partial(func._op_dk, getattr(torch._C.DispatchKey, key))
    except (AttributeError, RuntimeError):
        return None
    return None


def _has_composite_kernel(func: Any) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(op_name(func), "CompositeImplicitAutograd")
    except RuntimeError:
        return False


def _via_functional(decomposition: Callable, out_names: tuple[str, ...], args: tuple, kwargs: dict) -> Any:
    if out_names:
        result = decomposition(*args, **{k: v for k, v in kwargs.items() if k not in out_names})
        outs = [kwargs[n] for n in out_names]
        results = result if isinstance(result, (tuple, list)) else (result,)
        for o, r in zip(outs, results):
            _write_out(o, r)
        return outs[0] if len(outs) == 1 else tuple(outs)
    self = args[0]
    self.copy_(decomposition(*args, **kwargs))
    return self


_write_out = _meta.write_out


@functools.lru_cache(maxsize=None)
def _kernel_counts_writes(name: str) -> bool:
    """Whether the device's kernel of an in-place op counts its writes in
    each target's version, as torch's kernels of the foreach in-place ops
    do (CPU's and CUDA's call ``increment_version``: these ops have no
    ADInplaceOrView kernel that would).  Without it autograd would not see
    a saved tensor changed by ``torch._foreach_add_`` and would compute
    the gradient from the new values.  The fused optimizer and amp ops,
    whose CPU kernels count nothing, are left as CPU leaves them."""
    try:
        viewed = torch._C._dispatch_has_kernel_for_dispatch_key(name, "ADInplaceOrView")
    except RuntimeError:
        return False
    return not viewed and name.split("::")[-1].startswith("_foreach_")


def _write_back_each(func: Any, functional_op: Any, schema: Any, mutable: list, count_writes: bool, args: tuple,
                     kwargs: dict) -> Any:
    if count_writes and args and _positions_meet(args[0], args[1:], kwargs):
        # torch's kernels write position by position: a storage written at
        # one position and read or written at another sees the first write
        # (the functional op computes every position from the old values)
        n = len(args[0])
        for i in range(n):
            func(*[_at_position(v, i, n) for v in args], **{k: _at_position(v, i, n) for k, v in kwargs.items()})
        return args[0] if schema.returns else None
    with _fused.writing_back():
        return _write_back_each_held(func, functional_op, schema, mutable, count_writes, args, kwargs)


def _write_back_each_held(func: Any, functional_op: Any, schema: Any, mutable: list, count_writes: bool,
                          args: tuple, kwargs: dict) -> Any:
    if _fused.replaying and not _profile.active and len(mutable) == 1 and mutable[0] is schema.arguments[0] \
            and not mutable[0].kwarg_only and args:
        storages = _whole_storages(args[0])
        if storages is not None and _fused.replay(functional_op, args, kwargs, into=storages):
            # the script's functional op, its results straight into the targets
            if count_writes:
                torch.autograd.graph.increment_version(args[0])
            return args[0] if schema.returns else None
    out_names = {a.name for a in mutable if a.kwarg_only}
    results = functional_op(*args, **{k: v for k, v in kwargs.items() if k not in out_names})
    if len(mutable) == 1 or not isinstance(results, (tuple, list)):
        results = (results,)
    bound = dict(zip((a.name for a in schema.arguments), args))
    bound.update(kwargs)
    writes = []
    for argument, value in zip(mutable, results):
        target = bound[argument.name]
        pairs = zip(target, value) if isinstance(target, (list, tuple)) else ((target, value),)
        writes.extend((argument.kwarg_only, t, v) for t, v in pairs)
    for out, t, v in writes:
        if not out and isinstance(v, torch.Tensor):
            # torch refuses an in-place result self cannot hold (a float
            # step into an int tensor) before writing anything; a copy_
            # would cast it silently
            _meta.check_inplace(v, t)
    # torch's refusal of a target with self-overlapping elements, by the op's
    # own rule (zero_ allows it); a whole storage (no view) cannot overlap itself
    viewed = [t for out, t, _ in writes if not out and getattr(t, "_view", None) is not None]
    if viewed:
        _meta.check_out_overlap(viewed, func)
    for out, t, v in writes:
        if out:
            _write_out(t, v)
        elif not _swapped_in(t, v):
            t.copy_(v)
    if count_writes:  # the writes above, inside the dispatcher, count nothing themselves
        torch.autograd.graph.increment_version([t for out, t, _ in writes if not out and isinstance(t, torch.Tensor)])
    if not schema.returns:
        return None
    written = [bound[a.name] for a in mutable][:len(schema.returns)]  # an in-place op returns what it wrote
    return written[0] if len(written) == 1 else tuple(written)


def _positions_meet(targets: Any, others: tuple, kwargs: dict) -> bool:
    """Whether a foreach in-place op's positions share storage: a target's
    storage written at two positions, or read at another position (or by
    a tensor argument every position reads)."""
    if (type(targets) is not list and type(targets) is not tuple) or len(targets) < 2:
        return False
    ours = [(id(t._storage), i) for i, t in enumerate(targets) if type(t) is _tensor.JaxTensor]
    written = dict(ours)
    if len(written) != len(ours):
        return True
    for v in (*others, *kwargs.values()):
        if type(v) is list or type(v) is tuple:
            if any(type(x) is _tensor.JaxTensor and written.get(id(x._storage), j) != j for j, x in enumerate(v)):
                return True
        elif type(v) is _tensor.JaxTensor and id(v._storage) in written:
            return True
    return False


def _at_position(v: Any, i: int, n: int) -> Any:
    """Argument ``v`` of a foreach op over ``n`` positions, at position ``i``."""
    return [v[i]] if (type(v) is list or type(v) is tuple) and len(v) == n else v


def _whole_storages(targets: Any) -> list | None:
    """The storages of ``targets`` (a list of 'jax' tensors an in-place op
    writes) where each is a whole, writable, unpadded storage on one device
    (no view): what fused eager's replay lane can give its results
    directly.  None otherwise."""
    if type(targets) is not list and type(targets) is not tuple:
        return None
    storages = []
    for t in targets:
        if type(t) is not _tensor.JaxTensor or t._view is not None:
            return None
        storage = t._storage
        if storage.padded is not None or storage.read_only is not None or type(storage.place) is not int:
            return None
        storages.append(storage)
    return storages


def _swapped_in(target: Any, value: Any) -> bool:
    """``target.copy_(value)`` for a fresh result of the target's own shape
    on its own device, without a second trip through torch's dispatcher:
    what copy_ ends in (the storage takes the new array, or a view's
    elements are written).  A foreach optimizer step writes back every
    parameter and state tensor (GPT-2's AdamW: 364 writes a step).  The
    caller applies the op's refusal of self-overlapping targets and counts
    the writes in the targets' versions where the op's kernel would.
    False where copy_'s conversions or broadcasting are needed."""
    if not (isinstance(target, _tensor.JaxTensor) and isinstance(value, _tensor.JaxTensor)) \
            or value._view is not None or value.shape != target.shape \
            or value._storage.place != target._storage.place:
        return False
    source, storage = value._storage, target._storage
    pending = source._array
    if type(pending) is _tensor.Pending and storage.padded is None and source.padded is None \
            and storage.jax_dtype == source.jax_dtype and type(storage.place) is int:
        # fused eager: the target takes the result still pending, so that
        # an optimizer's step stays one segment (reading it here ran the
        # segment after each foreach op: 8 programs an AdamW step)
        view = target._view
        if view is None:
            if pending.segment.share(pending, storage):
                return True
        elif view.kind == "reshape" and view.elem is None and storage.numel == value.numel():
            # a tensor over a storage of its own, as torch.load makes an
            # optimizer's state: the result reshaped into it, recorded
            storage.check_writable()
            if _fused.record(_reshape_into(pending.shape, storage.shape, pending.dtype), [pending], None,
                             storage.device_index, storage.place, into=[storage]):
                return True
    if storage.padded is not None and _dynamic_dims.write(target, value):
        return True  # in the storage's bucket (a padded result as it is laid out)
    _tensor.write(target, source.get())
    return True


_reshapes: dict = {}


def _reshape_into(shape: tuple, into: tuple, dtype: Any) -> Any:
    """The recorded op that gives a storage of shape ``into`` an array of
    ``shape`` (the same elements, row-major)."""
    return _fused.host_op(_reshapes, "pjrt_host.reshape_into", (shape, into, dtype_name(dtype)),
                          lambda: (lambda a: a.reshape(into), None))


def _last_resort(func: Any, args: tuple, kwargs: dict) -> Any:
    if _config.current().cpu_fallback:
        return run_on_cpu(func, args, kwargs)
    raise missing_lowering(func)
