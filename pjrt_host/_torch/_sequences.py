"""``torch.nn.utils.rnn``'s packing on the device, as torch ops.

``_pack_padded_sequence(input, lengths, batch_first)`` keeps, for each time
step ``t``, the first ``batch_sizes[t]`` sequences' rows; ``lengths`` and
``batch_sizes`` live on the CPU (torch's rule on every device).  CPU's own
kernel runs on a stand-in of the input's first two dimensions: it checks
the lengths with CPU's errors and computes ``batch_sizes``; the device then
gathers the kept rows in one ``index_select``.  The backward puts the
gradient's rows back with one ``index_copy`` into zeros.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["HANDLERS"]


def _rows(batch_sizes: list[int], batch: int) -> list[int]:
    """The rows of a time-major (T * B, ...) input that packing keeps, in order."""
    return [t * batch + b for t, size in enumerate(batch_sizes) for b in range(size)]


def _pack_padded_sequence(args: tuple, kwargs: dict) -> Any:
    names = ("input", "lengths", "batch_first")
    x, lengths, batch_first = (args[i] if i < len(args) else kwargs[n] for i, n in enumerate(names))
    # CPU's kernel on a stand-in: its checks and errors (lengths on the CPU,
    # sorted, positive, as many as the batch), and batch_sizes.
    # (through torch's public function: the same CPU kernel)
    stand_in = torch.zeros(tuple(x.shape[:2]), dtype=torch.float32)
    batch_sizes = torch.nn.utils.rnn.pack_padded_sequence(stand_in, lengths, batch_first=batch_first).batch_sizes
    steps = x.transpose(0, 1) if batch_first else x
    batch = steps.shape[1]
    flat = steps.reshape(steps.shape[0] * batch, *steps.shape[2:])
    index = torch.tensor(_rows(batch_sizes.tolist(), batch), dtype=torch.int64, device=x.device)
    return torch.ops.aten.index_select.default(flat, 0, index), batch_sizes


def _pack_padded_sequence_backward(args: tuple, kwargs: dict) -> Any:
    names = ("grad", "input_size", "batch_sizes", "batch_first")
    grad, input_size, batch_sizes, batch_first = (args[i] if i < len(args) else kwargs[n]
                                                  for i, n in enumerate(names))
    size = [int(s) for s in input_size]
    steps, batch = (size[1], size[0]) if batch_first else (size[0], size[1])
    index = torch.tensor(_rows(batch_sizes.tolist(), batch), dtype=torch.int64, device=grad.device)
    zeros = torch.zeros((steps * batch, *size[2:]), dtype=grad.dtype, device=grad.device)
    out = torch.ops.aten.index_copy.default(zeros, 0, index, grad).view(steps, batch, *size[2:])
    return out.transpose(0, 1) if batch_first else out


HANDLERS = {
    "aten::_pack_padded_sequence": _pack_padded_sequence,
    "aten::_pack_padded_sequence_backward": _pack_padded_sequence_backward,
}
