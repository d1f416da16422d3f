"""The ``kernels`` section: each of the plugin's vendor kernels
(``DevicePlugin.kernels``) against the host's reference lowering of its op,
on the same inputs.

Inputs are the ATen op's own calls, recorded on torch CPU (a dispatch mode)
while torch's OpInfo samples of the ops named like it run -- forward, and
backward for a backward op such as ``_softmax_backward_data`` -- plus edge
cases of the kernel's declared condition: each recorded call again with its
first tensor holding infinities and NaN, and with large values, and cast to
each dtype the kernel declares.  A call the kernel's condition refuses runs
the reference anyway and is not counted.

Per kernel: values within ``torch.testing.assert_close``'s tolerances for
the dtype (the kernel runs in strict mode, so a failure is the kernel's own
error naming the plugin, the op and the kernel, with the sample), its jax
derivative against the reference's (what ``assume_pure``'s backward uses)
where the reference has one, and a figure: the kernel's time over the
reference lowering's on the largest input, both compiled, measured here.
"""

from __future__ import annotations

import time
from typing import Any

from ._recorder import Recorder, Skip, first_line
from ._support import plugin_record

__all__ = ["kernels"]

#: Calls recorded per kernel (OpInfo samples are many; a few distinct ones show a bug).
_MAX_CALLS = 12


def kernels(rec: Recorder, name: str, quick: bool, **_: Any) -> None:
    record = plugin_record(name)
    declared = record.plugin.declared_kernels
    if not declared.kernels:
        rec.finish(status="skip", reason="the plugin declares no kernels (DevicePlugin.kernels)")
        return
    import jax
    import torch

    import pjrt_host
    from ... import _lowerings, _plugin
    from ..._lowerings import _kernels

    device = pjrt_host.devices()[0]
    # every declared kernel, whatever PJRT_HOST_PLUGIN_KERNELS says, in strict mode
    declared = declared._replace(mode="on", dropped=())
    options = {n: getattr(record.plugin, n) for n in (*_plugin.INT_LOWERING_OPTIONS, *_plugin.BOOL_LOWERING_OPTIONS)}
    reference_ctx = _lowerings.LoweringContext(**options)
    for op_name, kernel in declared.kernels:
        title = f"{op_name} -> {kernel.fn}"
        lowering = _lowerings.lookup(_Named(op_name))
        with rec.check(f"{title}: loads") as info:
            if lowering is None:
                raise AssertionError(f"the host has no lowering named {op_name}: a kernel replaces a lowering of "
                                     "the table (python -c 'from pjrt_host import _lowerings; "
                                     "print(_lowerings.registered_names())')")
            ctx = _lowerings.LoweringContext(**options, declared_kernels=declared._replace(
                kernels=((op_name, kernel),)), kernel_setting=("strict", ()))
            info["detail"] = f"condition: {', '.join(kernel.dtypes) or 'any dtype'}" + (
                f", ranks {kernel.ranks}" if kernel.ranks else "") + (f", when {kernel.when}" if kernel.when else "")
        if lowering is None or not ctx.kernels:
            continue
        calls = _recorded_calls(torch, op_name, quick)
        calls += _edge_cases(torch, calls, kernel.dtypes)
        applied: list[tuple[Any, Any, Any]] = []
        with rec.check(f"{title}: values") as info:
            for args, kwargs, out in calls:
                jargs, jkwargs = _to_jax(torch, jax, device, args), _to_jax(torch, jax, device, kwargs)
                if _kernels.matching(ctx.kernels, lowering.names, jargs, jkwargs) is None:
                    continue
                dtypes = _result_dtypes(jax, out)
                try:
                    got = _lowerings.invoke(lowering, jargs, jkwargs, ctx, dtypes)
                    want = _lowerings.invoke(lowering, jargs, jkwargs, reference_ctx, dtypes)
                    _assert_close(torch, got, want)
                except _kernels.KernelError as err:
                    raise AssertionError(f"{first_line(str(err))[:400]} (sample: {_describe(args, kwargs)})") from err
                except Exception as err:
                    text = " ".join(str(err).split())[:400]
                    raise AssertionError(f"plugin {declared.plugin}'s kernel {kernel.fn} for {op_name} differs from "
                                         f"the host's lowering: {text} (sample: {_describe(args, kwargs)})") from err
                applied.append((jargs, jkwargs, dtypes))
            if not applied:
                raise Skip(f"no recorded call of {op_name} meets the kernel's condition "
                           f"({len(calls)} calls from torch's OpInfo samples and edge cases)")
            info["detail"] = f"{len(applied)} calls match the reference lowering (of {len(calls)} recorded)"
        if not applied:
            continue
        with rec.check(f"{title}: autograd") as info:
            info["detail"] = _check_derivative(jax, torch, lowering, applied, ctx, reference_ctx)
        largest = _enlarged(jax, max(applied, key=lambda c: sum(getattr(a, "size", 0) for a in jax.tree.leaves(c[0]))),
                            ctx, lowering)
        try:
            kernel_s = _time(jax, lowering, largest, ctx)
            reference_s = _time(jax, lowering, largest, reference_ctx)
            rec.figure(f"{op_name} kernel time", kernel_s * 1e3, "ms", reference=reference_s * 1e3,
                       reference_name="host lowering",
                       note=f"{kernel.fn} on {_describe(largest[0], largest[1])}, both compiled (ratio < 1: faster)")
        except Exception as err:
            rec.figure(f"{op_name} kernel time", None, "ms", note=f"not measured: {first_line(str(err))[:200]}")


class _Named:
    """What :func:`_lowerings.lookup` needs of an op: its name."""

    def __init__(self, name: str) -> None:
        self._name = name

    def name(self) -> str:
        return self._name


def _recorded_calls(torch: Any, op_name: str, quick: bool) -> list[tuple[Any, Any, Any]]:
    """Calls of ``op_name`` (args, kwargs, CPU result) made by torch CPU while
    the OpInfo samples of ops named like it run (forward and backward)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    try:
        from .. import _opinfo
    except ImportError:
        return []
    base = op_name.split("::", 1)[1].split(".")[0]
    stem = base.strip("_").removesuffix("_backward_data").removesuffix("_backward")
    names = {stem, f"nn.functional.{stem}", base}
    calls: list[tuple[Any, Any, Any]] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.name().removesuffix(".default")
            if (name == op_name or name.split(".")[0] == op_name) and len(calls) < _MAX_CALLS:
                calls.append((_detached(torch, args), _detached(torch, kwargs or {}), _detached(torch, out)))
            return out

    for info in _opinfo.op_db:
        if info.name not in names:
            continue
        for dtype in (torch.float32, torch.bfloat16):
            if dtype not in info.supported_dtypes("cpu"):
                continue
            grad = dtype.is_floating_point and info.supports_autograd
            try:
                samples = list(info.sample_inputs("cpu", dtype, requires_grad=grad))
            except Exception:
                continue
            for sample in samples[: 3 if quick else 8]:
                try:
                    with Record():
                        result = info(sample.input, *sample.args, **sample.kwargs)
                        outs = [r for r in (result if isinstance(result, (tuple, list)) else (result,))
                                if isinstance(r, torch.Tensor) and r.requires_grad]
                        if outs:
                            torch.autograd.backward(outs, [torch.randn_like(o) for o in outs])
                except Exception:
                    continue
    return calls


def _detached(torch: Any, value: Any) -> Any:
    from torch.utils._pytree import tree_map

    return tree_map(lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v, value)


def _edge_cases(torch: Any, calls: list, dtypes: tuple[str, ...]) -> list[tuple[Any, Any, Any]]:
    """Each recorded call with its first float tensor holding +-inf and NaN,
    then large values, then cast to each declared dtype (no CPU result:
    the kernel is compared with the reference lowering only)."""
    more = []
    for args, kwargs, _ in calls[:4]:
        position = next((i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point()
                         and a.numel() >= 3), None)
        if position is None:
            continue
        first = args[position]

        def replaced(value: Any) -> tuple:
            return tuple(value if i == position else a for i, a in enumerate(args))

        special = first.clone().flatten()
        special[0], special[1], special[2] = float("inf"), float("-inf"), float("nan")
        more.append((replaced(special.reshape(first.shape)), kwargs, None))
        more.append((replaced(first * 1e4), kwargs, None))
        for name in dtypes:
            dtype = getattr(torch, name, None)
            if isinstance(dtype, torch.dtype) and dtype != first.dtype:
                more.append((replaced(first.to(dtype)), kwargs, None))
    return more


def _to_jax(torch: Any, jax: Any, device: Any, value: Any) -> Any:
    import numpy as np
    from torch.utils._pytree import tree_map

    def move(v: Any) -> Any:
        if not isinstance(v, torch.Tensor):
            return v
        if v.dtype == torch.bfloat16:
            import ml_dtypes

            array = v.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        else:
            array = v.numpy()
        return jax.device_put(np.asarray(array), device)

    return tree_map(move, value)


def _result_dtypes(jax: Any, out: Any) -> Any:
    """The CPU result's dtypes as invoke takes them (None: the lowering's own)."""
    from ..._lowerings._dtypes import jax_dtype

    if out is None:
        return None
    if isinstance(out, (tuple, list)):
        return tuple(jax_dtype(o.dtype) if hasattr(o, "dtype") else None for o in out)
    return jax_dtype(out.dtype) if hasattr(out, "dtype") else None


def _as_torch(torch: Any, value: Any) -> Any:
    import numpy as np

    array = np.asarray(value)
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(array.copy())


def _assert_close(torch: Any, got: Any, want: Any) -> None:
    import jax

    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got_leaves) == len(want_leaves), f"{len(got_leaves)} results, the reference gives {len(want_leaves)}"
    for g, w in zip(got_leaves, want_leaves):
        # torch's own tolerances for the dtype (float32: 1.3e-6 relative, 1e-5 absolute)
        torch.testing.assert_close(_as_torch(torch, g), _as_torch(torch, w), equal_nan=True)


def _check_derivative(jax: Any, torch: Any, lowering: Any, applied: list, ctx: Any, reference_ctx: Any) -> str:
    """jax's derivative of the kernel against the reference's, on the float
    arguments of each call (what assume_pure's backward computes)."""
    import numpy as np

    from ... import _lowerings

    compared = 0
    for jargs, jkwargs, dtypes in applied:
        positions = [i for i, a in enumerate(jargs) if hasattr(a, "dtype") and jax.numpy.issubdtype(a.dtype, jax.numpy.floating)
                     and a.size]
        if not positions or any(not np.all(np.isfinite(np.asarray(jargs[i], dtype=np.float32))) for i in positions):
            continue

        def of(c: Any) -> Any:
            def f(*floats: Any) -> Any:
                args = list(jargs)
                for i, v in zip(positions, floats):
                    args[i] = v
                return _lowerings.invoke(lowering, args, jkwargs, c, dtypes)
            return f

        floats = [jargs[i] for i in positions]
        try:
            want, reference_vjp = jax.vjp(of(reference_ctx), *floats)
        except Exception:
            continue  # the reference has no jax derivative here (integer outputs, ...)
        cotangent = jax.tree.map(lambda w: jax.numpy.asarray(
            np.random.default_rng(0).standard_normal(w.shape), w.dtype), want)
        got, kernel_vjp = jax.vjp(of(ctx), *floats)
        _assert_close(torch, kernel_vjp(cotangent), reference_vjp(cotangent))
        compared += 1
    if not compared:
        raise Skip("no call with finite float inputs whose reference lowering jax can differentiate")
    return f"jax's derivative of {compared} calls matches the reference lowering's"


def _enlarged(jax: Any, call: tuple, ctx: Any, lowering: Any, elements: int = 1 << 18) -> tuple:
    """``call`` with its arrays of the first array's shape repeated along
    their first dimension up to about ``elements`` values (OpInfo samples
    are a few dozen values: a time on them is the call's overhead), if the
    kernel's condition still holds; else ``call``."""
    from ..._lowerings import _kernels

    jargs, jkwargs, dtypes = call
    first = next((a for a in jargs if hasattr(a, "shape") and getattr(a, "ndim", 0) >= 1), None)
    if first is None or first.size == 0 or first.size >= elements:
        return call
    reps = max(1, elements // first.size)
    tiled = tuple(jax.numpy.tile(a, (reps,) + (1,) * (a.ndim - 1)) if hasattr(a, "shape") and a.shape == first.shape
                  else a for a in jargs)
    if _kernels.matching(ctx.kernels, lowering.names, tiled, jkwargs) is None:
        return call
    return tiled, jkwargs, dtypes


def _time(jax: Any, lowering: Any, call: tuple, ctx: Any, repeats: int = 30) -> float:
    from ... import _lowerings

    jargs, jkwargs, dtypes = call
    positions = [i for i, a in enumerate(jargs) if hasattr(a, "shape")]

    @jax.jit
    def run(*arrays: Any) -> Any:
        args = list(jargs)
        for i, v in zip(positions, arrays):
            args[i] = v
        return _lowerings.invoke(lowering, args, jkwargs, ctx, dtypes)

    arrays = [jargs[i] for i in positions]
    jax.block_until_ready(run(*arrays))
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeats):
            out = run(*arrays)
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - start) / repeats)
    return best


def _describe(args: Any, kwargs: Any) -> str:
    def one(v: Any) -> str:
        if hasattr(v, "shape") and hasattr(v, "dtype"):
            return f"{str(v.dtype).removeprefix('torch.')}{list(v.shape)}"
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(one(x) for x in v) + "]"
        return repr(v)

    text = ", ".join(one(a) for a in args)
    if kwargs:
        text += ", " + ", ".join(f"{k}={one(v)}" for k, v in kwargs.items())
    return f"({text})"
