"""Kernels on the device's autograd key: composite ops whose 'jax' form
differs from torch's own before they decompose (a composite op decomposes
there, before reaching the device).  Registered inside ``import torch``: no
jax."""

from __future__ import annotations

import logging

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


def _sdpa_checked(*args, **kwargs):
    """scaled_dot_product_attention's own composite kernel (the math
    formulation on this device), after the check that sdpa_kernel allows
    the math backend: torch asks no backend choice of a PrivateUse1 device
    without a C++ stub (``_sdpa``)."""
    from .. import _sdpa

    _sdpa.check_backends()
    return torch.ops.aten.scaled_dot_product_attention.default.decompose(*args, **kwargs)


#: Composite ops whose 'jax' form checks argument values first.
CHECKED_COMPOSITE_OPS = (("one_hot", _one_hot_checked), ("scaled_dot_product_attention", _sdpa_checked))


def register(aten: torch.library.Library) -> None:
    """Register both tables' kernels in ``aten`` on AutogradPrivateUse1."""
    for name, kernel in DENSE_GRADIENT_OPS + CHECKED_COMPOSITE_OPS:
        try:
            aten.impl(name, kernel, "AutogradPrivateUse1")
        except Exception as err:
            logger.debug("no AutogradPrivateUse1 kernel for aten::%s: %s", name, err)
