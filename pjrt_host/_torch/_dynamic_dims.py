"""Dynamic dimensions: which ops run on padded storages, and when a
dimension becomes dynamic (docs/dynamic-shapes.md).

*When.*  Much as dynamo decides: a dimension of an op's input that takes a
third size at the same place (the op, the input position, the line of code
that called it and the shapes of its parameters) becomes dynamic there
(:func:`on_miss`), and so does a dimension ``torch._dynamo.mark_dynamic``
marked on the tensor.  The input's storage is then padded to the dimension's
bucket (``_padding.bucket``), once: the op's result is padded too, and the
ops after it read it padded without having seen two sizes themselves.
``config(dynamic_shapes="all")`` makes every dimension of every input
dynamic at the first call, with odd buckets: the test mode that would show
any padding leaking into a result.

*Which ops.*  An op runs on padded inputs when its rule below says how to
make padding harmless, as a *fill*: the value padding takes before the
lowering reads it (zeros before a sum or a contraction, the lowest value
before a softmax or a max, ``ignore_index`` for a loss's targets; none
for an elementwise op, whose results in the padding are never read), and
the dims that must stay exact (a layer norm's normalised dims).  Every value
inside the logical box is then the value of the exact computation.  Every
other op -- views, random draws, in-place and out= forms, ops without a
rule -- takes its inputs cut to their logical sizes (``Storage.unpad``,
counted by op in ``torch.jax.dynamic_shape_stats()``): it costs what every
op cost before buckets, never a wrong value.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple

import numpy as _np
import torch

from .. import _program_cache
from .._lowerings._dtypes import dtype_name
from . import _config, _padding
from ._signatures import GENERATOR, DynamicScalar, HostLane, HostScalar, SequenceArg, matches
from ._tensor import (JaxTensor, Pending, Storage, TensorSpec, contiguous_strides, make, new_tensor, read_through,
                      view_for)

__all__ = ["PaddedRead", "Rule", "fill_of", "logical_shapes", "on_miss", "padded_inputs", "padded_values", "join", "pad_end", "place_gradient", "placed_at", "prepare", "read_of",
           "result_padding", "rule_for", "unpad_all"]


class Rule(NamedTuple):
    """How an op reads padded inputs: ``fill`` for every tensor argument,
    ``fills`` (position -> fill, or ``(position of the value, None)`` to take
    it from another argument) where one differs, and ``exact`` (args,
    kwargs -> the dims of each argument that must not be padded, by
    position), None when any may be."""

    fill: Any = None
    fills: dict | None = None
    exact: Callable[[tuple, dict], dict] | None = None
    #: (args, kwargs -> ``(position, dim)`` -> the ``(position, dim)`` of
    #: other arguments it lines up with): for a contraction, which dims
    #: meet, so that an exact operand is padded along the dim its partner
    #: holds padded -- not along any dim of the same size (a head dim as
    #: long as the key/value length)
    align: Callable[[tuple, dict], dict] | None = None
    #: the lowering reads the mask of its padded inputs' logical elements
    #: (``LoweringContext.logical``: attention's key positions, batch
    #: norm's statistics), which eager's padded route gives it and a
    #: compiled graph's does not: such an op keeps a graph per shape
    logical: bool = False


def _normalised_dims(inputs: tuple, shape_pos: int, params: tuple) -> Callable[[tuple, dict], dict]:
    """A norm's exact dims: the normalised ones of ``inputs``, all of its
    ``params`` (weight, bias)."""
    def exact(args: tuple, kwargs: dict) -> dict:
        k = len(args[shape_pos])
        dims = {p: set(range(args[p].dim() - k, args[p].dim())) for p in inputs if isinstance(args[p], torch.Tensor)}
        for p in params:
            if p < len(args) and isinstance(args[p], torch.Tensor):
                dims[p] = set(range(args[p].dim()))
        return dims
    return exact


def _joined_dim(args: tuple, kwargs: dict) -> dict:
    """cat's exact dim: the one it joins along, in every tensor."""
    tensors = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    ndim = max((t.dim() for t in tensors), default=1)
    return {0: {dim % ndim if ndim else 0}}


def _indexed_exact(args: tuple, kwargs: dict) -> dict:
    """index's exact dims where its indices are integer tensors: the
    gathered dims of the tensor that are not one component (a
    ``reshape(-1)`` of a padded matrix holds its logical positions apart).
    A gathered dim of one component holds logical position i at physical
    position i, and the lowering wraps a negative index by the dim's
    logical size; a padded index is filled 0, always in range.  Several
    indices broadcast together as an elementwise op's operands do, so their
    padded dims are the result's (transformers' masks:
    ``mask[batch[:, None, None, None], positions[None, None, None, :]]``).
    A bool mask selects by its values: every dim of the tensor and of its
    indices."""
    indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
    x = args[0]
    given = [(d, i) for d, i in enumerate(indices) if i is not None]
    if given and all(isinstance(i, torch.Tensor) and i.dtype not in (torch.bool, torch.uint8) for _, i in given):
        gathered = tuple(d for d, _ in given)
        return {0: set(gathered)} if _merged(x, gathered) else {}
    given = [i for _, i in given]
    return {0: set(range(x.dim())), 1: set(range(max((i.dim() for i in given if isinstance(i, torch.Tensor)),
                                                     default=0)))}


def _gathered_exact(args: tuple, kwargs: dict) -> dict:
    """gather's exact dims: the tensor's dims that merged several (its
    logical positions are not its first ones: the gathered dim reads
    logical position i at physical i, the others are read as a prefix of
    the index's sizes), and the index's other dims where they are shorter
    than the tensor's (a padded index would read past them).  A padded
    index is filled 0, always in range (RoBERTa gathers its token types by
    its padded position ids)."""
    x = args[0] if args else kwargs.get("self")
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    index = args[2] if len(args) > 2 else kwargs.get("index")
    if not isinstance(x, torch.Tensor) or not isinstance(index, torch.Tensor) or x.dim() == 0 \
            or index.dim() != x.dim():
        return {0: set(range(max(getattr(x, "ndim", 0), 1))), 2: set(range(max(getattr(index, "ndim", 0), 1)))}
    dim %= x.dim()
    return {0: {d for d in range(x.dim()) if _merged(x, (d,))},
            2: {d for d in range(index.dim()) if d != dim and index.shape[d] != x.shape[d]}}


def _selected_exact(args: tuple, kwargs: dict) -> dict:
    """index_select's exact dims: the selected dim of the tensor where it
    merged several (one component holds logical position i at physical i,
    and the indices are checked against the logical size).  Its other dims
    are copied whole, their padding with them (beam search reorders a key /
    value cache padded along its length by the beams' indices).  A padded
    index is filled 0: it reads position 0 into the result's padding."""
    x = args[0] if args else kwargs.get("self")
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        return {0: set(), 2: {0}}
    dim %= x.dim()
    return {0: {dim} if _merged(x, (dim,)) else set()}


def _arg_reduced_exact(args: tuple, kwargs: dict) -> dict:
    """argmax / argmin (and max / min along a dim, their values with their
    indices): the reduced dim stays exact where it merged padded dims (its
    positions would count padding); without a dim the flat index counts
    every position: every dim exact.  The padding, filled so that it never
    wins, sits after the logical positions, so a tie still goes to the
    first of them."""
    x = args[0] if args else kwargs.get("self")
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if not isinstance(x, torch.Tensor):
        return {}
    if dim is None or x.dim() == 0:
        return {0: set(range(max(x.dim(), 1)))}
    dim %= x.dim()
    return {0: {dim} if _merged(x, (dim,)) else set()}


def _scattered_exact(args: tuple, kwargs: dict) -> dict:
    """scatter_add's exact dims: the tensor's dims that merged several (an
    index value is a logical position, which one component holds at the
    same physical one), and the index's and the source's dims where the
    two differ or, besides ``dim``, where they are shorter than the tensor
    (a padded index would write past it).  A padded index is filled 0 and
    its source 0: it adds zeros at position 0 (gather's backward)."""
    x = args[0] if args else kwargs.get("self")
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    index = args[2] if len(args) > 2 else kwargs.get("index")
    src = args[3] if len(args) > 3 else kwargs.get("src")
    tensors = (x, index, src)
    if not all(isinstance(t, torch.Tensor) for t in tensors) or x.dim() == 0 \
            or not index.dim() == src.dim() == x.dim():
        return {p: set(range(max(getattr(t, "ndim", 0), 1))) for p, t in zip((0, 2, 3), tensors)}
    dim %= x.dim()
    uneven = {d for d in range(x.dim())
              if index.shape[d] != src.shape[d] or (d != dim and index.shape[d] != x.shape[d])}
    return {0: {d for d in range(x.dim()) if _merged(x, (d,))}, 2: uneven, 3: uneven}


def _put_exact(args: tuple, kwargs: dict) -> dict:
    """index_put's exact dims when one integer index tensor (1-D) indexes
    one dim (the backward of ``x[:, :, [-2]]``, Falcon's key and value):
    that dim of the tensor and of the values, the index, and the tensor's
    dims that merged several.  The values' other dims are the tensor's, so
    they line up; padded values land in the tensor's padding.  Any other
    indexing (several index tensors, a mask, values that broadcast) keeps
    everything exact."""
    x = args[0] if args else kwargs.get("self")
    indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
    values = args[2] if len(args) > 2 else kwargs.get("values")
    given = [(d, i) for d, i in enumerate(indices or ()) if i is not None]
    if isinstance(x, torch.Tensor) and isinstance(values, torch.Tensor) and len(given) == 1 \
            and values.dim() == x.dim() and isinstance(given[0][1], torch.Tensor) and given[0][1].dim() == 1 \
            and given[0][1].dtype not in (torch.bool, torch.uint8):
        k = given[0][0]
        return {0: {k} | {d for d in range(x.dim()) if _merged(x, (d,))}, 1: {0}, 2: {k}}
    every = {}
    for pos, t in ((0, x), (2, values)):
        every[pos] = set(range(max(getattr(t, "ndim", 0), 1)))
    every[1] = set(range(max((getattr(i, "ndim", 0) for _, i in given), default=1)))
    return every


def _tested_exact(args: tuple, kwargs: dict) -> dict:
    """isin's test elements, every dim: their padding would be tested too
    (the elements are read as an elementwise op's operand)."""
    if len(args) > 1:
        test, pos = args[1], 1
    else:
        test, pos = kwargs.get("test_elements"), "test_elements"
    return {pos: set(range(test.dim()))} if isinstance(test, torch.Tensor) else {}


def _one_component_corner(args: tuple, kwargs: dict) -> dict:
    """tril / triu keep or zero a position by its row and column, which a
    padded input holds at its own logical indices only where each of its
    last two dims is one component (its padding at its end): a dim that
    merged a batch dim with a padded one must run exact."""
    t = args[0] if args else None
    if not isinstance(t, torch.Tensor) or t.dim() < 2:
        return {}
    corner = (t.dim() - 2, t.dim() - 1)
    return {0: set(corner)} if _merged(t, corner) else {}


def _merged(t: Any, dims: tuple) -> bool:
    """Whether any of ``dims`` of ``t``, read padded, is not one component
    (it merged a padded dim with others, so its logical positions are not
    its first ones), or ``t``'s view cannot be read padded at all.  A dim
    that merged exact ones only holds its positions in order (beam search's
    mask, its batch and beams merged by ``repeat_interleave``)."""
    if type(t) is not JaxTensor or t._storage.padded is None or any(d >= t.dim() for d in dims):
        return False
    r = read_of(t)
    return r is None or any(len(r.comps[d]) != 1 and any(c[0] != c[1] for c in r.comps[d]) for d in dims)


def _meeting(*pairs: tuple) -> Callable[[tuple, dict], dict]:
    """A contraction's :attr:`Rule.align`: ``pairs`` of ``((position,
    dim), (position, dim))`` that meet (a negative dim counts from the end:
    a broadcast input, addmm's bias)."""
    def align(args: tuple, kwargs: dict) -> dict:
        out: dict = {}
        for ends in pairs:
            found = []
            for pos, d in ends:
                t = args[pos] if pos < len(args) else None
                if type(t) is not JaxTensor or not -t.dim() <= d < t.dim():
                    break
                found.append((pos, d % t.dim()))
            else:
                a, b = found
                out.setdefault(a, []).append(b)
                out.setdefault(b, []).append(a)
        return out

    return align


def _meets_nothing(args: tuple, kwargs: dict) -> dict:
    """A :attr:`Rule.align` of an op whose arguments' dims meet none of the
    others': index_select's indices, whose length says nothing of the
    tensor's dims (T5's beam search reorders its caches by 6 beam indices
    where 6 is both the cross-attention cache's padded length and, exact,
    its batch: the size's ambiguity ran every reorder cut)."""
    return {}


def _leading_dims_meet(a: int, b: int) -> Callable[[tuple, dict], dict]:
    """A :attr:`Rule.align`: the arguments at ``a`` and ``b`` meet dim by
    dim, from their first (softmax's gradient and output; an embedding's
    gradient and its indices, the gradient's last dim the embedding's).  T5's
    relative position bias came padded along one of its two lengths
    beside a gradient padded along both: the program failed to trace."""
    def align(args: tuple, kwargs: dict) -> dict:
        x = args[a] if a < len(args) else None
        y = args[b] if b < len(args) else None
        if type(x) is not JaxTensor or type(y) is not JaxTensor:
            return {}
        out: dict = {}
        for d in range(min(x.dim(), y.dim())):
            out[(a, d)] = [(b, d)]
            out[(b, d)] = [(a, d)]
        return out

    return align


def _counted_indices(args: tuple, kwargs: dict) -> dict:
    """embedding_dense_backward's exact dims when it scales each row's
    gradient by how often its index occurs (``scale_grad_by_freq``): every
    dim of the indices, and the gradient's along them.  A padded index is
    filled 0, one more occurrence of row 0, which would shrink that row's
    gradient; exact, the call counts only the logical indices."""
    scale = args[4] if len(args) > 4 else kwargs.get("scale_grad_by_freq", False)
    if not scale:
        return {}
    indices = args[1] if len(args) > 1 else kwargs["indices"]
    dims = set(range(indices.dim()))
    return {0: dims, 1: dims}


def _attention_exact(first: int) -> Callable[[tuple, dict], dict]:
    """Attention's exact dims (its query at ``first``, then key, value,
    mask, dropout's mask, dropout_p, is_causal, scale, enable_gqa): the head
    dim (the scale reads its size), the heads where the key has fewer
    (``enable_gqa`` repeats them), and under ``is_causal`` a query or key
    length that merged another dim (the causal mask keeps a position by its
    row and column, which a padded array holds at its logical indices only
    when the padding is at its end); in the backward, the output's
    gradient's as the query's (a gradient padded along its head dim then
    runs cut, where its program would fail)."""
    def exact(args: tuple, kwargs: dict) -> dict:
        tensors = [args[p] if p < len(args) else None for p in range(first, first + 3)]
        if not all(type(t) is JaxTensor for t in tensors):
            return {}
        dims = {first + i: {t.dim() - 1} for i, t in enumerate(tensors)}
        if len(args) > first + 8 and args[first + 8]:
            for i, t in enumerate(tensors):
                dims[first + i].add(t.dim() - 3)
        if len(args) > first + 6 and args[first + 6]:
            for i, t in enumerate(tensors[:2]):
                r = read_of(t) if t._storage.padded is not None else None
                if r is not None and len(r.comps[-2]) > 1:
                    dims[first + i].add(t.dim() - 2)
        if first and type(args[0]) is JaxTensor and args[0].dim() == tensors[0].dim():
            dims[0] = set(dims[first])  # the output's gradient: laid out as the query
        return dims
    return exact


def _samples_apart(params: tuple = (), conv: tuple | None = None) -> Callable[[tuple, dict], dict]:
    """The exact dims of an op that computes each sample alone (a
    convolution, a pooling, their backwards): every dim of its tensors but
    the first, and every dim of ``params`` (weight, bias).  ``conv``: the
    positions of the input and weight; an input without a batch dim (fewer
    dims than the weight) is exact throughout, its first dim the channels
    the convolution sums over."""
    def exact(args: tuple, kwargs: dict) -> dict:
        dims = {p: set(range(0 if p in params else 1, a.dim()))
                for p, a in enumerate(args) if isinstance(a, torch.Tensor)}
        if conv is not None:
            x, w = args[conv[0]], args[conv[1]]
            if isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor) and x.dim() != w.dim():
                dims[conv[0]] = set(range(x.dim()))
        return dims
    return exact


def _channels_exact(args: tuple, kwargs: dict) -> dict:
    """Batch norm with running statistics: per channel (dim 1) an affine
    map of each element, its parameters and statistics exact.  Training
    (``native_batch_norm``'s flag) reduces over the batch: exact throughout."""
    x = args[0]
    training = args[5] if len(args) > 5 and type(args[5]) is bool else kwargs.get("training", False)
    dims = {0: set(range(x.dim())) if training else {1}}
    for p in range(1, 5):
        if p < len(args) and isinstance(args[p], torch.Tensor):
            dims[p] = set(range(args[p].dim()))
    return dims


def _flipped_dims(args: tuple, kwargs: dict) -> dict:
    """flip's exact dims: the ones it reverses (their padding would come
    first); the others keep their padding at their ends."""
    x = args[0]
    dims = args[1] if len(args) > 1 else kwargs.get("dims", ())
    ndim = x.dim() if isinstance(x, torch.Tensor) else 0
    return {0: {d % ndim for d in dims} if ndim else set()}


def _padded_ends(args: tuple, kwargs: dict) -> dict:
    """constant_pad_nd's exact dims: the ones it pads or crops (two amounts
    per dim, from the last); the others keep their padding at their ends
    (Swin pads its feature map's height and width to whole windows while
    its batch is padded: by nothing, at most sizes)."""
    x = args[0] if args else kwargs.get("self")
    pad = args[1] if len(args) > 1 else kwargs.get("pad", ())
    ndim = x.dim() if isinstance(x, torch.Tensor) else 0
    return {0: {ndim - 1 - k for k in range(len(pad) // 2) if pad[2 * k] or pad[2 * k + 1]}}


def _attention_rule(first: int) -> Rule:
    """Attention as one op (``pjrt_host::attention``, its backward with the
    output's gradient first) over a padded query, key and value: zeros in
    the padding, and the key positions past the logical length masked by
    the lowering itself (``LoweringContext.logical``).  The query's length
    meets the masks' rows, the key's length the value's and the masks'
    columns, the head dims each other, and the batch and heads theirs in
    every operand (a gradient padded along the heads lines the query up
    with it)."""
    q, k, v, mask, keep = first, first + 1, first + 2, first + 3, first + 4
    pairs = [((q, -1), (k, -1)), ((k, -2), (v, -2)), ((mask, -1), (k, -2)), ((mask, -2), (q, -2)),
             ((keep, -1), (k, -2)), ((keep, -2), (q, -2))]
    # the batch and the heads (with ``enable_gqa`` the heads are exact)
    pairs += [((a, d), (b, d)) for d in (-3, -4) for a, b in ((q, k), (k, v), (mask, q), (keep, q))]
    if first:  # the backward: the output's gradient is shaped as the query, with the value's head dim
        pairs += [((0, -2), (q, -2)), ((0, -1), (v, -1)), ((0, -3), (q, -3)), ((0, -4), (q, -4))]
    return Rule(fill=0, exact=_attention_exact(first), align=_meeting(*pairs), logical=True)


#: The resampling ops (each sample alone, to spatial output sizes).
_RESAMPLINGS = ("upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
                "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
                "upsample_trilinear3d")
_SUMS = Rule(fill=0)
_RULES: dict[str, Rule] = {
    # attention: zeros in the padding, the key positions past the logical
    # length masked by the lowering
    "pjrt_host::attention": _attention_rule(0), "pjrt_host::attention_backward": _attention_rule(1),
    # sums and contractions: zeros add nothing
    "aten::sum": _SUMS, "aten::sum.dim_IntList": _SUMS, "aten::cumsum": _SUMS,
    "aten::mm": Rule(fill=0, align=_meeting(((0, 1), (1, 0)))),
    "aten::bmm": Rule(fill=0, align=_meeting(((0, 0), (1, 0)), ((0, 2), (1, 1)))),
    "aten::addmm": Rule(fill=0, align=_meeting(((1, 1), (2, 0)), ((0, -2), (1, 0)), ((0, -1), (2, 1)))),
    "aten::baddbmm": Rule(fill=0, align=_meeting(((1, 0), (2, 0)), ((1, 2), (2, 1)), ((0, -3), (1, 0)),
                                                 ((0, -2), (1, 1)), ((0, -1), (2, 2)))),
    "aten::mv": Rule(fill=0, align=_meeting(((0, 1), (1, 0)))),
    "aten::dot": Rule(fill=0, align=_meeting(((0, 0), (1, 0)))),
    # softmax: padding never wins the max and adds exp(-inf) = 0 to the sum;
    # their backwards are sums of products with the (zeroed) output
    "aten::_softmax": Rule(fill="min"), "aten::_log_softmax": Rule(fill="min"), "aten::_safe_softmax": Rule(fill="min"),
    # the gradient and the output meet dim by dim
    "aten::_softmax_backward_data": Rule(fill=0, align=_leading_dims_meet(0, 1)),
    "aten::_log_softmax_backward_data": Rule(fill=0, align=_leading_dims_meet(0, 1)),
    "aten::amax": Rule(fill="min"), "aten::max": Rule(fill="min"),
    "aten::amin": Rule(fill="max"), "aten::min": Rule(fill="max"),
    # the index of the first extreme along a dim (the next token's logits)
    "aten::argmax": Rule(fill="min", exact=_arg_reduced_exact),
    "aten::argmin": Rule(fill="max", exact=_arg_reduced_exact),
    "aten::max.dim": Rule(fill="min", exact=_arg_reduced_exact),
    "aten::min.dim": Rule(fill="max", exact=_arg_reduced_exact),
    # any / all / prod: what adds no True, no False, no factor
    "aten::any": _SUMS, "aten::any.dim": _SUMS, "aten::any.dims": _SUMS,
    "aten::all": Rule(fill=1), "aten::all.dim": Rule(fill=1), "aten::all.dims": Rule(fill=1),
    "aten::prod": Rule(fill=1), "aten::prod.dim_int": Rule(fill=1),
    # layer norm over exact dims: padded rows are normalised alone; the
    # backward's weight and bias gradients sum over rows (zeros)
    "aten::native_layer_norm": Rule(fill=None, exact=_normalised_dims((0,), 1, (2, 3))),
    "aten::native_layer_norm_backward": Rule(fill=0, exact=_normalised_dims((0, 1), 2, (5, 6))),
    # an index of 0 is always in range; its gradient rows are zeros (unless
    # the backward counts the indices: then they stay exact)
    "aten::embedding": _SUMS, "aten::embedding_dense_backward": Rule(fill=0, exact=_counted_indices,
                                                                        align=_leading_dims_meet(0, 1)),
    # a position kept or zeroed by its row and column: the same at a
    # padded array's logical positions
    "aten::tril": Rule(fill=None, exact=_one_component_corner),
    "aten::triu": Rule(fill=None, exact=_one_component_corner),
    # joined along an exact dim, padded ones line up
    "aten::cat": Rule(fill=None, exact=_joined_dim),
    # reversed along exact dims, the others keep their padding at their ends
    "aten::flip": Rule(fill=None, exact=_flipped_dims),
    # padded (or cropped) along exact dims, the same (growing a padded dim
    # at its end runs in its bucket first: pad_end)
    "aten::constant_pad_nd": Rule(fill=None, exact=_padded_ends),
    # convolutions and poolings padded along the batch only: each sample
    # alone (padded rows compute what they compute); the backwards' weight
    # and bias gradients sum over samples (zeros), a max pool's padded
    # indices (0) point inside their window's sample
    "aten::convolution": Rule(fill=None, exact=_samples_apart((1, 2), conv=(0, 1))),
    "aten::convolution_backward": Rule(fill=0, exact=_samples_apart((2,), conv=(1, 2)),
                                       align=_meeting(((0, 0), (1, 0)))),
    "aten::max_pool2d_with_indices": Rule(fill=None, exact=_samples_apart()),
    "aten::max_pool2d_with_indices_backward": Rule(fill=0, exact=_samples_apart(),
                                                   align=_meeting(((0, 0), (1, 0)), ((0, 0), (7, 0)))),
    "aten::avg_pool2d": Rule(fill=None, exact=_samples_apart()),
    "aten::avg_pool2d_backward": Rule(fill=0, exact=_samples_apart(), align=_meeting(((0, 0), (1, 0)))),
    "aten::_adaptive_avg_pool2d": Rule(fill=None, exact=_samples_apart()),
    # resampling: each sample alone, to output sizes that are spatial only
    # (the backwards take the input's sizes, its batch among them: exact)
    **{f"aten::{name}{overload}": Rule(fill=None, exact=_samples_apart())
       for name in _RESAMPLINGS for overload in ("", ".vec")},
    "aten::_adaptive_avg_pool2d_backward": Rule(fill=0, exact=_samples_apart(), align=_meeting(((0, 0), (1, 0)))),
    # batch norm with running statistics (eval): per channel, elementwise
    "aten::_native_batch_norm_legit_no_training": Rule(fill=None, exact=_channels_exact),
    "aten::native_batch_norm": Rule(fill=None, exact=_channels_exact),
    # batch norm in training: its statistics over the logical samples (the
    # lowering masks the padding, filled 0), its backward's sums over zeros
    "aten::_native_batch_norm_legit_functional": Rule(fill=0, exact=_samples_apart((1, 2, 3, 4)), logical=True),
    "aten::native_batch_norm_backward": Rule(fill=0, exact=_samples_apart((2, 3, 4, 5, 6)),
                                             align=_meeting(((0, 0), (1, 0))), logical=True),
    # a gather by integer index tensors: their padding reads position 0
    "aten::index.Tensor": Rule(fill=0, exact=_indexed_exact),
    "aten::_unsafe_index.Tensor": Rule(fill=0, exact=_indexed_exact),
    "aten::gather": Rule(fill=0, exact=_gathered_exact),
    # its indices' dim meets none of the tensor's (its length is the result's
    # selected dim): an exact index stays exact whatever its size
    "aten::index_select": Rule(fill=0, exact=_selected_exact, align=_meets_nothing),
    # tensors of one shape stacked along a new dim: padded ones line up as an elementwise op's operands
    "aten::stack": Rule(fill=None),
    # values put along one dim by one index tensor: the values' other dims are the tensor's
    "aten::index_put": Rule(fill=0, exact=_put_exact),
    # gather's backward: a padded index (0) adds its source's padding (0) at position 0
    "aten::scatter_add": Rule(fill=0, exact=_scattered_exact),
    # padded targets are ignored, as the loss's own ignore_index
    "aten::nll_loss_forward": Rule(fill=0, fills={1: (4, None)}),
    "aten::nll_loss_backward": Rule(fill=0, fills={2: (5, None)}),
    # every element the value, the padding too (``fill_`` runs as ``fill``:
    # torch's SiLU backward fills an ``empty_like`` of a padded activation)
    "aten::fill.Scalar": Rule(fill=None), "aten::fill.Tensor": Rule(fill=None),
    # membership of each element, tested against exact test elements
    "aten::isin.Tensor_Tensor": Rule(fill=None, exact=_tested_exact),
    "aten::isin.Scalar_Tensor": Rule(fill=None, exact=_tested_exact),
    "aten::isin.Tensor_Scalar": Rule(fill=None),
}

_ELEMENTWISE = Rule(fill=None)

#: Random ops whose draws are made per element (``_lowerings._util.draw``):
#: over a padded input each logical element takes the value an exact draw
#: gives it (``LoweringContext.draw_positions``), so a seed draws the same
#: numbers with buckets and without.
_DRAWS: dict[str, Rule] = {"aten::native_dropout": _ELEMENTWISE}


def _keep_exact(args: tuple, kwargs: dict) -> dict:
    """Dropout's mask for attention (query, key, p): the head dims exact."""
    return {0: {args[0].dim() - 1}, 1: {args[1].dim() - 1}}


def _keep_align(args: tuple, kwargs: dict) -> dict:
    """Its query and key meet along their batch dims, and their heads where
    they have as many (``enable_gqa`` repeats the key's)."""
    q, k = args[0], args[1]
    out: dict = {}
    for d in range(-q.dim(), -2):
        if d == -3 and q.shape[-3] != k.shape[-3]:
            continue
        out[(0, d % q.dim())] = [(1, d % k.dim())]
        out[(1, d % k.dim())] = [(0, d % q.dim())]
    return out


# dropout's mask for attention: the query's and key's values are not read
# (fill 0: not elementwise, the two lengths do not line up by position)
_DRAWS["pjrt_host::attention_keep"] = Rule(fill=0, exact=_keep_exact, align=_keep_align, logical=True)


def rule_for(func: Any, name: str, lowering: Any, inplace: int | None, out_names: tuple) -> Rule | None:
    """The op's rule, or None: it never runs on padded inputs (views, random
    draws, in-place / out= forms, data-dependent shapes, ops without one)."""
    if inplace is not None or out_names or lowering.data_dependent:
        return None
    if lowering.needs_rng:
        # (an in-place draw per element, ``bernoulli_(p)``, runs as this
        # functional call: ``CompiledOp._padded_in_place``)
        return _DRAWS.get(name, _ELEMENTWISE if lowering.per_element and not lowering.factory else None)
    rule = _RULES.get(name)
    if rule is not None:
        return rule
    try:
        tags = func.tags
    except AttributeError:
        return None
    if torch.Tag.pointwise in tags and torch.Tag.nondeterministic_seeded not in tags:
        return _ELEMENTWISE
    return None


def fill_of(rule: Rule, position: Any, args: tuple, kwargs: dict) -> Any:
    """The fill of the tensor argument at ``position`` (an index into args,
    or a keyword)."""
    fills = rule.fills
    if fills is None or position not in fills:
        return rule.fill
    value = fills[position]
    if type(value) is tuple:
        at = value[0]
        return args[at] if at < len(args) else rule.fill
    return value


def padded_inputs(args: tuple, kwargs: dict) -> list:
    """The call's 'jax' tensors (in lists too) whose storage is padded, or
    that are views of an exact one read wider (:func:`mark_wider`)."""
    return [t for _, t in _tensor_args(args, kwargs, lists=True)
            if t._storage.padded is not None or (_WIDE in t.__dict__ and wide_of(t) is not None)]


def exact_empties(args: tuple, kwargs: dict, padded: list) -> tuple | None:
    """The call's arguments with each empty tensor among ``padded`` (its
    tensors over padded storages) replaced by a new exact one of its shape,
    dtype and device: it reads nothing, and cutting its storage would cost a
    program per length (the comparison of no candidate tokens at assisted
    generation's last step, a slice of a padded cache past its end); None
    when none is empty."""
    for t in padded:
        if 0 in t.shape:
            break
    else:
        return None  # (the common case: a loop, no set made)
    empties = {id(t) for t in padded if 0 in t.shape}

    def swap(v: Any) -> Any:
        if type(v) is JaxTensor and id(v) in empties:
            return new_tensor(tuple(v.shape), v.dtype, v._storage.device_index)
        if type(v) is list or type(v) is tuple:
            return type(v)([swap(x) for x in v])
        return v

    return tuple([swap(a) for a in args]), {k: swap(v) for k, v in kwargs.items()}


def unpad_all(args: tuple, kwargs: dict, who: str) -> None:
    """Cut every padded storage among the call's tensors (in lists too)."""
    for v in (*args, *kwargs.values()) if kwargs else args:
        if type(v) is JaxTensor:
            if v._storage.padded is not None:
                v._storage.unpad(who)
        elif type(v) is list or type(v) is tuple:
            unpad_all(v, {}, who)


class PaddedRead(NamedTuple):
    """How an op reads a tensor over a padded storage: the storage's
    ``physical`` shape, the physical ``view`` (``View.static`` or None) and
    its run-time ``offset``, per dim of the tensor its ``masks`` (see
    ``PaddedSpec``) with the logical ``sizes`` they compare with, its
    physical sizes ``psize`` and per dim its components ``comps``."""

    physical: tuple
    view: Any
    offset: int
    masks: tuple
    sizes: tuple  #: per dim, the logical sizes its masks compare with
    psize: tuple
    comps: tuple
    pstride: tuple = ()  #: the physical view's strides
    offset_elements: int = 0  #: its offset into the storage's array


class _Physical:
    """A padded storage's array as ``view_for`` reads a storage."""

    __slots__ = ("shape", "numel", "jax_dtype", "nbytes")

    def __init__(self, shape: tuple, dtype: Any) -> None:
        self.shape, self.jax_dtype = shape, dtype
        self.numel = math.prod(shape)
        self.nbytes = 0


_reads: dict = {}


def read_of(t: JaxTensor, exact: bool = False) -> PaddedRead | None:
    """``t`` (over a padded storage) read through a physical view, or None
    when its view cannot be one: a view that splits a padded dim or crosses
    it, or reads the bytes as another dtype.  (A slice that starts inside a
    padded dim, ``x[:, 1:]``, reads a whole bucket from its start.)"""
    storage = t._storage
    view = t._view
    if view is None:
        size, stride, offset = storage.shape, None, 0  # (contiguous: its strides made on a miss)
    elif view.elem is not None:
        return None
    else:
        size, stride, offset = view.size, view.stride, view.offset
    padded = tuple(((n, n, False),) for n in storage.shape) if exact else storage.padded
    key = (padded, storage.jax_dtype, size, stride, offset)
    found = _reads.get(key, _reads)
    if found is not _reads:
        return found
    found = _translate(padded, storage.jax_dtype, size, contiguous_strides(size) if stride is None else stride, offset)
    if len(_reads) > 8192:
        _reads.clear()
    _reads[key] = found
    return found


def _translate(padded: tuple, dtype: Any, size: tuple, stride: tuple, offset: int) -> PaddedRead | None:
    comps = [c for dim in padded for c in dim]
    m = len(comps)
    P = [c[0] for c in comps]
    L = [c[1] for c in comps]
    if 0 in L or 0 in size:
        return None  # nothing to read: an empty tensor runs exact
    ls = [1] * m
    ps = [1] * m
    for j in range(m - 2, -1, -1):
        ls[j] = ls[j + 1] * L[j + 1]
        ps[j] = ps[j + 1] * P[j + 1]
    coords = []
    rem = offset
    for j in range(m):
        coords.append(rem // ls[j])
        rem %= ls[j]
    extent = [0] * m  # per component: how far the view's dims reach into it
    touched = [0] * m  # per dynamic component: the view dims that span it
    psize, pstride, masks, sizes, vcomps = [], [], [], [], []
    for n, s in zip(size, stride):
        if n == 1 or s == 0:
            psize.append(n)
            pstride.append(0 if n != 1 else 1)
            masks.append(())
            sizes.append(())
            vcomps.append(((n, n, False),))
            continue
        inner = [j for j in range(m) if ls[j] <= s and L[j] > 1]
        if not inner:
            return None
        j = inner[0]  # the outermost component the stride does not jump over
        if s % ls[j]:
            return None
        mult = s // ls[j]
        if n * mult <= L[j]:  # within one component: a slice, or a split of an exact one
            extent[j] += (n - 1) * mult
            if not comps[j][2]:
                psize.append(n)
                pstride.append(ps[j] * mult)
                masks.append(())
                sizes.append(())
                vcomps.append(((n, n, False),))
                continue
            if mult != 1:
                return None
            # a slice starting inside the padded dim (x[:, 1:]) reads a
            # whole bucket from its start: what lies past its logical end
            # is padding (a gather, its start at run time, clamped at the
            # array's end)
            touched[j] += 1
            psize.append(P[j])
            pstride.append(ps[j])
            masks.append(((1, P[j]),))
            sizes.append((n,))
            vcomps.append(((P[j], n, True),))
            continue
        top, q = j, 1
        if mult != 1:
            # the outer factor of an exact component, its inner factor
            # another dim's (a head dim split off the channels), merged with
            # the components outside it: MobileViT's (B x 4, 24) patches
            # viewed as (B x 4 x 4, 1, 6) for its attention's matmuls
            if comps[j][2] or L[j] % mult or coords[j]:
                return None
            top, q = j - 1, L[j] // mult
            extent[j] += (q - 1) * mult
        a, spanned = top, q
        while a >= 0 and spanned < n and spanned * L[a] <= n:
            spanned *= L[a]
            a -= 1
        part = 1  # the inner factor of an exact outer component the dim also spans
        if spanned < n and a >= 0 and not comps[a][2] and n % spanned == 0 and L[a] % (n // spanned) == 0:
            part = n // spanned
            if coords[a] % part:
                return None
            extent[a] += part - 1
            spanned = n
        a += 1
        if spanned != n:
            return None
        terms, logical = [], []
        for i in range(a, top + 1):
            if coords[i] != 0:
                return None
            extent[i] += L[i] - 1
            if comps[i][2]:
                touched[i] += 1
                terms.append((math.prod(P[i + 1:top + 1]) * q, P[i]))
                logical.append(L[i])
        psize.append(part * math.prod(P[a:top + 1]) * q)
        pstride.append(ps[j] * mult)
        masks.append(tuple(terms))
        sizes.append(tuple(logical))
        # (the exact outer factor is a component of the dim too: without
        # it the components' sizes multiply to less than the dim's, and a
        # tensor lined up with this one was padded to the wrong shape)
        vcomps.append(((part, part, False),) * (part > 1) + tuple(comps[a:top + 1]) + ((q, q, False),) * (q > 1))
    for j in range(m):
        if touched[j] > 1 or (extent[j] and coords[j] + extent[j] >= L[j]):
            return None
    physical = _padding.physical_shape(padded)
    poffset = sum(c * p for c, p in zip(coords, ps))
    pview = view_for(_Physical(physical, dtype), tuple(psize), tuple(pstride), poffset)
    return PaddedRead(physical, None if pview is None else pview.static, 0 if pview is None else pview.run_offset,
                      tuple(masks), tuple(tuple(int(x) for x in d) for d in sizes), tuple(psize), tuple(vcomps),
                      tuple(pstride), poffset)


def prepare(rule: Rule, args: tuple, kwargs: dict) -> tuple | None:
    """How the call's tensors are read padded: ``(reads, dims, args,
    kwargs)``, with ``reads`` (``id`` of a tensor -> :class:`PaddedRead`),
    ``dims`` ((physical, logical) size -> components, of every padded dim
    among them) and the call's arguments, where an exact tensor whose dims
    line up with padded ones (as broadcasting aligns them for an
    elementwise op; else by their logical size, where one padded dim has
    it) is read padded too: an expanded dim through a wider expand, others
    from a padded copy.  None when the call cannot run padded: a view that
    is not a physical one, a rule's exact dim padded, dims of the same sizes
    padded in two ways, a size that is a padded dim's and an exact one's
    outside an elementwise op (which of them a dim lines up with, its size
    does not say)."""
    tensors = _tensor_args(args, kwargs, lists=True)
    exact = rule.exact(args, kwargs) if rule.exact is not None else {}
    reads: dict = {}
    dims: dict = {}
    exact_sizes: set = set()  # sizes of dims exact in padded tensors
    for pos, t in tensors:
        if t._storage.padded is None:
            wide = wide_of(t) if _WIDE in t.__dict__ else None
            if wide is None:
                continue
            r = _read_widened(t, wide)[0]  # an expand read wider: no copy
            if r is None:
                continue
        else:
            r = read_of(t)
            if r is None:
                return None
        keep = exact.get(pos)
        for d, (p, n, c) in enumerate(zip(r.psize, t.shape, r.comps)):
            if p == n:
                continue
            if keep and d in keep:
                return None
            if not _alike_layout(dims.setdefault((p, n), c), c):
                return None
        exact_sizes.update(n for p, n in zip(r.psize, t.shape) if p == n and n > 1)
        reads[id(t)] = r
    elementwise = rule.fill is None and not rule.fills
    if elementwise and not _broadcast_alike(tensors, reads):
        return None
    meets = rule.align(args, kwargs) if rule.align is not None else None
    at = {pos: t for pos, t in tensors} if meets is not None else None
    if meets is not None:
        # dims that meet in a contraction, both read padded, must be laid out
        # alike (a merged [B*T] dim's rows against a dim padded at its end
        # are different lengths: the program could not be traced).  Dims
        # padded in neither are alike whatever their components say (a
        # batch of 6 against the 3 x 2 of a merged batch and heads)
        for (pos, d), partners in meets.items():
            r = reads.get(id(at.get(pos)))
            if r is None:
                continue
            for pos2, d2 in partners:
                r2 = reads.get(id(at.get(pos2)))
                if r2 is None or r.psize[d] == at[pos].shape[d] or r2.psize[d2] == at[pos2].shape[d2]:
                    continue  # (a dim padded against an exact one: lined up below)
                if r.psize[d] != r2.psize[d2] or not _alike_layout(r.comps[d], r2.comps[d2]):
                    return None
    swaps: dict = {}
    made: dict = {}  # id of a copy padded here -> id of the argument it stands for
    # A tensor padded here may line others up with it: a contraction's
    # exact operand padded to meet a padded gradient (attention's query)
    # gives its padding to the mask rows meeting it, whatever their order
    # in the call.  So the pass repeats until nothing more is padded.
    for _ in range(len(tensors) + 1):
        again = False
        for n_t, (pos, t) in enumerate(tensors):
            got = _line_up(pos, t, tensors, reads, dims, exact, exact_sizes, elementwise, meets, at, made)
            if got is None:
                return None
            if got is t:
                continue
            r, replaced = got
            reads[id(replaced)] = r
            again = True
            if replaced is not t:
                orig = made.get(id(t), id(t))
                made[id(replaced)] = orig
                swaps[orig] = replaced
                tensors[n_t] = (pos, replaced)
                if at is not None and at.get(pos) is t:
                    at[pos] = replaced
        if not again:
            break
    if meets is not None and not _alike(meets, at, reads):
        return None
    if swaps:
        args = tuple(_swapped(a, swaps) for a in args)
        if kwargs:
            kwargs = {k: _swapped(v, swaps) for k, v in kwargs.items()}
    return reads, dims, args, kwargs


class PaddedLane:
    """How fused eager's replay lane (``_fused.replay``) takes a padded
    call of one key without the engine: its padded arguments read as the
    recorded call read them, and its exact ones encoded alike, give the
    key; the results' logical shapes and padding are worked out per call,
    as the engine does (:func:`logical_shapes`, :func:`result_padding`).

    How the call is lined up (:func:`prepare`): a rule with exact dims,
    meeting dims or fills from other arguments runs ``prepare`` itself
    (``full``); for the others the lane keeps its decisions by its terms
    (:func:`padded_lane`) and ``patterns``: per padded argument (its
    position, or keyword), per dim, -1 where the recorded call read it
    padded and its size where not (a dim at its bucket's full size is not
    read padded, and lining up goes by which dims are)."""

    __slots__ = ("op", "key", "patterns", "physical", "full", "known", "shapes", "prepared")

    def __init__(self, op: Any, key: tuple, patterns: dict, physical: tuple, full: bool) -> None:
        self.op, self.key, self.patterns, self.physical, self.full = op, key, patterns, physical, full
        #: (id, position) -> a PaddedRead found to encode to the entry at that
        #: position (kept alive here): one read at two positions is checked at each
        self.known: dict = {}
        #: (``full``) ``prepare``'s answers by what decides them (:meth:`_lined_up`)
        self.prepared: dict = {}
        # the results' logical shapes by the call's tensors' sizes (the
        # engine's memo, without hashing the key per call); not where a
        # scalar is traced (its value is not among the sizes)
        self.shapes: dict | None = None if _traces_a_scalar(key) else {}

    def match(self, args: tuple, kwargs: dict, dyn: list, place: int) -> tuple | None:
        """``((shape, physical, padding) per result, reads)`` when the call
        is one of this lane's key (its run-time values appended to
        ``dyn`` in the engine's order), None when it is not."""
        key_args, key_kwargs = self.key[0], self.key[1]
        if len(args) != len(key_args) or len(kwargs) != len(key_kwargs):
            return None
        if self.full:
            lined_up = self._lined_up(args, kwargs)
            if lined_up is None:
                return None  # (a call that pads an argument to line it up takes the engine's way)
            reads, dims = lined_up
        else:
            reads, dims = {}, {}
        for i, (v, k) in enumerate(zip(args, key_args)):
            if not self._one(v, k, i, dyn, place, reads, dims, args, kwargs):
                return None
        for name, k in key_kwargs:
            if name not in kwargs or not self._one(kwargs[name], k, name, dyn, place, reads, dims, args, kwargs):
                return None
        memo = self.shapes
        if memo is None:
            shapes = logical_shapes(self.op, self.key, args, kwargs)
        else:
            sizes = tuple([tuple(t.shape) for _, t in _tensor_args(args, kwargs, lists=True)])
            shapes = memo.get(sizes, memo)
            if shapes is memo:
                shapes = logical_shapes(self.op, self.key, args, kwargs)
                if len(memo) > 256:
                    memo.clear()
                memo[sizes] = shapes
        if shapes is None:
            return None
        results = result_layouts(dims, self.physical, shapes)
        return None if results is None else (results, reads)

    def _lined_up(self, args: tuple, kwargs: dict) -> tuple | None:
        """``(reads, dims)`` as :func:`prepare` lines the call up, None
        where it cannot or pads an argument to do so: kept per what decides
        it (each padded tensor's ``PaddedRead``, kept alive with the answer,
        so its id names it; each exact tensor's sizes and whether it is a
        parameter; the call's other arguments), since ``prepare`` cost a
        matmul's call 30 us of its 45 on the lane.  An exact tensor read
        wider through an expand (``mark_wider``) is lined up every time."""
        tensors = _tensor_args(args, kwargs, lists=True)
        parts, found = [], []
        for pos, t in tensors:
            if t._storage.padded is None:
                if _WIDE in t.__dict__:
                    return self._prepare(args, kwargs)
                parts.append((pos, t.shape, _is_parameter(t)))
                found.append(None)
            else:
                r = read_of(t)
                if r is None:
                    return None  # (prepare's answer too)
                parts.append((pos, t.shape, id(r)))
                found.append(r)
        try:
            key = (tuple(parts), _plain(args), _plain(tuple(kwargs.items())) if kwargs else None)
            kept = self.prepared.get(key, self.prepared)
        except (TypeError, _NotPlain):
            return self._prepare(args, kwargs)
        if kept is self.prepared:
            answer = self._prepare(args, kwargs)
            if answer is not None:
                by_id = answer[0]
                # (each tensor's read as prepare gave it, by position in the call)
                kept = (tuple(by_id.get(id(t)) for _, t in tensors), answer[1], tuple(found))
            else:
                kept = None
            if len(self.prepared) > 64:
                self.prepared.clear()
            self.prepared[key] = kept  # (the reads in ``found`` stay alive with it: the ids in the key name them)
        if kept is None:
            return None
        reads = {id(t): r for (_, t), r in zip(tensors, kept[0]) if r is not None}
        return reads, kept[1]

    def _prepare(self, args: tuple, kwargs: dict) -> tuple | None:
        prepared = prepare(self.op.rule, args, kwargs)
        if prepared is None or prepared[2] is not args or prepared[3] is not kwargs:
            return None
        return prepared[0], prepared[1]

    def engine_key(self, args: tuple, kwargs: dict, cfg: Any, results: list) -> tuple:
        """The engine's key and run-time values for a call this lane took
        (``PJRT_HOST_CHECK_REPLAY``), after checking that the engine lines
        the call up alike and gives its results the lane's ``(shape,
        physical, padding)``; AssertionError where it does not."""
        name = self.op.name
        made = self.op.padded_key(args, kwargs, cfg)
        if len(made) == 3 or made[4] is not args or made[5] is not kwargs:
            raise AssertionError(f"pjrt_host: fused eager's replay lane took a padded call of {name}, but the "
                                 f"engine would run it otherwise ({made[0] if len(made) == 3 else 'lined up'})")
        key, values, _, dims, _, _ = made
        engine = result_layouts(dims, self.physical, logical_shapes(self.op, key, args, kwargs) or ())
        if engine != results:
            raise AssertionError(f"pjrt_host: fused eager's replay lane gave {name}'s results the shapes and "
                                 f"padding {results}, the engine {engine}")
        return key, values

    def _one(self, v: Any, k: Any, at: Any, dyn: list, place: int, reads: dict, dims: dict, args: tuple,
             kwargs: dict) -> bool:
        if type(k) is not _padding.PaddedSpec:
            return not (self.full and type(v) is JaxTensor and id(v) in reads) and matches(v, k, dyn, place)
        if type(v) is not JaxTensor:
            return False
        storage = v._storage
        a = storage._array
        if storage.padded is None or storage.place != place or a is None:
            return False  # (an exact tensor read wider: the engine's way)
        if self.full:
            r = reads.get(id(v))
            if r is None or fill_of(self.op.rule, at, args, kwargs) != k.fill:
                return False
        else:
            r = read_of(v)
            if r is None:
                return False
        if self.known.get((id(r), at)) is not r:
            if (storage.jax_dtype != k.dtype or r.physical != k.physical or r.view != k.view or r.masks != k.masks
                    or tuple(tuple((c[0], c[2]) for c in dim) for dim in r.comps) != k.comps):
                return False
            if len(self.known) > 64:
                self.known.clear()
            self.known[(id(r), at)] = r
        if not self.full:
            pattern = self.patterns.get(at)
            if pattern is None:
                return False
            for d, (p, n) in enumerate(zip(r.psize, v.shape)):
                if p == n:
                    if pattern[d] != n:
                        return False
                else:
                    if pattern[d] != -1:
                        return False
                    c = r.comps[d]
                    had = dims.setdefault((p, n), c)
                    if had is not c and not _alike_layout(had, c):
                        return False  # (prepare refuses dims of the same sizes padded in two ways)
            reads[id(v)] = r
        dyn.append(a)
        if r.view is not None:
            dyn.append(r.offset)
        if k.sized:
            for sizes in r.sizes:
                for n in sizes:
                    dyn.append(_padding.device_scalar(n, place))
        return True


def padded_lane(op: Any, key: tuple, entry: Any, reads: dict, given: tuple, prepared: tuple) -> Any:
    """The replay lane of a padded call just recorded (its key, what it
    read, its arguments as given and as :func:`prepare` lined them up), or
    ``_fused.NO_LANE`` where its calls take the engine's way: an op with
    something around its engine call, a random draw, a call that padded
    an argument to line it up (the copy is per call), a padded read inside
    a list, a host scalar or a generator.  A rule with exact or meeting
    dims or fills from other arguments runs :func:`prepare` per call; the
    others keep its decisions by the lane's patterns, and so take no exact
    tensor outside an elementwise op (one is lined up with padded dims by
    its sizes, which the call's logical sizes decide)."""
    from . import _fused

    rule = op.rule
    physical = op.physical.get(key)
    if (not op.padded_replayable or not op.simple or op.lowering.needs_rng or prepared[0] is not given[0]
            or prepared[1] is not given[1] or physical is None or type(key[4]) is not int):
        return _fused.NO_LANE
    full = rule.exact is not None or rule.align is not None or bool(rule.fills)
    tensors = full or rule.fill is None
    entries = (*key[0], *(k for _, k in key[1]))
    if not all(type(k) is _padding.PaddedSpec or _exact_entry(k, tensors) for k in entries):
        return _fused.NO_LANE
    args, kwargs = given
    patterns = {}
    for at, v in (*enumerate(args), *kwargs.items()):
        r = reads.get(id(v)) if type(v) is JaxTensor else None
        if r is not None:
            patterns[at] = tuple(-1 if p != n else n for p, n in zip(r.psize, v.shape))
    # one PaddedLane per op, key and patterns, whichever scripts take it (a
    # step at another length replays other scripts): what it keeps per call
    # layout (reads, shapes, prepare's answers) is found by all of them
    shared = (op, key, tuple(patterns.items()))
    lane = _padded_lanes.get(shared)
    if lane is None or lane.physical != physical or lane.full != full:
        if len(_padded_lanes) > 4096:
            _padded_lanes.clear()
        lane = _padded_lanes[shared] = PaddedLane(op, key, patterns, physical, full)
    return _fused.Lane(op.func, key, op, entry.used, entry.plan, lane)


#: (op, key, patterns) -> its PaddedLane (:func:`padded_lane`).
_padded_lanes: dict = {}


class _NotPlain(Exception):
    pass


_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


def _plain(values: tuple) -> tuple:
    """The call's arguments other than its tensors, as a key (a tensor as
    None: its own part of the key says it); _NotPlain for anything else."""
    out = []
    for v in values:
        t = type(v)
        if t is JaxTensor:
            out.append(None)
        elif t in _PLAIN:
            out.append((t, v))
        elif t is list or t is tuple:
            out.append((t, _plain(v)))
        else:
            raise _NotPlain
    return tuple(out)


def _traces_a_scalar(key: tuple) -> bool:
    def traced(k: Any) -> bool:
        return type(k) is DynamicScalar or (type(k) is SequenceArg and any(traced(x) for x in k))
    return any(traced(k) for k in (*key[0], *(k for _, k in key[1])))


def _exact_entry(k: Any, tensors: bool) -> bool:
    """Whether a key entry is one the padded lane reads as the exact lane
    does (:func:`~._signatures.matches`), with an exact tensor only where
    ``tensors``."""
    t = type(k)
    if t is SequenceArg:
        return all(_exact_entry(x, tensors) for x in k)
    if t is TensorSpec:
        return tensors
    return t is not _padding.PaddedSpec and t is not HostScalar and k is not GENERATOR


def _broadcast_alike(tensors: list, reads: dict) -> bool:
    """Whether the dims broadcasting lines up (counted from the last), where
    two tensors are read padded along them, are padded alike: one logical
    size in two buckets (a tensor padded under another setting's buckets,
    or a cache grown into the next bucket, beside one padded now) would not
    trace, and the program failed on every such call before it ran exact."""
    seen: dict = {}
    for _, t in tensors:
        r = reads.get(id(t))
        if r is None:
            continue
        rank = t.dim()
        for d, (p, n) in enumerate(zip(r.psize, t.shape)):
            if p == n:
                continue
            first = seen.setdefault(rank - d, (p, r.comps[d]))
            if first[0] != p or not _alike_layout(first[1], r.comps[d]):
                return False
    return True


def _alike(meets: dict, at: dict, reads: dict) -> bool:
    """Whether the dims that meet in a contraction are laid out alike once
    the call's tensors are lined up (both exact, or both read with the same
    padding): a dim read padded against an exact one of its size would not
    trace (the program failed, and the call ran exact after it)."""
    for (pos, d), partners in meets.items():
        t = at.get(pos)
        if t is None:
            continue
        r = reads.get(id(t))
        padded = r is not None and r.psize[d] != t.shape[d]
        for pos2, d2 in partners:
            u = at.get(pos2)
            if u is None or t.shape[d] == 1 or u.shape[d2] == 1:
                continue
            r2 = reads.get(id(u))
            if padded != (r2 is not None and r2.psize[d2] != u.shape[d2]):
                return False
            if padded and (r.psize[d] != r2.psize[d2] or not _alike_layout(r.comps[d], r2.comps[d2])):
                return False
    return True


def _alike_layout(a: tuple, b: tuple) -> bool:
    """Whether two dims' components lay their elements out alike: the same
    components once the ones of size 1 are left out (a ``[2, 1, 1, T]``
    read as one dim of ``2 x T`` against a ``[2, T]`` one: Gemma's
    attention output projected back) and neighbouring exact ones taken as
    one (Swin's rows, a padded batch x 8 x 8 against the same batch x 64,
    in a weight's gradient)."""
    return a == b or _one_layout(a) == _one_layout(b)


def _one_layout(comps: tuple) -> tuple:
    out: list = []
    for c in comps:
        if c[0] == 1:
            continue
        if not c[2] and out and not out[-1][2]:
            n = out[-1][0] * c[0]
            out[-1] = (n, n, False)
        else:
            out.append(c)
    return tuple(out)


def _line_up(pos: Any, t: JaxTensor, tensors: list, reads: dict, dims: dict, exact: dict, exact_sizes: set,
             elementwise: bool, meets: dict | None, at: dict | None, made: dict) -> Any:
    """One tensor of :func:`prepare`'s call lined up with the padded ones:
    ``t`` itself when it stays as it is, ``(PaddedRead, the tensor read)``
    when it is read padded along more dims, None when it cannot be."""
    own = reads.get(id(t))
    if _is_parameter(t):
        return t
    # a padded tensor is padded along more dims only where broadcasting
    # or a contraction lines them up; by size alone (a head dim as long as
    # the key/value length) it would take a padding that is not its own
    met_only = own is not None and not elementwise and id(t) not in made
    keep = exact.get(pos) or ()
    targets = {}
    for d, n in enumerate(t.shape):
        if n <= 1 or d in keep or (own is not None and own.psize[d] != n):
            continue
        if met_only and (meets is None or (pos, d) not in meets):
            continue
        if elementwise:
            back = t.dim() - d
            aligned = [u for _, u in tensors
                       if id(u) in reads and u.dim() >= back and reads[id(u)].psize[u.dim() - back] != u.shape[-back]]
            if any(u.shape[-back] != n for u in aligned):
                return None  # sizes that do not broadcast: the exact run raises torch's error
            found = {reads[id(u)].comps[u.dim() - back] for u in aligned}
        elif meets is not None:
            # a dim that meets others (a contraction's): padded alike
            # where they are; its size says nothing (a head dim as long
            # as the key/value length).  A free dim (a matmul's rows or
            # columns, a convolution's channels) meets nothing: it stays
            # as it is, whatever its size (a projection's width of 16
            # took the padding of the [batch * length] rows it multiplies,
            # 2 x 8 of a bucket of 16: a Llama with head dim 8 at a prompt
            # of 8 padded its heads, and a later op's program failed)
            if (pos, d) not in meets:
                continue
            found = set()
            for pos2, d2 in meets.get((pos, d), ()):
                u = at[pos2]
                r2 = reads.get(id(u))
                if r2 is not None and u.shape[d2] == n and r2.psize[d2] != n:
                    found.add(r2.comps[d2])
        else:
            found = {c for (p, size), c in dims.items() if size == n}
            if found and n in exact_sizes:
                # the size is a padded dim's and an exact one's (a head
                # dim as long as the key/value length): which one this
                # dim lines up with, the size does not say
                return None
        if len(found) > 1:
            return None
        if found:
            targets[d] = found.pop()
    if not targets:
        return t
    # an exact tensor is read wider; a padded one whose other dims
    # line up with padded ones in an elementwise op (a gradient padded
    # along the batch as well as the length, added to one padded along
    # the length) is padded along them too
    r, replaced = _read_widened(t, targets) if own is None else _read_repadded(t, targets)
    if r is None:
        return None
    return r, replaced


def _swapped(v: Any, swaps: dict) -> Any:
    if type(v) is list or type(v) is tuple:
        return type(v)(swaps.get(id(x), x) for x in v)
    return swaps.get(id(v), v)


def read_wider(t: JaxTensor, wide: dict) -> PaddedRead | None:
    """How a view marked by :func:`mark_wider` is read (None: it cannot be)."""
    return _read_widened(t, wide)[0]


def _read_widened(t: JaxTensor, targets: dict) -> tuple:
    """An exact tensor read as padded along ``targets`` (dim ->
    components): ``(PaddedRead, the tensor read)``, ``(None, t)`` when it
    cannot be."""
    storage = t._storage
    view = t._view
    if storage.padded is not None or type(storage.place) is not int or \
            (view is not None and view.elem is not None):
        return None, t
    stride = t.stride()
    # (a slice is read wider only along a dim of one component: logical
    # position i at physical i; an expand reads the same element anywhere)
    if view is not None and all(stride[d] == 0 or len(c) == 1 for d, c in targets.items()) \
            and _fits_wider(t, {d: math.prod(x[0] for x in c) for d, c in targets.items()}):
        # expanded dims (a wider expand reads the same element) or a slice
        # of a longer storage (the wider slice reads elements the masks
        # make padding): read wider, no copy
        r = read_of(t, exact=True)
        if r is None:
            return None, t
        psize, pstride, masks, sizes, comps = (list(r.psize), list(r.pstride),
                                               list(r.masks), list(r.sizes), list(r.comps))
        for d, c in targets.items():
            psize[d] = math.prod(x[0] for x in c)
            if stride[d] == 0:
                pstride[d] = 0
            masks[d], sizes[d] = _terms(c)
            comps[d] = c
        pview = view_for(_Physical(r.physical, storage.jax_dtype), tuple(psize), tuple(pstride), r.offset_elements)
        return PaddedRead(r.physical, None if pview is None else pview.static,
                          0 if pview is None else pview.run_offset, tuple(masks), tuple(sizes), tuple(psize),
                          tuple(comps)), t
    padded = tuple(targets.get(d, ((n, n, False),)) for d, n in enumerate(t.shape))
    values = read_through(storage.get(), view.static, view.run_offset) if view is not None else storage.get()
    copy = make(Storage(_padding.pad_as(values, padded), tuple(t.shape), storage.jax_dtype, storage.device_index,
                        storage.place, padded), tuple(t.shape), t.dtype)
    _padding.note("pads")
    return read_of(copy), copy


def _read_repadded(t: JaxTensor, targets: dict) -> tuple:
    """A tensor over a padded storage read as padded along ``targets`` too
    (dim -> components; dims exact in it): ``(PaddedRead, a padded copy)``,
    ``(None, t)`` when its view is not a physical one."""
    got = padded_values(t)
    if got is None:
        return None, t
    arr, comps = got
    shape = tuple(t.shape)
    padded = comps if comps is not None else tuple(((n, n, False),) for n in shape)
    wider = tuple(targets.get(d, padded[d]) for d in range(len(shape)))
    storage = t._storage
    copy = make(Storage(_padding.widen(arr, padded, wider), shape, storage.jax_dtype, storage.device_index,
                        storage.place, wider), shape, t.dtype)
    _padding.note("pads")
    return read_of(copy), copy


def _terms(comps: tuple) -> tuple:
    """The masks and logical sizes of one dim made of ``comps``."""
    terms, sizes = [], []
    for i, (p, n, dynamic) in enumerate(comps):
        if dynamic:
            terms.append((math.prod(c[0] for c in comps[i + 1:]), p))
            sizes.append(n)
    return tuple(terms), tuple(sizes)


def result_padding(dims: dict, physical: tuple, shape: tuple) -> tuple | None:
    """A padded call's result's components (None: exact), from the padded
    dims of its inputs of the same sizes; False when one is unknown."""
    if physical == shape:
        return None
    if len(physical) != len(shape):
        return False
    out = []
    for p, n in zip(physical, shape):
        if p == n:
            out.append(((n, n, False),))
            continue
        c = dims.get((p, n))
        if c is None:
            return False
        out.append(c)
    return tuple(out)


def result_layout(dims: dict, physical: tuple, shape: tuple) -> tuple | None:
    """A padded call's result of array shape ``physical`` and torch's
    ``shape``: its ``(shape, padding)`` (:func:`result_padding`; an empty
    result whose padding cannot be told takes the array's shape, exact:
    :func:`lowered_exact`), or None when its padding is unknown (the call
    runs exact)."""
    padded = result_padding(dims, physical, shape)
    if padded is not False:
        return shape, padded
    return (physical, None) if lowered_exact(physical) else None


def result_layouts(dims: dict, physical: tuple, shapes: list) -> list | None:
    """:func:`result_layout` of each result: ``(shape, physical, padding)``
    each, or None when one's padding is unknown."""
    out = []
    for pshape, shape in zip(physical, shapes):
        found = result_layout(dims, pshape, shape)
        if found is None:
            return None
        out.append((found[0], pshape, found[1]))
    return out


def lowered_exact(physical: tuple) -> bool:
    """Whether a result whose padding :func:`result_padding` cannot tell is
    exact as the lowering shapes it: an empty one, where torch's meta
    kernel gives another shape (``native_batch_norm`` in eval: full-size
    saved statistics, where CPU and the lowering give empty ones; op by op,
    the tensor takes the lowering's shape).  An empty array holds no
    padding; any other unknown result runs the call exact."""
    return 0 in physical


def on_miss(op: Any, args: tuple, kwargs: dict, mode: Any) -> bool:
    """A new signature of ``op``, which has a rule: the dims of its inputs
    that run padded at their place (the op's input position called from
    the same line of code outside torch, by the same module instance, with
    the same parameters, as dynamo's automatic dynamic goes by the frame
    and source: from a third size on, :func:`_padding.runs_padded`), the dims ``torch._dynamo.mark_dynamic`` marked, and
    with ``mode`` "all" every dim, become dynamic, and the inputs holding
    them are padded.  True when one was."""
    seen = op.seen_shapes
    padded_any = False
    place = None
    tensors = _tensor_args(args, kwargs)
    backward = False
    if mode != "all":
        from ._meta import inside_backward

        # a backward's inputs come padded from its forward, or not at all:
        # there only an expand (autograd's gradient of a sum or a mean, the
        # size of the forward's input) is read wider
        backward = inside_backward()
        if backward and not any(t._view is not None and 0 in t.stride() for _, t in tensors):
            return False
        # the parameters' shapes are part of the place: one line of code (a
        # Linear's forward) runs every layer of every width
        params = tuple((pos, tuple(t.shape)) for pos, t in tensors if _is_parameter(t))
    for pos, t in tensors:
        if _is_parameter(t) or (backward and (t._view is None or 0 not in t.stride())):
            continue  # parameters keep their shapes
        shape = tuple(t.shape)
        dims = set()
        if backward:
            # the expand is the forward input's size: it is read wider along
            # the dims a padded call read that input padded along, and no
            # other (autograd's thread has no user frame, so every backward
            # call of an op would count its sizes at one place: a head dim
            # of one model and another's then looked dynamic)
            physical = _padding.padded_read_of(shape)
            if physical is not None:
                dims = {d for d, (n, p) in enumerate(zip(shape, physical)) if p != n}
        elif mode == "all":
            dims = {d for d, n in enumerate(shape) if _padding.dynamic_ok(n, True)}
        else:
            if place is None:
                place = (_caller(), params)
            sizes = seen.get((place, pos, len(shape)))
            if sizes is None:
                if len(seen) > 16384:  # (a place per module instance: room for a few hundred layers)
                    seen.clear()
                sizes = seen[(place, pos, len(shape))] = [{} for _ in shape]
            dims = {d for d, n in enumerate(shape) if _padding.runs_padded(sizes[d], n)}
            marked = getattr(t, "_dynamo_dynamic_indices", None)
            if marked:
                dims |= {d for d in marked if d < len(shape) and _padding.dynamic_ok(shape[d])}
        if dims and op.rule.exact is not None:
            dims -= op.rule.exact(args, kwargs).get(pos, set())
        if dims and (mark_wider(t, dims, odd=mode == "all")
                     or (not backward and _pad_storage(t, dims, odd=mode == "all"))):
            padded_any = True
    return padded_any


#: The key in a tensor's ``__dict__`` of the dims an expand of an exact
#: storage is read wider along (dim -> components).
_WIDE = _padding.WIDE


def mark_wider(t: JaxTensor, dims: set, odd: bool = False) -> bool:
    """``t``, a view of an exact storage, is read by padded calls wider
    along ``dims`` to their buckets: the same elements, no copy
    (``prepare``).  Along an expanded dim (stride 0) a wider expand reads
    the same element; along a slice of a longer storage (BERT's position
    ids, ``self.position_ids[:, :L]`` of a buffer of 512) the wider slice
    reads the storage's next elements, which the reads mask as padding --
    where it stays inside the storage.  Autograd's gradient of a sum or a
    mean over a dynamic dim is such an expand, of a size that changes with
    the length; read wider, what is computed from it is padded and runs
    the bucket's programs.  False: ``t`` is not one."""
    storage = t._storage
    view = t._view
    if view is None or view.elem is not None or storage.padded is not None or type(storage.place) is not int:
        return False
    shape = t.shape
    wide = {d: ((_padding.room(shape[d], odd), shape[d], True),) for d in dims}
    wide = {d: c for d, c in wide.items() if c[0][0] != c[0][1]}
    if not wide or not _fits_wider(t, {d: c[0][0] for d, c in wide.items()}):
        return False
    t.__dict__[_WIDE] = (tuple(shape), t.stride(), wide)
    _padding.live = True
    return True


def wide_of(t: JaxTensor) -> dict | None:
    """The dims ``t`` is read wider along (:func:`mark_wider`: dim ->
    components); None where it is not, or where an in-place view op
    (``unsqueeze_``, ``transpose_``) has changed its shape or strides since
    (the mark is dropped: its dims would name others)."""
    found = t.__dict__.get(_WIDE)
    if found is None:
        return None
    shape, stride, wide = found
    if shape != tuple(t.shape) or stride != t.stride():
        del t.__dict__[_WIDE]
        return None
    return wide


def _fits_wider(t: JaxTensor, sizes: dict) -> bool:
    """Whether ``t``'s view, ``sizes`` long along those dims (dim -> size),
    stays inside its storage: every such dim expanded (stride 0), or the
    last element it reads within the storage's."""
    stride = t.stride()
    if all(stride[d] == 0 for d in sizes):
        return True
    if any(st < 0 for st in stride):
        return False
    last = t.storage_offset() + sum((sizes.get(d, n) - 1) * st for d, (n, st) in enumerate(zip(t.shape, stride)))
    return last < t._storage.numel



def _is_parameter(t: JaxTensor) -> bool:
    """An ``nn.Parameter`` (this class, marked): its shapes never change."""
    return bool(t.__dict__.get("_is_param", False))


_caller = _padding.caller


def padded_values(t: JaxTensor) -> tuple | None:
    """``t``'s values as a padded array of its own (a contiguous copy: the
    storage's array itself when ``t`` is all of it) with their padding, or
    None: ``t`` is not over a padded storage, or its view is not a physical
    one, or dynamic shapes are off."""
    if t._storage.padded is None or not _config.current().dynamic_shapes:
        return None
    found = _padded_read(t)
    if found is None:
        return None
    r, arr, padding = found
    if r.view is not None:
        arr = read_through(arr, r.view, r.offset)
    return arr, padding


def _padded_read(t: JaxTensor) -> tuple | None:
    """How ``t`` reads its padded storage (its :class:`PaddedRead`), the
    storage's computed array, and ``t``'s padding (None where ``t`` reads a
    box of its own logical shape); None where its view is not a physical
    one."""
    r = read_of(t)
    if r is None:
        return None
    return r, t._storage.computed(), (None if r.psize == tuple(t.shape) else r.comps)


_join_programs: dict = {}


def grows(tensors: list, dim: int) -> tuple[bool, Any]:
    """A cat that no padded tensor reaches yet: a tensor of it becomes
    dynamic along ``dim`` -- its storage is padded, so that the cat joins in
    buckets (:func:`join`) and every op after it reads the padded result --
    when it is an earlier result of this cat (an accumulator fed back: a
    key/value cache, the ids ``generate`` appends a token to, from its
    second step on), or when its size along ``dim`` took a third size at
    this place (its position in the list, the same line of code).  A list
    argument's tensors are not inputs :func:`on_miss` sees; this is where a
    growing one is found.  Returns whether one was padded, and the place
    (None: not one to watch), for :func:`joined` to mark the result."""
    mode = _config.current().dynamic_shapes
    if not mode or mode == "all" or not tensors:
        return False, None  # (with "all", the ops that read the tensors pad them)
    from ._meta import inside_backward

    if inside_backward():
        return False, None
    place = None
    padded_any = False
    for i, t in enumerate(tensors):
        if type(t) is not JaxTensor or t.dim() == 0 or _is_parameter(t) or not -t.dim() <= dim < t.dim():
            continue
        d = dim % t.dim()
        if place is None:
            place = ("cat", _caller(), d)
        # the sizes along the cat's dim at the tensor's position in the list
        # (the sizes are noted for fed-back ones too: a fresh tensor at a place
        # known to change -- a new prompt's -- is padded at once)
        changing = _padding.changing_dims((place, i, t.dim()), (t.shape[d],))
        noted = None if _results_of is None else _results_of.get(t._storage)
        fed_back = noted == place or (type(noted) is frozenset and place in noted)
        if (changing or fed_back) and _pad_storage(t, {d}):
            padded_any = True
    return padded_any, place


#: An exact cat's result storage -> the cat's place: a result that comes
#: back into its own cat is an accumulator, dynamic from then on (:func:`grows`).
_results_of: Any = None


def joined(result: Any, place: Any) -> None:
    """Note ``result`` (an exact cat's, at ``place`` from :func:`grows`; a
    replayed one's, at the frozenset of its lane's places)."""
    global _results_of
    if place is None or type(result) is not JaxTensor or result._view is not None:
        return
    if _results_of is None:
        import weakref

        _results_of = weakref.WeakKeyDictionary()
    _results_of[result._storage] = place


def note_on_replay(lane: Any, place: Any) -> None:
    """Have fused eager's replay lane of an exact cat (``lane``, the
    recorded op's) note each result it gives at ``place`` too, as the cat's
    handler notes its own (:func:`joined`).  Ops of one key share a lane,
    and the key and value caches' cats of a layer share a key, so the lane
    notes its results at every place its key was recorded at (a result
    taken for an accumulator it is not is at worst joined padded: its
    values are the same)."""
    # (a callable: fused eager, below this module's layer, does not import it)
    places = lane.noted.keywords["place"] if lane.noted is not None else frozenset()
    if place not in places and len(places) < 16:
        lane.noted = functools.partial(joined, place=places | {place})


def join(tensors: list, dim: int, record: Callable | None = None) -> JaxTensor | None:
    """``torch.cat(tensors, dim)`` along a dim some of them hold padded (a
    key/value cache growing by a token): the result padded to the bucket of
    its logical length, each tensor placed at its run-time offset, so that
    every length of a bucket runs one program.  None: not such a call
    (dynamic shapes off, no tensor padded along ``dim``, other dims that do
    not line up, a view that is not a physical one).

    ``record`` (fused eager): given ``(fn, key, inputs, shape, physical,
    padded, dtype, index)`` when a tensor is a whole storage whose value is
    still pending, it records the join into the segment and returns its
    result (None: the values are computed and the join runs now)."""
    joining = _joining(tensors, dim)
    if joining is None:
        return None
    tensors, dim, total = joining
    # a whole storage whose bucket the result outgrows is laid out in the
    # result's bucket first (one program per bucket, not one per crossing)
    for t in tensors:
        if t._view is None and t._storage.padded is not None:
            _padding.grow_bucket(t._storage, dim, _padding.room(total))
    call = _join_call(tensors, dim, total, record is not None, False)
    if call is None:
        return None
    key, inputs, shape, physical, padded = call
    found = _join_programs.get(key)
    if found is None:
        body = _join_body(key)
        found = _join_programs[key] = (body, _program_cache.Kept("pjrt_host.join", body, key))
    body, program = found
    first = tensors[0]
    index = first._storage.device_index
    pending = [i for i, v in enumerate(inputs[:len(tensors)]) if type(v) is Pending]
    if pending:
        joined = record(body, key, inputs, shape, physical, padded, first.dtype, index)
        if joined is not None:
            _padding.note_padded_call(physical, shape)
            return joined
        for i in pending:  # (the storage's computed array: its view, if any, is read in the join)
            inputs[i] = tensors[i]._storage.computed()
    arr = program(*inputs)
    _padding.note_padded_call(tuple(arr.shape), shape)
    from ._sync import note_result

    note_result(index, arr)
    return make(Storage(arr, shape, arr.dtype, index, first._storage.place, padded), shape, first.dtype)


class JoinLane(HostLane):
    """Fused eager's replay lane of a join recorded into a segment (a
    key/value cache's cat, every layer and token): a later call of the
    script's join at the same place is matched by the join's own key
    (:func:`_join_call`, which runs nothing) and recorded without the
    dispatcher's handler.  A call whose cache would grow into the next
    bucket (:func:`join` lays it out first) or whose key differs takes the
    engine's way."""

    __slots__ = ()

    def __init__(self, func: Any, key: tuple, place: int, dtype: torch.dtype) -> None:
        super().__init__(func, key, place, None, dtype)

    def _call(self, args: tuple, kwargs: dict, lane: bool) -> tuple | None:
        tensors = args[0] if args else kwargs.get("tensors")
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        if type(tensors) not in (list, tuple) or type(dim) is not int or len(args) + len(kwargs) > 2:
            return None
        joining = _joining(list(tensors), dim)
        if joining is None:
            return None
        tensors, dim, total = joining
        room = _padding.room(total)
        for t in tensors:
            padded = t._storage.padded
            if (lane and t._view is None and padded is not None and len(padded[dim]) == 1 and padded[dim][0][2]
                    and padded[dim][0][0] < room and not t._storage.pending):
                return None  # (join grows it first)
        return _join_call(tensors, dim, total, True, lane)

    def match(self, args: tuple, kwargs: dict, dyn: list, place: int) -> tuple | None:
        """``(((shape, physical, padding),), (physical, shape))`` when the
        call is a join of this lane's key (its inputs appended to ``dyn``),
        None when it is not."""
        call = self._call(args, kwargs, True)
        if call is None or call[0] != self.key:
            return None
        key, inputs, shape, physical, padded = call
        dyn.extend(inputs)
        return ((shape, physical, padded),), (physical, shape)

    def note_padded_call(self, args: tuple, kwargs: dict, noted: tuple) -> None:
        _padding.note_padded_call(*noted)

    def engine_key(self, args: tuple, kwargs: dict, cfg: Any, results: tuple) -> tuple:
        """The key and inputs :func:`join` gives the call
        (``PJRT_HOST_CHECK_REPLAY``); AssertionError where its result's
        layout is not the lane's."""
        call = self._call(args, kwargs, False)
        if call is None:
            raise AssertionError("pjrt_host: fused eager's replay lane took a cat as a join, but join would not take it")
        key, inputs, shape, physical, padded = call
        if ((shape, physical, padded),) != tuple(results):
            raise AssertionError(f"pjrt_host: fused eager's replay lane gave a join the layout {results}, join "
                                 f"{((shape, physical, padded),)}")
        return key, inputs


def _joining(tensors: list, dim: int) -> tuple | None:
    """``(tensors, dim, total)`` of a cat :func:`join` may take: the
    tensors it places (torch's skipped empty ones left out), ``dim``
    made positive and the joined length; None where it cannot."""
    if not _config.current().dynamic_shapes or not tensors:
        return None
    dtype = tensors[0].dtype
    kept = []
    for t in tensors:
        # one dtype only: torch promotes over every tensor, the skipped ones below too
        if type(t) is not JaxTensor or t.dtype != dtype:
            return None
        # torch skips an empty 1-d tensor in a cat (a cache's initial torch.tensor([]))
        shape = t.shape
        if not (len(shape) == 1 and shape[0] == 0):
            kept.append(t)
    if not kept:
        return None
    ndim = len(kept[0].shape)
    if ndim == 0 or not -ndim <= dim < ndim:
        return None  # (a dim out of range: torch's cat raises its error)
    dim %= ndim
    total = 0
    for t in kept:
        shape = t.shape
        if len(shape) != ndim:
            return None
        total += shape[dim]
    return kept, dim, total


@functools.lru_cache(maxsize=1024)
def _unpadded_alike(layout: tuple) -> tuple:
    """``layout`` (per dim, its components) with each dim padded nowhere as
    one exact component: a cache whose heads merged key/value heads and
    their groups (Falcon's, 2 x 2) lines up with a new token's 4 heads."""
    return tuple(comps if any(c[2] for c in comps) else ((math.prod(c[1] for c in comps),) * 2 + (False,),)
                 for comps in layout)


def _join_call(tensors: list, dim: int, total: int, fused: bool, lane: bool) -> tuple | None:
    """``(key, inputs, shape, physical, padded)`` of :func:`join`'s
    program for the call, without running anything: its key, its inputs
    (each tensor's array, its length along ``dim``, its view's run-time
    offset), the result's logical shape, its array's shape and its
    padding.  ``fused``: a pending whole storage (or view of an exact
    one) is read as its pending value, recorded with the join.  ``lane``
    (:class:`JoinLane`): a tensor read through a program of its own gives
    None instead."""
    first = tensors[0]
    index = first._storage.device_index
    arrays, lengths, offsets, views, layouts = [], [], [], [], []
    read_along = 0  # the largest length along dim a part is read with
    along = False  # whether a part is padded along dim
    for t in tensors:
        storage = t._storage
        if type(storage.place) is not int or storage.device_index != index:
            return None
        view = t._view
        padded = storage.padded
        # each part: its array, its padding (None: exact), its length along
        # dim, the view the join reads it through, or None, its run-time
        # offset, the shape read; a view is read inside the join's program,
        # not by a program of its own
        if fused and storage.pending and (view is None or (padded is None and view.elem is None)):
            # recorded as it is: a pending whole storage, or a view of an exact one read in the join
            arr = storage._array
            static, offset = (None, 0) if view is None else (view.static, view.run_offset)
            read = storage.shape if view is None else t.shape
        elif padded is not None:
            r = read_of(t)
            if r is None:
                return None
            # a pending view of a padded storage (a cache's first key, a view of
            # the q/k/v projection) is read in the join recorded with it: its
            # value computed here ran the segment (two programs a layer)
            if fused and storage.pending:
                arr = storage._array
            elif lane and storage._array is None:
                return None
            else:
                arr = storage.computed()
            if r.psize == tuple(t.shape):
                padded = None
            else:
                padded = r.comps
            static, offset = (r.view, r.offset) if r.view is not None else (None, 0)
            read = r.psize if r.view is not None else arr.shape
        elif view is not None and view.elem is None:
            if lane and storage._array is None:
                return None
            arr, static, offset, read = storage.get(), view.static, view.run_offset, t.shape
        elif lane:
            return None  # (read through a program of its own)
        else:
            arr = read_through(storage.get(), view.static, view.run_offset) if view is not None else storage.get()
            static, offset, read = None, 0, arr.shape
        if padded is None:
            layout = tuple([((n, n, False),) for n in t.shape])
        else:
            layout = padded
            if len(padded[dim]) != 1:
                return None  # a merged dim there
            along = along or padded[dim][0][2]
        if layouts and (arr.dtype != arrays[0].dtype or (
                (layout[:dim] != layouts[0][:dim] or layout[dim + 1:] != layouts[0][dim + 1:])  # (every token's cat)
                and (_unpadded_alike(layout[:dim]) != _unpadded_alike(layouts[0][:dim])
                     or _unpadded_alike(layout[dim + 1:]) != _unpadded_alike(layouts[0][dim + 1:])))):
            return None  # other dims that do not line up
        arrays.append(arr)
        lengths.append(t.shape[dim])
        offsets.append(offset)
        views.append(static)
        layouts.append(layout)
        read_along = max(read_along, read[dim])
    if not along:
        return None  # nothing padded along dim
    physical_out = max(_padding.room(total), read_along)
    if physical_out > _padding.MAX_SIZE:
        return None  # its length could not travel as an int32: the exact cat
    key = (tuple([tuple(a.shape) for a in arrays]), dtype_name(arrays[0].dtype), dim, physical_out, tuple(views))
    shape = list(first.shape)
    shape[dim] = total
    padded = list(layouts[0])
    padded[dim] = ((physical_out, total, True),)
    padded = tuple(padded)
    return key, [*arrays, *[_np.int32(n) for n in lengths], *offsets], tuple(shape), _padding.physical_shape(padded), padded


def _join_body(key: tuple) -> Callable:
    """(Traced.) :func:`join`'s program for ``key``: each input placed at
    its run-time offset in a zero bucket of the joined length."""
    shapes, _, dim, physical_out, views = key
    count = len(shapes)

    def body(*inputs):
        import jax.numpy as jnp

        from . import _strided

        arrays = [_strided.read(a, v, off) for a, v, off in zip(inputs[:count], views, inputs[2 * count:])]
        lengths = inputs[count:2 * count]
        shape = list(arrays[0].shape)
        shape[dim] = physical_out
        out = jnp.zeros(tuple(shape), arrays[0].dtype)
        offset = jnp.int32(0)
        for a, n in zip(arrays, lengths):
            if a.shape[dim] == 0:
                continue  # an empty part places nothing (and has nothing to take from)
            out = _placed(a, dim, physical_out, offset, n, out)
            offset = offset + n
        return out
    return body


def _placed(a: Any, dim: int, physical: int, at: Any, count: Any, otherwise: Any) -> Any:
    """(Traced.) ``a`` placed along ``dim`` of a bucket of ``physical``
    from the run-time offset ``at``, its first ``count`` elements there and
    ``otherwise`` around them: the body of every program that moves a
    padded dim's values within a bucket (a join, a slice's gradient, a pad
    at the end)."""
    import jax.numpy as jnp
    from jax import lax

    shape = list(a.shape)
    shape[dim] = physical
    i = lax.broadcasted_iota("int32", tuple(shape), dim)
    index = jnp.clip(jnp.arange(physical, dtype=jnp.int32) - at, 0, a.shape[dim] - 1)
    return jnp.where((i >= at) & (i < at + count), jnp.take(a, index, axis=dim), otherwise)


#: (Traced.) :func:`_placed` for the padded graphs of torch.compile (a join in a graph).
placed_at = _placed

_placing_programs: dict = {}


def place_gradient(grad: Any, sizes: Any, dim: int, start: int, step: int) -> JaxTensor | None:
    """``slice_backward`` of a gradient padded along the sliced ``dim``:
    ``grad`` placed at the slice's ``start`` (a run-time scalar, as is its
    length) in the bucket of ``sizes[dim]``, zeros around it, so that every
    length of a bucket runs one program.  None: not such a call (dynamic
    shapes off, ``grad`` not padded along ``dim`` alone, a view that is not a
    physical one, a step along a padded dim)."""
    if not _config.current().dynamic_shapes or type(grad) is not JaxTensor or type(step) is not int or step < 1:
        return None
    sizes = tuple(sizes)
    ndim = grad.dim()
    if ndim == 0 or len(sizes) != ndim or type(grad._storage.place) is not int:
        return None
    dim %= ndim
    found = padded_values(grad)
    if found is None or found[1] is None:
        return None
    arr, padded = found
    comps = padded[dim]
    n, length = sizes[dim], grad.shape[dim]
    start = min(max(start + n if start < 0 else start, 0), n)
    if length == 0 or start + step * (length - 1) >= n:
        return None
    if comps == ((length, length, False),) and all(sizes[d] == grad.shape[d] for d in range(ndim) if d != dim):
        # sliced along an exact dim (rotary embeddings' halves of the head
        # dim, GPT-J's every other element): zeros around the gradient
        # there, its padding kept elsewhere
        return _placed_along_exact(arr, padded, sizes, dim, start, step, grad)
    if step != 1 or len(comps) != 1 or not comps[0][2]:
        return None  # not padded along dim, or merged there
    # the bucket the input was padded to (odd ones in the test mode "all")
    physical_out = max(_padding.room(n, _config.current().dynamic_shapes == "all"), arr.shape[dim])
    if physical_out > _padding.MAX_SIZE:
        return None  # (as in join)
    index = grad._storage.device_index
    out = _placing_program(arr, dim, physical_out)(arr, _padding.device_scalar(start, index),
                                                   _padding.device_scalar(length, index))
    return _grown(out, sizes, padded, dim, ((physical_out, n, True),), grad)


def _placing_program(arr: Any, dim: int, physical_out: int) -> Any:
    """The program placing an array like ``arr`` along ``dim`` of a bucket
    of ``physical_out`` (:func:`_placed`, zeros around it): ``(array, at,
    count)``, one per shape and bucket."""
    key = (tuple(arr.shape), dtype_name(arr.dtype), dim, physical_out)
    program = _placing_programs.get(key)
    if program is None:
        def body(a, at, count):
            import jax.numpy as jnp

            return _placed(a, dim, physical_out, at, count, jnp.zeros((), a.dtype))

        if len(_placing_programs) > 512:
            _placing_programs.clear()
        program = _placing_programs[key] = _program_cache.Kept("pjrt_host.place_gradient", body, key)
    return program


def select_into_bucket(grad: Any, sizes: Any, dim: int, index: int) -> JaxTensor | None:
    """``select_backward`` of an exact gradient inside a backward whose
    forward input (of ``sizes``) a padded call read padded along ``dim``
    alone: BERT's pooler and its classification heads read ``hidden[:,
    0]``, whose gradient (batch x width) holds no padded dim, while torch's
    ``select_backward`` is keyed by the input's sizes, so every length
    compiled a program.  ``grad`` is placed at ``index`` in that bucket,
    zeros around it, the length a run-time scalar: one program per bucket,
    and the gradient joins the other padded ones as it is.  None where it
    is not such a call."""
    cfg = _config.current()
    if not cfg.dynamic_shapes or type(grad) is not JaxTensor or type(grad._storage.place) is not int:
        return None
    from ._meta import inside_backward

    sizes = tuple(sizes)
    if grad.dim() + 1 != len(sizes) or not inside_backward():
        return None
    physical = _padding.padded_read_of(sizes)
    n = sizes[dim]
    if physical is None or len(physical) != len(sizes) or physical[dim] > _padding.MAX_SIZE \
            or any((p != s) != (d == dim) for d, (p, s) in enumerate(zip(physical, sizes))) \
            or physical[dim] != _padding.room(n, cfg.dynamic_shapes == "all"):
        return None
    from ._tensor import read

    arr = read(grad).reshape(tuple(1 if d == dim else s for d, s in enumerate(sizes)))
    at = grad._storage.device_index
    out = _placing_program(arr, dim, physical[dim])(arr, _padding.device_scalar(index, at),
                                                    _padding.device_scalar(1, at))
    exact = tuple(((s, s, False),) for s in arr.shape)
    return _grown(out, sizes, exact, dim, ((physical[dim], n, True),), grad)


def _placed_along_exact(arr: Any, padded: tuple, sizes: tuple, dim: int, start: int, step: int,
                        grad: JaxTensor) -> JaxTensor:
    """``slice_backward`` of ``grad`` (its padded array ``arr``) along a dim
    it holds exact: ``arr`` at every ``step``-th position from ``start``
    along ``dim``, zeros elsewhere up to ``sizes[dim]``; one program per
    bucket."""
    n = sizes[dim]
    after = n - start - arr.shape[dim]
    key = ("exact", tuple(arr.shape), dtype_name(arr.dtype), dim, start, after, step)
    program = _placing_programs.get(key)
    if program is None:
        widths = tuple((start, after) if d == dim else (0, 0) for d in range(arr.ndim))
        shape = tuple(n if d == dim else s for d, s in enumerate(arr.shape))
        at = tuple(slice(start, start + step * (arr.shape[dim] - 1) + 1, step) if d == dim else slice(None)
                   for d in range(arr.ndim))

        def body(a):
            import jax.numpy as jnp

            if step == 1:
                return jnp.pad(a, widths)
            return jnp.zeros(shape, a.dtype).at[at].set(a)

        if len(_placing_programs) > 512:
            _placing_programs.clear()
        program = _placing_programs[key] = _program_cache.Kept("pjrt_host.place_gradient", body, key)
    return _grown(program(arr), sizes, padded, dim, ((n, n, False),), grad)


def _grown(out: Any, shape: tuple, padded: tuple, dim: int, comps: tuple, like: JaxTensor) -> JaxTensor:
    """The tensor of a program's result ``out``: logical ``shape``, laid
    out as ``padded`` with ``dim`` made of ``comps``, on ``like``'s device."""
    placed = list(padded)
    placed[dim] = comps
    placed = tuple(placed)
    if _padding.physical_shape(placed) == shape:
        placed = None
    _padding.note_padded_call(tuple(out.shape), shape)
    from ._sync import note_result

    index = like._storage.device_index
    note_result(index, out)
    return make(Storage(out, shape, out.dtype, index, like._storage.place, placed), shape, like.dtype)


_growing_programs: dict = {}


def pad_grows(x: Any, pad: Any) -> bool:
    """``constant_pad_nd`` growing one dim of an exact ``x`` at its end
    (``F.pad(labels, (0, 1), value=-100)``: a causal LM's labels, fresh from
    the host at every step): ``x``'s storage is padded along that dim when
    its size took a third size at this place (the line of code), as
    :func:`grows` does for a cat, so that :func:`pad_end` runs it in
    buckets.  True when it was."""
    mode = _config.current().dynamic_shapes
    if not mode or mode == "all" or type(x) is not JaxTensor or x._view is not None \
            or x._storage.padded is not None or _is_parameter(x) or x.dim() == 0:
        return False
    pad = list(pad)
    ndim = x.dim()
    if len(pad) % 2 or len(pad) // 2 > ndim:
        return False
    grown = [(ndim - 1 - k, pad[2 * k], pad[2 * k + 1]) for k in range(len(pad) // 2) if pad[2 * k] or pad[2 * k + 1]]
    if len(grown) != 1 or grown[0][1] != 0 or grown[0][2] <= 0:
        return False
    from ._meta import inside_backward

    if inside_backward():
        return False
    d = grown[0][0]
    if not _padding.changing_dims(("constant_pad_nd", _caller(), d, ndim), (x.shape[d],)):
        return False
    return _pad_storage(x, {d})


def cast_grows(t: Any) -> bool:
    """A cast (``_to_copy`` to another dtype) of an exact ``t`` whose dims
    took a third size at this place (the line of code): ``t``'s storage is
    padded along them, as a factory's result is, so that the cast and what
    reads it run the bucket's programs.  transformers casts each step's
    fresh ``attention_mask`` to bool before any op with a rule reads it:
    that cast compiled at every length.  True when it was."""
    if type(t) is not JaxTensor or t._view is not None or t._storage.padded is not None or t.dim() == 0 \
            or _is_parameter(t):
        return False
    mode = _config.current().dynamic_shapes
    if not mode or mode == "all":
        return False
    from ._meta import inside_backward

    if inside_backward():
        return False
    dims = _padding.changing_dims(("_to_copy", _caller()), tuple(t.shape))
    return bool(dims) and _pad_storage(t, dims)


def move_layout(source: Any, index: int, before: Any) -> tuple:
    """How host tensor ``source``, about to move to device ``index``, is
    laid out there (``before``: the device's result note before the move,
    ``_sync.last_note``): ``(padded, mark)``, with ``padded`` per dim its
    components where a dim took a third size at the line that moves it (a
    training loop's ``batch.to('jax')``, Trainer's and accelerate's own),
    as a factory's result is, so that the ops reading a batch of a new
    length run their bucket's programs from the first, else None; and
    ``mark`` for :func:`moved`, once it is there.  Padded on the host, on
    its way: no copy back from the device (which waited for the device's
    queue, every batch).  A tensor read first by ops that never see its
    sizes change at their own place (T5's and BART's labels, shifted right
    into the decoder's inputs by a ``new_zeros`` and slice writes)
    otherwise stayed exact and compiled at every length.

    The place is the line and the tensor's position in a run of moves there
    with no other device work between them (a batch's dict comprehension:
    its ids, mask and labels each count their own sizes), so that one line
    moving tensors of many shapes at once (a state dict, a list of
    parameters) pads none of them.  Only a tensor whose sizes changed along
    one dim, the others keeping theirs (at most two: a last, short batch),
    is padded: a batch's length changes, not its rank's every dim.
    Parameters and buffers moved by ``module.to()`` are never padded (its
    ``_apply``, which ``_modules`` wraps, is on the stack)."""
    mode = _config.current().dynamic_shapes
    if not mode or mode == "all" or source.dim() == 0 or isinstance(source, torch.nn.Parameter):
        return None, None
    from ._meta import inside_backward
    from ._modules import moving_a_module

    if inside_backward() or moving_a_module():
        return None, None
    place, last = _caller(), _last_move
    # (nothing ran since the last move: the note before this one is its)
    position = last[2] + 1 if last is not None and last[0] == place and last[1] is before else 0
    shape = tuple(source.shape)
    changing = _padding.changing_dims(("to_device", place, position), shape)
    padded = _padding.bucket_layout(shape, changing) if len(changing) == 1 else None
    return padded, (place, index, position)


def moved(mark: Any) -> None:
    """A host tensor :func:`move_layout` gave ``mark`` is on the device:
    the next move at its line, with no device work between, is the next
    position of the run."""
    global _last_move
    if mark is not None:
        from . import _sync

        place, index, position = mark
        _last_move = (place, _sync.last_note(index), position)


_last_move: Any = None


def pad_end(x: Any, pad: Any, value: Any, record: Callable | None = None) -> JaxTensor | None:
    """``constant_pad_nd`` that grows one dim ``x`` holds padded at its end
    (``F.pad(labels, (0, 1), value=-100)``, a causal LM's loss): the values
    past the logical length set to ``value`` in the bucket of the new
    length, the length a run-time scalar, so that every length of a bucket
    runs one program.  None: not such a call.  ``record`` (fused eager): as
    :func:`join`'s, for ``x`` a whole storage (pending or not): the call is
    recorded into the segment instead of running a program of its own."""
    if not _config.current().dynamic_shapes or type(x) is not JaxTensor or type(x._storage.place) is not int:
        return None
    pad = list(pad)
    ndim = x.dim()
    if len(pad) % 2 or len(pad) // 2 > ndim or any(p < 0 for p in pad):
        return None
    grown = [(ndim - 1 - k, pad[2 * k], pad[2 * k + 1]) for k in range(len(pad) // 2) if pad[2 * k] or pad[2 * k + 1]]
    if len(grown) != 1 or grown[0][1] != 0:
        return None  # one dim, grown at its end only
    dim, _, after = grown[0]
    whole = record is not None and x._view is None and x._storage.padded is not None
    found = (x._storage._array, x._storage.padded) if whole else padded_values(x)
    if found is None or found[1] is None:
        return None
    arr, padded = found
    comps = padded[dim]
    if len(comps) != 1 or not comps[0][2]:
        return None
    n = x.shape[dim]
    total = n + after
    # the same bucket while the new length fits it, so that the padded
    # labels line up with the rows they label
    physical_out = arr.shape[dim] if total <= arr.shape[dim] else \
        _padding.room(total, _config.current().dynamic_shapes == "all")
    if physical_out > _padding.MAX_SIZE:
        return None  # (as in join)
    if x.dtype == torch.bool:
        value = bool(value)
    elif not (x.dtype.is_floating_point or x.dtype.is_complex):
        value = int(value)
    else:
        value = float(value)
    key = (tuple(arr.shape), dtype_name(arr.dtype), dim, physical_out, type(value))
    program = _growing_programs.get(key)
    if program is None:
        def body(a, count, v):
            from jax import lax

            return _placed(a, dim, physical_out, 0, count, lax.convert_element_type(v, a.dtype))

        if len(_growing_programs) > 512:
            _growing_programs.clear()
        program = _growing_programs[key] = (body, _program_cache.Kept("pjrt_host.pad_end", body, key))
    body, program = program
    shape = list(x.shape)
    shape[dim] = total
    shape = tuple(shape)
    count = _padding.device_scalar(n, x._storage.device_index)
    if whole:
        placed = list(padded)
        placed[dim] = ((physical_out, total, True),)
        placed = tuple(placed)
        physical = _padding.physical_shape(placed)
        # (a length that fills its bucket, 31 + 1 in 32, is an exact result:
        # recorded too, where it ran a program of its own at every call)
        grown_ = record(body, key, [arr, count, value], shape, physical, placed if physical != shape else None,
                        x.dtype, x._storage.device_index)
        if grown_ is not None:
            _padding.note_padded_call(physical, shape)
            return grown_
        arr = x._storage.computed()
    out = program(arr, count, value)
    return _grown(out, shape, padded, dim, ((physical_out, total, True),), x)


def adopt(dst: JaxTensor, src: JaxTensor) -> bool:
    """``dst.copy_(src)`` where ``src`` is all of a padded storage and
    ``dst`` all of an exact one (itself, or a contiguous view of it of
    ``src``'s shape): ``dst``'s storage takes ``src``'s values laid out as
    they are, its dims' components grouped as its own shape groups them.
    Autograd's ``as_strided`` backward copies a padded gradient into a flat
    zeros of its size (torch's ``adaptive_avg_pool2d`` to 1 restrides its
    output in place: Swin's pooler, ConvNeXt's); the exact copy cut the
    gradient, a program per batch size.  False: not such a copy."""
    storage = src._storage
    into = dst._storage
    if src._view is not None or storage.padded is None or into.padded is not None or src.dtype != dst.dtype \
            or src.shape != dst.shape or type(into.place) is not int or into.place != storage.place \
            or into.read_only is not None or _is_parameter(dst) or into.numel != dst.numel() \
            or dst.storage_offset() != 0 or not dst.is_contiguous():
        return False
    comps = [c for dim in storage.padded for c in dim if c[1] != 1]
    layout: list = []
    i = 0
    for n in into.shape:
        group: list = []
        size = 1
        while size < n and i < len(comps):
            group.append(comps[i])
            size *= comps[i][1]
            i += 1
        if size != n:
            return False
        layout.append(tuple(group) if group else ((1, 1, False),))
    if i != len(comps):
        return False
    layout = tuple(layout)
    physical = _padding.physical_shape(layout)
    arr = storage.computed()  # (a fused-eager result runs its segment)
    if tuple(arr.shape) != physical:
        arr = arr.reshape(physical)
    into.commit(arr)
    into.padded = layout
    _padding.noted_padding()
    return True


#: Backwards of resampling (each sample alone) that take the input's sizes,
#: its batch among them: :func:`whole_batch` runs them.
RESAMPLING_BACKWARDS = frozenset(f"aten::{name}_backward" for name in _RESAMPLINGS)


def whole_batch(g: Any, sizes: Any) -> tuple | None:
    """A gradient ``g`` of an op that computes each sample alone, read
    padded along its batch only (one component), and the op's input ``sizes``
    (its batch first), as the op runs exact over every sample of the
    bucket: ``(g's whole array as an exact tensor, the sizes with the
    bucket's batch, finish)``, where ``finish`` makes the exact result of
    the bucket the padded result of the logical batch (its padding rows are
    computed from padding: unread).  One program per bucket, where the size
    list keyed one per batch and the op cut its gradient (SegFormer's and
    MobileViT's resampling).  None: not such a call."""
    storage = g._storage
    if storage.padded is None or type(storage.place) is not int or g.dim() < 2 \
            or type(sizes) not in (list, tuple) or len(sizes) != g.dim() or sizes[0] != g.shape[0]:
        return None
    r = read_of(g)
    if r is None or len(r.comps[0]) != 1 or not r.comps[0][0][2] \
            or any(len(c) != 1 or c[0][2] for c in r.comps[1:]):
        return None
    first = r.comps[0]
    bucket, n = first[0][0], g.shape[0]
    alias = Storage(None, r.physical, storage.jax_dtype, storage.device_index)
    alias.take(storage)  # (a pending result is shared: its segment goes on recording)
    alias.padded = None
    whole = make(alias, r.physical, g.dtype)
    if g._view is not None:  # (a channel slice of a cat's gradient: SegFormer's decoder)
        whole = torch.ops.aten.as_strided.default(whole, list(r.psize), list(r.pstride), r.offset_elements)
    _padding.note("padded_calls")

    def finish(out: Any) -> Any:
        if type(out) is not JaxTensor or out._view is not None or out.dim() != g.dim() or out.shape[0] != bucket:
            return out[:n]  # (not a result of the whole bucket's layout: its logical rows)
        shape = (n, *out.shape[1:])
        result = Storage(None, shape, out._storage.jax_dtype, out._storage.device_index)
        result.take(out._storage)
        result.padded = (first, *(((k, k, False),) for k in out.shape[1:]))
        return make(result, shape, out.dtype)

    return whole, [bucket, *sizes[1:]], finish


_write_programs: dict = {}


def write(t: JaxTensor, value: Any) -> bool:
    """``t`` (all of a padded storage, or a view of it) given the values of
    ``value`` (a 'jax' tensor, or an array broadcastable to ``t``'s shape)
    in the storage's bucket, the storage staying padded: only the positions
    of ``t``'s logical elements change (a physical view can reach past them
    into another row's: ``x[:, 1:]`` of a padded ``x`` reads a whole bucket
    from column 1), the logical sizes run-time scalars, so that one program
    serves every size of the bucket.  T5's and BART's decoder inputs are
    built by writes into slices of a fresh tensor (``shifted[..., 1:] =
    labels[..., :-1]``): a write cut the storage, and the segment of
    every op after it compiled at every length.  A padded ``value`` laid
    out as ``t``'s view reads is taken as it is; any other is read at its
    logical sizes.  False: not such a write (a view the padding cannot
    describe, or one whose elements overlap; the caller cuts)."""
    storage = t._storage
    if storage.padded is None or type(storage.place) is not int or not _config.current().dynamic_shapes \
            or (t._view is not None and t._view.elem is not None):
        return False
    r = read_of(t)
    if r is None:
        return False
    from . import _strided

    if r.view is not None and _strided.may_overlap(r.psize, r.pstride):
        return False
    shape = tuple(t.shape)
    psize = r.psize
    logical = vstatic = vstorage = None
    voffset = 0
    if type(value) is JaxTensor:
        vr = read_of(value) if value._storage.padded is not None and value._storage.place == storage.place else None
        if vr is not None and all(len(c) == 1 for c in (*r.comps, *vr.comps)):
            # (each dim's logical values at its start: the value's bucket cut
            # or padded to the target's, one program per pair of buckets; the
            # value read through its view inside the write's program)
            logical, vstatic, voffset, vstorage = tuple(value.shape), vr.view, vr.offset, value._storage
            value = vstorage.computed()
        else:
            from ._tensor import read

            value = read(value)  # (merged dims laid out otherwise: cut)
    vshape = tuple(value.shape) if vstorage is None else vr.psize
    if logical is None:
        if t._view is None and any(n != 1 and n != p for n, p in zip(vshape[::-1], psize[::-1])):
            return False  # (all of the storage from an exact value: it takes the value as it is, no program)
        logical = vshape
    if len(vshape) > len(shape):
        return False
    lead = (1,) * (len(shape) - len(vshape))
    vshape, logical = lead + vshape, lead + logical
    # per dim: None (broadcast), or how much of the value to keep and pad
    fit = []
    for d, n in enumerate(logical):
        if n == 1 and shape[d] != 1:
            fit.append(None)
        elif n == shape[d] and len(r.comps[d]) == 1:
            keep = min(vshape[d], psize[d])
            fit.append((keep, psize[d] - keep))
        else:
            # not broadcastable (the caller raises torch's error), or a dim
            # that merges several (x.flatten()): its logical values are not
            # its first positions
            return False
    fit = tuple(fit)
    sizes = [_padding.device_scalar(n, storage.place) for d in r.sizes for n in d]
    key = (_padding.physical_shape(storage.padded), dtype_name(storage.jax_dtype), r.view, psize, r.masks, fit, vshape,
           tuple(value.shape), dtype_name(value.dtype), vstatic)
    storage.check_writable()
    import sys

    from ._tensor import DONATE

    arr = storage.computed()
    donate = DONATE and sys.getrefcount(arr) <= 3 and value is not arr  # (the attribute, arr, the argument)
    program = _write_programs.get((key, donate))
    if program is None:
        if len(_write_programs) > 512:
            _write_programs.clear()
        program = _write_programs[(key, donate)] = _program_cache.Kept(
            "pjrt_host.padded_write", _write_body(r.view, r.masks, psize, vshape, fit, vstatic), (key, donate),
            donate_argnums=(0,) if donate else ())
    padded = storage.padded
    del arr
    new = program(storage.computed(), r.offset, value, voffset, *sizes)
    storage.commit(new)
    storage.padded = padded
    _padding.note("padded_writes")
    return True


def _write_body(static: Any, masks: tuple, psize: tuple, vshape: tuple, fit: tuple, vstatic: Any) -> Callable:
    """The traceable function of a padded write (:func:`write`): ``(storage
    array, view offset, value, value's view offset, *logical sizes)`` ->
    the storage array with the view's logical positions given the value."""
    from . import _strided

    def body(a: Any, off: Any, v: Any, voff: Any, *run_sizes: Any) -> Any:
        import jax.numpy as jnp

        if vstatic is not None:
            v = _strided.read(v, vstatic, voff)
        v = v.astype(a.dtype).reshape(vshape)
        v = v[tuple(slice(None) if f is None else slice(0, f[0]) for f in fit)]
        if any(f is not None and f[1] for f in fit):
            v = jnp.pad(v, [(0, 0) if f is None else (0, f[1]) for f in fit])
        v = jnp.broadcast_to(v, psize)
        mask = _padding.inside(psize, masks, run_sizes)
        if static is None:
            return v if mask is None else jnp.where(mask, v, a)
        # the flat position of each of the view's elements: the view read
        # from the positions themselves
        positions = jnp.arange(a.size, dtype=jnp.int32 if a.size < 2 ** 31 else jnp.int64)
        index = _strided.read(positions.reshape(a.shape), static, off)
        flat = a.reshape(-1)
        if mask is not None:
            index = jnp.where(mask, index, flat.shape[0])  # (past the end: dropped)
        return flat.at[index].set(v, mode="drop").reshape(a.shape)

    return body


def _tensor_args(args: tuple, kwargs: dict, lists: bool = False) -> list:
    """``(position, tensor)`` of the call's 'jax' tensors (with ``lists``,
    those of list arguments too, at their list's position)."""
    found = []
    for pos, v in (*enumerate(args), *kwargs.items()) if kwargs else enumerate(args):
        if type(v) is JaxTensor:
            found.append((pos, v))
        elif lists and (type(v) is list or type(v) is tuple):
            found += [(pos, x) for x in v if type(x) is JaxTensor]
    return found


def pad_marked(args: tuple, kwargs: dict) -> bool:
    """Dims ``torch._dynamo.mark_dynamic`` marked on an input that is
    padded along others (a padded call's miss): its storage is laid out
    wider along them too, as :func:`on_miss` pads an exact one's.  True
    when one was."""
    widened = False
    for _, t in _tensor_args(args, kwargs):
        marked = getattr(t, "_dynamo_dynamic_indices", None)
        if marked and t._view is None and t._storage.padded is not None and not _is_parameter(t):
            widened |= _padding.pad_more(t._storage, {d for d in marked if d < t.dim()})
    return widened


def _pad_storage(t: JaxTensor, dims: set, odd: bool = False, padding: tuple | None = None) -> bool:
    """Pad ``t``'s storage along ``dims`` to their buckets (or as
    ``padding``, one dim's components): a tensor that is its whole storage,
    on one device, computed; else nothing."""
    if t._view is not None:
        return False
    return _padding.pad_storage(t._storage, dims, odd, padding)


def logical_shapes(op: Any, key: tuple, args: tuple, kwargs: dict) -> list | None:
    """The logical shapes of a padded call's results (None for a result that
    is not a tensor; None in all: torch cannot say), from torch's meta
    kernel at the call's logical sizes -- which also raises torch's error
    where those sizes do not fit -- once per key and sizes."""
    sizes = tuple(tuple(t.shape) for _, t in _tensor_args(args, kwargs, lists=True))
    memo = op.logical
    found = memo.get((key, sizes), memo)
    if found is not memo:
        return found
    from . import _meta

    known, out = _meta.run_meta(op.meta_op, args, kwargs)
    if not known:
        shapes = None
    else:
        outs = out if isinstance(out, (tuple, list)) else (out,)
        shapes = [tuple(o.shape) if isinstance(o, torch.Tensor) else None for o in outs]
    if len(memo) > 4096:
        memo.clear()
    memo[(key, sizes)] = shapes
    return shapes
