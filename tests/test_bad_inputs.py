"""Inputs torch CPU refuses are refused on 'jax' with CPU's exception type and
text, never answered with values (NaN, inf, a zero row, a silent cast).

Value-dependent refusals (a probability, a class, a singular matrix) come
at the next synchronisation point by default, naming the op, or at the op
itself with ``checks='sync'``; dtype refusals come at the call."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

import pjrt_host  # noqa: E402

F = torch.nn.functional

NAN, INF = float("nan"), float("inf")

def _ctc(d, inputs, labels, lengths=None, reduction="mean"):
    """CTC loss of 6 steps, 2 sequences, 4 classes, targets 3 wide; the
    lengths as device tensors (or ``lengths(values)``)."""
    log_probs = torch.linspace(-3, 0, 48).view(6, 2, 4).log_softmax(2).to(d).requires_grad_()
    targets = torch.tensor([[1, 2, 3], [3, 1, 2]], device=d)
    as_lengths = lengths or (lambda v: torch.tensor(v, device=d))
    loss = F.ctc_loss(log_probs, targets, as_lengths(inputs), as_lengths(labels), reduction=reduction)
    loss.sum().backward()
    return torch.cat([loss.detach().reshape(-1).cpu(), log_probs.grad.reshape(-1).cpu()])


CASES = {
    # an empty table's embedding is index_select's refusal on CPU (RuntimeError), not "index out of range"
    "embedding of an empty table past its rows": lambda d: F.embedding(torch.tensor([3], device=d),
                                                                       torch.zeros(2, 0, device=d)),
    # a class target out of range (a wrong class count): the loss was NaN or wrong
    "cross_entropy target too large": lambda d: F.cross_entropy(torch.zeros(2, 3, device=d), torch.tensor([0, 5], device=d)),
    "cross_entropy negative target": lambda d: F.cross_entropy(torch.zeros(2, 3, device=d), torch.tensor([-1, 0], device=d)),
    "cross_entropy target of another ignore_index": lambda d: F.cross_entropy(
        torch.zeros(2, 3, device=d), torch.tensor([-100, 1], device=d), ignore_index=2),
    "nll_loss 2d target too large": lambda d: F.nll_loss(torch.zeros(1, 3, 2, 2, device=d),
                                                         torch.tensor([[[0, 1], [2, 3]]], device=d)),
    "nll_loss of a 1-D input": lambda d: F.nll_loss(torch.zeros(3, device=d), torch.tensor(4, device=d)),
    "bincount negative": lambda d: torch.bincount(torch.tensor([2, -1], device=d)),
    "repeat_interleave of a negative count": lambda d: torch.repeat_interleave(torch.tensor([1, 2], device=d),
                                                                            torch.tensor([1, -1], device=d)),
    "masked_scatter of too few sources": lambda d: torch.zeros(2, 3, device=d).masked_scatter(
        torch.tensor([True, False, True], device=d), torch.ones(3, device=d)),
    # CTC lengths past the input or the targets: the loss was inf or a finite value
    "ctc_loss input length past the input": lambda d: _ctc(d, [7, 6], [3, 3]),
    "ctc_loss negative input length": lambda d: _ctc(d, [6, -1], [3, 3]),
    "ctc_loss negative target length": lambda d: _ctc(d, [6, 6], [3, -2]),
    "ctc_loss target length past the targets": lambda d: _ctc(d, [6, 6], [4, 3]),
    "ctc_loss input length past the input, as a list": lambda d: _ctc(d, [7, 6], [3, 3], list),
    "segment_reduce lengths short of the data": lambda d: torch.segment_reduce(
        torch.arange(6.0, device=d), "sum", lengths=torch.tensor([2, 3], device=d)),
    "segment_reduce negative length": lambda d: torch.segment_reduce(
        torch.arange(6.0, device=d), "sum", lengths=torch.tensor([3, -1, 4], device=d)),
    "segment_reduce decreasing offsets": lambda d: torch.segment_reduce(
        torch.arange(6.0, device=d), "sum", offsets=torch.tensor([0, 4, 2, 6], device=d)),
    "embedding_bag offsets not from 0": lambda d: F.embedding_bag(
        torch.tensor([1, 2, 4, 5], device=d), torch.ones(10, 3, device=d), torch.tensor([1, 3], device=d)),
    "embedding_bag offsets past the indices": lambda d: F.embedding_bag(
        torch.tensor([1, 2, 4, 5], device=d), torch.ones(10, 3, device=d), torch.tensor([0, 5], device=d)),
    "embedding_bag decreasing offsets": lambda d: F.embedding_bag(
        torch.tensor([1, 2, 4, 5], device=d), torch.ones(10, 3, device=d), torch.tensor([0, 3, 1], device=d)),
    "poisson of a negative rate": lambda d: torch.poisson(torch.tensor([1.0, -1.0], device=d)),
    # attention's own op takes only what torch accepts; the rest, torch's errors
    "sdpa of a mask that does not broadcast": lambda d: F.scaled_dot_product_attention(
        torch.ones(2, 3, 4, 8, device=d), torch.ones(2, 3, 5, 8, device=d), torch.ones(2, 3, 5, 6, device=d),
        attn_mask=torch.ones(3, 3, dtype=torch.bool, device=d)),
    "sdpa of mixed dtypes": lambda d: F.scaled_dot_product_attention(
        torch.ones(2, 4, 8, device=d), torch.ones(2, 5, 8, dtype=torch.float64, device=d), torch.ones(2, 5, 6, device=d)),
    "sdpa gqa of heads that do not divide": lambda d: F.scaled_dot_product_attention(
        torch.ones(1, 3, 4, 8, device=d), torch.ones(1, 2, 5, 8, device=d), torch.ones(1, 2, 5, 6, device=d),
        enable_gqa=True),
    # a sorter index outside the sequence: a clipped read gave a position
    "searchsorted sorter past the sequence": lambda d: torch.searchsorted(
        torch.tensor([3.0, 1.0, 2.0], device=d), torch.tensor([1.5, 2.5], device=d),
        sorter=torch.tensor([1, 2, 3], device=d)),
    "searchsorted negative sorter": lambda d: torch.searchsorted(
        torch.tensor([3.0, 1.0, 2.0], device=d), torch.tensor(2.5, device=d), sorter=torch.tensor([1, 2, -1], device=d)),
    # a range that is not finite, or upside down: the counts were of whatever bins that made
    "histc of an infinite range": lambda d: torch.histc(torch.tensor([0.5, 1.5], device=d), bins=4, min=0, max=INF),
    "histogram of an infinite range": lambda d: torch.histogram(torch.tensor([0.5, 1.5], device=d), bins=4,
                                                                range=(0.0, INF)),
    "histogram of a range upside down": lambda d: torch.histogram(torch.tensor([0.5, 1.5], device=d), bins=4,
                                                                  range=(3.0, 1.0)),
    "cholesky out= expanded": lambda d: torch.cholesky(torch.eye(3, device=d),
                                                       out=torch.zeros(1, 1, device=d).expand(3, 3)),
    "histogramdd of an infinite range": lambda d: torch.histogramdd(
        torch.tensor([[0.1, 1.0], [0.2, 2.0]], device=d), bins=[2, 2], range=[0.0, 1.0, 0.0, INF]),
    "histogramdd of a range upside down": lambda d: torch.histogramdd(
        torch.tensor([[0.1, 1.0], [0.2, 2.0]], device=d), bins=[2, 2], range=[0.0, 1.0, 3.0, 1.0]),
    "multinomial of more draws than categories": lambda d: torch.multinomial(torch.tensor([0.5, 0.5], device=d), 3),
    "arange beyond int64": lambda d: torch.arange(0, 1e20, device=d),
    # dtypes CPU's (and cuda's) kernels have no code for: the device computed float16 and
    # complex, and jax refused bool and int64 in its own words
    "ctc_loss of float16": lambda d: F.ctc_loss(torch.zeros(6, 2, 4, dtype=torch.float16, device=d),
                                                torch.tensor([[1, 2], [2, 1]], device=d),
                                                torch.tensor([6, 6], device=d), torch.tensor([2, 2], device=d)),
    "ctc_loss of int64": lambda d: F.ctc_loss(torch.zeros(6, 2, 4, dtype=torch.int64, device=d),
                                              torch.tensor([[1, 2], [2, 1]], device=d),
                                              torch.tensor([6, 6], device=d), torch.tensor([2, 2], device=d)),
    "segment_reduce of int64": lambda d: torch.segment_reduce(torch.ones(4, dtype=torch.int64, device=d), "sum",
                                                              lengths=torch.tensor([2, 2], device=d)),
    "segment_reduce of complex": lambda d: torch.segment_reduce(torch.ones(4, dtype=torch.complex64, device=d), "max",
                                                                lengths=torch.tensor([2, 2], device=d)),
    # an FFT of an empty tensor: CPU's MKL plan refuses it, jnp returned an empty result
    "fft of an empty batch": lambda d: torch.fft.fft(torch.empty(0, 5, device=d)),
    "rfft2 of an empty tensor": lambda d: torch.fft.rfft2(torch.empty(3, 0, 4, device=d)),
    "irfft of an empty tensor": lambda d: torch.fft.irfft(torch.empty(0, 4, dtype=torch.complex64, device=d)),
    "ifftn of an empty tensor": lambda d: torch.fft.ifftn(torch.empty(2, 0, dtype=torch.complex64, device=d)),
    # integer division by zero: CPU's kernels refuse it, jax gives -1, 0 or the dividend
    "floor_divide of ints by a zero tensor": lambda d: torch.tensor([1, 2], device=d) // torch.tensor([1, 0], device=d),
    "remainder of ints by 0": lambda d: torch.tensor([1, 2], device=d) % 0,
    "fmod_ of uint8 by a zero tensor": lambda d: torch.tensor([1, 2], dtype=torch.uint8, device=d).fmod_(
        torch.tensor([0, 1], dtype=torch.uint8, device=d)),
    "div trunc of ints by a zero tensor": lambda d: torch.div(torch.tensor([1], device=d), torch.tensor([0], device=d),
                                                              rounding_mode="trunc"),
    # sizes that do not fit, in CPU's words (the meta kernels' differ): large calls by
    # their text, small ones by CPU's kernel run at the call's sizes
    "linear of widths that do not chain": lambda d: F.linear(torch.ones(64, 784, device=d), torch.ones(10, 700, device=d)),
    "cat of sizes that do not match": lambda d: torch.cat([torch.ones(64, 300, device=d), torch.ones(64, 301, device=d)]),
    "grouped conv of another channel count": lambda d: F.conv2d(torch.ones(1, 6, 4, 4, device=d),
                                                                torch.ones(4, 2, 3, 3, device=d), groups=2),
    "stack of unequal sizes": lambda d: torch.stack([torch.ones(2, device=d), torch.ones(3, device=d)]),
    "topk of more than there are": lambda d: torch.ones(3, device=d).topk(5),
    "cross_entropy of a 2-D class-index target": lambda d: F.cross_entropy(torch.ones(4, 10, device=d),
                                                                          torch.zeros(4, 9, dtype=torch.long, device=d)),
    # shapes that do not broadcast: CPU's TensorIterator text, not the meta kernel's
    "add of shapes that do not broadcast": lambda d: torch.ones(2, 3, 4, device=d) + torch.ones(3, 5, device=d),
    "where of shapes that do not broadcast": lambda d: torch.where(torch.ones(3, device=d) > 0, torch.ones(3, device=d),
                                                                   torch.ones(4, device=d)),
    # a negative integer exponent of an integer base (jax computes 0)
    "pow int by negative int": lambda d: torch.pow(torch.arange(1, 4, device=d), -3),
    "foreach pow int by negative int": lambda d: torch._foreach_pow([torch.arange(1, 4, device=d)], -2),
    # an in-place foreach step whose results the int tensors cannot hold
    "foreach div_ of int tensors by floats": lambda d: torch._foreach_div_([torch.ones(2, dtype=torch.long, device=d)],
                                                                           [2.0]),
    "foreach mul_ of an int tensor by a float": lambda d: torch._foreach_mul_(
        [torch.ones(2, device=d), torch.ones(2, dtype=torch.long, device=d)], 0.5),
    "foreach pow int by a negative list item": lambda d: torch._foreach_pow(
        [torch.arange(1, 4, device=d), torch.arange(2, device=d)], [2, -1]),
    "add out= int": lambda d: torch.add(torch.ones(2, device=d), 1, out=torch.empty(2, dtype=torch.long, device=d)),
    "sub out= bool": lambda d: torch.sub(torch.ones(2, device=d), 1, out=torch.empty(2, dtype=torch.bool, device=d)),
    "mul out= int from int*float": lambda d: torch.mul(torch.ones(2, dtype=torch.long, device=d), 0.5,
                                                       out=torch.empty(2, dtype=torch.long, device=d)),
    "mm out= long": lambda d: torch.mm(torch.ones(1, 2, device=d), torch.ones(2, 1, device=d),
                                       out=torch.empty(1, 1, dtype=torch.long, device=d)),
    "cat out= long": lambda d: torch.cat([torch.ones(1, 2, device=d)] * 2,
                                         out=torch.empty(2, 2, dtype=torch.long, device=d)),
    "solve singular": lambda d: torch.linalg.solve(torch.zeros(2, 2, device=d), torch.ones(2, device=d)),
    "solve batch, one singular": lambda d: torch.linalg.solve(
        torch.stack([torch.eye(3, device=d), torch.ones(3, 3, device=d)]), torch.ones(2, 3, device=d)),
    "cholesky not positive-definite": lambda d: torch.linalg.cholesky(
        torch.tensor([[4.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 1.0]], device=d)),
    "cholesky negative": lambda d: torch.linalg.cholesky(-torch.eye(2, device=d)),
    "inv singular": lambda d: torch.linalg.inv(torch.zeros(2, 2, device=d)),
    "inverse singular": lambda d: torch.inverse(torch.tensor([[1.0, 2.0], [2.0, 4.0]], device=d)),
    "multinomial negative": lambda d: torch.multinomial(torch.tensor([0.5, -0.1, 0.6], device=d), 1),
    "multinomial nan": lambda d: torch.multinomial(torch.tensor([0.5, float("nan")], device=d), 1),
    "multinomial inf": lambda d: torch.multinomial(torch.tensor([0.5, float("inf")], device=d), 1),
    "multinomial all zero": lambda d: torch.multinomial(torch.zeros(2, 3, device=d), 1),
    "one_hot negative": lambda d: F.one_hot(torch.tensor([0, -1], device=d), 3),
    "one_hot too big": lambda d: F.one_hot(torch.tensor([0, 5], device=d), 3),
    "one_hot empty, classes unknown": lambda d: F.one_hot(torch.tensor([], dtype=torch.long, device=d)),
    "one_hot int32": lambda d: F.one_hot(torch.tensor([1], dtype=torch.int32, device=d), 3),
    # values torch's kernels read and refuse (deferred to the next synchronisation on the device)
    "svd of NaN": lambda d: torch.linalg.svdvals(torch.tensor([[1.0, NAN], [0.0, 1.0]], device=d)),
    "matrix_rank of NaN": lambda d: torch.linalg.matrix_rank(torch.tensor([[1.0, NAN], [0.0, 1.0]], device=d)),
    "eigh of NaN in the lower triangle": lambda d: torch.linalg.eigvalsh(
        torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [NAN, 0.0, 1.0]], device=d)),
    "pinv of NaN": lambda d: torch.linalg.pinv(torch.tensor([[1.0, NAN], [0.0, 1.0]], device=d)),
    "eig of NaN": lambda d: torch.linalg.eig(torch.tensor([[1.0, NAN], [0.0, 1.0]], device=d)),
    "old cholesky of NaN": lambda d: torch.cholesky(torch.tensor([[1.0, 0.0], [NAN, 1.0]], device=d)),
    "old cholesky not positive-definite": lambda d: torch.cholesky(-torch.eye(2, device=d)),
    "bernoulli p NaN": lambda d: torch.bernoulli(torch.tensor([0.5, NAN], device=d)),
    "bernoulli p above 1": lambda d: torch.bernoulli(torch.tensor([0.5, 1.5], device=d)),
    "normal std NaN": lambda d: torch.normal(torch.zeros(2, device=d), torch.tensor([1.0, NAN], device=d)),
    "normal std negative": lambda d: torch.normal(0.0, torch.tensor([1.0, -1.0], device=d)),
    "binary_cross_entropy input NaN": lambda d: F.binary_cross_entropy(torch.tensor([0.5, NAN], device=d),
                                                                       torch.ones(2, device=d)),
    "binary_cross_entropy target above 1": lambda d: F.binary_cross_entropy(torch.tensor([0.5, 0.5], device=d),
                                                                            torch.tensor([1.0, 2.0], device=d)),
    "assert_async false": lambda d: torch._assert_async(torch.tensor(0, device=d)),
    "assert_async message": lambda d: torch._assert_async(torch.tensor(False, device=d), "my message"),
    # dtypes and scalar parameters torch CPU's kernels refuse where its meta kernels do not
    "abs of bool": lambda d: torch.abs(torch.ones(2, dtype=torch.bool, device=d)),
    "addmm int64 and float": lambda d: torch.addmm(torch.ones(2, 2, device=d), torch.ones(2, 2, device=d),
                                                   torch.ones(2, 2, dtype=torch.long, device=d)),
    "sub of bool": lambda d: torch.ones(2, device=d) - torch.ones(2, dtype=torch.bool, device=d),
    "fmax complex": lambda d: torch.fmax(torch.ones(2, dtype=torch.complex64, device=d),
                                         torch.ones(2, dtype=torch.complex64, device=d)),
    "floor complex": lambda d: torch.floor(torch.ones(2, dtype=torch.complex64, device=d)),
    "normal_ negative std": lambda d: torch.ones(3, device=d).normal_(0, -1),
    "uniform_ from > to": lambda d: torch.ones(3, device=d).uniform_(3, -1),
    "uniform_ of int64": lambda d: torch.ones(3, dtype=torch.long, device=d).uniform_(),
    # writes into a tensor whose elements share memory
    "abs out= expanded": lambda d: torch.abs(torch.ones(3, device=d), out=torch.zeros(1, device=d).expand(3)),
    "add_ on expanded": lambda d: torch.zeros(1, device=d).expand(3).add_(1),
    "uniform_ on expanded": lambda d: torch.zeros(1, device=d).expand(3).uniform_(),
    "copy_ into expanded": lambda d: torch.zeros(1, device=d).expand(3).copy_(torch.ones(3)),
    "cumsum out= expanded": lambda d: torch.cumsum(torch.ones(3, device=d), 0, out=torch.zeros(1, device=d).expand(3)),
    # a view scatter's src of another shape than the slice
    "diagonal_scatter src too long": lambda d: torch.diagonal_scatter(torch.zeros(3, 4, device=d),
                                                                      torch.ones(4, device=d)),
    "select_scatter src too short": lambda d: torch.select_scatter(torch.zeros(3, 4, device=d),
                                                                   torch.ones(3, device=d), 0, 1),
    "max of empty": lambda d: torch.max(torch.ones(0, device=d)),
    "max over a dim of complex": lambda d: torch.max(torch.ones(2, dtype=torch.complex64, device=d), 0),
    "masked_select float mask": lambda d: torch.masked_select(torch.ones(2, device=d), torch.ones(2, device=d)),
    "masked_select shapes": lambda d: torch.masked_select(torch.ones(2, 3, device=d),
                                                          torch.ones(2, 4, dtype=torch.bool, device=d)),
    "conv2d bias of another length": lambda d: F.conv2d(torch.ones(1, 3, 6, 6, device=d),
                                                        torch.ones(3, 3, 3, 3, device=d), torch.ones(4, device=d)),
    "conv2d negative padding": lambda d: F.conv2d(torch.ones(1, 3, 6, 6, device=d), torch.ones(3, 3, 3, 3, device=d),
                                                  padding=-1),
    "conv_transpose2d output_padding too large": lambda d: F.conv_transpose2d(
        torch.ones(1, 3, 6, 6, device=d), torch.ones(3, 3, 3, 3, device=d), output_padding=3),
    "interpolate nearest of no channels": lambda d: F.interpolate(torch.zeros(2, 0, 4, device=d), size=6),
    "interpolate nearest of no width": lambda d: F.interpolate(torch.zeros(0, 3, 0, device=d), size=6),
    "soft_margin_loss target longer than input": lambda d: F.soft_margin_loss(torch.ones(1, device=d),
                                                                              torch.ones(2, device=d)),
    "roll of an empty tensor, more shifts than dims": lambda d: torch.zeros(0, 2, device=d).roll((1, 2), (0,)),
    "cross_entropy of a 1-D input, target of two": lambda d: F.cross_entropy(torch.randn(4, device=d),
                                                                             torch.tensor([1, 2], device=d)),
    "index_select index of two dims": lambda d: torch.index_select(torch.zeros(3, 2, device=d), 0,
                                                                   torch.tensor([[0, 1], [1, 2]], device=d)),
    "slice_scatter src broadcast": lambda d: torch.slice_scatter(torch.zeros(3, 4, device=d),
                                                                 torch.ones(3, 1, device=d), 1, 0, 4, 2),
    # CPU names an index by its place among the given ones, not by the dim it
    # indexes (x[:, :, i] out of range: "dimension 0")
    "index along the last dim out of range": lambda d: torch.zeros(2, 4, 3, device=d)[:, :, torch.tensor([5], device=d)],
    "index after a mask out of range": lambda d: torch.zeros(2, 4, 3, device=d)[
        torch.tensor([True, False], device=d), :, torch.tensor([-4], device=d)],
    "index_put_ along the last dim out of range": lambda d: torch.zeros(2, 4, 3, device=d).index_put_(
        (torch.tensor([0], device=d), torch.tensor([1], device=d), torch.tensor([3], device=d)),
        torch.tensor(1.0, device=d)),
}

# Where CPU accepts: the device gives CPU's values (the checks must not refuse these).
GOOD = {
    "ctc_loss with lengths within bounds": lambda d: _ctc(d, [6, 4], [3, 0]),
    # lengths in CPU tensors, as cuda users pass them ('mean' divides by them
    # in torch's composite for tensor subclasses: torch's mixed-device error)
    "ctc_loss with CPU length tensors": lambda d: _ctc(d, [6, 4], [3, 1], torch.tensor, "sum"),
    "segment_reduce lengths with an empty segment": lambda d: torch.segment_reduce(
        torch.arange(6.0, device=d), "sum", lengths=torch.tensor([2, 0, 4], device=d)),
    "segment_reduce offsets not from 0 and short of the data": lambda d: torch.segment_reduce(
        torch.arange(6.0, device=d), "sum", offsets=torch.tensor([1, 3, 5], device=d)),
    "embedding_bag of every row, 2-d": lambda d: F.embedding_bag(
        torch.tensor([[0, 9], [3, 3]], device=d), torch.arange(30.0, device=d).view(10, 3)),
    "searchsorted with a sorter": lambda d: torch.searchsorted(
        torch.tensor([3.0, 1.0, 2.0], device=d), torch.tensor([1.5, 2.5, 9.0], device=d), right=True,
        sorter=torch.tensor([1, 2, 0], device=d)),
    "histc of the input's own range": lambda d: torch.histc(torch.tensor([0.5, 1.5, 3.0], device=d), bins=4),
    "histc of a given range over infinite values": lambda d: torch.histc(
        torch.tensor([0.5, INF, NAN], device=d), bins=4, min=0, max=2),
    "histogram of the input's own range": lambda d: torch.histogram(
        torch.tensor([0.5, 1.5, 3.0], device=d), bins=3)[0],
    "lstsq of a finite A": lambda d: torch.linalg.lstsq(torch.eye(3, 2, device=d), torch.ones(3, 1, device=d)).solution,
    "embedding_bag with an empty bag": lambda d: F.embedding_bag(
        torch.tensor([1, 2, 4, 5], device=d), torch.arange(30.0, device=d).view(10, 3), torch.tensor([0, 2, 2], device=d)),
    # targets equal to ignore_index lie outside the classes and are skipped
    "cross_entropy ignore_index targets": lambda d: F.cross_entropy(
        torch.arange(6.0, device=d).view(2, 3), torch.tensor([-100, 2], device=d)),
    "nll_loss 2d ignore_index 255": lambda d: F.nll_loss(torch.zeros(1, 3, 2, 2, device=d),
                                                         torch.tensor([[[0, 255], [2, 1]]], device=d), ignore_index=255),
    "bincount with minlength": lambda d: torch.bincount(torch.tensor([0, 3, 3], device=d), minlength=6),
    "masked_scatter of as many sources as ones": lambda d: torch.zeros(2, 3, device=d).masked_scatter(
        torch.tensor([True, False, True], device=d), torch.arange(4.0, device=d)),
    "repeat_interleave with a zero count": lambda d: torch.repeat_interleave(torch.tensor([1, 2], device=d),
                                                                          torch.tensor([0, 2], device=d)),
    # an empty signal that n= pads first is no empty FFT
    "fft of an empty dim padded by n": lambda d: torch.fft.fft(torch.empty(5, 0, device=d), n=4),
    # integer division by zero of no elements: CPU's kernels divide nothing and raise nothing
    "remainder of empty ints by 0": lambda d: torch.empty(0, dtype=torch.long, device=d) % 0,
    "take_along_dim of empty tensors": lambda d: torch.take_along_dim(
        torch.empty(0, 5, device=d), torch.empty(0, 5, dtype=torch.long, device=d), 1),
    "floor_divide of empty ints by a zero tensor": lambda d: torch.empty(0, 2, dtype=torch.long, device=d) // torch.tensor(
        [0, 1], device=d),
    # division by zero with a float result is inf, as on CPU
    "true division of ints by zero": lambda d: torch.tensor([1, 2], device=d) / torch.tensor([1, 0], device=d),
    "floor_divide of floats by zero": lambda d: torch.tensor([1.0, 2.0], device=d) // torch.tensor([1.0, 0.0], device=d),
    "remainder of ints by a float zero": lambda d: torch.tensor([1, 2], device=d) % 0.0,
    "eigh of NaN in the triangle it does not read": lambda d: torch.linalg.eigvalsh(
        torch.tensor([[1.0, 0.0, NAN], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], device=d)),
    "add out= float from int": lambda d: torch.add(torch.ones(2, dtype=torch.long, device=d), 1,
                                                   out=torch.empty(2, device=d)),
    "sum out= long from float (reductions cast)": lambda d: torch.sum(torch.ones(1, 2, device=d), 0,
                                                                     out=torch.empty(2, dtype=torch.long, device=d)),
    "add out= resized": lambda d: torch.add(torch.ones(2, device=d), 1, out=torch.empty(0, device=d)),
    "cholesky": lambda d: torch.linalg.cholesky(torch.tensor([[4.0, 2.0], [2.0, 3.0]], device=d)),
    "cholesky empty": lambda d: torch.linalg.cholesky(torch.empty(0, 0, device=d)),
    "solve": lambda d: torch.linalg.solve(torch.tensor([[2.0, 1.0], [1.0, 3.0]], device=d), torch.ones(2, device=d)),
    "inv": lambda d: torch.linalg.inv(torch.tensor([[2.0, 1.0], [1.0, 3.0]], device=d)),
    "inv_ex reports without raising": lambda d: torch.linalg.inv_ex(torch.zeros(2, 2, device=d)).info,
    "cholesky_ex reports without raising": lambda d: torch.linalg.cholesky_ex(-torch.eye(2, device=d)).info,
    "multinomial": lambda d: torch.multinomial(torch.tensor([0.0, 1.0, 0.0], device=d), 2, replacement=True),
    "one_hot": lambda d: F.one_hot(torch.tensor([0, 2, 1], device=d)),
    "one_hot classes given": lambda d: F.one_hot(torch.tensor([[0], [2]], device=d), 4),
    "one_hot empty": lambda d: F.one_hot(torch.tensor([], dtype=torch.long, device=d), 3),
    "assert_async true": lambda d: torch._assert_async(torch.tensor(True, device=d), "fine"),
    "add out= resized to 0-dim": lambda d: torch.add(torch.tensor(1.0, device=d), torch.tensor(2.0, device=d),
                                                     out=torch.empty(4, device=d)),
    "fill_ on expanded": lambda d: torch.zeros(1, device=d).expand(3).fill_(2),
    "zero_ on expanded": lambda d: torch.ones(1, device=d).expand(3).zero_(),
    # CPU's out= kernels of these factories are fill_, which takes an expanded out=
    "ones out= expanded": lambda d: torch.ones(3, out=torch.zeros(1, device=d).expand(3)),
    "zeros out= expanded": lambda d: torch.zeros(2, 3, out=torch.ones(1, 1, device=d).expand(2, 3)),
    "full out= expanded": lambda d: torch.full((3,), 2.5, out=torch.zeros(1, device=d).expand(3)),
    "cholesky of (0, 5)": lambda d: torch.cholesky(torch.ones(0, 5, device=d)),
    "diagonal_scatter": lambda d: torch.diagonal_scatter(torch.zeros(3, 4, device=d), torch.ones(2, device=d), 2),
    "normal_ of float": lambda d: torch.zeros(3, device=d).normal_(0, 0).add(1),
    # torch's meta kernel of nearest upsampling refused any empty input with a TypeError
    "interpolate nearest of an empty batch": lambda d: F.interpolate(torch.zeros(0, 3, 4, 4, device=d), size=6),
    "interpolate nearest-exact of an empty batch": lambda d: F.interpolate(torch.zeros(0, 3, 4, device=d), size=6,
                                                                           mode="nearest-exact"),
    "soft_margin_loss bool target": lambda d: F.soft_margin_loss(torch.tensor([0.5, -1.0], device=d),
                                                                 torch.tensor([True, False], device=d), reduction="none"),
    # torch's kernels return early for an empty input, before reading dims or squareness
    "roll of an empty tensor along an out-of-range dim": lambda d: torch.zeros(0, 0, 0, device=d).roll(1, 3),
    "pinv hermitian of an empty non-square matrix": lambda d: torch.linalg.pinv(torch.zeros(0, 5, device=d),
                                                                                hermitian=True),
    # torch's kernels promote indices and offsets to their common dtype before checking it
    "embedding_bag bool indices, int64 offsets": lambda d: F.embedding_bag(
        torch.tensor([True, False, True], device=d), torch.arange(10.0, device=d).view(5, 2),
        torch.tensor([0, 2], device=d)),
    "embedding_bag int32 indices, bool offsets": lambda d: F.embedding_bag(
        torch.tensor([1, 4, 2], dtype=torch.int32, device=d), torch.arange(10.0, device=d).view(5, 2),
        torch.tensor([False, True], device=d), mode="max"),
    # a window of no taps: torch's kernels give -inf, indexed at the window's start
    "fractional_max_pool2d kernel size <= 0": lambda d: torch.ops.aten.fractional_max_pool2d(
        torch.arange(81.0, device=d).view(1, 1, 9, 9), [-5, 2], [2, 2], torch.full((1, 1, 2), 0.5, device=d))[1],
    "fractional_max_pool3d kernel size <= 0": lambda d: torch.ops.aten.fractional_max_pool3d(
        torch.arange(125.0, device=d).view(1, 5, 5, 5), [2, 0, 2], [2, 2, 2], torch.full((1, 1, 3), 0.5, device=d))[0],
    # ATen's kernel reads a mask of any dtype by its truth (torch's decomposition wants bool)
    "_unsafe_masked_index int64 mask": lambda d: torch.ops.aten._unsafe_masked_index(
        torch.arange(6.0, device=d).view(2, 3), torch.tensor([[1], [0]], device=d),
        [torch.tensor([[0], [1]], device=d)], -1.0),
    "_unsafe_masked_index_put_accumulate float mask": lambda d: torch.ops.aten._unsafe_masked_index_put_accumulate(
        torch.zeros(3, device=d), torch.tensor([2.0, 0.0], device=d), [torch.tensor([0, 2], device=d)],
        torch.ones(2, device=d)),
    # CPU's kernels touch no element of an empty tensor, so they check no index
    # value (fuzz run N, seeds 13001886 and 13002141); each raised on 'jax'
    "index an empty tensor out of range": lambda d: torch.zeros(1, 0, device=d)[torch.tensor([0, 1], device=d)],
    "index an empty 3-d tensor out of range": lambda d: torch.zeros(1, 2, 0, device=d)[
        torch.tensor([1, -3], device=d)],
    "index an empty slice out of range": lambda d: torch.zeros(2, 3, device=d)[:, :0][torch.tensor([5], device=d)],
    "index_put_ into an empty tensor out of range": lambda d: torch.zeros(2, 0, device=d).index_put_(
        (torch.tensor([5], device=d),), torch.tensor(1.0, device=d)),
    "setitem into an empty tensor out of range": lambda d: _setitem(torch.zeros(2, 0, device=d),
                                                                    torch.tensor([5], device=d), 1.0),
    "index_copy_ into an empty tensor out of range": lambda d: torch.zeros(1, 0, device=d).index_copy_(
        0, torch.tensor([3], device=d), torch.zeros(1, 0, device=d)),
    "index_fill_ of an empty tensor out of range": lambda d: torch.zeros(1, 0, device=d).index_fill_(
        0, torch.tensor([3], device=d), 1.0),
    # torch accepts an empty index of any rank: the lowerings of scatter raised
    # IndexError for one of fewer dims than self (fuzz run N, seed 13006320:
    # gather's gradient)
    "scatter an empty 1-d index into a 2-d tensor": lambda d: torch.ones(2, 3, device=d).scatter_add(
        1, torch.tensor([], dtype=torch.long, device=d), torch.ones(0, device=d)),
    "gather's gradient through an empty 1-d index": lambda d: _gather_grad_of_empty(d),
}


def _gather_grad_of_empty(d):
    x = torch.ones(2, 0, device=d, requires_grad=True)
    torch.gather(x.movedim(0, -1), 1, torch.tensor([], dtype=torch.long, device=d)).sum().backward()
    return x.grad


def _setitem(x, index, value):
    x[index] = value
    return x


def _outcome(fn, device):
    try:
        result = fn(device)
        if isinstance(result, torch.Tensor):
            result = result.cpu()
        else:
            torch.jax.synchronize() if device == "jax" else None
        return ("value", result)
    except Exception as err:  # noqa: BLE001 - the exception is what is compared
        return ("raised", type(err), str(err))


@pytest.mark.parametrize("mode", [True, "sync"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_device_refuses_what_cpu_refuses(case, mode):
    want = _outcome(CASES[case], "cpu")
    assert want[0] == "raised", f"CPU accepts {case}: not a bad input"
    with pjrt_host.config(checks=mode):
        got = _outcome(CASES[case], "jax")
    assert got[0] == "raised", f"{case}: 'jax' returned {got[1]} where CPU raised {want[1].__name__}: {want[2]}"
    assert issubclass(got[1], want[1]) or got[1].__name__ == want[1].__name__, (case, got, want)
    # LAPACK's own error code (where its iteration stopped) is CPU's alone
    text = want[2].split("\n")[0].split(" (error code:")[0]
    assert got[2].startswith(text), f"{case}: {got[2]!r} is not CPU's {text!r}"


# Where CPU raises with values the device's check cannot carry in its
# verdict (the input's own least and greatest values; MKL's argument
# number): the same exception type, a message that starts alike.
CASES_IN_OTHER_WORDS = {
    "histc of an input holding inf": (lambda d: torch.histc(torch.tensor([0.5, INF], device=d), bins=4),
                                      "torch.histc: range of [min, max] of the input is not finite"),
    "histc of an input holding NaN": (lambda d: torch.histc(torch.tensor([0.5, NAN], device=d), bins=4, min=1, max=1),
                                      "torch.histc: range of [min, max] of the input is not finite"),
    "histogram of an input holding inf": (
        lambda d: torch.histogram(torch.tensor([0.5, -INF], device=d), bins=4),
        "torch.histogramdd: dimension 0's range [min, max] of the input is not finite"),
    "histogramdd of an input holding NaN in its second column": (
        lambda d: torch.histogramdd(torch.tensor([[0.5, 1.0], [0.2, NAN]], device=d), bins=[2, 2]),
        "torch.histogramdd: dimension 1's range [min, max] of the input is not finite"),
    # CPU names the index's position too, or (its path for 1-d indices with
    # offsets) says "Expected i < index_size"
    "embedding_bag of an index past the table": (
        lambda d: F.embedding_bag(torch.tensor([[1, 12]], device=d), torch.ones(10, 3, device=d)),
        "Index of input takes value 12 which is not in the valid range [0, 10)"),
    "embedding_bag of a negative index with offsets": (
        lambda d: F.embedding_bag(torch.tensor([1, -2, 4], device=d), torch.ones(10, 3, device=d),
                                  torch.tensor([0, 2], device=d)),
        "Index of input takes value -2 which is not in the valid range [0, 10)"),
    "embedding_bag of an index past the table with offsets": (
        lambda d: F.embedding_bag(torch.tensor([1, 2, 12], device=d), torch.ones(10, 3, device=d),
                                  torch.tensor([0, 2], device=d)),
        "Index of input takes value 12 which is not in the valid range [0, 10)"),
    "lstsq of a NaN in A": (lambda d: torch.linalg.lstsq(torch.tensor([[1.0, NAN], [3.0, 4.0], [5.0, 6.0]], device=d),
                                                         torch.ones(3, 1, device=d)).solution,
                            "torch.linalg.lstsq: A has illegal value: it holds NaN"),
    "lstsq of a NaN in B": (lambda d: torch.linalg.lstsq(torch.eye(3, 2, device=d),
                                                         torch.full((3, 1), NAN, device=d)).solution,
                            "torch.linalg.lstsq: B has illegal value: it holds NaN"),
}


@pytest.mark.parametrize("mode", [True, "sync"])
@pytest.mark.parametrize("case", sorted(CASES_IN_OTHER_WORDS))
def test_the_device_refuses_what_cpu_refuses_in_its_own_words(case, mode):
    fn, text = CASES_IN_OTHER_WORDS[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = _outcome(fn, "cpu")
    if want[0] != "raised":  # lstsq: MKL refuses NaN as an illegal argument; other LAPACKs solve
        pytest.skip(f"this build's CPU kernel accepts {case}")
    with pjrt_host.config(check_indices=mode):
        got = _outcome(fn, "jax")
    assert got[0] == "raised" and got[1] is want[1], (case, got, want)
    assert got[2].startswith(text), got[2]
    assert ("found at the next synchronisation point" in got[2]) == (mode is True)


@pytest.mark.parametrize("case", sorted(GOOD))
def test_the_device_accepts_what_cpu_accepts(case):
    want = _outcome(GOOD[case], "cpu")
    got = _outcome(GOOD[case], "jax")
    assert want[0] == got[0] == "value", (case, got, want)
    if isinstance(want[1], torch.Tensor):
        torch.testing.assert_close(got[1], want[1], equal_nan=True)


def test_a_value_check_names_the_op_when_found_later():
    probs = torch.tensor([0.5, -1.0], device="jax")
    draw = torch.multinomial(probs, 1)  # no wait for the device here
    with pytest.raises(RuntimeError, match=r"element < 0 \(raised by aten::multinomial on jax:0, found at the next"):
        draw.cpu()
    torch.ones(2, device="jax").cpu()  # reported once: the device keeps working


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_checks_sync_waits_for_a_verdict_still_being_computed(eager):
    """``checks='sync'`` raises at the op even when the rates are the end of
    a product the device is still computing: a verdict not yet ready is no
    pass (it was, so a negative Poisson rate sometimes drew)."""
    big = torch.ones(1000, 1000, device="jax")
    with pjrt_host.config(eager=eager), pjrt_host.config(checks="sync"):
        for _ in range(3):
            rates = torch.tensor([1.0, -1.0], device="jax") + (big @ big @ big).sum() * 0
            with pytest.raises(RuntimeError, match=r"^invalid Poisson rate, expected rate to be non-negative$"):
                torch.poisson(rates)


def test_checks_off_gives_the_unchecked_values():
    with pjrt_host.config(checks=False):
        row = F.one_hot(torch.tensor([-1], device="jax"), 3).cpu()
    assert row.tolist() == [[0, 0, 0]]


def test_a_jax_refusal_is_a_torch_error_naming_the_op():
    """Arguments torch's meta kernel lets through but jax refuses (glu of a
    bool tensor, which torch CPU refuses in its kernel; too large for the
    CPU probe to copy, and 1-element tensors do not fit glu) are never jax's
    TypeError: a RuntimeError names the op and says what to do."""
    with pytest.raises(RuntimeError, match=r"aten::glu: jax cannot compute this call .*TypeError: logistic"):
        F.glu(torch.ones(2, 1 << 15, dtype=torch.bool, device="jax")).cpu()


def test_histc_of_integers_bins_them_as_an_accelerator_does():
    """torch CPU refuses histc of integers, its CUDA kernel bins them, and
    transformers' mixture-of-experts routing calls it with int32 expert
    indices on every device but the CPU: 'jax' takes CUDA's side (the
    counts CPU gives the same values as floats, in the input's dtype)."""
    with pytest.raises(NotImplementedError, match="histogram_cpu"):
        torch.histc(torch.tensor([0, 1], dtype=torch.int32), bins=2, min=0, max=1)
    for dtype in (torch.int32, torch.int64, torch.uint8):
        values = torch.tensor([0, 1, 1, 3, 2, 2, 2, 7], dtype=dtype)
        for bins, lo, hi in ((4, 0, 3), (3, 0, 0), (8, 0, 7)):
            got = torch.histc(values.to("jax"), bins=bins, min=lo, max=hi)
            assert got.dtype == dtype
            assert got.cpu().tolist() == torch.histc(values.float(), bins=bins, min=lo, max=hi).long().tolist()


def test_cpu_refusals_are_found_at_the_calls_own_sizes():
    """torch CPU's kernel refusals that its meta kernels let through are
    torch CPU's errors: found by running the call once per signature on CPU
    zeros of its own sizes and strides (glu of bool: 1-element tensors do
    not fit glu; an out= of another dtype than gather's own; an overlapping
    write that only some kernels refuse), and at the op as a whole where
    torch decomposes it (log_softmax of bool)."""
    with pytest.raises(NotImplementedError, match=r'"glu_cpu" not implemented for \'Bool\''):
        F.glu(torch.ones(4, 4, dtype=torch.bool, device="jax"))
    x, i = torch.randn(3, 4, device="jax"), torch.zeros(3, 4, dtype=torch.long, device="jax")
    with pytest.raises(RuntimeError, match="Expected out tensor to have dtype float, but got long int instead"):
        torch.gather(x, 1, i, out=torch.empty(3, 4, dtype=torch.long, device="jax"))
    with pytest.raises(NotImplementedError, match=r"\"log_softmax_lastdim_kernel_impl\" not implemented for 'Bool'"):
        torch.log_softmax(torch.ones(3, dtype=torch.bool, device="jax"), 0)
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        torch.zeros(1, device="jax").expand(4).add_(1)
    # torch CPU's masked_fill_ writes into an expanded self without complaint
    mask = torch.tensor([True, True, True, True])
    want = torch.zeros(1).expand(4).masked_fill_(mask, 2.0)
    got = torch.zeros(1, device="jax").expand(4).masked_fill_(mask.to("jax"), 2.0)
    assert got.cpu().tolist() == want.tolist()


def test_cpu_answers_where_torch_decomposes_or_reorders_the_op():
    """Where the device runs an op through torch's decomposition, another
    op's form or a factory, CPU's answers stand: the meta kernel's refusal
    with CPU's exception type (index_copy_'s IndexError), an out= list of
    another dtype (split_with_sizes_copy), an out= of another shape resized,
    not broadcast into (isin), a factory's out= (ones), an in-place op whose
    functional form takes its arguments in another order (polygamma_)."""
    x = torch.zeros(3, 4, device="jax")
    with pytest.raises(IndexError, match="Number of indices"):
        x.index_copy_(0, torch.tensor([0], device="jax"), torch.ones(2, 4, device="jax"))
    with pytest.raises(RuntimeError, match="Expected out tensor to have dtype float, but got long int instead"):
        torch.split_with_sizes_copy(torch.randn(4, device="jax"), [2, 2],
                                    out=[torch.empty(2, dtype=torch.long, device="jax") for _ in range(2)])
    out = torch.empty(7, dtype=torch.bool, device="jax")
    with pytest.warns(UserWarning, match="was resized"):
        torch.isin(torch.arange(4, device="jax"), torch.tensor([1, 3], device="jax"), out=out)
    assert out.cpu().tolist() == [False, True, False, True]
    assert torch.ones(2, 3, out=torch.empty(2, 3, device="jax")).cpu().tolist() == [[1.0] * 3] * 2
    got = torch.tensor([1.0, 2.0], device="jax").polygamma_(1)
    torch.testing.assert_close(got.cpu(), torch.tensor([1.0, 2.0]).polygamma_(1))
    with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
        torch.tensor([1, 2], device="jax").polygamma_(1)


def test_views_beyond_their_storage_and_promotions_are_cpus():
    """as_strided beyond its storage is torch's setStorage error (meta
    tensors do not check it); solve_triangular promotes its operands as CPU
    does."""
    with pytest.raises(RuntimeError, match=r"setStorage: sizes \[2\], strides \[1\], storage offset 3, and "
                                           r"itemsize 4 requiring a storage size of 20 are out of bounds"):
        torch.zeros(4, device="jax")[2:].as_strided((2,), (1,), 3)
    assert torch.zeros(4, device="jax")[2:].as_strided((2,), (1,), 2).cpu().tolist() == [0.0, 0.0]
    a, b = torch.tensor([[2.0, 0.0], [1.0, 3.0]]), torch.tensor([[1, 2], [3, 4]])
    got = torch.linalg.solve_triangular(a.to("jax"), b.to("jax"), upper=False)
    torch.testing.assert_close(got.cpu(), torch.linalg.solve_triangular(a, b, upper=False))


def test_random_factories_refuse_what_cpu_refuses():
    """Random factories refuse the dtypes and bounds CPU's kernels refuse
    (rand of bool, randn_like of bool, randint_like with high < low)."""
    with pytest.raises(NotImplementedError, match=r"\"check_uniform_bounds\" not implemented for 'Bool'"):
        torch.rand(3, dtype=torch.bool, device="jax")
    with pytest.raises(NotImplementedError, match=r"\"normal_kernel_cpu\" not implemented for 'Bool'"):
        torch.randn_like(torch.zeros(3, dtype=torch.bool, device="jax"))
    with pytest.raises(RuntimeError, match=r"random_ expects 'from' to be less than 'to'"):
        torch.randint_like(torch.zeros(3, device="jax"), -2)


def test_an_out_form_whose_meta_kernel_sizes_a_buffer_gives_cpus_values():
    """log_sigmoid's out= runs log_sigmoid_forward with an empty buffer,
    which its meta kernel sizes and the device's lowering does not: the
    results are copied all the same (it returned None)."""
    x = torch.randn(5)
    out = torch.empty(5, device="jax")
    torch._C._nn.log_sigmoid(x.to("jax"), out=out)
    torch.testing.assert_close(out.cpu(), torch._C._nn.log_sigmoid(x))


def test_an_ops_own_refusal_comes_before_its_index_check():
    """The index check of embedding reads the weight's first size: with a
    weight of no dimensions, torch CPU's "'weight' must be 2-D" is the
    answer, not the check's own IndexError."""
    with pytest.raises(RuntimeError, match="'weight' must be 2-D"):
        F.embedding(torch.tensor([0, 1], device="jax"), torch.tensor(2.0, device="jax"))
    with pjrt_host.config(checks="sync"):
        with pytest.raises(IndexError, match="index out of range in self"):
            F.embedding(torch.tensor([0, 5], device="jax"), torch.randn(3, 2, device="jax"))


@pytest.mark.parametrize("op", [torch.ops.aten.native_batch_norm.out, torch.ops.aten._native_batch_norm_legit.out])
def test_batch_norms_out_forms_are_cpus(op):
    """The out= forms of batch norm write their three results into the out=
    tensors (resized where their shape differs) and update the running
    statistics in training, as CPU does (native_batch_norm.out left the out=
    tensors untouched; _native_batch_norm_legit.out had no lowering); an out=
    of another dtype is CPU's refusal."""
    x, w, b = torch.randn(4, 3, 5), torch.randn(3), torch.randn(3)

    def run(device):
        rm, rv = torch.zeros(3, device=device), torch.ones(3, device=device)
        outs = [torch.empty(60, device=device), torch.empty(3, device=device), torch.empty(0, device=device)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the resize's deprecation warning
            op(x.to(device), w.to(device), b.to(device), rm, rv, True, 0.1, 1e-5,
               out=outs[0], save_mean=outs[1], save_invstd=outs[2])
        return [t.cpu() for t in (*outs, rm, rv)]

    for got, want in zip(run("jax"), run("cpu")):
        torch.testing.assert_close(got, want)
    j = lambda t: t.to("jax")  # noqa: E731
    with pytest.raises(RuntimeError, match="expected scalar type Float but found Long"):
        op(j(x), j(w), j(b), torch.zeros(3, device="jax"), torch.ones(3, device="jax"), True, 0.1, 1e-5,
           out=torch.empty(4, 3, 5, dtype=torch.long, device="jax"), save_mean=torch.empty(3, device="jax"),
           save_invstd=torch.empty(3, device="jax"))


def test_grid_samplers_refuse_unknown_modes():
    """torch CPU's grid sampler kernels take an unknown interpolation or
    padding mode without checking and return their output uninitialised;
    torch's decomposition of 2-d sampling refuses them, and 3-d sampling on
    the device refuses them alike (it raised NotImplementedError calling
    mode 5 bicubic, and computed an unknown padding mode as zeros)."""
    x, grid = torch.randn(1, 1, 3, 3, 3, device="jax"), torch.zeros(1, 2, 2, 2, 3, device="jax")
    with pytest.raises(RuntimeError, match="Invalid interpolation mode 5"):
        torch.grid_sampler_3d(x, grid, 5, 0, False)
    with pytest.raises(RuntimeError, match="Invalid padding mode -1"):
        torch.grid_sampler_3d(x, grid, 0, -1, False)
    with pytest.raises(RuntimeError, match="Invalid interpolation mode 4"):
        torch.grid_sampler_2d(torch.randn(1, 1, 3, 3, device="jax"), torch.zeros(1, 2, 2, 2, device="jax"), 4, 0, False)
