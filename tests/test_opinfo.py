"""Conformance of the 'jax' device against torch CPU, driven by torch's own
OpInfo database (``torch.testing._internal.common_methods_invocations.op_db``).

One test per (OpInfo, dtype) for float32, int64 and bool, where the OpInfo
supports that dtype on CPU: its sample inputs run on CPU and, moved with
``.to('jax')``, on the device; the results must agree (same structure, dtype
and shape; values within the tolerances below, NaNs in the same places).

Expected failures and skips live in ``opinfo_expected_failures.py``, each
with a one-line reason.  An expected failure that passes fails the run
(a stale entry), so the list stays true.  That file also names the few
OpInfos whose results are defined only up to a free choice (the signs of
eigenvectors and singular vectors): those are compared as torch's own
``test_compare_cpu`` compares two devices, through each sample's
``output_process_fn_grad``.  Random ops and uninitialised memory cannot
match CPU's values: ``opinfo_properties.py`` says what is checked of them
instead (structure, dtype and shape always; each random op's defining
properties; exact values where a sample turns the randomness off).  The
session ends with a line
``OpInfo on jax: N passed (P by properties), M expected failures, K skipped of T``.

Samples: every op on the device is compiled for each new shape, and that
dominates the run time, so each case runs up to ``PJRT_HOST_OPINFO_SAMPLES``
(default 3) *different* samples: samples that differ only in their tensors'
sizes or values exercise the same lowering code, so a sample is taken only
if its non-tensor arguments, or whether its tensors are 0-dim or empty,
differ from those already taken (31,000 samples of the 1,494 cases come
down to 13,400 distinct ones; the default runs 4,000 of them).  0 runs every
sample, distinct or not, for a deep run (hours on two cores).
"""

from __future__ import annotations

import collections
import os
import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest", reason="torch's OpInfo database needs expecttest (pip install expecttest)")

from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402
from torch.utils._pytree import tree_flatten, tree_map  # noqa: E402

from opinfo_expected_failures import (  # noqa: E402
    ACCELERATOR_DTYPES, EXPECTED_FAILURES, FLOAT32_REFERENCE, SKIPS, TOLERANCES as WIDER, UP_TO_FREEDOM)
from opinfo_properties import RANDOM, RANDOM_INPUTS, TIES, UNINITIALISED  # noqa: E402

def _dtypes() -> tuple:
    """PJRT_HOST_OPINFO_DTYPES: comma-separated torch dtype names to run
    (default float32,int64,bool,bfloat16,float16)."""
    raw = os.environ.get("PJRT_HOST_OPINFO_DTYPES", "float32,int64,bool,bfloat16,float16")
    return tuple(getattr(torch, name.strip()) for name in raw.split(",") if name.strip())


DTYPES = _dtypes()
# float32 results: XLA's transcendental functions and reduction orders differ
# from ATen's by a few ulps; 1e-4 relative keeps real bugs visible.
TOLERANCES = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.complex64: dict(rtol=1e-4, atol=1e-5)}


#: OpInfos whose tensor arguments besides the input stay on CPU, by torch's rule.
CPU_ARGUMENTS = {"tensor_split": "indices_or_sections, when a tensor, must be a CPU tensor"}


def _samples_per_case() -> int:
    """PJRT_HOST_OPINFO_SAMPLES: distinct samples run per (OpInfo, dtype); default 3, 0 means every sample."""
    return int(os.environ.get("PJRT_HOST_OPINFO_SAMPLES", "3"))


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


def _samples(op: Any, dtype: torch.dtype) -> Any:
    """The case's samples to run: the first of each distinct signature, or every one (limit 0)."""
    seen = set()
    distinct = _samples_per_case() > 0
    for sample in op.sample_inputs("cpu", dtype, requires_grad=False):
        if distinct:
            key = _signature((sample.input, sample.args, sample.kwargs))
            if key in seen:
                continue
            seen.add(key)
        yield sample


def _case_id(op: Any, dtype: torch.dtype) -> str:
    name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
    return f"{name}-{str(dtype).removeprefix('torch.')}"


def _cases() -> list[Any]:
    cases = []
    for op in op_db:
        supported = op.supported_dtypes("cpu")
        for dtype in DTYPES:
            if dtype in supported:
                cases.append(pytest.param(op, dtype, id=_case_id(op, dtype)))
    return cases


CASES = _cases()
_outcomes: collections.Counter = collections.Counter()


def _device_available() -> bool:
    try:
        torch.zeros(1, device="jax")
        return True
    except Exception:
        return False


class _Summary:
    """Registered as a pytest plugin by the first test: its terminal-summary
    hook prints the counts once the session has finished."""

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        total = sum(v for k, v in _outcomes.items() if k != "by properties")
        line = (f"OpInfo on jax: {_outcomes['passed']} passed ({_outcomes['by properties']} by properties), "
                f"{_outcomes['xfailed']} expected failures, {_outcomes['skipped']} skipped of {total}")
        if _outcomes["failed"]:
            line += f" ({_outcomes['failed']} failed)"
        terminalreporter.write_sep("-", line)


@pytest.fixture(scope="module", autouse=True)
def _summary(request: pytest.FixtureRequest) -> Any:
    if not _device_available():
        pytest.skip("the 'jax' device is not available")
    manager = request.config.pluginmanager
    if not manager.has_plugin("pjrt-host-opinfo-summary"):
        manager.register(_Summary(), "pjrt-host-opinfo-summary")
    yield


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


def _compare(actual: Any, expected: Any, dtype: torch.dtype, values: bool = True, wider: dict | None = None,
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


def _run_case(op: Any, dtype: torch.dtype, name: str, up_to_freedom: bool = False) -> tuple[int, bool]:
    """Run the case's samples; return (how many were compared, whether any
    only by properties).  ``up_to_freedom``: compare what the sample's
    ``output_process_fn_grad`` keeps of both results (torch's OpInfos use it
    to take out a free choice: |eigenvectors|, |U|, U @ Vh ...), as torch's
    test_compare_cpu does."""
    limit = _samples_per_case()
    random_check = RANDOM.get(name)
    case = _case_id(op, dtype)
    ties = TIES.get(name) or TIES.get(case)
    wider = WIDER[case][0] if case in WIDER else None
    dtypes = ACCELERATOR_DTYPES[case][0] if case in ACCELERATOR_DTYPES else None
    draw = RANDOM_INPUTS.get(name)
    compared, by_properties = 0, False
    for sample in _samples(op, dtype):
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
            _compare(actual, expected, dtype, values=False)
            ties(sample, tree_map(_cpu, actual), expected)
        elif name in UNINITIALISED:
            _compare(actual, expected, dtype, values=False)
            by_properties = True
        elif random_check is not None:
            _compare(actual, expected, dtype, values=False)
            try:
                random_check(sample, expected, expected)
            except AssertionError as err:
                raise AssertionError(f"opinfo_properties.py: torch CPU's own result fails {name}'s check: {err}") \
                    from None
            exact = random_check(sample, tree_map(_cpu, actual), expected)
            if exact:
                _compare(actual, expected, dtype, wider=wider)
            else:
                by_properties = True
        else:
            _compare(actual, expected, dtype, wider=wider, dtypes=dtypes)
        compared += 1
    return compared, by_properties


@pytest.mark.parametrize("op, dtype", CASES)
def test_opinfo(op: Any, dtype: torch.dtype) -> None:
    case = _case_id(op, dtype)
    name = case.rsplit("-", 1)[0]
    reason = SKIPS.get(case) or SKIPS.get(name)
    if reason:
        _outcomes["skipped"] += 1
        pytest.skip(reason)
    expected_failure = EXPECTED_FAILURES.get(case) or EXPECTED_FAILURES.get(name)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compared, by_properties = _run_case(
                op, dtype, name, up_to_freedom=bool(UP_TO_FREEDOM.get(case) or UP_TO_FREEDOM.get(name)))
    except Exception as err:
        if expected_failure:
            _outcomes["xfailed"] += 1
            pytest.xfail(f"{expected_failure} ({type(err).__name__})")
        _outcomes["failed"] += 1
        raise
    if compared == 0:
        _outcomes["skipped"] += 1
        pytest.skip("torch CPU accepts none of this OpInfo's samples")
    if expected_failure:
        _outcomes["failed"] += 1
        pytest.fail(f"{case} passes but is listed as an expected failure ({expected_failure!r}): remove the entry")
    _outcomes["passed"] += 1
    _outcomes["by properties"] += by_properties
