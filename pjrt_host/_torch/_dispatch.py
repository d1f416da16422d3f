"""Running ATen ops on 'jax' tensors.

For each op the dispatcher picks, once, a handler:

1. a view op (``view``, ``t``, slicing, ``expand`` ...) never computes: torch's
   meta kernel gives the result's sizes, strides and offset, and the result
   shares the input's storage;
2. an op in the lowering table (:mod:`pjrt_host._lowerings`) is compiled with
   ``jax.jit``, once per op, input shapes/dtypes/views and static arguments;
   torch's meta kernel, run once per compiled variant, gives the result dtypes
   (so dtypes are torch's, whatever jnp would have promoted to) and raises
   torch's own error for bad shapes;
3. an in-place or ``out=`` op runs its functional op and writes the result
   back through the target's view, in the same compiled function;
4. an op without a lowering runs torch's decomposition (each piece
   re-dispatched here);
5. otherwise NotImplementedError naming the op and how to report it (or,
   with ``pjrt_host.config(cpu_fallback=True)``, the op runs on torch CPU with
   a one-time warning).

Ops are looked up by name, never by ``torch.ops.aten`` attribute, so a
torch release that drops an overload cannot break import.
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .. import _lowerings
from .._lowerings._dtypes import jax_dtype, torch_dtype
from . import _config, _rng, _tensor, _views
from ._tensor import JaxTensor, Storage, make, view_for

__all__ = ["dispatch", "zeros_on", "new_tensor", "wrap_array", "read"]

logger = logging.getLogger("pjrt_host")

REPORT = "https://github.com/pjrt-host/pjrt-host/issues"

_handlers: dict[Any, Callable[[tuple, dict], Any]] = {}
_last: dict[int, Any] = {}  # device index -> last array produced there (synchronize waits on it)
_warned: set[str] = set()
_lock = threading.Lock()


# ---------------------------------------------------------------- devices


def jax_device(index: int) -> Any:
    from . import _device_table

    return _device_table.device(index)


def zeros_on(shape: tuple[int, ...], jdtype: Any, index: int) -> Any:
    return jax.device_put(np.zeros(shape, dtype=jdtype), jax_device(index))


# ---------------------------------------------------------------- dtypes


_dtype_map: dict[torch.dtype, torch.dtype] | None = None


def device_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a tensor of ``dtype`` has on the device: the same, unless
    the plugin maps it (``unsupported_dtypes``), which is warned once."""
    global _dtype_map
    if _dtype_map is None:
        _dtype_map = {}
        from .. import _runtime

        for src, dst in dict(getattr(_runtime.plugin(), "unsupported_dtypes", {}) or {}).items():
            s, d = getattr(torch, src, None), getattr(torch, dst, None)
            if isinstance(s, torch.dtype) and isinstance(d, torch.dtype):
                _dtype_map[s] = d
    if not _dtype_map:
        return dtype
    mapped = _dtype_map.get(dtype, dtype)
    if mapped is not dtype:
        key = f"dtype:{dtype}"
        if key not in _warned:
            _warned.add(key)
            from .. import _runtime

            warnings.warn(
                f"pjrt_host: the {_runtime.runtime().record.name!r} device does not support {dtype}; "
                f"such tensors are {mapped} on it (warned once)", stacklevel=3)
    return mapped


# ---------------------------------------------------------------- tensors


def read(t: JaxTensor) -> Any:
    """The values of a 'jax' tensor as a jax array (eager)."""
    vw = t._vw
    arr = t._st.get()
    if vw is None:
        return arr
    return _read_jit(vw.static)(arr, vw.offset)


_read_cache: dict[Any, Any] = {}


def _read_jit(static: tuple) -> Any:
    fn = _read_cache.get(static)
    if fn is None:
        fn = _read_cache[static] = jax.jit(lambda a, off: _views.read(a, static, off))
    return fn


def wrap_array(array: Any, index: int, dtype: torch.dtype | None = None) -> JaxTensor:
    """A new tensor owning ``array`` (already on device ``index``)."""
    if dtype is None:
        dtype = torch_dtype(array.dtype)
    shape = tuple(array.shape)
    return make(Storage(array, shape, array.dtype, index), shape, dtype)


def new_tensor(shape: tuple[int, ...], dtype: torch.dtype, index: int) -> JaxTensor:
    """An uninitialised (lazily zero) tensor, as ``torch.empty`` makes."""
    dtype = device_dtype(dtype)
    shape = tuple(shape)
    return make(Storage(None, shape, jax_dtype(dtype), index), shape, dtype)


def write(t: JaxTensor, value: Any) -> None:
    """Replace the values of ``t`` (through its view) with ``value``, an
    array of t's shape, cast here to the storage's dtype."""
    st = t._st
    vw = t._vw
    if value.dtype != st.jdtype:
        value = value.astype(st.jdtype)
    if vw is None:
        if tuple(value.shape) != st.shape:
            value = jnp.broadcast_to(value, st.shape)
        st.array = value
    else:
        st.array = _write_jit(vw.static)(st.get(), vw.offset, value)
    st.version += 1


_write_cache: dict[Any, Any] = {}


def _write_jit(static: tuple) -> Any:
    fn = _write_cache.get(static)
    if fn is None:
        fn = _write_cache[static] = jax.jit(
            lambda a, off, v: _views.write(a, static, off, jnp.broadcast_to(v, static[1])))
    return fn


# ---------------------------------------------------------------- errors


def device_error(a: Any, b: Any) -> RuntimeError:
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, {a} and {b}!")


def not_implemented(func: Any) -> NotImplementedError:
    name = _name(func)
    return NotImplementedError(
        f"pjrt_host: the ATen op {name} has no lowering to JAX and no decomposition in torch "
        f"{torch.__version__}, so it cannot run on the 'jax' device. Please report it at {REPORT} "
        f"(include the op name and your torch version). To run such ops on torch CPU meanwhile "
        f"(slow: two transfers per call), wrap the code in `with pjrt_host.config(cpu_fallback=True):`.")


def _name(func: Any) -> str:
    try:
        return func.name()
    except Exception:
        return str(func)


# ---------------------------------------------------------------- entry


def dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
    handler = _handlers.get(func)
    if handler is None:
        handler = _handlers[func] = _make_handler(func)
    return handler(args, kwargs)


# Installed as JaxTensor.__torch_dispatch__'s target (skips one import per call).
_tensor._dispatch_fn = dispatch


def _make_handler(func: Any) -> Callable[[tuple, dict], Any]:
    from . import _special

    name = _name(func)
    special = _special.HANDLERS.get(name) or _special.HANDLERS.get(name.split(".", 1)[0])
    if special is not None:
        return lambda args, kwargs: special(func, args, kwargs)
    return _make_handler_generic(func)


def _make_handler_generic(func: Any) -> Callable[[tuple, dict], Any]:
    schema = func._schema
    try:
        inplace_view = torch.Tag.inplace_view in func.tags
    except Exception:
        inplace_view = False
    if inplace_view:
        return lambda args, kwargs: run_inplace_view(func, args, kwargs)
    if func.is_view or _returns_alias(schema):
        return lambda args, kwargs: run_view(func, args, kwargs)
    mutable = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    lowering = _lowerings.lookup(func)
    if mutable:
        first = schema.arguments[0]
        if lowering is not None and mutable[0] is first and not first.kwarg_only:
            # An in-place op with a lowering of its own: it returns self's new value.
            return _Compiled(func, lowering, inplace=0).__call__
        functional = _functional_of(func, schema, mutable)
        if functional is not None:
            f_op, out_names = functional
            f_low = _lowerings.lookup(f_op)
            if f_low is not None:
                if out_names:
                    return _Compiled(func, f_low, out_names=out_names, meta_op=f_op).__call__
                return _Compiled(func, f_low, inplace=0, meta_op=f_op).__call__
            decomp = _decomposition(f_op)
            if decomp is not None:
                return lambda args, kwargs: _via_functional(func, decomp, out_names, args, kwargs)
    elif lowering is not None:
        return _Compiled(func, lowering).__call__
    decomp = _decomposition(func)
    if decomp is not None:
        return lambda args, kwargs: decomp(*args, **kwargs)
    return lambda args, kwargs: _fallback(func, args, kwargs)


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
            return getattr(packet, overload or "default"), ()
        out_names = tuple(a.name for a in mutable)
        if all(a.kwarg_only for a in mutable):
            packet = getattr(torch.ops.aten, name)
            inputs = [(a.name, str(a.type)) for a in schema.arguments if not a.kwarg_only or a.name not in out_names]
            for ov in packet.overloads():
                cand = getattr(packet, ov)
                cs = cand._schema
                if any(a.alias_info is not None and a.alias_info.is_write for a in cs.arguments):
                    continue
                if [(a.name, str(a.type)) for a in cs.arguments] == inputs:
                    return cand, out_names
    except Exception:
        return None
    return None


_decomp_table: dict | None = None


def _decomposition(func: Any) -> Callable | None:
    """torch's own way to run ``func`` with other ops: its
    CompositeImplicitAutograd kernel (reached here in inference mode, where
    autograd does not decompose it first), else the Python decomposition
    tables of torch._decomp."""
    global _decomp_table
    try:
        if torch._C._dispatch_has_kernel_for_dispatch_key(_name(func), "CompositeImplicitAutograd"):
            return func.decompose
    except Exception:
        pass
    if _decomp_table is None:
        try:
            import torch._decomp as decomp

            try:
                import torch._refs  # noqa: F401 - registers more decompositions
            except Exception:
                pass
            _decomp_table = dict(decomp.decomposition_table)
        except Exception as err:  # pragma: no cover - torch internals moved
            logger.warning("pjrt_host: torch's decomposition table is unavailable: %s", err)
            _decomp_table = {}
    return _decomp_table.get(func)


def _via_functional(func: Any, decomp: Callable, out_names: tuple[str, ...], args: tuple, kwargs: dict) -> Any:
    if out_names:
        kw = {k: v for k, v in kwargs.items() if k not in out_names}
        result = decomp(*args, **kw)
        outs = [kwargs[n] for n in out_names]
        results = result if isinstance(result, (tuple, list)) else (result,)
        for o, r in zip(outs, results):
            o.copy_(r)
        return outs[0] if len(outs) == 1 else tuple(outs)
    self = args[0]
    result = decomp(*args, **kwargs)
    self.copy_(result)
    return self


# ---------------------------------------------------------------- views


_view_cache: dict[Any, tuple] = {}


def _meta_view_of(t: JaxTensor) -> torch.Tensor:
    st = t._st
    base = torch.empty(st.numel, dtype=t.dtype, device="meta")
    return base.as_strided(t.shape, t.stride(), t.storage_offset())


def run_view(func: Any, args: tuple, kwargs: dict) -> Any:
    self = args[0]
    if not isinstance(self, JaxTensor):
        raise TypeError(f"pjrt_host: view op {_name(func)} expects a 'jax' tensor first")
    key = (func, self._st.numel, self.dtype, tuple(self.shape), self.stride(), self.storage_offset(),
           _static_key(args[1:]), _static_key(tuple(kwargs.items())) if kwargs else None)
    try:
        results = _view_cache.get(key)
    except TypeError:
        key, results = None, None
    if results is None:
        out = func(_meta_view_of(self), *args[1:], **kwargs)
        single = isinstance(out, torch.Tensor)
        metas = [out] if single else list(out)
        results = (single, [(tuple(m.shape), m.dtype, tuple(m.stride()), m.storage_offset(),
                             "conj" if m.is_conj() else "neg" if m.is_neg() else None) for m in metas])
        if key is not None:
            if len(_view_cache) > 8192:  # x[i] for ever new i: bound the memory
                _view_cache.clear()
            _view_cache[key] = results
    single, metas = results
    if single and metas[0][4]:
        # conj() / _neg_view(): torch marks the view with a bit instead of
        # computing; the device computes the values (a new tensor).
        arr = read(self)
        arr = jnp.conj(arr) if metas[0][4] == "conj" else -arr
        return wrap_array(arr, self._st.index, self.dtype)
    st = self._st
    outs = []
    for size, dtype, stride, offset, _bit in metas:
        if dtype != self.dtype:
            if func._schema.name == "aten::view" or _name(func) == "aten::view.dtype":
                # view(dtype): a reinterpretation; same-width ones are exact.
                return _view_dtype(self, dtype)
            # view_as_real / view_as_complex and friends: computed by their
            # lowering as a new tensor (writes through it do not reach self).
            lowering = _lowerings.lookup(func)
            if lowering is None:
                raise not_implemented(func)
            return _Compiled(func, lowering)(args, kwargs)
        outs.append(make(st, size, dtype, stride, offset, view_for(st, size, stride, offset)))
    return outs[0] if single else outs


def run_inplace_view(func: Any, args: tuple, kwargs: dict) -> Any:
    """transpose_, squeeze_, unsqueeze_, t_, as_strided_ ...: torch's meta
    kernel changes self's metadata in place (as torch does for its own
    wrapper subclasses), and self's view into its storage follows."""
    self = args[0]
    from torch.utils._mode_utils import no_dispatch

    with no_dispatch():
        meta_in_tls = torch._C._meta_in_tls_dispatch_include()
        torch._C._set_meta_in_tls_dispatch_include(True)
        try:
            func(*args, **kwargs)
        finally:
            torch._C._set_meta_in_tls_dispatch_include(meta_in_tls)
    size, stride, offset = tuple(self.shape), tuple(self.stride()), self.storage_offset()
    self._vw = view_for(self._st, size, stride, offset)
    return self


def _view_dtype(self: JaxTensor, dtype: torch.dtype) -> JaxTensor:
    arr = read(self)
    jd = jax_dtype(dtype)
    if np.dtype(jd).itemsize != np.dtype(arr.dtype).itemsize:
        raise NotImplementedError(
            f"pjrt_host: tensor.view({dtype}) of a {self.dtype} tensor (different element size) is not "
            f"supported on the 'jax' device; use .cpu().view(...) instead")
    return wrap_array(jax.lax.bitcast_convert_type(arr, jd), self._st.index, dtype)


def _static_key(values: Any) -> Any:
    out = []
    for v in values:
        if isinstance(v, (list, tuple)):
            out.append((list, _static_key(v)))
        elif isinstance(v, (bool, int, float)):
            out.append((type(v), v))
        elif isinstance(v, torch.Tensor):
            raise TypeError("tensor in view arguments")
        else:
            out.append(v)
    return tuple(out)


# ---------------------------------------------------------------- compiled ops

_TENSOR = "\x00T"
_CPU = "\x00C"
_LIST = "\x00L"
_GEN = "\x00G"


_CONCRETE_ERRORS = (jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError,
                    jax.errors.TracerIntegerConversionError, jax.errors.NonConcreteBooleanIndexError,
                    jax.errors.TracerArrayConversionError)
_make_wrapper = torch.Tensor._make_wrapper_subclass


class _Compiled:
    """One op (or its in-place / out= form) compiled per static signature."""

    __slots__ = ("func", "lowering", "inplace", "out_names", "meta_op", "cache", "eager", "name", "rng",
                 "scalar_slots", "dynamic", "misses", "in_trial")

    def __init__(self, func: Any, lowering: Callable, inplace: int | None = None,
                 out_names: tuple[str, ...] = (), meta_op: Any = None) -> None:
        self.func = func
        # The table holds Lowering records; this (pre-engine) dispatcher calls the function itself.
        self.lowering = getattr(lowering, "fn", lowering)
        self.inplace = inplace
        self.out_names = out_names
        self.meta_op = meta_op if meta_op is not None else func
        self.cache: dict[Any, tuple] = {}
        self.eager = False
        self.name = _name(func)
        self.rng = bool(getattr(lowering, "needs_rng", False))
        # Arguments typed Scalar / float: an optimizer passes a new value every
        # step (Adam's step size), which must not mean a new compile every step.
        self.scalar_slots = _scalar_slots(func)
        self.dynamic: bool | None = None  # scalars traced (True), static (False), undecided (None)
        self.misses = 0
        self.in_trial = False

    # The hot path: flatten, look up, call, wrap.  Kept short on purpose:
    # every line here is paid by every op.
    def __call__(self, args: tuple, kwargs: dict) -> Any:
        if self.out_names or self.rng or self.dynamic:
            return self._call_general(args, kwargs)
        dyn: list[Any] = []
        dev: list[int] = []
        try:
            key_args = tuple([_encode(v, dyn, dev) for v in args])
        except _ForeignFirst as err:
            raise device_error(_first_jax_device(list(args) + list(kwargs.values())), err.device) from None
        key = (key_args, tuple([(k, _encode(v, dyn, dev)) for k, v in kwargs.items()]) if kwargs else (),
               (), _config.current())
        if not dev:
            raise RuntimeError(f"pjrt_host: {self.name} reached the 'jax' device without a 'jax' tensor")
        index = dev[0]
        if len(dev) > 1:
            for d in dev:
                if d != index:
                    raise device_error(_tensor.torch_device(index), _tensor.torch_device(d))
        entry = self.cache.get(key)
        if entry is None:
            self.misses += 1
            if self.misses > 3 and self.dynamic is None and self.scalar_slots and not self.in_trial \
                    and not self.eager:
                return self._trial_dynamic(args, kwargs)
            entry = self._build(key, args, kwargs, [], key[3], index)
        fn, plan = entry
        try:
            result = fn(*dyn)
        except _CONCRETE_ERRORS:
            result = self._go_eager(key, args, kwargs, index, dyn)
        mode, outs = plan
        if mode == "single":
            kind, shape, dtype = outs[0]
            if kind == "tensor":
                _last[index] = result
                t = _make_wrapper(JaxTensor, shape, dtype=dtype, device=_tensor.torch_device(index))
                t._st = Storage(result, shape, result.dtype, index)
                t._vw = None
                return t
        return self._finish(result, plan, args, [], index)

    def _trial_dynamic(self, args: tuple, kwargs: dict) -> Any:
        """Try tracing this op's scalars instead of compiling per value: keep
        it if the lowering traces and gives the same result (a lowering that
        branches on a scalar's value cannot)."""
        target = args[self.inplace] if self.inplace is not None else None
        saved = target._st.get() if target is not None else None
        self.in_trial = True
        try:
            static_out = self(args, kwargs)
        finally:
            self.in_trial = False
        if target is not None:
            static_value = target._st.array
            target._st.array = saved
        self.dynamic = True
        try:
            dyn_out = self._call_general(args, kwargs)
            if target is not None:
                same = _same(static_value, target._st.array)
            else:
                same = _same_outputs(static_out, dyn_out)
        except Exception as err:
            logger.debug("pjrt_host: %s keeps static scalars: %s", self.name, err)
            same = False
        if same:
            return dyn_out
        self.dynamic = False
        for k in [k for k in self.cache if _has_dynamic(k)]:
            del self.cache[k]
        if target is not None:
            target._st.array = static_value
        return static_out

    def _go_eager(self, key: Any, args: tuple, kwargs: dict, index: int, dyn: list) -> Any:
        # The lowering needs concrete values (a data-dependent shape): this op
        # runs op by op in jax eager mode from now on.
        self.eager = True
        self.cache.clear()
        fn, _ = self._build(key, args, kwargs, [], key[3], index)
        return fn(*dyn)

    def _call_general(self, args: tuple, kwargs: dict) -> Any:
        try:
            return self._call_general_checked(args, kwargs)
        except _ForeignFirst as err:
            raise device_error(_first_jax_device(list(args) + list(kwargs.values())), err.device) from None

    def _call_general_checked(self, args: tuple, kwargs: dict) -> Any:
        dyn: list[Any] = []
        dev: list[int] = []
        out_targets: list[JaxTensor] = []
        generator = None
        if self.out_names:
            kwargs = dict(kwargs)
            for n in self.out_names:
                out_targets.append(kwargs.pop(n))
        if self.rng and "generator" in kwargs:
            kwargs = dict(kwargs)
            generator = kwargs.pop("generator")
        if self.dynamic:
            slots = self.scalar_slots
            key_args = tuple([_encode_scalar(v, dyn, dev) if i in slots else _encode(v, dyn, dev)
                              for i, v in enumerate(args)])
            key_kwargs = tuple((k, _encode_scalar(v, dyn, dev) if k in slots else _encode(v, dyn, dev))
                               for k, v in kwargs.items()) if kwargs else ()
        else:
            key_args = _encode_seq(args, dyn, dev)
            key_kwargs = tuple((k, _encode(v, dyn, dev)) for k, v in kwargs.items()) if kwargs else ()
        if not dev:
            raise RuntimeError(f"pjrt_host: {self.name} reached the 'jax' device without a 'jax' tensor")
        index = dev[0]
        for t in out_targets:
            if not isinstance(t, JaxTensor):
                raise device_error(_tensor.torch_device(index), t.device)
            dev.append(t._st.index)
            dyn.append(t._st.get())
            vw = t._vw
            dyn.append(vw.offset if vw is not None and vw.kind == "gather" else 0)
        for d in dev:
            if d != index:
                raise device_error(_tensor.torch_device(index), _tensor.torch_device(d))
        if self.rng:
            kd, counter = _rng.next_key_args(index, generator)
            dyn.append(kd)
            dyn.append(counter)
        cfg = _config.current()
        key = (key_args, key_kwargs, tuple((t.dtype, tuple(t.shape), None if t._vw is None else t._vw.static,
                                            t._st.shape) for t in out_targets), cfg)
        entry = self.cache.get(key)
        if entry is None:
            entry = self._build(key, args, kwargs, out_targets, cfg, index)
        fn, plan = entry
        try:
            result = fn(*dyn)
        except _CONCRETE_ERRORS:
            self.eager = True
            self.cache.clear()
            fn, plan = self._build(key, args, kwargs, out_targets, cfg, index)
            result = fn(*dyn)
        return self._finish(result, plan, args, out_targets, index)

    def _finish(self, result: Any, plan: tuple, args: tuple, out_targets: list, index: int) -> Any:
        mode, outs = plan
        if mode == "inplace":
            self_t = args[self.inplace]
            st = self_t._st
            st.array = result
            st.version += 1
            _last[index] = result
            return self_t
        if mode == "out":
            for t, arr in zip(out_targets, result):
                t._st.array = arr
                t._st.version += 1
            _last[index] = result[0]
            return out_targets[0] if len(out_targets) == 1 else tuple(out_targets)
        if mode == "single":
            kind, shape, dtype = outs[0]
            if kind != "tensor":
                return _to_python(result)
            _last[index] = result
            return make(Storage(result, shape, result.dtype, index), shape, dtype)
        if mode == "dynamic":
            return _wrap_dynamic(result, index)
        wrapped = []
        for (kind, shape, dtype), arr in zip(outs, result):
            if kind == "tensor":
                wrapped.append(make(Storage(arr, shape, arr.dtype, index), shape, dtype))
                _last[index] = arr
            elif kind == "none":
                wrapped.append(None)
            else:
                wrapped.append(_to_python(arr))
        return tuple(wrapped) if mode == "tuple" else wrapped

    def _build(self, key: Any, args: tuple, kwargs: dict, out_targets: list, cfg: Any, index: int) -> tuple:
        meta = _run_meta(self.meta_op, args, kwargs)
        lowering = self.lowering
        rng = self.rng
        precision = cfg.matmul_precision
        template_args, template_kwargs = key[0], key[1]
        n_out = len(out_targets)
        out_views = [(None if t._vw is None else t._vw.static) for t in out_targets]

        if self.inplace is not None:
            target = args[self.inplace]
            tgt_static = None if target._vw is None else target._vw.static
            tgt_dtype = jax_dtype(target.dtype)
            tgt_shape = tuple(target.shape)
            # torch refuses an in-place result that self cannot hold
            # (int_tensor.add_(0.5)) or that would broadcast self.
            if meta is not None and self.meta_op is not self.func and isinstance(meta[0], torch.Tensor):
                _check_inplace(meta[0], target)
            plan = ("inplace", None)

            def fn(*dyn):
                call_args, call_kwargs, offsets = _decode_all(template_args, template_kwargs, dyn, rng)
                with jax.default_matmul_precision(precision):
                    value = lowering(*call_args, **call_kwargs)
                if isinstance(value, (tuple, list)):
                    value = value[0]
                value = jnp.broadcast_to(jnp.asarray(value).astype(tgt_dtype), tgt_shape)
                arr, off = offsets[self.inplace]
                return _views.write(arr, tgt_static, off, value)
        elif n_out:
            metas = meta[1] if meta is not None else None
            plan = ("out", None)

            def fn(*dyn):
                base = len(dyn) - 2 * n_out - (2 if rng else 0)
                out_arrays = dyn[base:base + 2 * n_out]
                rest = dyn[:base] + dyn[base + 2 * n_out:]
                call_args, call_kwargs, _ = _decode_all(template_args, template_kwargs, rest, rng)
                with jax.default_matmul_precision(precision):
                    value = lowering(*call_args, **call_kwargs)
                values = value if isinstance(value, (tuple, list)) else (value,)
                new = []
                for i in range(n_out):
                    arr, off = out_arrays[2 * i], out_arrays[2 * i + 1]
                    t = out_targets[i]
                    v = jnp.broadcast_to(jnp.asarray(values[i]).astype(jax_dtype(t.dtype)), tuple(t.shape))
                    new.append(_views.write(arr, out_views[i], off, v))
                return tuple(new)
            del metas
        else:
            mode, specs = _plan_from_meta(meta)
            out_dtypes = None if specs is None else [
                jax_dtype(device_dtype(s[2])) if s[0] == "tensor" else None for s in specs]

            def fn(*dyn):
                call_args, call_kwargs, _ = _decode_all(template_args, template_kwargs, dyn, rng)
                with jax.default_matmul_precision(precision):
                    value = lowering(*call_args, **call_kwargs)
                if out_dtypes is None:
                    return value
                if mode == "single":
                    return jnp.asarray(value).astype(out_dtypes[0]) if out_dtypes[0] is not None else value
                return tuple(v if d is None or v is None else jnp.asarray(v).astype(d)
                             for v, d in zip(value, out_dtypes))
            if specs is None:
                plan = ("dynamic", None)
            else:
                plan = (mode, [(s[0], s[1], device_dtype(s[2])) if s[0] == "tensor" else s for s in specs])
        jitted = fn if (self.eager or not cfg.jit) else jax.jit(fn)
        entry = (jitted, plan)
        with _lock:
            if len(self.cache) > 512:  # shapes that never repeat: bound the memory
                self.cache.clear()
            self.cache[key] = entry
        return entry


_SCALAR_NAMES = {
    torch.bool: "Bool", torch.uint8: "Byte", torch.int8: "Char", torch.int16: "Short", torch.int32: "Int",
    torch.int64: "Long", torch.float16: "Half", torch.bfloat16: "BFloat16", torch.float32: "Float",
    torch.float64: "Double", torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble",
}


def _check_inplace(result: torch.Tensor, target: JaxTensor) -> None:
    if not torch.can_cast(result.dtype, target.dtype):
        raise RuntimeError(
            f"result type {_SCALAR_NAMES.get(result.dtype, result.dtype)} can't be cast to the desired output "
            f"type {_SCALAR_NAMES.get(target.dtype, target.dtype)}")
    if tuple(result.shape) != tuple(target.shape):
        raise RuntimeError(
            f"output with shape {list(target.shape)} doesn't match the broadcast shape {list(result.shape)}")


def _wrap_dynamic(result: Any, index: int) -> Any:
    if isinstance(result, (tuple, list)):
        return type(result)(_wrap_dynamic(r, index) for r in result)
    if result is None or isinstance(result, (bool, int, float, complex)):
        return result
    if getattr(result, "ndim", None) is None:
        return result
    arr = result
    dtype = torch_dtype(arr.dtype)
    mapped = device_dtype(dtype)
    if mapped is not dtype:
        arr = arr.astype(jax_dtype(mapped))
    _last[index] = arr
    return wrap_array(arr, index, mapped)


def _to_python(x: Any) -> Any:
    if isinstance(x, (bool, int, float, complex)) or x is None:
        return x
    return np.asarray(x).item()


def _plan_from_meta(meta: Any) -> tuple[str, list | None]:
    """("single" | "tuple" | "list", [(kind, shape, dtype)]) from the meta
    result; kind is "tensor", "none" or "scalar" (a Python number)."""
    if meta is None:
        return "single", None
    out, _ = meta

    def spec(o):
        if isinstance(o, torch.Tensor):
            return ("tensor", tuple(o.shape), o.dtype)
        if o is None:
            return ("none", None, None)
        return ("scalar", None, None)

    if isinstance(out, (tuple, list)):
        return ("tuple" if isinstance(out, tuple) else "list"), [spec(o) for o in out]
    if isinstance(out, (torch.Tensor, bool, int, float)):
        return "single", [spec(out)]
    return "single", None


# ------------------------------------------------- argument encoding (hot path)


def _encode_seq(values: Any, dyn: list, dev: list) -> tuple:
    return tuple([_encode(v, dyn, dev) for v in values])


class _ForeignFirst(Exception):
    """A non-'jax' tensor came before any 'jax' tensor: the caller names both."""

    def __init__(self, device: torch.device) -> None:
        self.device = device


def _first_jax_device(values: Any) -> Any:
    for v in values:
        if isinstance(v, JaxTensor):
            return v.device
        if isinstance(v, (list, tuple)):
            found = _first_jax_device(v)
            if found is not None:
                return found
    return None


def _encode(v: Any, dyn: list, dev: list) -> Any:
    if isinstance(v, JaxTensor):
        st = v._st
        dev.append(st.index)
        arr = st.array
        if arr is None:
            arr = st.get()
        dyn.append(arr)
        vw = v._vw
        if vw is None:
            return (_TENSOR, v.dtype, st.shape, None)
        dyn.append(vw.offset if vw.kind == "gather" else 0)
        return (_TENSOR, v.dtype, st.shape, vw.static)
    if isinstance(v, torch.Tensor):
        if v.dim() == 0 and v.device.type == "cpu":
            dyn.append(np.asarray(v.item(), dtype=jax_dtype(v.dtype)))
            return (_CPU, v.dtype)
        if dev:
            raise device_error(_tensor.torch_device(dev[0]), v.device)
        raise _ForeignFirst(v.device)
    t = type(v)
    if t is list or t is tuple:
        return (_LIST, tuple([_encode(x, dyn, dev) for x in v]))
    if t is float or t is int or t is bool or t is complex:
        return (t, v)
    if isinstance(v, torch.Generator):
        return (_GEN, None)
    return v


_DYNS = "\x00S"
# Tensor positions too: torch passes a Python number there as it is (x / 2.0).
_SCALAR_TYPES = ("Scalar", "Scalar?", "float", "float?", "Tensor", "Tensor?")


def _scalar_slots(func: Any) -> frozenset:
    try:
        slots: set = set()
        for i, a in enumerate(func._schema.arguments):
            if str(a.type) in _SCALAR_TYPES or str(a.type).startswith("number"):
                slots.add(a.name)
                if not a.kwarg_only:
                    slots.add(i)
        return frozenset(slots)
    except Exception:
        return frozenset()


def _encode_scalar(v: Any, dyn: list, dev: list) -> Any:
    t = type(v)
    if t is float or t is int:
        dyn.append(v)
        return (_DYNS, t)
    if t is bool or t is complex or v is None:
        return (t, v)
    return _encode(v, dyn, dev)


def _has_dynamic(key: Any) -> bool:
    if type(key) is tuple:
        if key and key[0] == _DYNS:
            return True
        return any(_has_dynamic(k) for k in key)
    return False


def _same(a: Any, b: Any) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind in "fc":
        return bool(np.allclose(a, b, rtol=1e-6, atol=0, equal_nan=True))
    return bool(np.array_equal(a, b))


def _same_outputs(x: Any, y: Any) -> bool:
    if isinstance(x, JaxTensor) and isinstance(y, JaxTensor):
        return x.dtype == y.dtype and x.shape == y.shape and _same(read(x), read(y))
    if isinstance(x, (tuple, list)) and isinstance(y, (tuple, list)):
        return len(x) == len(y) and all(_same_outputs(a, b) for a, b in zip(x, y))
    return x == y


def _decode_all(targs: tuple, tkwargs: tuple, dyn: tuple, rng: bool):
    it = iter(dyn)
    offsets: list[tuple[Any, Any]] = []
    args = [_decode(x, it, offsets) for x in targs]
    kwargs = {k: _decode(x, it, offsets) for k, x in tkwargs}
    if rng:
        kd = next(it)
        counter = next(it)
        key = jax.random.fold_in(jax.random.wrap_key_data(kd.astype(jnp.uint32), impl="threefry2x32"), counter)
        args.insert(0, key)
    return args, kwargs, offsets


def _decode(x: Any, it: Any, offsets: list) -> Any:
    if type(x) is tuple and x:
        tag = x[0]
        if tag is _TENSOR or tag == _TENSOR:
            arr = next(it)
            static = x[3]
            off = next(it) if static is not None else 0
            offsets.append((arr, off))
            return _views.read(arr, static, off)
        if tag == _CPU:
            offsets.append((None, 0))
            return next(it)
        if tag == _LIST:
            return [_decode(y, it, offsets) for y in x[1]]
        if tag == _GEN:
            return None
        if tag == _DYNS:
            return next(it)
        if tag in (float, int, bool, complex):
            return x[1]
    return x


# ---------------------------------------------------------------- meta oracle


def _to_meta(v: Any) -> Any:
    if isinstance(v, JaxTensor):
        return _meta_view_of(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_to_meta(x) for x in v)
    return v


def _run_meta(func: Any, args: tuple, kwargs: dict) -> tuple[Any, Any] | None:
    """torch's own answer for the result's shapes and dtypes (None when the
    op has no meta kernel or a data-dependent shape).  torch's errors about
    the arguments (shapes, dtypes) are raised as they are."""
    try:
        margs = _to_meta(args)
        mkwargs = {k: _to_meta(v) for k, v in kwargs.items()}
        out = func(*margs, **mkwargs)
    except NotImplementedError:
        return None
    except RuntimeError as err:
        text = str(err)
        if "meta" in text.lower() or "data-dependent" in text or "data dependent" in text or "nonzero" in text:
            return None
        raise
    except Exception as err:
        if type(err).__name__ in ("DynamicOutputShapeException", "DataDependentOutputException",
                                  "GuardOnDataDependentSymNode"):
            return None
        raise
    return out, None


# ---------------------------------------------------------------- fallback


def _fallback(func: Any, args: tuple, kwargs: dict) -> Any:
    if not _config.current().cpu_fallback:
        raise not_implemented(func)
    name = _name(func)
    if name not in _warned:
        _warned.add(name)
        warnings.warn(f"pjrt_host: {name} has no lowering; running it on torch CPU (warned once)", stacklevel=3)
    index = None

    def to_cpu(v):
        nonlocal index
        if isinstance(v, JaxTensor):
            index = v._st.index
            return v.cpu()
        if isinstance(v, (list, tuple)):
            return type(v)(to_cpu(x) for x in v)
        return v

    cargs = to_cpu(args)
    ckwargs = {k: to_cpu(v) for k, v in kwargs.items()}
    out = func(*cargs, **ckwargs)
    device = _tensor.torch_device(index or 0)
    # Mutated arguments are written back.
    for a, (orig, cpu) in zip(func._schema.arguments, zip(list(args) + [kwargs.get(a.name) for a in func._schema.arguments[len(args):]],
                                                          list(cargs) + [ckwargs.get(a.name) for a in func._schema.arguments[len(args):]])):
        if a.alias_info is not None and a.alias_info.is_write and isinstance(orig, JaxTensor):
            orig.copy_(cpu)

    def back(v):
        if isinstance(v, torch.Tensor):
            return v.to(device)
        if isinstance(v, (list, tuple)):
            return type(v)(back(x) for x in v)
        return v

    return back(out)
