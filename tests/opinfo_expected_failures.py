"""Reviewed outcomes of tests/test_opinfo.py that are not a plain pass.

Keys are test ids without the brackets: ``<opinfo name>[.<variant>]-<dtype>``
for one dtype, or ``<opinfo name>[.<variant>]`` for every dtype.  Each value
is the one-line reason.  An EXPECTED_FAILURES entry that passes fails the
run: remove it when the op is fixed.
"""

from __future__ import annotations

_RANDOM = "random draws: the device's generator is not torch CPU's, values cannot match"
_UNINITIALISED = "uninitialised memory: values are unspecified on every device"

#: Not compared at all.
SKIPS: dict[str, str] = {
    **{name: _RANDOM for name in (
        "cauchy", "exponential", "geometric", "log_normal", "normal", "normal.in_place", "normal.number_mean",
        "uniform", "randn", "randn_like", "rand_like", "randint", "randint_like", "multinomial", "bernoulli",
        "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
        "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout.with_train",
        "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d", "nn.functional.rrelu",
    )},
    **{name: _UNINITIALISED for name in (
        "empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided",
    )},
}

#: Known to fail today.
EXPECTED_FAILURES: dict[str, str] = {
}
