"""Random ops: lowerings that take a jax PRNG key (``needs_rng``).

A random lowering is marked ``needs_rng``: the dispatcher passes a jax PRNG
key as its first argument, drawn from the device's random state
(``torch.manual_seed`` / ``torch.jax.manual_seed``), and drops torch's
``generator`` argument (a CPU generator seeds the draw instead).  A lowering
registered under an in-place name (``aten::normal_``) returns the new value
of ``self``; the dispatcher writes it back through self's view.  The random
factories (``rand``, ``randn`` ...) are in ``ops_factories``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from . import lowering
from ._util import draw, mask_as, widened

__all__: list[str] = []


def random_lowering(*names: str, per_element: bool = False):
    return lowering(*names, needs_rng=True, per_element=per_element)


def _float(x):
    return x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32


@random_lowering("aten::normal_", "aten::normal_functional", per_element=True)
def normal_(key, self, mean=0.0, std=1.0, *, generator=None):
    dt = _float(self)
    return (draw(lambda k, s: jax.random.normal(k, s, dt), key, self.shape) * std + mean).astype(self.dtype)


@random_lowering("aten::uniform_", per_element=True)
def uniform_(key, self, from_=0.0, to=1.0, *, generator=None):
    dt = _float(self)
    return draw(lambda k, s: jax.random.uniform(k, s, dt, from_, to), key, self.shape).astype(self.dtype)


@random_lowering("aten::exponential_", per_element=True)
def exponential_(key, self, lambd=1.0, *, generator=None):
    dt = _float(self)
    return (draw(lambda k, s: jax.random.exponential(k, s, dt), key, self.shape) / lambd).astype(self.dtype)


@random_lowering("aten::log_normal_", per_element=True)
def log_normal_(key, self, mean=1.0, std=2.0, *, generator=None):
    dt = _float(self)
    return jnp.exp(draw(lambda k, s: jax.random.normal(k, s, dt), key, self.shape) * std + mean).astype(self.dtype)


@random_lowering("aten::cauchy_", per_element=True)
def cauchy_(key, self, median=0.0, sigma=1.0, *, generator=None):
    dt = _float(self)
    return (draw(lambda k, s: jax.random.cauchy(k, s, dt), key, self.shape) * sigma + median).astype(self.dtype)


@random_lowering("aten::geometric_", per_element=True)
def geometric_(key, self, p, *, generator=None):
    u = draw(lambda k, s: jax.random.uniform(k, s, jnp.float64, minval=jnp.finfo(jnp.float64).tiny), key,
             self.shape)
    return jnp.ceil(jnp.log(u) / jnp.log1p(-p)).astype(self.dtype)


@random_lowering("aten::bernoulli_.float", per_element=True)
def bernoulli_float_(key, self, p=0.5, *, generator=None):
    return mask_as(draw(lambda k, s: jax.random.bernoulli(k, p, s), key, self.shape), self.dtype)


@random_lowering("aten::bernoulli_.Tensor", "aten::bernoulli.Tensor")
def bernoulli_tensor_(key, self, p, *, generator=None):
    p = jnp.broadcast_to(p, self.shape)
    return mask_as(draw(lambda k, s: jax.random.bernoulli(k, p.reshape(s), s), key, self.shape), self.dtype)


@random_lowering("aten::bernoulli")
def bernoulli(key, self, *, generator=None):
    return mask_as(draw(lambda k, s: jax.random.bernoulli(k, self.reshape(s), s), key, self.shape), self.dtype)


@random_lowering("aten::bernoulli.p")
def bernoulli_p(key, self, p, *, generator=None):
    return mask_as(draw(lambda k, s: jax.random.bernoulli(k, p, s), key, self.shape), self.dtype)


def _random_range(key, shape, dtype, low, high):
    if jnp.issubdtype(dtype, jnp.floating):
        # Integers in [low, high), as torch draws them for float tensors.
        return jnp.floor(draw(lambda k, s: jax.random.uniform(k, s, jnp.float64, low, high), key, shape)).astype(dtype)
    return draw(lambda k, s: jax.random.randint(k, s, low, high, jnp.int64), key, shape).astype(dtype)


@random_lowering("aten::random_.from", per_element=True)
def random_from_(key, self, from_, to=None, *, generator=None):
    if to is None:
        info = jnp.iinfo(self.dtype) if jnp.issubdtype(self.dtype, jnp.integer) else None
        to = (info.max if info is not None else 2 ** 24) + 1
        to = min(to, 2 ** 63 - 1)
    return _random_range(key, self.shape, self.dtype, from_, to)


@random_lowering("aten::random_.to", per_element=True)
def random_to_(key, self, to, *, generator=None):
    return _random_range(key, self.shape, self.dtype, 0, to)


@random_lowering("aten::random_", per_element=True)
def random_(key, self, *, generator=None):
    if self.dtype == jnp.bool_:
        high = 2
    elif jnp.issubdtype(self.dtype, jnp.integer):
        high = min(int(jnp.iinfo(self.dtype).max) + 1, 2 ** 63 - 1)
    else:
        high = 2 ** jnp.finfo(self.dtype).nmant + 1
    return _random_range(key, self.shape, self.dtype, 0, high)


@random_lowering("aten::native_dropout")
def native_dropout(key, input, p, train):
    if not train or p == 0:
        return input, jnp.ones(input.shape, jnp.bool_)
    if p == 1:
        return jnp.zeros_like(input), jnp.zeros(input.shape, jnp.bool_)
    keep = draw(lambda k, s: jax.random.bernoulli(k, 1.0 - p, s), key, input.shape)
    scale = jnp.asarray(1.0 / (1.0 - p), input.dtype)
    return jnp.where(keep, input * scale, jnp.zeros((), input.dtype)), keep


@random_lowering("aten::normal.Tensor_float")
def normal_tensor_float(key, mean, std=1.0, *, generator=None):
    return draw(lambda k, s: jax.random.normal(k, s, mean.dtype), key, mean.shape) * std + mean


@random_lowering("aten::normal.float_Tensor")
def normal_float_tensor(key, mean, std, *, generator=None):
    return draw(lambda k, s: jax.random.normal(k, s, std.dtype), key, std.shape) * std + mean


@random_lowering("aten::normal.Tensor_Tensor")
def normal_tensor_tensor(key, mean, std, *, generator=None):
    shape = jnp.broadcast_shapes(mean.shape, std.shape)
    dt = jnp.result_type(mean, std)
    return draw(lambda k, s: jax.random.normal(k, s, dt), key, shape) * std + mean


@random_lowering("aten::multinomial")
def multinomial(key, self, num_samples, replacement=False, *, generator=None):
    logits = jnp.log(self.astype(jnp.float64))
    batch = self.shape[:-1]
    if replacement:
        out = jax.random.categorical(key, logits, axis=-1, shape=(num_samples,) + batch)
        return jnp.moveaxis(out, 0, -1).astype(jnp.int64)
    # Without replacement: the Gumbel top-k trick.
    g = draw(lambda k, s: jax.random.gumbel(k, s, jnp.float64), key, self.shape)
    return jax.lax.top_k(logits + g, num_samples)[1].astype(jnp.int64)


# -------------------------------------------------- torch.distributions' samplers


@random_lowering("aten::poisson")
def poisson(key, self, generator=None):
    """Counts drawn at the rates ``self`` (a rate of 0 gives 0); a negative
    rate is refused by the value check, as on CPU."""
    rate = jnp.maximum(widened(self), 0)
    return jax.random.poisson(key, rate, self.shape, jnp.int64).astype(self.dtype)


@random_lowering("aten::binomial")
def binomial(key, count, prob, generator=None):
    """Successes in ``count`` trials of probability ``prob``; a probability
    past [0, 1] is taken at the bound, as CPU's sampler does."""
    wide = jnp.maximum(widened(count), 0)  # CPU's sampler gives 0 successes of a negative count
    p = jnp.clip(widened(prob), 0, 1)
    shape = jnp.broadcast_shapes(count.shape, prob.shape)
    return jax.random.binomial(key, wide, p, shape, wide.dtype).astype(count.dtype)


@random_lowering("aten::_standard_gamma")
def standard_gamma(key, self, generator=None):
    """Gamma(self, 1) draws (``torch.distributions.Gamma``, ``Beta``,
    ``Chi2``, ``StudentT``)."""
    wide = widened(self)
    sample = jax.random.gamma(key, wide, self.shape, wide.dtype)
    # CPU's sampler keeps every draw at least the dtype's smallest normal
    # number (an underflow, or alpha <= 0, where jax gives 0 or NaN)
    tiny = jnp.finfo(self.dtype).tiny
    return jnp.where(sample > tiny, sample, tiny).astype(self.dtype)


@lowering("aten::_standard_gamma_grad")
def standard_gamma_grad(self, output):
    """d sample / d alpha of a Gamma(alpha, 1) sample (``Gamma.rsample``'s
    backward), by implicit differentiation as jax computes it."""
    wide = widened(self)
    return jax.lax.random_gamma_grad(wide, widened(output).astype(wide.dtype)).astype(self.dtype)


@random_lowering("aten::_sample_dirichlet")
def sample_dirichlet(key, self, generator=None):
    """Dirichlet draws along the last dimension: Gamma draws, normalised,
    as CPU computes them."""
    wide = widened(self)
    return jax.random.dirichlet(key, wide, self.shape[:-1], wide.dtype).astype(self.dtype)


@random_lowering("aten::randint_like", "aten::randint_like.low_dtype")
def randint_like(key, self, low, high=None, *, dtype=None, layout=None, device=None, pin_memory=None,
                 memory_format=None):
    if high is None:
        low, high = 0, low
    return draw(lambda k, s: jax.random.randint(k, s, low, high, jnp.int64), key, self.shape).astype(self.dtype)


# -------------------------------------------------- dtype-changing "views"
# The device computes these as new tensors (a write through the result does
# not reach the input); they are views on CPU.


@random_lowering("aten::rrelu_with_noise_functional")
def rrelu_with_noise_functional(key, x, noise, lower=0.125, upper=1 / 3, training=False, *, generator=None):
    """(output, noise): in training each negative element is scaled by its
    own U(lower, upper) draw (recorded in noise, 1 elsewhere, for the
    backward); in eval by the mean slope (noise unchanged)."""
    if not training:  # leaky_relu by the mean slope, in float32 for 16-bit x as torch does
        wide = widened(x)
        return jnp.where(x >= 0, wide, wide * ((lower + upper) / 2)).astype(x.dtype), noise
    slope = draw(lambda k, s: jax.random.uniform(k, s, _float(x), lower, upper), key, x.shape)
    new_noise = jnp.where(x >= 0, 1, slope).astype(noise.dtype)
    return (x * new_noise.astype(x.dtype)).astype(x.dtype), new_noise


@random_lowering("aten::rrelu_with_noise")
def rrelu_with_noise(key, x, noise, lower=0.125, upper=1 / 3, training=False, *, generator=None):
    return rrelu_with_noise_functional(key, x, noise, lower, upper, training)[0]
