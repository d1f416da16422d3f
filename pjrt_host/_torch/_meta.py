"""torch's own answer for an op's results, from its meta kernels.

A compiled op asks once per signature: the result's shapes and dtypes (so
dtypes are torch's, whatever jnp would promote to), and torch's own errors
for bad arguments (shapes, dtypes) are raised as they are.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from typing import Any

import torch

from .._errors import user_stacklevel
from ._tensor import JaxTensor

__all__ = ["OutputPlan", "OutputSpec", "check_cpu_factory", "check_cpu_kernel", "inside_backward", "probe_key", "check_inplace", "check_out_dtypes", "check_out_overlap",
           "decode_result", "encode_result", "kernel_error", "meta_view_of", "out_needs_resize", "output_plan", "resize_out", "resize_warning", "run_meta",
           "write_out"]


def meta_view_of(t: JaxTensor) -> torch.Tensor:
    """A meta tensor with ``t``'s sizes, strides and offset into a storage
    as large as t's."""
    base = torch.empty(t._storage.numel, dtype=t.dtype, device="meta")
    return base.as_strided(t.shape, t.stride(), t.storage_offset())


def _to_meta(v: Any) -> Any:
    if isinstance(v, JaxTensor):
        return meta_view_of(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_to_meta(x) for x in v)
    return v


_DATA_DEPENDENT = ("DynamicOutputShapeException", "DataDependentOutputException", "GuardOnDataDependentSymNode")


def _grouped_mm_shapes(a: Any, b: Any, offs: Any = None, bias: Any = None, out_dtype: Any = None) -> Any:
    """``_grouped_mm``'s result on meta tensors: torch's meta kernel checks
    CUDA's grouped kernel (bfloat16 only, 16-byte strides), where CPU's
    kernel and the device's lowering take every float dtype (CPU's own
    refusals, such as its stride rule, come from its probe at the call)."""
    if a.dim() not in (2, 3) or b.dim() not in (2, 3):
        raise RuntimeError(f"mat_a has to be 2 or 3d, mat_b has to be 2 or 3d, got {a.dim()}d and {b.dim()}d")
    if a.dtype != b.dtype:
        raise RuntimeError(f"Expected mat_a and mat_b to have the same dtype, but got {a.dtype} and {b.dtype}")
    if (a.dim() == 2 or b.dim() == 2) and offs is None:
        raise RuntimeError("Have to provide offsets if there is a 2d matrix")
    if a.shape[-1] != b.shape[-2] and not (a.dim() == 2 and b.dim() == 2):
        raise RuntimeError(f"contraction dimension of mat_a and mat_b must match, got {a.shape[-1]} and {b.shape[-2]}")
    if a.dim() == 2 and b.dim() == 2:
        if a.shape[1] != b.shape[0]:
            raise RuntimeError(f"contraction dimension of mat_a and mat_b must match, got {a.shape[1]} and {b.shape[0]}")
        shape = (offs.shape[0], a.shape[0], b.shape[1])
    elif a.dim() == 2:
        shape = (a.shape[0], b.shape[2])
    elif b.dim() == 2:
        shape = (a.shape[1], b.shape[1])
    else:
        if a.shape[0] != b.shape[0]:
            raise RuntimeError(f"batch dimension has to match, got {a.shape[0]} and {b.shape[0]}")
        shape = (a.shape[0], a.shape[1], b.shape[2])
    return torch.empty(shape, dtype=a.dtype if out_dtype is None else out_dtype, device="meta")


#: Ops whose meta kernel refuses what CPU's kernel and the device's lowering
#: compute: a stand-in gives their results' shapes (op name -> function of
#: the call's meta arguments).
META_STAND_INS = {"aten::_grouped_mm": _grouped_mm_shapes}


def run_meta(func: Any, args: tuple, kwargs: dict) -> tuple[bool, Any]:
    """(known, result): ``func`` on meta versions of the arguments; known is
    False when the op has no meta kernel or a data-dependent shape."""
    try:
        out = func(*_to_meta(args), **{k: _to_meta(v) for k, v in kwargs.items()})
    except NotImplementedError:
        return False, None
    except RuntimeError as err:
        text = str(err)
        if "meta" in text.lower() or "data-dependent" in text or "data dependent" in text or "nonzero" in text:
            return False, None
        known_error = kernel_error(err)
        if known_error is not None:
            raise known_error from None
        raise
    except Exception as err:
        if type(err).__name__ in _DATA_DEPENDENT:
            return False, None
        if isinstance(err, TypeError) and str(err).startswith("cond must be a bool") and \
                getattr(func, "name", lambda: "")() in _EMPTY_BATCH_CHECKED:
            return True, _empty_batch_meta(func, args, kwargs)
        cpu_error = _KERNEL_ERRORS.get(str(err))
        if cpu_error is not None:
            raise cpu_error[0](cpu_error[1]) from None
        raise
    undefined = _UNDEFINED_RESULTS.get(getattr(func, "name", lambda: "")())
    if undefined is not None:
        out = undefined(args, kwargs, out)
    return True, out


def encode_result(known: bool, out: Any) -> bytes | None:
    """``run_meta``'s answer as the engine uses it (each result tensor's
    shape and dtype, the containers, which results are None or scalars),
    as text a later process reads back with :func:`decode_result`; None
    where the answer holds something else (a symbolic size)."""
    def enc(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            if not all(type(n) is int for n in v.shape):
                raise TypeError
            return ["t", list(v.shape), str(v.dtype).removeprefix("torch.")]
        if v is None:
            return None
        if type(v) in (bool, int, float):
            return ["s", type(v).__name__]
        if type(v) in (tuple, list):
            return [type(v).__name__, [enc(x) for x in v]]
        raise TypeError

    import json

    try:
        return json.dumps(["known", enc(out)] if known else ["unknown"]).encode()
    except TypeError:
        return None


def decode_result(data: bytes) -> tuple[bool, Any] | None:
    """The ``(known, result)`` that :func:`encode_result` kept, with meta
    tensors of its shapes and dtypes (None: not such a text)."""
    import json

    def dec(v: Any) -> Any:
        if v is None:
            return None
        if v[0] == "t":
            dtype = getattr(torch, v[2])
            if not isinstance(dtype, torch.dtype):
                raise ValueError
            return torch.empty(v[1], dtype=dtype, device="meta")
        if v[0] == "s":
            return {"bool": False, "int": 0, "float": 0.0}[v[1]]
        return {"tuple": tuple, "list": list}[v[0]](dec(x) for x in v[1])

    try:
        value = json.loads(data)
        return (True, dec(value[1])) if value[0] == "known" else (False, None)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None


def kernel_error(err: Exception) -> Exception | None:
    """The error torch's CPU kernels raise for a call whose meta kernel (a
    reference in Python) raised ``err``, where its text says which of
    torch's checks it is (``_KERNEL_ERROR_PATTERNS``); None otherwise."""
    if not isinstance(err, RuntimeError):
        return None
    text = str(err)
    for pattern, make in _KERNEL_ERROR_PATTERNS:
        found = pattern.match(text)
        if found:
            return make(found)
    return None


#: Nearest upsampling's meta kernels check ``input.numel() != 0 or
#: prod(input.size()[1:])`` with torch._check, which refuses the int that
#: ``or`` gives for an empty input (TypeError "cond must be a bool"); CPU's
#: kernels allow an empty batch and refuse other empty dimensions.
_EMPTY_BATCH_CHECKED = frozenset(f"aten::{name}{n}d" for name in ("upsample_nearest", "_upsample_nearest_exact")
                                 for n in (1, 2, 3))


def _empty_batch_meta(func: Any, args: tuple, kwargs: dict) -> Any:
    """The meta result of an empty input as the meta kernel means it: an
    empty batch gives the result of a batch of one with no rows; another
    empty dimension is refused, as CPU refuses it."""
    x = args[0]
    sizes = list(x.shape)
    if x.dim() < 2 or 0 in sizes[1:]:
        raise RuntimeError(f"Non-empty {x.dim()}D data tensor expected but got a tensor with sizes {sizes}")
    stand_in = torch.empty([1] + sizes[1:], dtype=x.dtype, device="meta")
    out = func(stand_in, *_to_meta(args[1:]), **{k: _to_meta(v) for k, v in kwargs.items()})
    return out.new_empty([sizes[0]] + list(out.shape[1:]))


def _mha_undefined_weights(args: tuple, kwargs: dict, out: Any) -> Any:
    need_weights = kwargs.get("need_weights", args[10] if len(args) > 10 else True)
    if need_weights and args[0].numel() > 0:
        return out
    return (out[0], None)


#: Ops whose CPU kernel returns an undefined tensor (None in Python) where
#: the meta kernel gives an empty one: their results as CPU's.
_UNDEFINED_RESULTS = {
    "aten::_native_multi_head_attention": _mha_undefined_weights,  # the weights, without need_weights
}


#: Where a meta kernel (a Python reference) raises for bad arguments with
#: another type than torch's CPU and cuda kernels, their error.
_KERNEL_ERRORS = {
    "clamp called but both min and max are none!":
        (RuntimeError, "torch.clamp: At least one of 'min' or 'max' must not be None"),
}


#: The same for a meta kernel's RuntimeError whose text says which of
#: torch's own checks it is: (pattern, the error torch raises from the match).
_KERNEL_ERROR_PATTERNS = (
    # nll_loss of a 1-D input: torch's nll_loss_nd (run on every device
    # before nll_loss_forward) wants a target of one element
    (re.compile(r"size mismatch \(got input: torch\.Size\(\[\d+\]\), target: torch\.Size\(\[(\d+)\]\)\)$"),
     lambda m: ValueError(f"For 1D input, 1D target must have size 1, but got target size: {m.group(1)}")),
    # shapes that do not broadcast (torch's reference _broadcast_shapes): CPU's
    # TensorIterator words it as the error every PyTorch user knows
    (re.compile(r"Attempting to broadcast a dimension of length (\d+) at (-\d+)! Mismatching argument at index \d+ "
                r"had .*; but expected shape should be broadcastable to \[([\d, ]*)\]$"),
     lambda m: _size_mismatch(int(m.group(1)), int(m.group(2)), [int(n) for n in m.group(3).split(",") if n.strip()])),
    # a size beyond int64 (torch.arange(0, 1e20)): CPU's check, not the
    # reference's failure to parse its own argument
    (re.compile(r"prims::iota\(\) Expected a value of type 'int' for argument 'length'"),
     lambda m: RuntimeError("invalid size, possible overflow?")),
    # mm / addmm / linear of sizes that do not chain (the error of every model
    # whose layer widths disagree), and cat's sizes: calls too large for CPU's probe
    (re.compile(r"a and b must have same reduction dim, but got \[(\d+), (\d+)\] X \[(\d+), (\d+)\]\.$"),
     lambda m: RuntimeError("mat1 and mat2 shapes cannot be multiplied ({}x{} and {}x{})".format(*m.groups()))),
    (re.compile(r"Sizes of tensors must match except in dimension (\d+)\. Expected (\d+) in dimension \d+ but got "
                r"(\d+) for tensor number (\d+) in the list$"),
     lambda m: RuntimeError("Sizes of tensors must match except in dimension {}. Expected size {} but got size {} for "
                            "tensor number {} in the list.".format(*m.groups()))),
)


def _size_mismatch(size: int, at: int, common: list[int]) -> Exception:
    if not -len(common) <= at < 0:
        return RuntimeError(f"shapes cannot be broadcast: a dimension of length {size} against {common}")
    return RuntimeError(f"The size of tensor a ({common[at]}) must match the size of tensor b ({size}) at "
                        f"non-singleton dimension {len(common) + at}")


@dataclasses.dataclass(frozen=True, slots=True)
class OutputSpec:
    """One result of an op: a tensor (shape, dtype), None, or a Python scalar."""

    kind: str  #: "tensor", "none" or "scalar"
    shape: tuple[int, ...] | None = None
    dtype: torch.dtype | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class OutputPlan:
    """How an op's results come back: ``container`` is "single", "tuple" or
    "list"; ``outputs`` is None when torch cannot say (no meta kernel, a
    data-dependent shape): the results are then wrapped as they come."""

    container: str
    outputs: tuple[OutputSpec, ...] | None


def _spec(o: Any) -> OutputSpec:
    if isinstance(o, torch.Tensor):
        return OutputSpec("tensor", tuple(o.shape), o.dtype)
    if o is None:
        return OutputSpec("none")
    return OutputSpec("scalar")


def output_plan(known: bool, out: Any) -> OutputPlan:
    if not known:
        return OutputPlan("single", None)
    if isinstance(out, (tuple, list)):
        if any(isinstance(o, (tuple, list)) for o in out):
            return OutputPlan("single", None)  # nested (Tensor[] among the results): wrapped as they come
        return OutputPlan("tuple" if isinstance(out, tuple) else "list", tuple(_spec(o) for o in out))
    if isinstance(out, (torch.Tensor, bool, int, float)):
        return OutputPlan("single", (_spec(out),))
    return OutputPlan("single", None)


SCALAR_NAMES = {
    torch.bool: "Bool", torch.uint8: "Byte", torch.int8: "Char", torch.int16: "Short", torch.int32: "Int",
    torch.int64: "Long", torch.float16: "Half", torch.bfloat16: "BFloat16", torch.float32: "Float",
    torch.float64: "Double", torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble",
}


def check_inplace(result: torch.Tensor, target: JaxTensor) -> None:
    """torch's errors for an in-place result that ``target`` cannot hold
    (``int_tensor.add_(0.5)``) or that would broadcast it."""
    if not torch.can_cast(result.dtype, target.dtype):
        raise RuntimeError(
            f"result type {SCALAR_NAMES.get(result.dtype, result.dtype)} can't be cast to the desired output "
            f"type {SCALAR_NAMES.get(target.dtype, target.dtype)}")
    if tuple(result.shape) != tuple(target.shape):
        raise RuntimeError(
            f"output with shape {list(target.shape)} doesn't match the broadcast shape {list(result.shape)}")


def check_out(func: Any, args: tuple, kwargs: dict, out_names: tuple, targets: list) -> None:
    """torch's dtype errors for ``out=`` tensors (``torch.add(a, 1,
    out=int_tensor)``), found by running the out= overload's own meta
    kernel with meta out tensors; worded as torch's CPU kernels word them.
    Other meta complaints are left to the op (a resize is no error)."""
    import re

    meta_kwargs = {k: _to_meta(v) for k, v in kwargs.items()}
    meta_kwargs.update({n: _to_meta(t) for n, t in zip(out_names, targets)})
    try:
        without_warnings(lambda: func(*_to_meta(args), **meta_kwargs))  # the op warns about resizing itself
    except (RuntimeError, TypeError) as err:
        text = str(err)
        cast = re.match(r"Attempting to cast from torch\.(\w+) to out tensor with dtype torch\.(\w+), but this "
                        r"can't be cast", text)
        exact = re.match(r"Expected out tensor to have dtype torch\.(\w+),? but got torch\.(\w+) instead", text)
        if cast:
            src, dst = (SCALAR_NAMES.get(getattr(torch, n), n) for n in cast.groups())
            if op_base(func) == "cat":
                raise TypeError(f"torch.cat(): input types can't be cast to the desired output type {dst}") from None
            raise RuntimeError(f"result type {src} can't be cast to the desired output type {dst}") from None
        if exact:
            want, got = (_C_NAMES.get(getattr(torch, n), n) for n in exact.groups())
            raise RuntimeError(f"Expected out tensor to have dtype {want}, but got {got} instead") from None
    except Exception:
        pass


def op_base(func: Any) -> str:
    """``aten::add.out`` -> ``add``."""
    return str(getattr(func, "__name__", func)).split("::")[-1].split(".")[0]


#: torch's C++ names of dtypes, as its kernels' messages print them.
_C_NAMES = {
    torch.bool: "bool", torch.uint8: "unsigned char", torch.int8: "signed char", torch.int16: "short int",
    torch.int32: "int", torch.int64: "long int", torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16",
    torch.float32: "float", torch.float64: "double", torch.complex64: "c10::complex<float>",
    torch.complex128: "c10::complex<double>",
}


def check_out_dtypes(op: str, result_dtypes: list, targets: list) -> None:
    """torch's error for the out= tensor of an op whose result dtype is its
    own (``nonzero``'s indices, ``masked_select``'s values): the out tensor
    must have it exactly."""
    from ._dtype_policy import device_dtype

    for d, t in zip(result_dtypes, targets):
        if d is not None and device_dtype(d) != device_dtype(t.dtype):
            raise RuntimeError(f"{op.split('::')[-1].split('.')[0]}: Expected out tensor to have scalar type "
                               f"{SCALAR_NAMES.get(d, d)} but got scalar type {SCALAR_NAMES.get(t.dtype, t.dtype)}")


def check_out_overlap(targets: list, *ops: Any) -> None:
    """torch's refusal of an in-place or out= tensor in which several
    elements share one memory location (an expanded tensor), for the ops
    whose CPU kernels refuse it: elementwise ones (torch's ``pointwise``
    tag, of the op or its functional form), random fills and the scans.
    torch's meta kernels do not check it, and its other kernels (matmuls,
    reductions) let it through, as ``fill_`` and ``zero_`` do."""
    if not any(_checks_overlap(op) for op in ops):
        return
    for t in targets:
        if isinstance(t, JaxTensor) and t.numel() > 1 and torch._debug_has_internal_overlap(meta_view_of(t)) == 1:
            raise RuntimeError(_OVERLAP)


def _checks_overlap(op: Any) -> bool:
    if isinstance(op, str):
        return op in _OVERLAP_CHECKED
    base = op_base(op)
    if base.startswith("_foreach_"):
        # torch's foreach kernels run the per-tensor op on each tensor: its rule
        single = getattr(torch.ops.aten, base[len("_foreach_"):], None)
        overloads = single.overloads() if single is not None else []
        return bool(overloads) and _checks_overlap(getattr(single, overloads[0]))
    if base in _OVERLAP_ALLOWED:
        return False
    tags = getattr(op, "tags", ())
    return base in _OVERLAP_CHECKED or torch.Tag.pointwise in tags or torch.Tag.nondeterministic_seeded in tags


_OVERLAP_ALLOWED = frozenset({"fill_", "zero_", "fill", "zero", "conj_physical_", "conj_physical"})
_OVERLAP_CHECKED = frozenset({"copy_", "abs_", "cumsum", "cumsum_", "cumprod", "cumprod_", "logcumsumexp",
                               # an out= kernel that copies its result in: CPU refuses, and its
                               # probe cannot say so (it refuses the probe's zeros first)
                               "cholesky"})
_OVERLAP = ("unsupported operation: more than one element of the written-to tensor refers to a single memory "
            "location. Please clone() the tensor before performing the operation.")


def out_needs_resize(meta: Any, targets: list) -> bool:
    """Whether torch would resize an out= tensor: the meta result's shapes
    (a tensor or a sequence of them) differ from the out tensors'."""
    results = [meta] if isinstance(meta, torch.Tensor) else list(meta) if isinstance(meta, (tuple, list)) else None
    if results is None or len(results) != len(targets) or not all(isinstance(r, torch.Tensor) for r in results):
        return False
    return any(tuple(r.shape) != tuple(t.shape) for r, t in zip(results, targets))


def write_out(out: Any, result: Any) -> None:
    """``result`` into an out= tensor, as torch's out= contract has it: an
    out tensor of another shape is resized to the result's (with torch's
    warning when it held elements), not broadcast into."""
    if isinstance(result, torch.Tensor) and tuple(out.shape) != tuple(result.shape):
        if out.numel() != 0:
            resize_warning(out.shape, result.shape)
        resize_out(out, result)
        return
    out.copy_(result)


def resize_warning(shape: Any, wanted: Any) -> None:
    """torch's warning for an out= tensor with elements that is resized,
    at the user's line, as CPU's."""
    warnings.warn(
        f"An output with one or more elements was resized since it had shape {list(shape)}, which does "
        f"not match the required output shape {list(wanted)}. This behavior is deprecated, and in a "
        "future PyTorch release outputs will not be resized unless they have zero elements. You can "
        "explicitly reuse an out tensor t by resizing it, inplace, to zero elements with t.resize_(0).",
        UserWarning, stacklevel=user_stacklevel())


def resize_out(out: Any, result: Any) -> None:
    """``result`` into the out= tensor ``out`` of another shape, as torch's
    out= contract resizes it: within its storage when the result fits there
    (a view's base and the other views of that storage see the write, as on
    CPU), else onto a storage of its own (torch would grow the shared
    storage, which a 'jax' storage cannot)."""
    with torch.no_grad():
        if out.storage_offset() + result.numel() <= out.untyped_storage().nbytes() // out.element_size():
            shape = tuple(result.shape)
            strides = [1] * len(shape)
            for i in range(len(shape) - 2, -1, -1):
                strides[i] = strides[i + 1] * max(shape[i + 1], 1)
            out.set_(out.untyped_storage(), out.storage_offset(), shape, tuple(strides))
            out.copy_(result)
        else:
            out.set_(result.to(out.dtype))


#: What torch CPU's kernels refuse that their meta kernels let through, by
#: message: a dtype the kernel has no code for, dtypes that must match, out=
#: tensors of another dtype than the kernel's own, the random ops' checks of
#: their scalar parameters.  None of these depends on the tensors' values or
#: sizes: a probe's zeros of any size give the answer the call would get.
_KERNEL_REFUSALS = re.compile("|".join((
    r"not implemented for '",
    r"must have the same dtype",
    r"expected scalar[ _]type",
    r"expected object of scalar type",
    r"found dtype \w+ but expected",
    r"expected out tensor to have (scalar type|dtype)",
    r"expected both inputs to be",
    r"with a bool tensor is not supported",
    r"not supported for complex",
    r"not implemented for complex",
    r"does not support complex",
    r"doesn't support tensors of type",
    r"doesn't handle types other than",
    r"integer division with \w+ is no longer supported",
    r"^\w+ expects (std|sigma|lambda|p) ",
    r"^\w+ expects to return a \[from, to\) range",
    r"^\w+ expects 'from' to be less than 'to'",
    r"cannot sample n_sample > prob_dist\.size\(-1\) samples without replacement",
    r"^(from|to)( - 1)? is out of bounds for \w+$",
    r"only supports bool tensor for result",
    r"expected the dtype for input and out to match",
    r"must be of same type as input",
    r"expects mantissa to have dtype",
    r"should be same as input",
    r"and out expected to have the same dtype",
    r"and result must have the same scalar type",
    r"should have the same dtype",
    r"output tensor's dtype is wrong",
    r"expected \w+ to be safely castable",
    r"expected result to be of dtype",
    r"mixed dtype \(cpu\)",
    r"unknown complex scalartype",
    r"(same|matching) (scalar type|dtype)",
    r"dtypes (to )?match",
    r"expected dtype",
    r"expected (target|indices|offsets) dtype",
    r"not (yet )?implemented for (complex|tensors with different dtypes)",
    r"(does not|doesn't) support bool",
    r"boolean inputs not supported",
    r"may not be a boolean tensor",
    r"not intended to support complex",
    r"only supports? (floating|bool)",
    r"unsupported input type",
    r"value cannot be converted to type \S+ without overflow",
    r"can't be cast to the desired output type",
    r"can't be safely cast to passed dtype",
    r"expected a long tensor for index",
    r"expects long tensor",
    r"to be non-complex",
    r"handles only integral",
    r"^\w+ should be >= 0",
    r"index is supposed to be a vector",
    r"integers to negative integer powers are not allowed",
)), re.IGNORECASE)
#: What CPU's kernels refuse for the tensors' sizes, strides and storage
#: alone: asked of a probe that has the call's own (a 1-element probe's
#: shapes would be refused for themselves).
_LAYOUT_REFUSALS = re.compile("|".join((
    r"more than one element of the written-to tensor refers to a single memory location",
    r"some elements of the input tensor and the written-to tensor refer to a single memory location",
    r"requiring a storage size of \d+ are out of bounds",
    r"\.is_contiguous\(",
    r"must have at least one element",
    r"trying to create tensor with negative dimension",
    r"\.numel\(\) == ",
    r"padding should be non-negative",
    r"negative (output_)?padding is not supported",
    r"output padding must be smaller",
    r"must be \d-D",
    r"indexing axis dim should be positive",
    r"expected reduction dim \d* ?(to have non-zero size|to be specified)",
    r"expected grid to have size",
    r"dimension out of range",
    r"dimension specified as -?\d+ but tensor has no dimensions",
    r"expected dim < ",
    r"tensor shape must match self tensor shape",
    r"index to scalar can have only 1 value",
    r"index should have one element",
    r"number of indices \(\d+\) should be equal to",
    r"to have the same number of elements",
    r"into an empty tensor",
    r"out of bounds for dimension with size 0",
    r"zero-dimensional tensor \(at position \d+\) cannot be concatenated",
    r"must be equal to the innermost dimension",
    r"non-empty \dD data tensor expected",
    r"input and output sizes should be greater than 0",
)), re.IGNORECASE)
#: The probe runs on tensors of the call's own sizes, strides and storage
#: sizes (zeros) when they hold at most this many elements in all, and its
#: results too; otherwise on 1-element tensors of the same dtypes.
_PROBE_ELEMENTS = 1 << 14


def _storage_elements(t: torch.Tensor) -> int:
    if isinstance(t, JaxTensor):
        return t._storage.nbytes // max(t.element_size(), 1)
    try:
        return t.untyped_storage().nbytes() // max(t.element_size(), 1)
    except Exception:
        return t.numel()


def _tensors_of(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        yield v
    elif isinstance(v, (list, tuple)):
        for x in v:
            yield from _tensors_of(x)


def _probe_args(args: tuple, kwargs: dict, device: str, real: bool) -> tuple[tuple, dict]:
    """The call's arguments with each tensor a zero tensor of its dtype on
    ``device``: of its own size, strides, offset and storage size where
    ``real`` (tensors sharing a storage share one here too), else of one
    element per dimension; a 'jax' device argument becomes ``device``."""
    bases: dict[int, torch.Tensor] = {}

    def small(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            if not real:
                return torch.zeros((1,) * v.dim(), dtype=v.dtype, device=device)
            owner = v._storage if isinstance(v, JaxTensor) else v.untyped_storage()
            key = id(owner)
            base = bases.get(key)
            n = _storage_elements(v)
            if base is None or base.dtype != v.dtype or base.numel() < n:
                base = bases[key] = torch.zeros(n, dtype=v.dtype, device=device)
            return base.as_strided(v.shape, v.stride(), v.storage_offset())
        if isinstance(v, torch.device) or (isinstance(v, str) and v.split(":")[0] == "jax"):
            return torch.device(device)
        if isinstance(v, (list, tuple)):
            return type(v)(small(x) for x in v)
        return v

    return small(args), {k: small(v) for k, v in kwargs.items() if k != "generator"}


def inside_backward() -> bool:
    """Whether this thread is running a node of autograd's engine."""
    return torch._C._current_graph_task_id() != -1


#: Ops whose accelerator kernels take input dtypes CPU's refuse, which
#: libraries call on any device that is not the CPU (overload name -> the
#: dtypes): transformers' mixture-of-experts routing counts experts with
#: ``histc`` of int32 indices off the CPU (float ones on it), which torch's
#: CUDA kernel bins and CPU's refuses ("histogram_cpu" not implemented for
#: 'Int'). Not refused here, so Mixtral and its kin run; the lowering bins
#: integers as CUDA does.
_ACCELERATOR_DTYPES = {"histc.default": (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)}


class _WarningsFlushed(torch.autograd.Function):
    """Runs ``box[1]()`` inside ``Function.apply``: a C++ entry that hands
    torch's C++ warnings to Python's ``warnings`` when it returns.  An op
    called through its OpOverload has none, so its C++ warnings wait for
    the user's own torch call to return, and reach the user after it (a
    probe's resize warning came out as a second copy of the device's own).
    ``fn``'s result or its exception is kept in the box, and ``apply``
    returns normally: an exception passing through ``apply`` while C++
    warnings are pending came out as CPython's SystemError ("returned a
    result with an exception set", or, now and then, "returned NULL without
    setting an exception" with the exception lost: ``dot_out`` of bools
    resizes its out=, warns, then refuses, and the refusal vanished)."""

    @staticmethod
    def forward(ctx: Any, box: list) -> None:
        box[2] = True
        try:
            box[0] = box[1]()
        except BaseException as err:  # raised again by without_warnings, outside apply
            box[3] = err

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> None:  # pragma: no cover - never differentiated
        return None


def without_warnings(fn: Any) -> Any:
    """``fn()`` with every warning it gives dropped, torch's C++ warnings
    included: for the host's own probes, which run an op to learn what
    torch says and must not say it to the user."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        box = [None, fn, False, None]  # (the result, the function, whether it ran, its exception)
        try:
            with torch.no_grad():
                _WarningsFlushed.apply(box)
        except Exception:
            if box[2]:
                raise  # a warning made an error (fn's own is in the box)
            return fn()  # apply refused to run (a functorch transform asks for a vmap rule)
        if box[3] is not None:
            err, box[3] = box[3], None
            raise err
        return box[0]


def check_cpu_kernel(func: Any, args: tuple, kwargs: dict) -> bool:
    """torch CPU's refusal of this call where its meta kernel (or the
    device's lowering) accepts it: a dtype its kernel has no code for
    (``abs`` of a bool tensor), dtypes that must match (``addmm`` of float
    and int64), an out= tensor of another dtype than the kernel's own, a
    scalar parameter (``normal_(std=-1)``), a write into overlapping memory.
    The op runs once on CPU tensors of the same dtypes, zeros: where the
    call's tensors are small, of their own sizes, strides and storage sizes
    (so the CPU kernel takes the path the call would take), else with every
    dimension 1 (nothing is probed then where the small call's results would
    be large, or its shapes do not fit).  An error of the kinds in
    ``_KERNEL_REFUSALS`` is raised as torch raises it; CPU's random state is
    kept.  True when CPU ran the call's own layouts without an error."""
    accepts = _ACCELERATOR_DTYPES.get(getattr(func, "__name__", None))
    if accepts is not None and any(isinstance(a, torch.Tensor) and a.dtype in accepts for a in args[:1]):
        return False
    if inside_backward():
        # autograd's engine: the inputs are what the device's forward saved,
        # in the dtypes of torch's meta kernels (layer norm's float32
        # statistics of a bfloat16 input, as on CUDA), which CPU's backward
        # kernels, made for CPU's forward, refuse
        return False
    tensors = [t for v in (*args, *kwargs.values()) for t in _tensors_of(v)]
    if not tensors or not any(isinstance(a, torch.Tensor) for a in _tensors_of(args)):
        return False
    try:
        real = all(t.layout == torch.strided for t in tensors) and \
            sum(_storage_elements(t) for t in tensors) <= _PROBE_ELEMENTS
        meta_args, meta_kwargs = _probe_args(args, kwargs, "meta", real)
        cpu_args, cpu_kwargs = _probe_args(args, kwargs, "cpu", real)
    except Exception:
        return False  # arguments a probe cannot copy (sparse tensors)
    refused, shape_refusal = None, False
    try:
        shaped = without_warnings(lambda: func(*meta_args, **meta_kwargs))
    except Exception as err:
        refused = str(err).split("\n")[0]
        if not real:
            return False  # the small shapes do not fit this call: nothing to learn
        # a meta kernel that cannot answer (none, or a data-dependent shape)
        # refuses nothing: CPU's refusal of zeros may be of their values
        shape_refusal = not (isinstance(err, NotImplementedError) or type(err).__name__ in _DATA_DEPENDENT
                             or "meta" in refused.lower() or "data-dependent" in refused
                             or "data dependent" in refused)
        # the call is refused (or its shapes are data-dependent); its inputs are
        # small, so CPU may say what it refuses first
    else:
        outs = shaped if isinstance(shaped, (tuple, list)) else (shaped,)
        if sum(o.numel() for o in outs if isinstance(o, torch.Tensor)) > _PROBE_ELEMENTS:
            return False
    try:
        with torch.random.fork_rng(devices=[]):
            without_warnings(lambda: func(*cpu_args, **cpu_kwargs))
    except (NotImplementedError, RuntimeError, TypeError, IndexError, ValueError) as err:
        text = str(err).split("\n")[0]
        # a refusal of the kinds CPU's kernels make alone; or, at the call's
        # own sizes, a call the meta kernel refuses too: CPU's exception type
        # and text (torch's reference code words its checks otherwise:
        # "a and b must have same reduction dim" for CPU's "mat1 and mat2
        # shapes cannot be multiplied")
        if _KERNEL_REFUSALS.search(text) or (real and (_LAYOUT_REFUSALS.search(text) or text == refused
                                                       or shape_refusal)):
            if real:
                _resized_before_refusal(kwargs, cpu_kwargs)
            raise type(err)(text) from None
        return False
    except Exception:
        return False
    return real


def _resized_before_refusal(kwargs: dict, cpu_kwargs: dict) -> None:
    """The out= tensors CPU's kernel resized before it refused the call
    (``dot_out`` resizes its out to 0-d, then finds no kernel for bool):
    the call's own are resized so too, where that shrinks them within their
    storage (a refused call grows nothing)."""
    for name, probe in cpu_kwargs.items():
        target = kwargs.get(name)
        if isinstance(target, JaxTensor) and isinstance(probe, torch.Tensor) and probe.shape != target.shape \
                and probe.numel() <= target.numel():
            try:
                with torch.no_grad():
                    target.resize_(probe.shape)
            except Exception:  # pragma: no cover - the refusal is what matters
                pass


def check_cpu_factory(op: Any, args: tuple, kwargs: dict) -> None:
    """torch CPU's refusal of a factory call's dtype or parameters
    (``rand(dtype=torch.bool)``: ``"check_uniform_bounds" not implemented
    for 'Bool'``, ``full((2,), 1e5, dtype=torch.float16)``: the value does
    not fit), for the first call of each signature: the factory runs on CPU
    at the call's own sizes where its result is small, else with every size
    list made of ones (CPU's fill of a single element converts its value
    unchecked).  Errors of the kinds in ``_KERNEL_REFUSALS`` are raised as
    torch raises them; CPU's random state is kept."""

    def ones(v: Any) -> Any:
        if isinstance(v, (list, tuple)) and v and all(type(x) is int for x in v):
            return type(v)(1 for _ in v)
        return v

    cpu_kwargs = {k: v for k, v in kwargs.items() if k not in ("pin_memory", "generator")}
    cpu_kwargs["device"] = "cpu"

    def probe() -> None:
        nonlocal args
        meta = op(*args, **dict(cpu_kwargs, device="meta"))
        if not (isinstance(meta, torch.Tensor) and meta.numel() <= _PROBE_ELEMENTS):
            args = tuple([ones(a) for a in args])
            meta = op(*args, **dict(cpu_kwargs, device="meta"))
            if isinstance(meta, torch.Tensor) and meta.numel() > _PROBE_ELEMENTS:
                return
        op(*args, **cpu_kwargs)

    try:
        with torch.random.fork_rng(devices=[]):
            without_warnings(probe)
    except (NotImplementedError, RuntimeError, TypeError, ValueError) as err:
        text = str(err).split("\n")[0]
        if _KERNEL_REFUSALS.search(text):
            raise type(err)(text) from None
    except Exception:
        return


def probe_key(args: tuple, kwargs: dict) -> Any:
    """What ``check_cpu_kernel``'s answer for a call depends on, hashable:
    each tensor's dtype and layout, integer and other arguments, floats by
    their sign alone (a step size that changes every call is no new
    signature)."""
    return _key_of(args), tuple([(k, _key_of(v)) for k, v in kwargs.items()]) if kwargs else ()


def _key_of(v: Any) -> Any:
    t = type(v)
    if t is JaxTensor or isinstance(v, JaxTensor):
        view = v._view
        return v.dtype, v._storage.spec if view is None else view.spec
    if t is float:
        return float, v < 0
    if t is int or t is bool:
        return t, v
    if t is tuple or t is list:
        return tuple([_key_of(x) for x in v])
    if isinstance(v, torch.Tensor):
        return v.dtype, v.device, v.layout, tuple(v.shape), v.stride() if v.layout == torch.strided else None
    return v
