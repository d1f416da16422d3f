"""torch.nn's transformer fast paths, as torch's CPU kernels compute them
(aten/src/ATen/native/transformers): ``_native_multi_head_attention``
(nn.MultiheadAttention in eval without grad), ``_transformer_encoder_layer_fwd``
(nn.TransformerEncoderLayer likewise) and ``_masked_softmax``.

torch takes these paths for every device it lists -- cpu, cuda, xpu and the
PrivateUse1 backend, which is 'jax' -- so they must run here with CPU's
rules: the mask is read as bool (True: masked, a float mask is nonzero
where masked), ``mask_type`` 0 is an attention mask [L, S], 1 a key padding
mask [B, S], 2 a mask of the scores' shape; a row with every key masked
gives zero weights (the fast path's rule, where the slow path gives NaN).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from . import lowering
from .ops_nn import _layer_norm, _matmul
from .ops_pointwise import gelu


def _mask_for(scores, mask, mask_type):
    """The bool mask broadcast to ``scores`` [B, H, L, S] (True: masked)."""
    mask = mask.astype(jnp.bool_) if mask.dtype != jnp.bool_ else mask
    if mask_type == 1 and scores.ndim == 4:
        mask = mask[:, None, None, :]  # [B, S]: key padding
    return jnp.broadcast_to(mask, scores.shape)


def _softmax_masked(scores, mask, mask_type, axis=-1):
    if mask is not None:
        scores = jnp.where(_mask_for(scores, mask, mask_type), -jnp.inf, scores)
    return jax.nn.softmax(scores, axis=axis)  # every key masked: NaN, as torch's CPU kernel gives


@lowering("aten::_masked_softmax")
def masked_softmax(x, mask, dim=None, mask_type=None):
    return _softmax_masked(x, mask, mask_type, -1 if dim is None else dim)


def _attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias, mask,
               need_weights, average_attn_weights, mask_type):
    d = embed_dim
    dh = d // num_head
    w_q, w_k, w_v = qkv_weight[:d], qkv_weight[d:2 * d], qkv_weight[2 * d:]
    b_q, b_k, b_v = qkv_bias[:d], qkv_bias[d:2 * d], qkv_bias[2 * d:]

    def heads(x, w, b):  # [B, T, D] -> [B, H, T, dh]
        y = _matmul(x, w.T) + b
        return y.reshape(y.shape[0], y.shape[1], num_head, dh).transpose(0, 2, 1, 3)

    # torch's _transform_bias_rescale_qkv: q scaled by 1/sqrt(dh) before the product
    q = heads(query, w_q, b_q) / math.sqrt(dh)
    k = heads(key, w_k, b_k)
    v = heads(value, w_v, b_v)
    scores = _matmul(q, k.transpose(0, 1, 3, 2))
    weights = _softmax_masked(scores, mask, mask_type).astype(q.dtype)
    ctx = _matmul(weights, v)  # [B, H, T, dh]
    ctx = ctx.transpose(0, 2, 1, 3).reshape(ctx.shape[0], ctx.shape[2], d)
    out = _matmul(ctx, proj_weight.T) + proj_bias
    if not need_weights:
        # Empty, as torch's meta kernel says (graphs); eagerly the device
        # returns None, CPU's undefined tensor (_meta.run_meta).
        return out, jnp.zeros((0,), out.dtype)
    return out, (jnp.sum(weights, axis=1) / num_head if average_attn_weights else weights)


@lowering("aten::_native_multi_head_attention")
def native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
                                proj_bias, mask=None, need_weights=True, average_attn_weights=True,
                                mask_type=None):
    if query.size == 0:
        return jnp.zeros(query.shape, query.dtype), jnp.zeros((0,), query.dtype)
    return _attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias, mask,
                      need_weights, average_attn_weights, mask_type)


@lowering("aten::_transformer_encoder_layer_fwd")
def transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                  use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2,
                                  norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None,
                                  mask_type=None):
    if src.size == 0:
        return src

    def norm(x, w, b):
        return _layer_norm(x, (embed_dim,), w, b, eps)[0]

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = _attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, False, True,
                   mask_type)[0]
    x = x + src
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    residual = x
    if norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    h = _matmul(x, ffn_weight_1.T) + ffn_bias_1
    h = gelu(h) if use_gelu else jnp.maximum(h, 0)
    x = _matmul(h, ffn_weight_2.T) + ffn_bias_2 + residual
    if not norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    return x
