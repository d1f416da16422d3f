"""``torch.autocast('jax')``: the ops that run in the autocast dtype or in
float32, as torch's cuda lists have them; every other op passes through
unchanged (``_kernels`` registers the fallthrough).  Registered inside
``import torch``: no jax."""

from __future__ import annotations

import logging
from typing import Callable

import torch

from .._devices import DEVICE_NAME
from ._kernels import aten_op, never_traced

__all__ = ["AUTOCAST_FP32_OPS", "AUTOCAST_OPS", "register"]

logger = logging.getLogger(__name__)

# Ops that run in the autocast dtype under torch.autocast('jax') (torch's
# "lower precision" list).
AUTOCAST_OPS = (
    "mm", "bmm", "matmul", "addmm", "addbmm", "baddbmm", "linear", "conv1d", "conv2d", "conv3d",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "prelu",
    "_scaled_dot_product_attention_math", "scaled_dot_product_attention", "chain_matmul", "addmv", "mv",
)

# Ops that run in float32 under torch.autocast('jax') when given float16 /
# bfloat16 inputs: torch's "fp32" autocast list for cuda (ops whose range or
# accumulation a 16-bit type would spoil: exp/log family, norms, softmax,
# losses, reductions).
AUTOCAST_FP32_OPS = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm", "group_norm",
    "frobenius_norm.dim", "nuclear_norm", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss",
    "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss",
    "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "softmax.int", "log_softmax.int", "cross_entropy_loss", "prod", "prod.dim_int", "sum", "sum.dim_IntList",
    "cumsum", "cumprod", "norm.Scalar", "norm.ScalarOpt_dim", "linalg_vector_norm",
)

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def register(aten: torch.library.Library) -> None:
    """Register the autocast kernels of both lists in ``aten``."""
    for names, to_float32 in ((AUTOCAST_OPS, False), (AUTOCAST_FP32_OPS, True)):
        for name in names:
            try:
                aten.impl(name, _autocast_kernel(name, to_float32), "AutocastPrivateUse1")
            except Exception as err:  # a renamed overload must not stop the device
                logger.debug("no AutocastPrivateUse1 kernel for aten::%s: %s", name, err)


def _autocast_kernel(name: str, to_float32: bool = False) -> Callable:
    op = None
    key = torch._C.DispatchKey.AutocastPrivateUse1

    def kernel(*args, **kwargs):
        nonlocal op
        if op is None:
            op = aten_op(name)
        dtype = torch.float32 if to_float32 else torch.get_autocast_dtype(DEVICE_NAME)

        def cast(v):
            if isinstance(v, torch.Tensor) and v.is_floating_point() and v.device.type == DEVICE_NAME and (
                    not to_float32 or v.dtype in _LOW_PRECISION):
                return v.to(dtype)
            if isinstance(v, (list, tuple)):
                return type(v)(cast(x) for x in v)
            return v

        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(key)):
            return op(*cast(args), **{k: cast(v) for k, v in kwargs.items()})

    kernel.__name__ = f"jax_autocast_{name.replace('.', '_')}"
    return never_traced(kernel)
