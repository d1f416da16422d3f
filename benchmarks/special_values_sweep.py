"""torch's unary and binary float ufuncs (OpInfo's ``unary_ufuncs`` and
``binary_ufuncs``) over the special values -0, +0, NaN, +-inf, tiny and
ordinary numbers, on torch CPU and on 'jax' (float32): prints each op whose
results differ (NaN against a number, another signed zero, or beyond
rtol 1e-4 / atol 1e-6) with its first differing inputs, and the count.
Casts of NaN, inf or out-of-range floats to integers are left out (C++
leaves them undefined).

    python benchmarks/special_values_sweep.py
"""

import math
import warnings

import torch
from torch.testing._internal.common_methods_invocations import binary_ufuncs, unary_ufuncs

import pjrt_host  # noqa: F401  (the device)

warnings.filterwarnings("ignore")
VALUES = [-0.0, 0.0, float("nan"), float("inf"), -float("inf"), -2.5, -1.0, -0.5, 0.5, 1.0, 2.5, 1e-30, -1e-30, 100.0]
CASTS = ("byte", "char", "int", "long", "short")


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.dtype.is_floating_point:
        return torch.equal(a, b)
    an, bn = torch.isnan(a), torch.isnan(b)
    if not torch.equal(an, bn):
        return False
    a, b = a[~an], b[~bn]
    if not torch.equal(torch.signbit(a[a == 0]), torch.signbit(b[b == 0])):
        return False
    return torch.allclose(a, b, rtol=1e-4, atol=1e-6)


def differs(w: float, g: float) -> bool:
    if math.isnan(w) or math.isnan(g):
        return math.isnan(w) != math.isnan(g)
    return w != g or (w == 0 and math.copysign(1, w) != math.copysign(1, g))


def compare(name: str, call, inputs: list) -> bool:
    try:
        want = call(*[t.clone() for t in inputs])
    except Exception:
        return True  # CPU refuses these inputs: not this sweep's question
    if not isinstance(want, torch.Tensor) or want.is_complex():
        return True
    try:
        got = call(*[t.clone().to("jax") for t in inputs]).cpu()
    except Exception as err:
        print("RAISES", name, type(err).__name__, str(err)[:80])
        return False
    if same(want, got):
        return True
    rows = list(zip(*[t.tolist() for t in inputs], want.tolist(), got.tolist()))
    print("DIFF", name, [r for r in rows if differs(r[-2], r[-1])][:3])
    return False


def main() -> None:
    x = torch.tensor(VALUES)
    y = torch.tensor([v for v in VALUES for _ in VALUES])
    z = torch.tensor([w for _ in VALUES for w in VALUES])
    bad = total = 0
    for op in unary_ufuncs:
        if op.name.split(".")[-1] in CASTS or not op.supports_dtype(torch.float32, "cpu"):
            continue
        total += 1
        bad += not compare(op.name, op.op, [x])
    for op in binary_ufuncs:
        if not op.supports_dtype(torch.float32, "cpu"):
            continue
        total += 1
        bad += not compare(op.name, op.op, [y, z])
    print(f"{bad} of {total} ops differ")


if __name__ == "__main__":
    main()
