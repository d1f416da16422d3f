"""The sections of ``python -m pjrt_host check``, in report order, each run
in its own child process by ``_check/__init__.py`` (which holds their
titles and time limits and imports neither torch nor jax).

One module per section (``_contract``, ``_dtypes``, ``_ops``, ``_compile``, ``_kernels``,
``_memory``, ``_collectives``, ``_performance``), over what they share:
``_recorder`` (a section's checks and figures, written to its result file
after each), ``_support`` (the plugin under test, comparison with torch
CPU) and ``_two_processes`` (a check run under ``pjrt_host launch``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ._collectives import collectives
from ._compile import compile_interop
from ._contract import contract
from ._dtypes import dtypes
from ._kernels import kernels
from ._memory import memory
from ._ops import ops
from ._performance import performance
from ._recorder import Recorder, error_text

__all__ = ["SECTIONS", "run_section"]

#: Section name -> the function that runs it, in report order.
SECTIONS: dict[str, Callable[..., None]] = {
    "contract": contract,
    "dtypes": dtypes,
    "ops": ops,
    "compile": compile_interop,
    "kernels": kernels,
    "memory": memory,
    "collectives": collectives,
    "performance": performance,
}


def run_section(section: str, name: str, result_file: Path, quick: bool, ops_filter: str | None) -> int:
    import warnings

    warnings.simplefilter("ignore")  # the report says what matters; warnings would bury the progress lines
    rec = Recorder(result_file)
    try:
        SECTIONS[section](rec, name, quick, ops_filter=ops_filter)
    except Exception as err:  # outside any check: the section itself could not run
        rec.add("section", "fail", error_text(err))
    rec.finish()
    return 0
