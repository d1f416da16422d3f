"""The fused optimizer steps: ``_fused_adam``, ``_fused_adamw``,
``_fused_sgd`` and ``_fused_adagrad``, which ``torch.optim`` calls with
``fused=True`` (transformers' Trainer by default: ``adamw_torch_fused``).

torch lists the privateuse1 device among those with fused kernels
(``torch.utils._foreach_utils._get_fused_kernels_supported_devices``), so
an optimizer built with ``fused=True`` on 'jax' parameters calls the
in-place ``aten::_fused_adamw_`` & co.  These are the functional forms: the
dispatcher runs the in-place op through them and writes each returned list
back into the lists it was given (params, grads, states), as it does for the
``_foreach_*`` ops.  One call is one compiled program over all the
parameters of a device and dtype, where the foreach path is a dozen.

The arithmetic is torch's CUDA / CPU fused kernels' (``FusedAdamKernel``,
``FusedSGDKernel``, ``FusedAdagradKernel``):

- ``grad_scale``: each gradient is divided by it first, and the unscaled
  gradient is what the op writes back into ``grads`` (GradScaler relies on
  it); without it the gradients are returned as they came.
- ``found_inf`` nonzero: nothing changes -- params, gradients and states
  come back as they were (the kernels return before touching them).  The
  optimizer itself takes the step count back (``_foreach_sub_``).
- ``state_steps`` hold the step already counted by the optimizer
  (``_foreach_add_`` before the call); the kernels only read them.
- the float hyper-parameters may arrive traced (the engine traces an op's
  float arguments once they keep changing, as a learning-rate schedule
  makes them), so nothing here branches on their values.
"""

from __future__ import annotations

import jax.numpy as jnp

from . import lowering


def _scalar(x, dtype):
    """A float hyper-parameter (Python float, traced float, 0-dim or (1,)
    array: ``tensor_lr``) as a 0-dim array of ``dtype``.  A Python float
    is rounded to ``dtype`` as a traced one is, so that the program
    compiled with the value as a constant and the one taking it traced
    (the engine compares the two before it keeps the traced one) compute
    the same numbers."""
    return jnp.reshape(jnp.asarray(x), ()).astype(dtype)


def _unscale(grads, grad_scale):
    if grad_scale is None:
        return grads
    scale = jnp.reshape(grad_scale, ())
    return [(g / scale.astype(g.dtype)).astype(g.dtype) for g in grads]


def _skip(found_inf, new, old):
    """``new`` unless ``found_inf`` is nonzero: then ``old`` (lists of arrays)."""
    if found_inf is None:
        return new
    found = jnp.reshape(found_inf, ()) != 0
    return [jnp.where(found, o, n) for n, o in zip(new, old)]


def _adam(decoupled, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1, beta2,
          weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
    if not params:
        return [], [], [], [], []
    unscaled = _unscale(grads, grad_scale)
    new_p, new_m, new_v, new_vmax = [], [], [], []
    for i, (p, g, m, v, step) in enumerate(zip(params, unscaled, exp_avgs, exp_avg_sqs, state_steps)):
        dtype = p.dtype
        lr_ = _scalar(lr, dtype)
        wd = _scalar(weight_decay, dtype)
        if maximize:
            g = -g
        if decoupled:
            p = jnp.where(wd != 0, p - lr_ * wd * p, p)
        else:
            g = jnp.where(wd != 0, g + wd * p, g)
        m = m + (g - m) * (1 - _scalar(beta1, dtype))  # exp_avg.lerp_(grad, 1 - beta1)
        v = v * _scalar(beta2, dtype) + (1 - _scalar(beta2, dtype)) * g * g
        step = jnp.reshape(step, ()).astype(jnp.float32)
        bias_correction1 = (1 - jnp.power(jnp.asarray(beta1, jnp.float32), step)).astype(dtype)
        bias_correction2_sqrt = jnp.sqrt(1 - jnp.power(jnp.asarray(beta2, jnp.float32), step)).astype(dtype)
        if amsgrad:
            vmax = jnp.maximum(max_exp_avg_sqs[i], v)
            new_vmax.append(vmax)
            denom = jnp.sqrt(vmax) / bias_correction2_sqrt + _scalar(eps, dtype)
        else:
            denom = jnp.sqrt(v) / bias_correction2_sqrt + _scalar(eps, dtype)
        p = p - (lr_ / bias_correction1) * m / denom
        new_p.append(p.astype(dtype))
        new_m.append(m.astype(dtype))
        new_v.append(v.astype(dtype))
    new_vmax = [x.astype(o.dtype) for x, o in zip(new_vmax, max_exp_avg_sqs)] if amsgrad else list(max_exp_avg_sqs)
    return (_skip(found_inf, new_p, params), _skip(found_inf, unscaled, grads), _skip(found_inf, new_m, exp_avgs),
            _skip(found_inf, new_v, exp_avg_sqs), _skip(found_inf, new_vmax, max_exp_avg_sqs))


@lowering("aten::_fused_adam.default", "aten::_fused_adam.tensor_lr", traced_scalars=True)
def fused_adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, **kw):
    """Adam with L2 weight decay (added to the gradient)."""
    return _adam(False, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, **kw)


@lowering("aten::_fused_adamw.default", "aten::_fused_adamw.tensor_lr", traced_scalars=True)
def fused_adamw(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, **kw):
    """AdamW: decoupled weight decay (``param *= 1 - lr * weight_decay``)."""
    return _adam(True, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, **kw)


@lowering("aten::_fused_sgd.default", "aten::_fused_sgd.tensor_lr", traced_scalars=True)
def fused_sgd(params, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening, nesterov, maximize,
              is_first_step, grad_scale=None, found_inf=None):
    """SGD; with momentum (``momentum_buffer_list`` not empty) the buffer
    starts as the gradient on the first step (``is_first_step``: the
    optimizer passes buffers of ``empty_like``), else
    ``momentum * buf + (1 - dampening) * grad``; nesterov adds
    ``momentum * buf`` to the gradient instead of replacing it."""
    if not params:
        return [], [], []
    unscaled = _unscale(grads, grad_scale)
    with_momentum = len(momentum_buffer_list) > 0
    new_p, new_buf = [], []
    for i, (p, g) in enumerate(zip(params, unscaled)):
        dtype = p.dtype
        if maximize:
            g = -g
        wd = _scalar(weight_decay, dtype)
        g = jnp.where(wd != 0, g + wd * p, g)
        if with_momentum:
            mom = _scalar(momentum, dtype)
            if is_first_step:
                buf = g
            else:
                buf = mom * momentum_buffer_list[i] + (1 - _scalar(dampening, dtype)) * g
            new_buf.append(buf.astype(momentum_buffer_list[i].dtype))
            g = g + mom * buf if nesterov else buf
        new_p.append((p - _scalar(lr, dtype) * g).astype(dtype))
    return (_skip(found_inf, new_p, params), _skip(found_inf, unscaled, grads),
            _skip(found_inf, new_buf, momentum_buffer_list) if with_momentum else list(momentum_buffer_list))


def _adagrad(params, grads, state_sums, state_steps, lr, lr_decay, weight_decay, eps, maximize, grad_scale,
             found_inf):
    unscaled = _unscale(grads, grad_scale)
    new_p, new_sums = [], []
    for p, g, s, step in zip(params, unscaled, state_sums, state_steps):
        dtype = p.dtype
        if maximize:
            g = -g
        wd = _scalar(weight_decay, dtype)
        g = jnp.where(wd != 0, g + wd * p, g)
        step = jnp.reshape(step, ()).astype(jnp.float32)
        clr = (_scalar(lr, jnp.float32) / (1 + (step - 1) * _scalar(lr_decay, jnp.float32))).astype(dtype)
        s = s + g * g
        std = jnp.sqrt(s) + _scalar(eps, dtype)
        new_p.append((p - clr * g / std).astype(dtype))
        new_sums.append(s.astype(dtype))
    return (_skip(found_inf, new_p, params), _skip(found_inf, unscaled, grads),
            _skip(found_inf, new_sums, state_sums))


@lowering("aten::_fused_adagrad.default", traced_scalars=True)
def fused_adagrad(params, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps, maximize,
                  grad_scale=None, found_inf=None):
    """Adagrad: ``state_sum += grad**2``; ``param -= clr * grad /
    (sqrt(state_sum) + eps)`` with ``clr = lr / (1 + (step - 1) * lr_decay)``.
    This overload also hands back ``state_steps`` (its in-place form marks
    them written), unchanged."""
    if not params:
        return [], [], [], []
    return (*_adagrad(params, grads, state_sums, state_steps, lr, lr_decay, weight_decay, eps, maximize, grad_scale,
                      found_inf), list(state_steps))


@lowering("aten::_fused_adagrad.tensor_lr", traced_scalars=True)
def fused_adagrad_tensor_lr(params, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps, maximize,
                            grad_scale=None, found_inf=None):
    """Adagrad with ``lr`` a tensor."""
    if not params:
        return [], [], []
    return _adagrad(params, grads, state_sums, state_steps, lr, lr_decay, weight_decay, eps, maximize, grad_scale,
                    found_inf)
