"""Kernels on the device's autograd key: composite ops whose 'jax' form
differs from torch's own before they decompose (a composite op decomposes
there, before reaching the device).  Registered inside ``import torch``: no
jax."""

from __future__ import annotations

import logging
import math

import torch

__all__ = ["CHECKED_COMPOSITE_OPS", "DENSE_GRADIENT_OPS", "register"]

logger = logging.getLogger(__name__)


# The backward formulas that build a sparse gradient (gather(sparse_grad=True),
# nn.Embedding(sparse=True)): the device has no sparse layout, and torch's
# composites reach its C++ sparse constructors from autograd's device thread,
# where the failure ended the process.  On 'jax' they give the dense gradient
# (the same values, as x.grad.to_dense() on CPU), through ops that autograd
# records, so double backward works.
def _gather_dense_backward(self, dim, index, grad):
    return torch.zeros_like(self, dtype=grad.dtype).scatter_add(dim, index, grad)


def _embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq, sparse):
    return torch.ops.aten.embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq)


DENSE_GRADIENT_OPS = (("_gather_sparse_backward", _gather_dense_backward),
                      ("embedding_backward", _embedding_dense_backward))


def _one_hot_checked(self, num_classes=-1):
    """one_hot's own composite kernel, after CPU's checks of the classes:
    torch leaves them to a device assert on accelerators, and the form it
    takes for them (``arange == x``) gives a zero row for a bad class."""
    from .. import _config, _value_checks

    if self.dtype != torch.int64:
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    if num_classes == -1 and self.numel() == 0:
        raise RuntimeError("Can not infer total number of classes from empty tensor.")
    _value_checks.one_hot_classes(self, num_classes, _config.current().check_mode)
    if num_classes == -1:
        num_classes = int(self.max().item()) + 1
    return (self.unsqueeze(-1) == torch.arange(num_classes, dtype=self.dtype, device=self.device)).to(torch.int64)


def _sdpa_checked(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """scaled_dot_product_attention in torch's math formulation, after the
    check that sdpa_kernel allows the math backend: torch asks no backend
    choice of a PrivateUse1 device without a C++ stub (``_sdpa``).

    On the device's own tensors it is one op forward and one backward
    (:class:`_Attention`); torch's composite ran about 20 ops forward and
    30 backward, each paying the per-op cost (2.4 ms a call, 4 heads of 64
    tokens, fused eager).  Tracing for torch.compile, padded inputs the
    one op's rule does not take (:func:`_padded_one_op`) and a mask that
    takes a gradient take torch's composite.  A backward with ``create_graph``
    differentiates torch's math formulation again."""
    from .. import _sdpa

    _sdpa.check_backends()
    if isinstance(dropout_p, (int, float)) and not 0 <= dropout_p <= 1:  # (torch's dropout's own error)
        raise RuntimeError(f"dropout probability has to be between 0 and 1, but got {dropout_p}")
    if _one_op(query, key, value, attn_mask, enable_gqa, dropout_p):
        args = (query, key, value, attn_mask, float(dropout_p), bool(is_causal), scale, bool(enable_gqa))
        if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad):
            return _Attention.apply(*args)
        return _attention(*args)[1]  # no graph to record (generate()'s every token): not Function.apply's cost
    from .._padding import sized_after_padded

    with sized_after_padded(query, key):  # (its causal mask: padded at once where they are)
        return torch.ops.aten.scaled_dot_product_attention.default.decompose(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


def _one_op(query, key, value, attn_mask, enable_gqa, dropout_p=0.0) -> bool:
    """Whether the call takes :class:`_Attention`: the device's own tensors
    of shapes and dtypes torch accepts (anything else takes the composite,
    which raises torch's own errors for them), read padded where their
    padding is what the one op's rule takes (:func:`_padded_one_op`)."""
    from .._tensor import JaxTensor

    if _library is None or torch.compiler.is_compiling():
        return False
    tensors = (query, key, value) if attn_mask is None else (query, key, value, attn_mask)
    if not all(type(t) is JaxTensor for t in tensors) or query.dim() < 3 \
            or not query.dim() == key.dim() == value.dim() or not query.dtype == key.dtype == value.dtype \
            or query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2] \
            or not query.shape[:-3] == key.shape[:-3] == value.shape[:-3] or key.shape[-3] != value.shape[-3]:
        return False
    heads, kv_heads = query.shape[-3], key.shape[-3]
    if heads != kv_heads and not (enable_gqa and kv_heads and heads % kv_heads == 0):
        return False
    if attn_mask is not None:
        if attn_mask.requires_grad or attn_mask.dtype not in (torch.bool, query.dtype):
            return False
        try:
            torch.broadcast_shapes(attn_mask.shape, tuple(query.shape[:-1]) + (key.shape[-2],))
        except RuntimeError:
            return False
    if any(t._storage.padded is not None for t in tensors):
        return _padded_one_op(tensors, bool(enable_gqa and heads != kv_heads), dropout_p)
    return True


def _padded_one_op(tensors, gqa: bool, dropout_p: float) -> bool:
    """Whether attention over padded inputs (dynamic dimensions) takes the
    one op, which masks the key positions past the logical length itself:
    no padding in a dim the op's rule keeps exact (the head dim, gqa's
    heads), where the composite's ops still read them padded; with dropout,
    query and key padded at the ends of their dims only (no merged dim),
    which is what dropout's mask (``pjrt_host::attention_keep``) draws its
    logical elements over."""
    from .. import _dynamic_dims

    kept = (-1, -3) if gqa else (-1,)
    sizes = []  # the query's and key's physical sizes
    for i, t in enumerate(tensors[:3]):
        if t._storage.padded is None:
            sizes.append(tuple(t.shape))
            continue
        read = _dynamic_dims.read_of(t)
        if read is None:
            return False
        if any(read.psize[d] != t.shape[d] for d in kept):
            return False
        if dropout_p > 0 and i < 2 and any(len(c) > 1 for c in read.comps):
            return False
        sizes.append(read.psize)
    # (dropout's mask: its logical flat index is an int32)
    return dropout_p == 0 or math.prod(sizes[0][:-1]) * sizes[1][-2] < 2 ** 31


class _Attention(torch.autograd.Function):
    """Attention as ``pjrt_host::attention`` and its backward as
    ``pjrt_host::attention_backward`` (``jax.vjp`` of the same lowering);
    dropout's mask is drawn first, as the math formulation draws it, and
    kept for the backward.  The mask is an op of the query and key
    (``pjrt_host::attention_keep``): over padded ones it is padded with
    them, each logical element drawn as an exact draw draws it, so dropout
    compiles once per bucket too."""

    @staticmethod
    def forward(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        keep, out = _attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        ctx.save_for_backward(query, key, value, attn_mask, keep)
        ctx.args = (dropout_p, is_causal, scale, enable_gqa)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, attn_mask, keep = ctx.saved_tensors
        if torch.is_grad_enabled():  # backward(create_graph=True): a gradient that differentiates again
            needed = [t for t in (query, key, value) if t.requires_grad]
            out = _math_attention(query, key, value, attn_mask, keep, *ctx.args)
            found = iter(torch.autograd.grad(out, needed, grad_out, create_graph=True))
            grads = [next(found) if t.requires_grad else None for t in (query, key, value)]
        else:
            grads = torch.ops.pjrt_host.attention_backward(grad_out.contiguous(), query, key, value, attn_mask,
                                                           keep, *ctx.args)
        return (*grads, None, None, None, None, None)


def _attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> tuple:
    """``(keep, out)``: dropout's mask (None without dropout) and the
    attention, as the one op computes them."""
    keep = torch.ops.pjrt_host.attention_keep(query, key, dropout_p) if dropout_p > 0 else None
    return keep, torch.ops.pjrt_host.attention(query, key, value, attn_mask, keep, dropout_p, is_causal, scale,
                                               enable_gqa)


def _math_attention(query, key, value, attn_mask, keep, dropout_p, is_causal, scale, enable_gqa):
    """torch's math formulation in torch ops (autograd records them), with
    dropout's mask ``keep``: what a gradient of the gradient differentiates."""
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        key = key.repeat_interleave(query.shape[-3] // key.shape[-3], dim=-3)
        value = value.repeat_interleave(query.shape[-3] // value.shape[-3], dim=-3)
    scores = query @ key.transpose(-2, -1) * scale
    if is_causal:
        causal = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
    empty = torch.isneginf(scores).all(-1, keepdim=True)  # a row masked whole attends to nothing (0, not NaN)
    weights = torch.where(empty, 0, torch.softmax(torch.where(empty, 0, scores), -1))
    if dropout_p > 0:
        weights = torch.where(keep, weights / (1 - dropout_p), 0)
    return weights @ value


_ATTENTION_ARGS = ("Tensor query, Tensor key, Tensor value, Tensor? attn_mask, Tensor? keep, float dropout_p, "
                   "bool is_causal, float? scale, bool enable_gqa")


def _attention_meta(query, key, value, attn_mask, keep, dropout_p, is_causal, scale, enable_gqa):
    return query.new_empty(tuple(query.shape[:-1]) + (value.shape[-1],))


def _attention_keep_meta(query, key, p):
    return query.new_empty(tuple(query.shape[:-1]) + (key.shape[-2],), dtype=torch.bool)


def _attention_backward_meta(grad_out, query, key, value, *args):
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)


_library = None


def _define_attention() -> None:
    """The two ops of :class:`_Attention` (lowered in ``ops_nn``)."""
    global _library
    _library = torch.library.Library("pjrt_host", "FRAGMENT")
    _library.define(f"attention({_ATTENTION_ARGS}) -> Tensor")
    _library.define(f"attention_backward(Tensor grad_out, {_ATTENTION_ARGS}) -> (Tensor, Tensor, Tensor)")
    _library.define("attention_keep(Tensor query, Tensor key, float p) -> Tensor")
    _library.impl("attention", _attention_meta, "Meta")
    _library.impl("attention_keep", _attention_keep_meta, "Meta")
    _library.impl("attention_backward", _attention_backward_meta, "Meta")


def _matmul_out(self, other, *, out):
    """``matmul(out=)`` where an operand has 3 or more dims: the product,
    then one write into ``out``, as CPU's composite gives it.

    torch's composite writes those products into a view of ``out`` and
    copies back unless the view ``is_alias_of(out)``, which C++ answers from
    the tensors' own storages; a 'jax' view's C++ storage is not its
    base's, so the composite copied once more (``_version`` 2 or 3 where
    CPU has 1) and, where it folds the batch into the rows, raised from
    that copy.  Other ranks, other devices, an ``out`` of another dtype
    and calls that need a gradient take the composite (its errors are
    CPU's)."""
    from .._tensor import JaxTensor

    if (self.dim() < 3 and other.dim() < 3) or not all(type(t) is JaxTensor for t in (self, other, out)) \
            or torch.is_grad_enabled() and (self.requires_grad or other.requires_grad) \
            or not self.dtype == other.dtype == out.dtype or torch.compiler.is_compiling():
        # (the C++ composite: OpOverload.decompose would take torch._refs'
        # Python form, which counts its resize as a write)
        return torch.ops.aten.matmul.out._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, self, other, out=out)
    result = torch.matmul(self, other)
    # One write, as an out= kernel below autograd makes it: a resize is not
    # counted in the version.
    from .._meta import write_out

    with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.ADInplaceOrView)):
        write_out(out, result)
    torch.autograd.graph.increment_version(out)
    return out


#: Composite ops whose 'jax' form checks argument values first, or writes
#: its ``out=`` as CPU's does.
CHECKED_COMPOSITE_OPS = (("one_hot", _one_hot_checked), ("scaled_dot_product_attention", _sdpa_checked),
                         ("matmul.out", _matmul_out))


def register(aten: torch.library.Library) -> None:
    """Register both tables' kernels in ``aten`` on AutogradPrivateUse1."""
    try:
        _define_attention()
    except Exception as err:  # (sdpa then stays torch's composite)
        logger.debug("pjrt_host::attention not defined: %s", err)
    for name, kernel in DENSE_GRADIENT_OPS + CHECKED_COMPOSITE_OPS:
        try:
            aten.impl(name, kernel, "AutogradPrivateUse1")
        except Exception as err:
            logger.debug("no AutogradPrivateUse1 kernel for aten::%s: %s", name, err)
