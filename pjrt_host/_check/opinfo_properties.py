"""What the OpInfo comparison (tests/test_opinfo.py, ``check``) checks of ops whose values cannot match torch
CPU's: random draws (the device's generator is not CPU's) and uninitialised
memory.

Their results are still compared in structure, dtype, shape and device, and
each random op's values must have the properties its definition gives them
(a uniform draw lies in its range, a dropout element is 0 or x / (1 - p), a
multinomial draw without replacement repeats no index ...).  Where a sample
turns the randomness off (dropout with ``training=False`` or ``p=0``) the
values are compared exactly.  An op whose randomness is an argument
(fractional max pooling's ``_random_samples``) gets the same draw on both
sides and is compared exactly.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

#: Values unspecified on every device: structure, dtype, shape and device only.
UNINITIALISED = frozenset({"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty",
                           "new_empty_strided"})

Check = Callable[[Any, Any, Any], bool]


def _tensor(out: Any) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out[0]


def _all(cond: torch.Tensor, what: str) -> None:
    assert bool(cond.all()), f"{what}: violated by {int((~cond).sum())} of {cond.numel()} elements"


def _finite(sample: Any, out: Any, expected: Any) -> bool:
    _all(torch.isfinite(_tensor(out)), "finite")
    return False


def _not_nan(sample: Any, out: Any, expected: Any) -> bool:
    _all(~torch.isnan(_tensor(out)), "not NaN")
    return False


def _positive(strict: bool) -> Check:
    def check(sample: Any, out: Any, expected: Any) -> bool:
        out = _tensor(out)
        _all(out > 0 if strict else (out >= 0) & torch.isfinite(out), "> 0" if strict else ">= 0")
        return False
    return check


def _geometric(sample: Any, out: Any, expected: Any) -> bool:
    out = _tensor(out)
    _all((out >= 1) & (out == out.round()), "an integer >= 1")
    return False


def _uniform(sample: Any, out: Any, expected: Any) -> bool:
    lo, hi = (sample.args + (0.0, 1.0)[len(sample.args):])[:2]
    out = _tensor(out)
    _all((out >= lo) & (out <= hi), f"in [{lo}, {hi}]")
    return False


def _int_range(low: int, high: int, out: torch.Tensor) -> None:
    _all((out >= low) & (out < high) & (out == out.round()), f"an integer in [{low}, {high})")


def _randint(sample: Any, out: Any, expected: Any) -> bool:
    bounds = [a for a in (sample.input, *sample.args) if isinstance(a, int)]
    low, high = (0, bounds[0]) if len(bounds) == 1 else bounds[:2]
    _int_range(low, high, _tensor(out))
    return False


def _randint_like(sample: Any, out: Any, expected: Any) -> bool:
    low, high = (0, sample.args[0]) if len(sample.args) == 1 else sample.args[:2]
    _int_range(low, high, _tensor(out))
    return False


def _multinomial(sample: Any, out: Any, expected: Any) -> bool:
    probs, out = sample.input, _tensor(out)
    categories = probs.shape[-1]
    _int_range(0, categories, out)
    rows = probs.reshape(-1, categories)
    picks = out.reshape(rows.shape[0], -1)
    _all(torch.gather(rows, 1, picks) > 0, "a category of non-zero probability")
    if not sample.kwargs.get("replacement", False):
        for row in picks:
            assert row.unique().numel() == row.numel(), f"drawn without replacement, yet repeats: {row.tolist()}"
    return False


def _bernoulli(sample: Any, out: Any, expected: Any) -> bool:
    p, out = sample.input, _tensor(out)
    _all((out == 0) | (out == 1), "0 or 1")
    _all((p != 0) | (out == 0), "0 where p = 0")
    _all((p != 1) | (out == 1), "1 where p = 1")
    return False


def _dropout_off(sample: Any) -> bool:
    return not sample.kwargs.get("training", True) or sample.kwargs.get("p", 0.5) == 0


def _close(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Equal up to the rounding of a's dtype (b computed in float32 or wider)."""
    rtol = {torch.bfloat16: 1.6e-2, torch.float16: 1e-3}.get(a.dtype, 1e-5)
    return torch.isclose(a.float(), b.float(), rtol=rtol, atol=1e-6)


def _dropout(feature_dims: Callable[[int], int]) -> Check:
    """Each element (each feature map: ``feature_dims(input.dim())``
    trailing dims) is zero or the input scaled by 1 / (1 - p)."""
    def check(sample: Any, out: Any, expected: Any) -> bool:
        if _dropout_off(sample):
            return True
        p, x, out = sample.kwargs.get("p", 0.5), sample.input, _tensor(out)
        dims = feature_dims(x.dim())
        scaled = x / (1 - p) if p < 1 else torch.zeros_like(x)
        zero, kept = out == 0, _close(out, scaled)
        if dims:
            maps = (-1,) + tuple(x.shape[x.dim() - dims:])
            zero = zero.reshape(maps).flatten(1).all(1)
            kept = kept.reshape(maps).flatten(1).all(1)
        _all(zero | kept, "0 or x / (1 - p)" + (" for a whole feature map" if dims else ""))
        return False
    return check


_SELU_ALPHA = 1.7580993408473766


def _alpha_dropout(sample: Any, out: Any, expected: Any) -> bool:
    """Kept: a * x + alpha * a * p; dropped: alpha * a * (p - 1) (torch's
    affine correction keeping mean and variance)."""
    if _dropout_off(sample):
        return True
    p, x, out = sample.kwargs.get("p", 0.5), sample.input, _tensor(out)
    if p == 1:
        _all(out == 0, "0 for p = 1")
        return False
    a = 1 / ((_SELU_ALPHA ** 2 * p + 1) * (1 - p)) ** 0.5
    x, out = x.double(), out.double()
    # 16-bit: each of the two terms may round (torch CPU rounds both).
    eps = torch.finfo(sample.input.dtype).eps if sample.input.is_floating_point() else 0.0
    shift = _SELU_ALPHA * a * p
    def near(want: torch.Tensor, scale: Any) -> torch.Tensor:
        return (out - want).abs() <= 2 * eps * scale + 1e-5 * want.abs() + 1e-6

    kept = near(a * x + shift, (a * x).abs() + abs(shift))
    dropped = near(torch.full_like(x, _SELU_ALPHA * a * (p - 1)), abs(_SELU_ALPHA * a * (p - 1)))
    _all(kept | dropped, "a kept or a dropped value")
    return False


def _rrelu(sample: Any, out: Any, expected: Any) -> bool:
    if not sample.kwargs.get("training", False):
        return True
    lower, upper = sample.kwargs.get("lower", 1 / 8), sample.kwargs.get("upper", 1 / 3)
    x, out = sample.input, _tensor(out)
    _all((x < 0) | (out == x), "x where x >= 0")
    slope = torch.where(x < 0, out / torch.where(x < 0, x, 1), (lower + upper) / 2)
    _all((slope >= lower - 1e-6) & (slope <= upper + 1e-6), f"a slope in [{lower}, {upper}] where x < 0")
    return False


def _attention(sample: Any, out: Any, expected: Any) -> bool:
    """With dropout the output is finite where torch's is (rows of weights
    dropped at random); without, torch's values."""
    if not sample.kwargs.get("dropout_p", 0):
        return True
    _all(torch.isfinite(_tensor(out)) | ~torch.isfinite(_tensor(expected)), "finite where torch's is")
    return False


def _multi_head_attention(sample: Any, out: Any, expected: Any) -> bool:
    """Dropout on the attention weights (positional dropout_p) in training."""
    dropout = sample.args[9] if len(sample.args) > 9 else sample.kwargs.get("dropout_p", 0)
    if not sample.kwargs.get("training", True) or not dropout:
        return True
    _all(torch.isfinite(_tensor(out)) | ~torch.isfinite(_tensor(expected)), "finite where torch's is")
    return False


def _lowrank(sample: Any, out: Any, expected: Any) -> bool:
    """U and V have orthonormal columns, S is non-negative and sorted; the
    samples' matrices have rank <= q, so without M the singular values are
    exact and must be torch's."""
    u, s, v = out
    for name, m in (("U", u), ("V", v)):
        eye = torch.eye(m.shape[-1]).expand(m.shape[:-2] + (m.shape[-1], m.shape[-1]))
        torch.testing.assert_close(m.mT @ m, eye, rtol=1e-4, atol=1e-4, msg=lambda e, n=name: f"{n}: {e}")
    _all(s >= -1e-5, "S >= 0")
    _all(s[..., :-1] >= s[..., 1:] - 1e-5, "S sorted descending")
    if sample.kwargs.get("M") is None:
        torch.testing.assert_close(s, expected[1], rtol=1e-4, atol=1e-4)
    return False


#: op name -> check(sample, result moved to CPU, torch CPU's result) -> whether
#: the values must equal torch's after all (randomness turned off by the
#: sample).  The test first applies each check to torch CPU's own result, so
#: a property that torch itself does not have fails as the test's fault.
RANDOM: dict[str, Check] = {
    "cauchy": _not_nan,
    "exponential": _positive(strict=False),
    "geometric": _geometric,
    "log_normal": _positive(strict=True),
    "normal": _finite, "normal.in_place": _finite, "normal.number_mean": _finite,
    "randn": _finite, "randn_like": _finite,
    "uniform": _uniform,
    "rand_like": _finite,  # torch's OpInfo calls randn_like (CPU's values check that)
    "randint": _randint,
    "randint_like": _randint_like,
    "multinomial": _multinomial,
    "bernoulli": _bernoulli,
    "nn.functional.dropout": _dropout(lambda ndim: 0),
    # torch reads a 3-d input to dropout2d as (N, C, L): one-dimensional maps
    "nn.functional.dropout2d": _dropout(lambda ndim: 1 if ndim == 3 else 2),
    "nn.functional.dropout3d": _dropout(lambda ndim: 3),
    "nn.functional.alpha_dropout": _alpha_dropout,
    "nn.functional.feature_alpha_dropout.with_train": _alpha_dropout,
    "nn.functional.rrelu": _rrelu,
    "nn.functional.scaled_dot_product_attention": _attention,
    "nn.functional.multi_head_attention_forward": _multi_head_attention,
    "svd_lowrank": _lowrank,
    "pca_lowrank": _lowrank,
}


def _pooling_samples(dims: int) -> Callable[[Any], dict]:
    def draw(sample: Any) -> dict:
        x = sample.input
        batch = 1 if x.dim() == dims + 1 else x.shape[0]
        return {"_random_samples": torch.rand(batch, x.shape[-dims - 1], dims, dtype=x.dtype)}
    return draw


#: op name -> extra kwargs drawn once on CPU and given to both sides: the op
#: is then deterministic and compared exactly.
RANDOM_INPUTS: dict[str, Callable[[Any], dict]] = {
    "nn.functional.fractional_max_pool2d": _pooling_samples(2),
    "nn.functional.fractional_max_pool3d": _pooling_samples(3),
}


def _dim(sample: Any, position: int) -> int:
    args = sample.args
    if len(args) > position and isinstance(args[position], int):
        return args[position]
    return sample.kwargs.get("dim", -1)


def _ties(position: int) -> Check:
    """For ops that report *an* index of a value (sort, topk, kthvalue,
    mode): which one among equal values is unspecified, so the values must
    be torch's and each index must point at an element equal to its value
    (``position``: where the sample's args hold ``dim``)."""
    def check(sample: Any, out: Any, expected: Any) -> bool:
        x = sample.input
        dim = _dim(sample, position) % max(x.dim(), 1) if x.dim() else 0
        if isinstance(out, torch.Tensor):  # argsort: indices only, the values are where torch's point
            indices = out
            expected_values = torch.take_along_dim(x, expected, dim) if x.dim() else x
        else:
            values, indices = out[0], out[1]
            expected_values = expected[0]
            torch.testing.assert_close(values, expected_values, equal_nan=True)
        if x.dim() == 0:
            _all(indices == 0, "index 0 of a 0-dim input")
            return False
        idx = indices if indices.dim() == x.dim() else indices.unsqueeze(dim)
        picked = torch.take_along_dim(x, idx, dim)
        want = expected_values if expected_values.dim() == x.dim() else expected_values.unsqueeze(dim)
        _all((picked == want) | (picked.isnan() & want.isnan()), "an index of an element equal to its value")
        if idx.shape == x.shape:  # sort / argsort: a permutation along dim
            _all(idx.sort(dim).values == torch.arange(x.shape[dim]).reshape(
                [-1 if d == dim else 1 for d in range(x.dim())]), "a permutation")
        return False
    return check


#: op name or case id -> check: values exact, indices up to ties.
TIES: dict[str, Check] = {
    "sort-bool": _ties(0), "argsort-bool": _ties(0), "mode": _ties(0),
    # 16-bit samples hold many equal values, and torch CPU's default sort is
    # not stable (stable=True is: tests/test_torch_cpu_parity.py checks it).
    **{f"{op}-{d}": _ties(0) for op in ("sort", "argsort") for d in ("bfloat16", "float16")},
    **{f"topk-{d}": _ties(1) for d in ("bfloat16", "float16")},
    "kthvalue-int64": _ties(1), "topk-int64": _ties(1),
}
