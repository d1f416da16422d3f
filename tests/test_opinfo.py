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
``output_process_fn_grad``.  The session ends with a line
``OpInfo on jax: N passed, M expected failures, K skipped of T``.

Run time: every op on the device is compiled for each new shape, and that
dominates, so samples per case are capped: ``PJRT_HOST_OPINFO_SAMPLES``,
default 1 (each OpInfo's first sample), keeps the whole file near 7 minutes
on two cores.  Set it higher, or 0 for every sample, for a deeper run.
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
from torch.utils._pytree import tree_flatten  # noqa: E402

from opinfo_expected_failures import EXPECTED_FAILURES, SKIPS, UP_TO_FREEDOM  # noqa: E402

DTYPES = (torch.float32, torch.int64, torch.bool)
# float32 results: XLA's transcendental functions and reduction orders differ
# from ATen's by a few ulps; 1e-4 relative keeps real bugs visible.
TOLERANCES = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.complex64: dict(rtol=1e-4, atol=1e-5)}


def _samples_per_case() -> int:
    """PJRT_HOST_OPINFO_SAMPLES: samples run per (OpInfo, dtype); default 1, 0 means all."""
    return int(os.environ.get("PJRT_HOST_OPINFO_SAMPLES", "1"))


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
        total = sum(_outcomes.values())
        line = (f"OpInfo on jax: {_outcomes['passed']} passed, {_outcomes['xfailed']} expected failures, "
                f"{_outcomes['skipped']} skipped of {total}")
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


def _compare(actual: Any, expected: Any, dtype: torch.dtype) -> None:
    leaves_a, spec_a = tree_flatten(actual)
    leaves_e, spec_e = tree_flatten(expected)
    assert spec_a == spec_e, f"result structure {spec_a} differs from torch CPU's {spec_e}"
    for a, e in zip(leaves_a, leaves_e):
        if isinstance(e, torch.Tensor):
            assert isinstance(a, torch.Tensor), f"expected a tensor, got {type(a).__name__}"
            assert a.device.type == "jax", f"result on {a.device}, expected the 'jax' device"
            tol = TOLERANCES.get(e.dtype, {})
            torch.testing.assert_close(a.cpu(), e, equal_nan=True, **tol)
        else:
            torch.testing.assert_close(a, e, equal_nan=True)


def _run_case(op: Any, dtype: torch.dtype, up_to_freedom: bool = False) -> int:
    """Run the case's samples; return how many were compared.  ``up_to_freedom``:
    compare what the sample's ``output_process_fn_grad`` keeps of both
    results (torch's OpInfos use it to take out a free choice: |eigenvectors|,
    |U|, U @ Vh ...), as torch's test_compare_cpu does."""
    limit = _samples_per_case()
    compared = 0
    for sample in op.sample_inputs("cpu", dtype, requires_grad=False):
        if limit and compared >= limit:
            break
        try:
            expected = op(sample.input, *sample.args, **sample.kwargs)
        except Exception:
            continue  # torch CPU refuses this sample: nothing to compare
        jax_sample = sample.transform(_to_jax)
        args = [_on_jax(a) for a in jax_sample.args]
        kwargs = {k: _on_jax(v) for k, v in jax_sample.kwargs.items()}
        with torch.device("jax"):  # factories without a device argument
            actual = op(_on_jax(jax_sample.input), *args, **kwargs)
        if up_to_freedom:
            expected, actual = sample.output_process_fn_grad(expected), sample.output_process_fn_grad(actual)
        _compare(actual, expected, dtype)
        compared += 1
    return compared


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
            compared = _run_case(op, dtype, up_to_freedom=bool(UP_TO_FREEDOM.get(case) or UP_TO_FREEDOM.get(name)))
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
