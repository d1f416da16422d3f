"""Run by test_torch_autoload: evaluates torch's own OpInfo samples on CPU
and prints one digest per op, so that two processes (device backend
autoloaded or not) can be compared exactly.  Not a test module itself."""

from __future__ import annotations

import hashlib
import json
import sys

import torch
from torch.testing._internal.common_methods_invocations import op_db


def digest(value, h):
    if isinstance(value, torch.Tensor):
        t = value.detach()
        h.update(str((t.dtype, tuple(t.shape), t.device.type)).encode())
        if t.is_complex():
            t = torch.view_as_real(t.resolve_conj())
        h.update(t.contiguous().to(torch.float64 if t.is_floating_point() else t.dtype).numpy().tobytes())
    elif isinstance(value, (list, tuple)):
        for v in value:
            digest(v, h)
    else:
        h.update(repr(value).encode())


def main(limit: int, stride: int) -> None:
    out = {}
    for op in op_db[::stride][:limit]:
        if torch.float32 not in op.supported_dtypes("cpu") or "empty" in op.name:
            continue  # empty*: uninitialised memory differs from run to run
        h = hashlib.sha256()
        torch.manual_seed(0)
        try:
            for i, sample in enumerate(op.sample_inputs("cpu", torch.float32)):
                if i >= 3:
                    break
                if op.name in ("bernoulli", "normal", "uniform") or "rand" in op.name or "dropout" in op.name:
                    torch.manual_seed(i)
                result = op(sample.input, *sample.args, **sample.kwargs)
                digest(result, h)
        except Exception as err:  # an op's own failure must also be the same
            h.update(type(err).__name__.encode())
        out[op.name + "." + op.variant_test_name] = h.hexdigest()[:16]
    print(json.dumps({"ops": out, "accelerator": str(torch.accelerator.current_accelerator()),
                      "jax_imported": "jax" in sys.modules}))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
