"""The 'jax' device against torch CPU, driven by torch's own OpInfo database
(``torch.testing._internal.common_methods_invocations.op_db``).

One case per (OpInfo, dtype) where the OpInfo supports that dtype on CPU: its
sample inputs run on CPU and, moved with ``.to('jax')``, on the device; the
results must agree (same structure, dtype and shape; values within the
tolerances below, NaNs in the same places).  tests/test_opinfo.py and
``python -m pjrt_host check`` (its ops section) both run :func:`run`, so a
vendor's report and this project's suite judge the same way.

Expected failures and skips live in ``opinfo_expected_failures.py``, each
with a one-line reason; an expected failure that passes is reported as
stale, so the list stays true.  That file also names the few OpInfos whose
results are defined only up to a free choice (signs of eigenvectors and
singular vectors): those are compared as torch's own ``test_compare_cpu``
compares two devices, through each sample's ``output_process_fn_grad``.
Random ops and uninitialised memory cannot match CPU's values:
``opinfo_properties.py`` says what is checked of them instead.

Samples: every op on the device is compiled for each new shape, and that
dominates the run time, so a case runs up to ``limit`` *different* samples:
samples that differ only in their tensors' sizes or values exercise the same
lowering code, so a sample is taken only if its non-tensor arguments, or
whether its tensors are 0-dim or empty, differ from those already taken.
``limit=0`` runs every sample, distinct or not.

Importing this module imports torch's OpInfo database, which needs
``expecttest`` (``pip install expecttest``).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Iterator

import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_flatten, tree_map

from .opinfo_expected_failures import (
    ACCELERATOR_DTYPES, EXPECTED_FAILURES, FLOAT32_REFERENCE, SKIPS, TOLERANCES as WIDER, UP_TO_FREEDOM)
from .opinfo_properties import RANDOM, RANDOM_INPUTS, TIES, UNINITIALISED

__all__ = ["Outcome", "case_id", "cases", "family", "run", "op_db"]

# float32 results: XLA's transcendental functions and reduction orders differ
# from ATen's by a few ulps; 1e-4 relative keeps real bugs visible.
TOLERANCES = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.complex64: dict(rtol=1e-4, atol=1e-5)}

#: OpInfos whose tensor arguments besides the input stay on CPU, by torch's rule.
CPU_ARGUMENTS = {"tensor_split": "indices_or_sections, when a tensor, must be a CPU tensor"}


@dataclasses.dataclass
class Outcome:
    """One case's result.  ``status``: ``passed``, ``failed``, ``xfailed``
    (a reviewed expected failure), ``stale`` (listed as an expected failure
    but passes), ``skipped`` (listed, or torch CPU accepts none of its
    samples).  ``detail``: the reason or the error."""

    status: str
    detail: str = ""
    by_properties: bool = False
    error: BaseException | None = None


def _signature(value: Any) -> Any:
    """What of a sample decides which lowering code runs: everything but its
    tensors' sizes and values (kept: their dtype, and whether 0-dim or empty)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, value.dim() == 0, value.numel() == 0)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__,) + tuple(_signature(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _signature(v)) for k, v in value.items()))
    if isinstance(value, float):
        return ("float", value)
    if isinstance(value, (bool, int, complex, str, type(None), torch.dtype, torch.device, torch.layout)):
        return value
    return type(value).__name__


def _samples(op: Any, dtype: torch.dtype, distinct: bool) -> Iterator[Any]:
    """The case's samples to run: the first of each distinct signature, or every one."""
    seen = set()
    for sample in op.sample_inputs("cpu", dtype, requires_grad=False):
        if distinct:
            key = _signature((sample.input, sample.args, sample.kwargs))
            if key in seen:
                continue
            seen.add(key)
        yield sample


def case_id(op: Any, dtype: torch.dtype) -> str:
    name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
    return f"{name}-{str(dtype).removeprefix('torch.')}"


def cases(dtypes: tuple[torch.dtype, ...]) -> list[tuple[Any, torch.dtype]]:
    """Every (OpInfo, dtype) whose OpInfo supports the dtype on CPU."""
    out = []
    for op in op_db:
        supported = op.supported_dtypes("cpu")
        out.extend((op, dtype) for dtype in dtypes if dtype in supported)
    return out


def family(op: Any) -> str:
    """The op family a report groups cases by: the namespace of a dotted
    OpInfo name (linalg, fft, special, nn.functional ...), else the kind of
    OpInfo (unary / binary elementwise, reduction, shape ...)."""
    if "." in op.name:
        return op.name.rsplit(".", 1)[0]
    kind = type(op).__name__.removesuffix("Info")
    return {
        "UnaryUfunc": "elementwise (unary)", "BinaryUfunc": "elementwise (binary)", "Reduction": "reductions",
        "ShapeFunc": "shape", "ForeachFunc": "foreach", "Spectral": "fft", "OpInfo": "other",
    }.get(kind, kind.lower())


def _to_jax(value: Any) -> Any:
    return value.to("jax") if isinstance(value, torch.Tensor) else value


def _on_jax(value: Any) -> Any:
    """A sample argument as it reads for the device: tensors moved, and a
    CPU device argument (factories, ``.to``) naming 'jax' instead."""
    if isinstance(value, torch.device) and value.type == "cpu":
        return torch.device("jax")
    if value == "cpu" and isinstance(value, str):
        return "jax"
    return value


def compare(actual: Any, expected: Any, values: bool = True, wider: dict | None = None,
            dtypes: dict | None = None) -> None:
    """Same structure; each tensor on the device, of torch's dtype and shape,
    and (``values``) within the tolerances, NaNs in the same places.
    ``dtypes``: result index -> the dtype the device gives instead of torch
    CPU's (ACCELERATOR_DTYPES)."""
    leaves_a, spec_a = tree_flatten(actual)
    leaves_e, spec_e = tree_flatten(expected)
    assert spec_a == spec_e, f"result structure {spec_a} differs from torch CPU's {spec_e}"
    for i, (a, e) in enumerate(zip(leaves_a, leaves_e)):
        if isinstance(e, torch.Tensor):
            assert isinstance(a, torch.Tensor), f"expected a tensor, got {type(a).__name__}"
            assert a.device.type == "jax", f"result on {a.device}, expected the 'jax' device"
            if dtypes and i in dtypes:  # the accelerator's dtype; values compared in torch CPU's
                assert a.dtype == getattr(torch, dtypes[i]), f"result {i}: {a.dtype}, expected {dtypes[i]}"
                a = a.to(e.dtype)
            assert (a.dtype, a.shape) == (e.dtype, e.shape), f"{a.dtype} {tuple(a.shape)}, torch gives " \
                                                             f"{e.dtype} {tuple(e.shape)}"
            if values:
                tol = wider or TOLERANCES.get(e.dtype, {})
                torch.testing.assert_close(a.cpu(), e, equal_nan=True, **tol)
        elif values:
            torch.testing.assert_close(a, e, equal_nan=True)


def _cpu(value: Any) -> Any:
    return value.cpu() if isinstance(value, torch.Tensor) else value


def _run_case(op: Any, dtype: torch.dtype, name: str, limit: int, up_to_freedom: bool = False) -> tuple[int, bool]:
    """Run the case's samples; return (how many were compared, whether any
    only by properties).  ``up_to_freedom``: compare what the sample's
    ``output_process_fn_grad`` keeps of both results (torch's OpInfos use it
    to take out a free choice: |eigenvectors|, |U|, U @ Vh ...), as torch's
    test_compare_cpu does."""
    random_check = RANDOM.get(name)
    case = case_id(op, dtype)
    ties = TIES.get(name) or TIES.get(case)
    wider = WIDER[case][0] if case in WIDER else None
    dtypes = ACCELERATOR_DTYPES[case][0] if case in ACCELERATOR_DTYPES else None
    draw = RANDOM_INPUTS.get(name)
    compared, by_properties = 0, False
    for sample in _samples(op, dtype, distinct=limit > 0):
        if limit and compared >= limit:
            break
        if draw is not None:
            sample.kwargs.update(draw(sample))
        try:
            if case in FLOAT32_REFERENCE:
                wide = sample.transform(lambda t: t.float() if isinstance(t, torch.Tensor) and t.dtype == dtype else t)
                expected = tree_map(lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.dtype == torch.float32
                                    else t, op(wide.input, *wide.args, **wide.kwargs))
            else:
                expected = op(sample.input, *sample.args, **sample.kwargs)
        except Exception:
            continue  # torch CPU refuses this sample: nothing to compare
        if name in CPU_ARGUMENTS:  # only the input moves
            jax_sample = type(sample)(_to_jax(sample.input), args=sample.args, kwargs=sample.kwargs)
        else:
            jax_sample = sample.transform(_to_jax)
        args = [_on_jax(a) for a in jax_sample.args]
        kwargs = {k: _on_jax(v) for k, v in jax_sample.kwargs.items()}
        with torch.device("jax"):  # factories without a device argument
            actual = op(_on_jax(jax_sample.input), *args, **kwargs)
        if up_to_freedom:
            expected, actual = sample.output_process_fn_grad(expected), sample.output_process_fn_grad(actual)
        if ties is not None:
            compare(actual, expected, values=False)
            ties(sample, tree_map(_cpu, actual), expected)
        elif name in UNINITIALISED:
            compare(actual, expected, values=False)
            by_properties = True
        elif random_check is not None:
            compare(actual, expected, values=False)
            try:
                random_check(sample, expected, expected)
            except AssertionError as err:
                raise AssertionError(f"opinfo_properties.py: torch CPU's own result fails {name}'s check: {err}") \
                    from None
            exact = random_check(sample, tree_map(_cpu, actual), expected)
            if exact:
                compare(actual, expected, wider=wider)
            else:
                by_properties = True
        else:
            compare(actual, expected, wider=wider, dtypes=dtypes)
        compared += 1
    return compared, by_properties


def run(op: Any, dtype: torch.dtype, limit: int = 3) -> Outcome:
    """One case: up to ``limit`` distinct samples (0: every sample)."""
    case = case_id(op, dtype)
    name = case.rsplit("-", 1)[0]
    reason = SKIPS.get(case) or SKIPS.get(name)
    if reason:
        return Outcome("skipped", reason)
    expected_failure = EXPECTED_FAILURES.get(case) or EXPECTED_FAILURES.get(name)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compared, by_properties = _run_case(
                op, dtype, name, limit, up_to_freedom=bool(UP_TO_FREEDOM.get(case) or UP_TO_FREEDOM.get(name)))
    except Exception as err:
        if expected_failure:
            return Outcome("xfailed", f"{expected_failure} ({type(err).__name__})")
        return Outcome("failed", f"{type(err).__name__}: {err}", error=err)
    if compared == 0:
        return Outcome("skipped", "torch CPU accepts none of this OpInfo's samples")
    if expected_failure:
        return Outcome("stale", f"{case} passes but is listed as an expected failure ({expected_failure!r}): "
                                "remove the entry")
    return Outcome("passed", by_properties=by_properties)
