"""Conformance of the 'jax' device against torch CPU, driven by torch's own
OpInfo database: one test per (OpInfo, dtype) for the dtypes below, where
the OpInfo supports that dtype on CPU.  The comparison itself (tolerances,
reviewed expected failures, random ops checked by their properties) is
``pjrt_host._check._opinfo``, which ``python -m pjrt_host check`` runs too;
its docstring says how cases are judged.

An expected failure that passes fails the run (a stale entry), so the list
stays true.  The session ends with a line
``OpInfo on jax: N passed (P by properties), M expected failures, K skipped of T``.

Samples: each case runs up to ``PJRT_HOST_OPINFO_SAMPLES`` *different*
samples (31,000 samples of the 1,494 float32/int64/bool cases come down to
13,400 distinct ones).  Default: 2 for float32 and 1 for int64, bool and the
16-bit floats, whose cases repeat the float32 lowerings at wider tolerances
(CI's time: the full default run is most of the suite), and only one of the
two 16-bit floats, and of int64 and bool, per OpInfo (half the OpInfos
each); ``pytest --slow`` (or PJRT_HOST_SLOW_TESTS=1) runs 3 samples for
every dtype, every dtype for every OpInfo.  0 runs every sample,
distinct or not, for a deep run (hours on two cores).
"""

from __future__ import annotations

import collections
import os
import zlib
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest", reason="torch's OpInfo database needs expecttest (pip install expecttest)")

from pjrt_host._check import _opinfo  # noqa: E402


def _dtypes() -> tuple:
    """PJRT_HOST_OPINFO_DTYPES: comma-separated torch dtype names to run
    (default float32,int64,bool,bfloat16,float16)."""
    raw = os.environ.get("PJRT_HOST_OPINFO_DTYPES", "float32,int64,bool,bfloat16,float16")
    return tuple(getattr(torch, name.strip()) for name in raw.split(",") if name.strip())


def _samples_per_case(dtype: torch.dtype, slow: bool) -> int:
    """PJRT_HOST_OPINFO_SAMPLES: distinct samples run per (OpInfo, dtype), 0
    meaning every sample; default above (3 with --slow)."""
    raw = os.environ.get("PJRT_HOST_OPINFO_SAMPLES")
    if raw is not None:
        return int(raw)
    if slow:
        return 3
    return 2 if dtype == torch.float32 else 1


def _in_default_run(op: Any, dtype: torch.dtype) -> bool:
    """The default run takes one 16-bit float per OpInfo, bfloat16 for half
    of them and float16 for the other half (by a stable hash of the name):
    both run the float32 lowerings through the same rounding rule, so every
    op is proven in a 16-bit dtype and both dtypes on half the ops.  The
    same for int64 and bool where an OpInfo supports both: every op is
    proven in an integer dtype, each dtype on half the ops (the other half
    of int64 where bool is unsupported).  ``--slow`` runs every dtype for
    every op."""
    half = zlib.crc32(f"{op.name}.{op.variant_test_name}".encode()) % 2
    if dtype in (torch.bfloat16, torch.float16):
        return half == (0 if dtype == torch.float16 else 1)
    if dtype in (torch.int64, torch.bool) and _supports(op, torch.int64) and _supports(op, torch.bool):
        return half == (0 if dtype == torch.int64 else 1)
    return True


def _supports(op: Any, dtype: torch.dtype) -> bool:
    return dtype in op.supported_dtypes("cpu")


CASES = [pytest.param(op, dtype, id=_opinfo.case_id(op, dtype),
                      marks=() if _in_default_run(op, dtype) else pytest.mark.slow)
         for op, dtype in _opinfo.cases(_dtypes())]
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


@pytest.mark.parametrize("op, dtype", CASES)
def test_opinfo(op: Any, dtype: torch.dtype, request: pytest.FixtureRequest) -> None:
    slow = request.config.getoption("--slow") or os.environ.get("PJRT_HOST_SLOW_TESTS") == "1"
    outcome = _opinfo.run(op, dtype, limit=_samples_per_case(dtype, slow))
    status = {"stale": "failed"}.get(outcome.status, outcome.status)
    _outcomes[status] += 1
    _outcomes["by properties"] += outcome.by_properties
    if outcome.status == "skipped":
        pytest.skip(outcome.detail)
    if outcome.status == "xfailed":
        pytest.xfail(outcome.detail)
    if outcome.status == "stale":
        pytest.fail(outcome.detail)
    if outcome.error is not None:
        raise outcome.error
