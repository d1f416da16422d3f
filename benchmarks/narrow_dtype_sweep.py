"""Python numbers beyond a narrow integer dtype's range, through 34 ops at one
line each (so that their values are traced after the first few), on torch
CPU and on 'jax': the result or the exception must be the same.

    python benchmarks/narrow_dtype_sweep.py

Prints each difference and the count (docs/torch-device.md, "What works").
"""

import itertools
import warnings

import torch

warnings.filterwarnings("ignore")

OPS = {
 "add": lambda x, s: x + s, "sub": lambda x, s: x - s, "rsub": lambda x, s: s - x, "mul": lambda x, s: x * s,
 "floordiv": lambda x, s: x // s, "rem": lambda x, s: x % s, "fmod": lambda x, s: torch.fmod(x, s),
 "eq": lambda x, s: x == s, "ne": lambda x, s: x != s, "lt": lambda x, s: x < s, "ge": lambda x, s: x >= s,
 "and": lambda x, s: x & s, "or": lambda x, s: x | s, "xor": lambda x, s: x ^ s,
 "lshift": lambda x, s: x << (s % 7), "maximum": lambda x, s: torch.clamp(x, min=s), "minimum": lambda x, s: torch.clamp(x, max=s),
 "where": lambda x, s: torch.where(x > 2, x, s), "masked_fill": lambda x, s: x.masked_fill(x > 2, s),
 "fill": lambda x, s: x.clone().fill_(s), "full_like": lambda x, s: torch.full_like(x, s),
 "add_alpha": lambda x, s: torch.add(x, x, alpha=s), "addcmul": lambda x, s: torch.addcmul(x, x, x, value=s),
 "lerp": lambda x, s: x.float().lerp(x.float(), s),
 "index_fill": lambda x, s: x.index_fill(0, torch.tensor([0], device=x.device), s),
 "scatter": lambda x, s: x.scatter(0, torch.tensor([1], device=x.device), s),
 "pow": lambda x, s: x ** (s % 3), "div_trunc": lambda x, s: torch.div(x, s, rounding_mode="trunc"),
 "bitwise_left": lambda x, s: torch.bitwise_left_shift(x, s % 5), "clamp_both": lambda x, s: x.clamp(s, s + 3),
 "remainder_s": lambda x, s: torch.remainder(s, x + 1), "isin": lambda x, s: torch.isin(x, s),
 "div_floor": lambda x, s: torch.div(x, s, rounding_mode="floor"), "true_div": lambda x, s: x / s,
}


def main() -> None:
    dtypes = [torch.uint8, torch.int8, torch.int16, torch.int32]
    scalars = [-1, -129, 200, 300, 70000, -70000, 2**33, -(2**40)]
    diffs = total = 0
    for (name, f), dt, s in itertools.product(OPS.items(), dtypes, scalars):
        x = torch.tensor([0, 1, 3, 100], dtype=dt)
        out = []
        for dev in ("cpu", "jax"):
            try:
                r = f(x.to(dev), s)
                out.append(("ok", r.cpu().tolist(), r.dtype))
            except Exception as e:
                out.append((type(e).__name__, str(e).split("\n")[0][:90]))
        total += 1
        if out[0][0] != out[1][0] or (out[0][0] == "ok" and out[0] != out[1]):
            diffs += 1
            print(name, dt, s, "|", out[0], "|", out[1])
    print(diffs, "of", total)


if __name__ == "__main__":
    main()
