"""Bad inputs on the 'jax' device against torch CPU, over torch's OpInfo database.

    python benchmarks/bad_input_sweep.py [--ops N] [--every K] [--slice S] [--timeout T] [--show N]

For each OpInfo of ``op_db`` (torch's own database), the calls below, each run on
torch CPU and on 'jax':

* torch's own ``error_inputs`` of the OpInfo (the inputs torch's tests say must raise);
* one sample input of the OpInfo (its first, in float32 where supported) made bad:
  wrong dtypes (every floating tensor as bool / int64 / float16 / float64 / complex64;
  one argument of another dtype), mismatched shapes (one tensor's last dimension one
  longer), out-of-range dims and negative sizes (each integer argument as ``ndim``,
  ``-ndim - 1`` and ``-1``), empty tensors, NaN / +inf / -inf, mixed devices (one
  tensor left on CPU), non-contiguous inputs, and for ops with ``out=``: ``out=`` of
  wrong dtypes, a wrong shape, non-contiguous, overlapping (an expanded tensor), on
  CPU, and aliasing the input; for ops with an in-place variant: an int / bool self,
  a self that would have to grow by broadcasting, and an overlapping self.

A case agrees when the device raises where CPU raises, with CPU's exception type,
and gives CPU's values (dtype, shape, values within float tolerances; only dtype
and shape for random and uninitialised ops) where CPU succeeds.  Mixed devices
follow torch's accelerator rule instead of CPU's (where everything is on CPU):
a tensor on CPU other than a 0-dim one is refused with a RuntimeError.

Each slice of ops runs in a worker subprocess (this file with ``--worker``),
printing a line before and after each case: a call that ends the process is
recorded as a crash and one that prints nothing within ``--timeout`` seconds as
a hang; a new worker goes on after it.  The summary gives the counts, the
leaked jax / XLA exception types (an exception raised inside jax or jaxlib that
reached the user), and the differing cases grouped by op and kind.
``KNOWN_DIFFERENCES`` lists the differences that stay, each with its reason
(docs/bad-inputs.md has the figures of a full run).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

HERE = Path(__file__).resolve()

#: The differences that stay, each with its reason: (label, case-id pattern,
#: CPU's answer pattern, the device's answer pattern, reason), matched with
#: re.search against ``op|kind``, ``Type: message`` (or ``value``).  A case
#: listed here still counts as a disagreement in the figures.
KNOWN_DIFFERENCES: tuple[tuple[str, str, str, str, str], ...] = (
    ("cpu-dtype-gap", r"", r"^NotImplementedError: .*not implemented for '", r"",
     "torch CPU's kernel has no code for this dtype where its meta kernel (and the device's lowering) accepts it; "
     "the device finds such refusals by running the op once per signature on CPU zeros of its own layouts "
     "(_meta.check_cpu_kernel), which does not reach ops the device makes itself (randn_like), ops with their own "
     "handler (native_batch_norm) or kernels that first refuse the zeros for their values (ctc_loss)"),
    ("cpu-dtype-rule", r"\|(dtype|promote|inplace:(int64|bool)|out:)",
     r"same dtype|scalar[ _]type|expected .*dtype|not supported|not (yet )?implemented|Unsupported input type|"
     r"can't be cast|must be|does not support|dtype", r"^value|^RuntimeError|^TypeError|^AssertionError",
     "torch CPU's kernel refuses this dtype or dtype combination with its own check (the meta kernel accepts "
     "it), and the device computes it in torch's promoted dtype; or the check comes from a different layer "
     "(torch's decomposition or reference) with another exception type"),
    ("out-exact-dtype", r"\|out:", r"[Ee]xpected out tensor to have dtype|expected scalar_type|must be of same type|"
     r"expects mantissa|Found dtype", r"^value",
     "this op's CPU kernel wants out= of exactly its result dtype; the device's out= follows torch's general rule "
     "(any dtype the result can be cast to)"),
    ("overlap", r"\|(out|inplace):overlap", r"written-to tensor|^value", r"written-to tensor|^value",
     "whether a write into a tensor whose elements share memory is refused depends on each CPU kernel; the "
     "device takes CPU's answer from its probe at the call's own layouts, and where the probe cannot tell (CPU "
     "refuses its zeros first, a factory's out=) refuses it for the elementwise, random and scan ops"),
    ("complex32", r"", r"", r"complex32 has no jax equivalent",
     "the device holds no complex32 (chalf): jax has no such type (docs/torch-device.md)"),
    ("value-check", r"\|poison:", r"", r"^value",
     "torch CPU's kernel reads the values and refuses NaN / inf where the device has no deferred value check "
     "(it has them for multinomial, one_hot, SVDs, eig, the old cholesky, bernoulli's p, normal's std and "
     "binary_cross_entropy's range): histogram ranges, eigh and lstsq of NaN (LAPACK's answers), eig of an "
     "infinite entry (torch.linalg.eigvals of a tensor subclass reaches the device as linalg_eig, and CPU's eigvals "
     "takes one), "
     "linalg.cholesky of an infinite entry (MKL's arithmetic decides which minor fails, if any)"),
    ("mixed-index", r"^(gather|index_[\w.]+|scatter[\w.]*|_unsafe_masked_index\w*)\|mixed:", r"", r"^value",
     "an index tensor on CPU is moved to the device, as torch's CPU kernels and PyTorch's device-generic tests read "
     "it wherever it lives; the sweep's accelerator rule refuses it"),
    ("device-feature", r"", r"", r"growing a 'jax' tensor in place|aten::_to_sparse has no lowering",
     "the device has no sparse layouts and does not grow a tensor's storage in place (docs/torch-device.md)"),
    ("mixed-linear-cross-entropy", r"^nn\.functional\.linear_cross_entropy[\w.]*\|mixed:", r"^value", r"same device",
     "a 0-dim CPU tensor among linear_cross_entropy's arguments: torch's chunked implementation runs kernels "
     "with torch's common-device check (as the margin losses, whose refusal the meta device shows), which the "
     "device follows; on CPU every tensor is on CPU"),
    ("out-written-by-python", r"^lu\|out:cpu", r"", r"^value",
     "torch.lu's out= is written by torch's Python code (resize_as_ and copy_ of each result), which copies "
     "into an out= tensor wherever it lives, on every device"),
    ("mixed-ctc-targets", r"^nn\.functional\.ctc_loss\|mixed:", r"", r"^value",
     "torch's ctc_loss moves targets to log_probs' device before its kernel (for cuDNN's CPU targets), on every "
     "device: a CPU tensor among them is no error"),
    ("batch-norm-long-weight", r"^(native_batch_norm|_native_batch_norm_legit|_batch_norm_with_update)\|shape:",
     r"^value", r"Attempting to broadcast a dimension|must match the size of tensor",
     "torch CPU's batch norm kernel reads the first C entries of a weight / bias / running statistic longer than "
     "the channels without checking its length; torch's meta kernel and decomposition (which the device follows) "
     "broadcast it against the input and refuse it"),
    ("grid-sampler-mode", r"^grid_sampler_[23]d\|int:arg[12]=", r"^value", r"Invalid (interpolation|padding) mode",
     "torch CPU's grid sampler kernels take an unknown interpolation or padding mode without checking and return "
     "their output uninitialised; torch's decomposition refuses it, and the device does"),
    ("inplace-resize", r"^addbmm\|inplace:broadcast", r"^value", r"doesn't match the broadcast shape",
     "addbmm_'s kernel (CPU's and cuda's) resizes self to the result's shape in place; the device does not grow a "
     "tensor's storage in place and refuses the broadcast, as every other in-place op is refused"),
    ("value-check-not-yet", r"^_segment_reduce\.offsets\|",
     r"Expected all rows of lengths along axis|Expected segment_length >= 0|Expected i < index_size", r"^value",
     "torch's kernel reads segment_reduce's offsets and refuses inconsistent ones; the device has deferred checks "
     "for its lengths and for embedding_bag's offsets, not yet for these offsets"),
    ("ldl-nan-pivot", r"^linalg\.ldl_factor\|poison:nan", r"^value", r"INTERNAL ASSERT FAILED",
     "the device's LDL factorization follows reference LAPACK's sytf2, which reports a NaN pivot in info (as for a "
     "zero one); torch CPU's MKL sytrf does not, and returns the factors; torch's own check of a non-zero info for "
     "ldl_factor then fails its internal assertion"),
)

#: Cases not run: torch CPU itself misbehaves on them (the reference is the defect).
TORCH_CPU_DEFECTS: dict[str, str] = {
    "nn.functional.avg_pool3d|out:overlap": "torch CPU's avg_pool3d writes past an expanded out= tensor's storage: "
                                            "the heap is corrupted and the process aborts (munmap_chunk(): invalid "
                                            "pointer) on CPU alone",
    "narrow_copy|out:overlap": "torch CPU's narrow_copy writes past an expanded out= tensor's storage (heap "
                               "corruption; a segmentation fault on CPU alone)",
    "linalg.eigvals|poison:nan": "torch CPU's eigvals of a matrix holding NaN ends the process in MKL "
                                 "(SGEBAL: 'Parameter 3 was incorrect', then a segmentation fault) on CPU alone",
    "_segment_reduce.offsets|empty:input": "torch CPU's _segment_reduce with offsets of an empty input ends the "
                                           "process with a segmentation fault in its own run",
}

# Inputs whose values decide nothing about raising but that a lowering may take
# a long time over (a size argument made huge) are not generated: every integer
# made bad is made small.


@dataclasses.dataclass
class Case:
    """One call: ``sample`` holds CPU tensors; ``place(t, device, k)`` puts the
    k-th tensor leaf on a device (default: a copy there); ``variant`` is
    ``op`` (the OpInfo's function), ``inplace`` or ``out`` (then ``out(template,
    device)`` makes the ``out=`` argument from CPU's result of the good sample)."""

    id: str
    kind: str
    op: Any
    sample: Any
    variant: str = "op"
    place: Callable[[Any, str, int], Any] | None = None
    out: Callable[[Any, str], Any] | None = None
    template: Any = None
    mixed: int | None = None  # the tensor leaf kept on CPU in the device run
    expect_error: tuple[type, str] | None = None  # torch's ErrorInput


# ---------------------------------------------------------------- generation

def _name(op: Any) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _leaves(sample: Any) -> list:
    from torch.utils._pytree import tree_flatten
    return tree_flatten((sample.input, sample.args, sample.kwargs))[0]


def _tensor_leaves(sample: Any) -> list:
    import torch
    return [x for x in _leaves(sample) if isinstance(x, torch.Tensor)]


def _map_tensors(sample: Any, fn: Callable[[Any, int], Any]) -> Any:
    """A copy of the sample with each tensor leaf t (the k-th) as fn(t, k)."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten
    leaves, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
    k, out = 0, []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            out.append(fn(leaf, k))
            k += 1
        else:
            out.append(leaf)
    inp, args, kwargs = tree_unflatten(out, spec)
    return type(sample)(inp, args=args, kwargs=kwargs)


def _map_ints(sample: Any) -> list[tuple[str, Callable[[int], Any]]]:
    """(where, rebuild(value)) for each integer argument (top level of args and
    kwargs, and the first element of an integer list/tuple argument)."""
    found = []
    args, kwargs = list(sample.args), dict(sample.kwargs)

    def rebuild_arg(i, j=None):
        def make(value):
            new = list(args)
            if j is None:
                new[i] = value
            else:
                seq = list(new[i])
                seq[j] = value
                new[i] = type(new[i])(seq)
            return type(sample)(sample.input, args=tuple(new), kwargs=kwargs)
        return make

    def rebuild_kwarg(key, j=None):
        def make(value):
            new = dict(kwargs)
            if j is None:
                new[key] = value
            else:
                seq = list(new[key])
                seq[j] = value
                new[key] = type(new[key])(seq)
            return type(sample)(sample.input, args=tuple(args), kwargs=new)
        return make

    def is_int(v):
        return isinstance(v, int) and not isinstance(v, bool)

    for i, a in enumerate(args):
        if is_int(a):
            found.append((f"arg{i}", rebuild_arg(i)))
        elif isinstance(a, (list, tuple)) and a and is_int(a[0]):
            found.append((f"arg{i}[0]", rebuild_arg(i, 0)))
    for key, a in kwargs.items():
        if is_int(a):
            found.append((key, rebuild_kwarg(key)))
        elif isinstance(a, (list, tuple)) and a and is_int(a[0]):
            found.append((f"{key}[0]", rebuild_kwarg(key, 0)))
    return found[:4]


def _noncontiguous(t: Any) -> Any:
    """t's values in a non-contiguous tensor (every other element of a wider one)."""
    import torch
    if t.dim() == 0 or t.numel() == 0:
        return t
    base = torch.empty(t.shape[:-1] + (t.shape[-1] * 2,), dtype=t.dtype, device=t.device)
    view = base[..., ::2]
    view.copy_(t)
    return view


def _poison(value: float) -> Callable[[Any, int], Any]:
    import torch

    def fn(t, k):
        if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
            return t
        t = t.clone()
        t.view(-1)[0] = value
        if t.numel() > 2:
            t.view(-1)[-1] = value
        return t
    return fn


def _base_dtype(op: Any) -> Any:
    import torch
    supported = op.supported_dtypes("cpu")
    for dtype in (torch.float32, torch.int64, torch.bool, torch.complex64, torch.float64):
        if dtype in supported:
            return dtype
    return None


def _first_sample(op: Any, dtype: Any) -> Any:
    """The first sample CPU accepts, and CPU's result of it."""
    import torch
    torch.manual_seed(0)
    try:
        samples = op.sample_inputs("cpu", dtype, requires_grad=False)
        for sample in samples:
            if isinstance(sample.input, torch.Tensor) and sample.input.layout != torch.strided:
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    args, kwargs = _clone_call(sample)
                    result = op(*args, **kwargs)
            except Exception:
                continue
            return sample, result
    except Exception:
        pass
    return None, None


def _clone_call(sample: Any) -> tuple:
    s = _map_tensors(sample, lambda t, k: t.clone())
    return (s.input, *s.args), s.kwargs


def cases_for(op: Any) -> Iterator[Case]:
    """Every case of one OpInfo, in a fixed order (seeded generation)."""
    import torch
    name = _name(op)
    if op.error_inputs_func is not None:
        torch.manual_seed(0)
        try:
            errors = list(op.error_inputs("cpu"))
        except Exception:
            errors = []
        for i, err in enumerate(errors):
            yield Case(f"{name}|error:{i}", "error_inputs", op, err.sample_input,
                       expect_error=(err.error_type, str(err.error_regex)))
    dtype = _base_dtype(op)
    if dtype is None:
        return
    sample, result = _first_sample(op, dtype)
    if sample is None:
        return
    tensors = _tensor_leaves(sample)
    ids = collections.Counter()

    def case(kind, s, **kw):
        ids[kind] += 1
        suffix = f"#{ids[kind]}" if ids[kind] > 1 else ""
        return Case(f"{name}|{kind}{suffix}", kind.split(":")[0], op, s, **kw)

    yield case("good", sample)
    # wrong dtypes: every floating tensor as another dtype
    floating = [t for t in tensors if t.is_floating_point() or t.is_complex()]
    for wrong in (torch.bool, torch.int64, torch.float16, torch.float64, torch.complex64):
        if floating and wrong != dtype:
            yield case(f"dtype:{str(wrong)[6:]}", _map_tensors(
                sample, lambda t, k, w=wrong: t.to(w) if t.is_floating_point() or t.is_complex() else t))
    # one argument of another dtype than the rest
    for k in range(1, min(len(tensors), 3)):
        for wrong in (torch.int64, torch.complex64, torch.bool):
            yield case(f"promote:{k}:{str(wrong)[6:]}", _map_tensors(
                sample, lambda t, j, k=k, w=wrong: t.to(w) if j == k else t))
    # mismatched shapes: one tensor's last dimension one longer
    if len(tensors) > 1:
        for k in range(min(len(tensors), 3)):
            yield case(f"shape:{k}", _map_tensors(sample, lambda t, j, k=k: _longer(t) if j == k else t))
    # out-of-range dims, negative sizes
    if isinstance(sample.input, torch.Tensor):
        ndim = sample.input.dim()
        for where, rebuild in _map_ints(sample):
            for value in dict.fromkeys((max(ndim, 1), -max(ndim, 1) - 1, -1)):
                yield case(f"int:{where}={value}", rebuild(value))
    # empty tensors
    if isinstance(sample.input, torch.Tensor) and sample.input.dim() >= 1:
        yield case("empty:input", _map_tensors(sample, lambda t, j: _emptied(t) if j == 0 else t))
        if len(tensors) > 1:
            yield case("empty:all", _map_tensors(sample, lambda t, j: _emptied(t) if t.dim() >= 1 else t))
    # NaN and infinities
    if floating:
        for label, value in (("nan", math.nan), ("inf", math.inf), ("-inf", -math.inf)):
            yield case(f"poison:{label}", _map_tensors(sample, _poison(value)))
    # mixed devices: one tensor left on CPU; non-contiguous inputs
    for k, t in enumerate(tensors[:3]):
        if len(tensors) > 1:  # with one tensor, on CPU, the call is CPU's own
            yield case(f"mixed:{k}", sample, mixed=k)
        if t.dim() >= 1 and t.numel() > 1:
            yield case(f"noncontig:{k}", sample, place=lambda t, device, j, k=k: (
                _noncontiguous(t.clone().to(device)) if j == k else t.clone().to(device)))
    # in-place variant
    if op.inplace_variant is not None and isinstance(sample.input, torch.Tensor):
        yield case("inplace:ok", sample, variant="inplace")
        for wrong in (torch.int64, torch.bool):
            if wrong != dtype:
                yield case(f"inplace:{str(wrong)[6:]}", _map_tensors(
                    sample, lambda t, j, w=wrong: t.to(w) if j == 0 else t), variant="inplace")
        if sample.input.dim() >= 1 and sample.input.numel() > 1:
            yield case("inplace:broadcast", _map_tensors(
                sample, lambda t, j: t[..., :1].clone() if j == 0 else t), variant="inplace")
            yield case("inplace:overlap", sample, variant="inplace", place=lambda t, device, j: (
                t.reshape(-1)[:1].clone().to(device).expand(t.shape) if j == 0 else t.clone().to(device)))
    # out=
    outs = _out_template(result)
    if op.supports_out and outs is not None:
        def make_out(fn):
            return lambda template, device: _rebuild_out(template, lambda t: fn(t, device))

        yield case("out:ok", sample, variant="out", template=result,
                   out=make_out(lambda t, d: torch.empty_like(t, device=d)))
        for wrong in (torch.int64, torch.bool, torch.float16, torch.float64, torch.complex64):
            yield case(f"out:{str(wrong)[6:]}", sample, variant="out", template=result,
                       out=make_out(lambda t, d, w=wrong: torch.empty(t.shape, dtype=w, device=d)))
        yield case("out:shape", sample, variant="out", template=result,
                   out=make_out(lambda t, d: torch.empty((t.numel() + 3,), dtype=t.dtype, device=d)))
        yield case("out:noncontig", sample, variant="out", template=result,
                   out=make_out(lambda t, d: _noncontiguous(torch.zeros(t.shape, dtype=t.dtype, device=d))))
        yield case("out:overlap", sample, variant="out", template=result, out=make_out(
            lambda t, d: torch.zeros((1,) * t.dim(), dtype=t.dtype, device=d).expand(t.shape)
            if t.numel() > 1 else torch.empty_like(t, device=d)))
        yield case("out:cpu", sample, variant="out", template=result,
                   out=make_out(lambda t, d: torch.empty_like(t, device="cpu")))


def _longer(t: Any) -> Any:
    import torch
    if t.dim() == 0:
        return torch.stack([t, t])
    shape = list(t.shape)
    shape[-1] += 1
    return torch.cat([t, t[..., :1]], dim=-1) if t.shape[-1] else torch.zeros(shape, dtype=t.dtype)


def _emptied(t: Any) -> Any:
    return t[:0].clone()


def _out_template(result: Any) -> Any:
    import torch
    if isinstance(result, torch.Tensor):
        return result
    if isinstance(result, (tuple, list)) and result and all(isinstance(r, torch.Tensor) for r in result):
        return result
    return None


def _rebuild_out(template: Any, fn: Callable[[Any], Any]) -> Any:
    import torch
    if isinstance(template, torch.Tensor):
        return fn(template)
    return tuple(fn(t) for t in template)


# ------------------------------------------------------------------- running

def _on(value: Any, device: str) -> Any:
    import torch
    if device in ("jax", "meta"):
        if isinstance(value, torch.device) and value.type == "cpu":
            return torch.device(device)
        if isinstance(value, str) and value == "cpu":
            return device
    return value


def _call(case: Case, device: str) -> Any:
    """Run the case on one device: its tensors placed there, its result with
    every tensor copied to CPU (the device run synchronised, so a deferred
    check reports here)."""
    import torch
    from torch.utils._pytree import tree_map

    def place(t, k):
        if device in ("jax", "meta") and (case.mixed == k or k in ON_CPU_EVERYWHERE.get(case.op.name, ())):
            return t.clone()
        if case.place is not None and device != "meta":
            return case.place(t, device, k)
        return t.clone().to(device)

    s = _map_tensors(case.sample, place)
    args = [_on(a, device) for a in s.args]
    kwargs = {k: _on(v, device) for k, v in s.kwargs.items()}
    inp = _on(s.input, device)
    if case.variant == "out":
        kwargs["out"] = case.out(case.template, device)
    fn = case.op.inplace_variant if case.variant == "inplace" else case.op
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if device == "meta":  # torch's own answer on a device that is not CPU (no values)
            with torch.device("meta"):
                fn(inp, *args, **kwargs)
            return None
        if device == "jax":
            with torch.device("jax"):
                result = fn(inp, *args, **kwargs)
            result = tree_map(lambda x: (x.device.type, x.cpu()) if isinstance(x, torch.Tensor) else x, result)
            torch.jax.synchronize()
        else:
            result = fn(inp, *args, **kwargs)
            result = tree_map(lambda x: (x.device.type, x) if isinstance(x, torch.Tensor) else x, result)
    return result


def _where_raised(err: BaseException) -> str:
    """The package of the innermost frame that raised: jax, jaxlib, pjrt_host, torch or other."""
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return "other"
    path = frames[-1].filename.replace("\\", "/")
    for package in ("jaxlib", "jax", "pjrt_host", "torch"):
        if f"/{package}/" in path:
            return package
    return "other"


def _outcome(case: Case, device: str) -> dict:
    try:
        return {"raised": False, "result": _call(case, device)}
    except Exception as err:  # noqa: BLE001 - the exception is what is compared
        line = str(err).strip().split("\n")[0][:300]
        return {"raised": True, "type": type(err).__name__, "module": type(err).__module__,
                "mro": [c.__name__ for c in type(err).__mro__], "message": line, "where": _where_raised(err)}


TOLERANCES = {"float32": dict(rtol=1e-4, atol=1e-5), "complex64": dict(rtol=1e-4, atol=1e-5),
              "float16": dict(rtol=1e-2, atol=1e-3), "bfloat16": dict(rtol=1.6e-2, atol=1e-2)}


def _values_differ(case: Case, got: Any, want: Any) -> str:
    """'' when the device's result is CPU's; else what differs."""
    import torch
    from torch.utils._pytree import tree_flatten
    from pjrt_host._check.opinfo_properties import RANDOM, UNINITIALISED
    from pjrt_host._check.opinfo_expected_failures import EXPECTED_FAILURES, UP_TO_FREEDOM
    base = case.id.split("|")[0]
    values = not (base in RANDOM or base in UNINITIALISED or base in EXPECTED_FAILURES
                  or any(k.rsplit("-", 1)[0] == base for k in UP_TO_FREEDOM))
    leaves_g, spec_g = tree_flatten(got, is_leaf=lambda x: isinstance(x, tuple) and len(x) == 2
                                    and isinstance(x[1], torch.Tensor))
    leaves_w, spec_w = tree_flatten(want, is_leaf=lambda x: isinstance(x, tuple) and len(x) == 2
                                    and isinstance(x[1], torch.Tensor))
    if len(leaves_g) != len(leaves_w):
        return f"result structure {spec_g} differs from CPU's {spec_w}"
    for g, w in zip(leaves_g, leaves_w):
        if isinstance(w, tuple) and len(w) == 2 and isinstance(w[1], torch.Tensor):
            if not (isinstance(g, tuple) and len(g) == 2 and isinstance(g[1], torch.Tensor)):
                return f"a {type(g).__name__} where CPU gives a tensor"
            (gdev, gt), (wdev, wt) = g, w
            if case.mixed is None and case.kind != "out" and wdev == "cpu" and gdev != "jax":
                return f"result on {gdev}"
            if (gt.dtype, gt.shape) != (wt.dtype, wt.shape):
                return f"{gt.dtype} {tuple(gt.shape)}, CPU gives {wt.dtype} {tuple(wt.shape)}"
            if values:
                try:
                    torch.testing.assert_close(gt, wt, equal_nan=True, check_device=False,
                                               **TOLERANCES.get(str(wt.dtype)[6:], {}))
                except AssertionError as err:
                    return str(err).split("\n")[0][:200] + " " + " ".join(str(err).split("\n")[1:3])[:200]
        elif values and not isinstance(w, torch.Tensor):
            try:
                if w != g and not (isinstance(w, float) and math.isnan(w) and math.isnan(g)):
                    return f"{g!r}, CPU gives {w!r}"
            except Exception:  # noqa: BLE001 - incomparable values differ
                return f"{g!r}, CPU gives {w!r}"
    return ""


def _mixed_expected(case: Case) -> bool:
    """Torch's accelerator rule: a CPU tensor among device tensors is refused
    unless it is 0-dim (a scalar) or one torch wants on CPU."""
    leaves = _tensor_leaves(case.sample)
    on_cpu = ON_CPU_EVERYWHERE.get(case.op.name, ())
    on_device = [k for k in range(len(leaves)) if k != case.mixed and k not in on_cpu]
    return leaves[case.mixed].dim() != 0 and bool(on_device) and case.mixed not in on_cpu


#: Ops that read only a CPU tensor's sizes, which torch takes from any device
#: (composite views; the meta device runs them with a CPU tensor too): the
#: accelerator rule does not apply, CPU's values are the reference.
SHAPES_ONLY = frozenset({"expand_as", "reshape_as", "view_as", "broadcast_tensors", "resize_as_"})

#: Tensor arguments (by position among a sample's tensors) that torch wants
#: on CPU on every device: the device runs keep them there, as a user must.
ON_CPU_EVERYWHERE: dict[str, tuple[int, ...]] = {
    "tensor_split": (1,),  # tensor_indices_or_sections: "expected ... to be on cpu" on any accelerator
}


def _factory_out_on_cpu(case: Case) -> dict | None:
    """A factory (no tensor arguments) with out= on CPU, as torch answers it
    on any other device: run under ``torch.device('meta')`` (torch's own
    device, no pjrt_host), as the device run is under ``torch.device('jax')``.
    torch's argument parser refuses the out= of another device type; None
    where meta runs it."""
    import torch
    sample = case.sample
    fn = case.op.inplace_variant if case.variant == "inplace" else case.op
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch.device("meta"):
                fn(_on(sample.input, "meta"), *[_on(a, "meta") for a in sample.args],
                   **{k: _on(v, "meta") for k, v in sample.kwargs.items()}, out=case.out(case.template, "meta"))
        except Exception as err:  # noqa: BLE001 - the exception is what is compared
            return {"raised": True, "type": type(err).__name__, "mro": [c.__name__ for c in type(err).__mro__],
                    "message": str(err).strip().split("\n")[0][:300], "mixed": True}
    return None


def _meta_refusal(case: Case) -> dict | None:
    """The case's device refusal on torch's meta device, where it comes
    from code every accelerator runs: C++ (structured meta functions,
    shared with cuda's kernels) or torch's device check of its composite
    ops (``_prims_common.check_same_device``), not ``torch._refs``' elementwise
    references, which refuse a 0-dim CPU operand that TensorIterator takes
    as a scalar (torch's own OpInfos skip them for it on cuda)."""
    try:
        _call(case, "meta")
    except Exception as err:  # noqa: BLE001 - the exception is what is compared
        frames = traceback.extract_tb(err.__traceback__)
        text = str(err).strip().split("\n")[0][:300]
        if "device" not in text or (frames and "/torch/_refs/" in frames[-1].filename.replace("\\", "/")):
            return None
        return {"raised": True, "type": type(err).__name__, "mro": [c.__name__ for c in type(err).__mro__],
                "message": text, "mixed": True}
    return None


def judge(case: Case, cpu_done: Callable[[], None] = lambda: None) -> dict:
    """Run the case on CPU and on 'jax' and say how the answers compare."""
    want = _outcome(case, "cpu")
    cpu_done()
    got = _outcome(case, "jax")
    rec = {"id": case.id, "kind": case.kind, "cpu_raised": want["raised"], "jax_raised": got["raised"]}
    if not want["raised"] and (case.mixed is not None and _mixed_expected(case)
                               and case.op.name not in SHAPES_ONLY
                               or case.id.split("|")[1].startswith("out:cpu") and _tensor_leaves(case.sample)):
        want = {"raised": True, "type": "RuntimeError", "mro": ["RuntimeError"], "message": "", "mixed": True}
    elif not want["raised"] and case.mixed is not None and case.op.name not in SHAPES_ONLY:
        # a 0-dim CPU tensor: torch's accelerators take it where their code
        # does not reshape it or check for one device first; torch's meta
        # device runs the same device-generic code, so its refusal is theirs
        meta = _meta_refusal(case)
        if meta is not None:
            want = meta
    elif not want["raised"] and case.id.split("|")[1].startswith("out:cpu"):
        want = _factory_out_on_cpu(case) or want
    rec["cpu_raised"] = want["raised"]
    if got["raised"]:
        rec.update(jax_type=got["type"], jax_message=got["message"], where=got["where"],
                   leaked=got["where"] in ("jax", "jaxlib") or got["module"].split(".")[0] in ("jax", "jaxlib")
                   or "XlaRuntimeError" in got["message"] or got["type"] == "XlaRuntimeError")
    if want["raised"]:
        rec.update(cpu_type=want["type"], cpu_message=want["message"])
    rec["agree_raise"] = want["raised"] == got["raised"]
    if want["raised"] and got["raised"]:
        rec["agree_type"] = (want["type"] == got["type"] or want["type"] in got["mro"])
        rec["agree_message"] = want.get("mixed", False) or got["message"] == want["message"] \
            or got["message"].startswith(want["message"])
    elif not want["raised"] and not got["raised"]:
        rec["agree_type"] = True
        differ = _values_differ(case, got["result"], want["result"])
        rec["agree_values"] = not differ
        if differ:
            rec["values"] = differ
    else:
        rec["agree_type"] = False
    return rec


# -------------------------------------------------------------------- worker

def worker(names: list[str], skip: set[str]) -> None:
    """Run every case of the named OpInfos, printing ``START id`` before and
    ``RESULT {json}`` after each."""
    import torch
    import pjrt_host  # noqa: F401 - the 'jax' device
    from torch.testing._internal.common_methods_invocations import op_db
    warnings.simplefilter("ignore")
    torch.zeros(1, device="jax")
    by_name = {}
    for op in op_db:
        by_name.setdefault(_name(op), op)
    for name in names:
        try:
            cases = list(cases_for(by_name[name]))
        except Exception as err:  # noqa: BLE001 - a generator torch cannot run is reported, not fatal
            print("GENFAIL", json.dumps({"op": name, "error": f"{type(err).__name__}: {err}"[:300]}), flush=True)
            continue
        for case in cases:
            if case.id in skip or case.id in TORCH_CPU_DEFECTS:
                continue
            print("START", case.id, flush=True)
            try:
                rec = judge(case, lambda: print("CPUDONE", flush=True))
            except Exception as err:  # noqa: BLE001 - the harness's own failure
                rec = {"id": case.id, "kind": case.kind, "harness": f"{type(err).__name__}: {err}"[:300]}
            print("RESULT", json.dumps(rec, default=str), flush=True)
    print("DONE", flush=True)


def op_names(every: int = 1, limit: int = 0) -> list[str]:
    """The OpInfo names of op_db, in order: every ``every``-th, at most ``limit``."""
    from torch.testing._internal.common_methods_invocations import op_db
    names = list(dict.fromkeys(_name(op) for op in op_db))[::every]
    return names[:limit] if limit else names


def _lines(proc: subprocess.Popen, timeout: Callable[[], float]) -> Iterator[str | None]:
    """The worker's output lines as they come (unbuffered: a line already
    read is never left waiting behind a select); None when nothing came
    for ``timeout()`` seconds."""
    import selectors
    fd = proc.stdout.fileno()
    pending = b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                yield line.decode(errors="replace")
            if not sel.select(timeout()):
                yield None
                return
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                if pending:
                    yield pending.decode(errors="replace")
                return
            pending += chunk


def sweep(names: list[str], timeout: float = 180.0, slice_size: int = 40,
          log: Callable[[str], None] | None = None, script: Path = HERE,
          save: Path | None = None) -> list[dict]:
    """Run the OpInfos' cases in worker subprocesses, ``slice_size`` OpInfos
    each; a case after which the worker dies is a ``crash`` record, one
    that prints nothing for ``timeout`` seconds a ``hang`` record.
    ``save``: each record is appended there as a JSON line as it comes."""
    records: list[dict] = []
    saved = 0

    def flush() -> None:
        nonlocal saved
        if save is not None:
            with open(save, "a") as f:
                f.writelines(json.dumps(r, default=str) + "\n" for r in records[saved:])
        saved = len(records)

    env = dict(os.environ)
    env.pop("JAX_PLATFORMS", None)
    for start in range(0, len(names), slice_size):
        part = names[start:start + slice_size]
        skip: set[str] = set()
        while True:
            proc = subprocess.Popen([sys.executable, str(script), "--worker", json.dumps(sorted(skip))],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    bufsize=0, env=env)
            proc.stdin.write("\n".join(part).encode())
            proc.stdin.close()
            current, finished, hung, on_device = None, False, False, False
            # a worker's start-up (torch, its OpInfo database, the device) is not a case
            for line in _lines(proc, lambda: timeout if current is not None else max(timeout, 600)):
                if line is None:
                    hung = True
                    proc.kill()
                    break
                if line.startswith("START "):
                    current, on_device = line[6:].strip(), False
                elif line.startswith("CPUDONE"):
                    on_device = True
                elif line.startswith("RESULT "):
                    rec = json.loads(line[7:])
                    records.append(rec)
                    skip.add(rec["id"])
                    current = None
                elif line.startswith("GENFAIL "):
                    records.append({"genfail": json.loads(line[8:])})
                elif line.startswith("DONE"):
                    finished = True
            proc.wait()
            proc.stdout.close()
            if finished:
                break
            if current is None:  # died outside a case (start-up): nothing more to learn from this slice
                records.append({"id": f"<slice {start}>", "kind": "harness", "crash": proc.returncode})
                break
            status = "hang" if hung else proc.returncode
            # torch CPU's own run ending the process is torch's defect, not the device's
            what = ("hang" if hung else "crash") if on_device else ("cpu_hang" if hung else "cpu_crash")
            records.append({"id": current, "kind": current.split("|")[1].split(":")[0], what: status})
            skip.add(current)
        flush()
        if log:
            log(f"  ops {start}..{start + len(part)}: {len(records)} records")
    return records


# ------------------------------------------------------------------- summary

def _answer(r: dict, side: str) -> str:
    if not r.get(f"{side}_raised"):
        return "value"
    return f"{r.get(f'{side}_type')}: {r.get(f'{side}_message', '')}"


def known(r: dict) -> str | None:
    """The reason a differing case (a record) is listed for, or None."""
    for label, case, cpu, dev, reason in KNOWN_DIFFERENCES:
        if re.search(case, r["id"]) and re.search(cpu, _answer(r, "cpu")) and re.search(dev, _answer(r, "jax")):
            return label
    return None


def summarise(records: list[dict]) -> dict:
    # a record of a case in TORCH_CPU_DEFECTS (from a run before it was listed) is torch's failure
    records = [dict(r, cpu_crash=r.get("crash", r.get("hang", "listed"))) if r.get("id") in TORCH_CPU_DEFECTS and
               ("crash" in r or "hang" in r) else r for r in records]
    records = [{k: v for k, v in r.items() if k not in ("crash", "hang")} if "cpu_crash" in r else r for r in records]
    cases = [r for r in records if "id" in r and "harness" not in r and r.get("kind") != "harness"]
    run = [r for r in cases if "agree_raise" in r]
    both_ok = [r for r in run if "agree_values" in r]
    both_raised = [r for r in run if r["cpu_raised"] and r["jax_raised"]]
    msg_checked = [r for r in both_raised if r.get("agree_type") and "cpu" not in r.get("cpu_message", "").lower()]
    return {
        "cases": len(cases),
        "run": len(run),
        "crashes": [r for r in cases if "crash" in r],
        "hangs": [r for r in cases if "hang" in r],
        "cpu_failures": [r for r in cases if "cpu_crash" in r or "cpu_hang" in r],
        "harness": [r for r in records if "harness" in r or "genfail" in r or r.get("kind") == "harness"],
        "agree_raise": sum(r["agree_raise"] for r in run),
        "agree_type": sum(r["agree_raise"] and r["agree_type"] for r in run),
        "both_raised": len(both_raised),
        "messages_checked": len(msg_checked),
        "agree_message": sum(bool(r.get("agree_message")) for r in msg_checked),
        "both_ok": len(both_ok),
        "agree_values": sum(r["agree_values"] for r in both_ok),
        "leaked": [r for r in run if r.get("leaked")],
        "differ": [r for r in run if not (r["agree_raise"] and r["agree_type"])],
        "values_differ": [r for r in both_ok if not r["agree_values"]],
    }


def report(summary: dict, show: int = 40) -> str:
    s = summary
    run = max(s["run"], 1)
    lines = [
        f"cases: {s['cases']} ({s['run']} judged)",
        f"crashes: {len(s['crashes'])}   hangs: {len(s['hangs'])}   harness/generator failures: {len(s['harness'])}",
        f"raise-or-not agrees with CPU: {s['agree_raise']} ({100 * s['agree_raise'] / run:.2f}%)",
        f"raise-or-not and exception type agree: {s['agree_type']} ({100 * s['agree_type'] / run:.2f}%)",
        f"messages (both raised, same type, CPU's text names no device): {s['agree_message']} of "
        f"{s['messages_checked']}",
        f"values agree where both succeed: {s['agree_values']} of {s['both_ok']}",
        f"leaked jax/XLA exceptions: {len(s['leaked'])} "
        f"{dict(collections.Counter(r['jax_type'] for r in s['leaked']))}",
    ]
    lines.append(f"torch CPU's own run ended the process (torch's defect; not judged): {len(s['cpu_failures'])}")
    for title, rows in (("crash", s["crashes"]), ("hang", s["hangs"]), ("CPU", s["cpu_failures"])):
        for r in rows:
            lines.append(f"  {title}: {r['id']} ({r.get('crash', r.get('hang', r.get('cpu_crash', r.get('cpu_hang'))))})")
    by_op = collections.Counter(r["id"].split("|")[0] for r in s["differ"])
    lines.append("top differing ops: " + ", ".join(f"{op} {n}" for op, n in by_op.most_common(15)))
    by_kind = collections.Counter(r["kind"] for r in s["differ"])
    lines.append("differing by kind: " + ", ".join(f"{k} {n}" for k, n in by_kind.most_common()))
    listed = collections.Counter(known(r) for r in s["differ"])
    lines.append("listed differences: " + ", ".join(f"{k} {n}" for k, n in listed.most_common() if k))
    unlisted = [r for r in s["differ"] if not known(r)]
    lines.append(f"differences not in KNOWN_DIFFERENCES: {len(unlisted)}")
    for r in unlisted[:show]:
        lines.append("  " + describe(r))
    for r in s["leaked"][:show]:
        lines.append("  leaked: " + describe(r))
    for r in s["values_differ"][:show]:
        lines.append(f"  values: {r['id']}: {r['values']}")
    return "\n".join(lines)


def describe(r: dict) -> str:
    cpu = f"{r['cpu_type']}: {r['cpu_message'][:100]}" if r["cpu_raised"] else "value"
    dev = f"{r['jax_type']}: {r['jax_message'][:140]} [{r.get('where')}]" if r["jax_raised"] else "value"
    return f"{r['id']}: CPU {cpu} | jax {dev}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--ops", type=int, default=0, help="at most this many OpInfos (0: all)")
    parser.add_argument("--every", type=int, default=1, help="every K-th OpInfo")
    parser.add_argument("--first", type=int, default=0, help="start at this OpInfo index")
    parser.add_argument("--slice", type=int, default=40, help="OpInfos per worker process")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds a case may print nothing")
    parser.add_argument("--show", type=int, default=40, help="differences to print")
    parser.add_argument("--save", help="append the records as JSON lines here, as they come")
    parser.add_argument("--only", help="comma-separated OpInfo names to run (instead of --ops/--every/--first)")
    parser.add_argument("--load", help="summarise the records of an earlier --save instead of running")
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker([n for n in sys.stdin.read().split("\n") if n], set(json.loads(args.worker)))
        return 0
    if args.load:
        records = [json.loads(line) for line in Path(args.load).read_text().splitlines() if line]
        print(report(summarise(records), args.show))
        return 0
    names = op_names(args.every)[args.first:]
    if args.ops:
        names = names[:args.ops]
    if args.only:
        names = args.only.split(",")
    t0 = time.perf_counter()
    records = sweep(names, timeout=args.timeout, slice_size=args.slice, log=lambda s: print(s, flush=True),
                    save=Path(args.save) if args.save else None)
    print(f"{len(names)} OpInfos in {time.perf_counter() - t0:.0f} s")
    print(report(summarise(records), args.show))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
