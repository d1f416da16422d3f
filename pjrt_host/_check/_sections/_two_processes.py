"""Running a check in two processes under ``python -m pjrt_host launch``
(``pjrt_host._check._mp_worker``), for the collectives and performance
sections."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["launch_workers"]


def launch_workers(mode: str, timeout: float, extra: list[str] | None = None) -> dict[str, Any]:
    """Run ``_mp_worker MODE`` in 2 processes under ``python -m pjrt_host
    launch``; {"ranks": {rank: its JSON}} or {"error": why}."""
    import signal

    with tempfile.TemporaryDirectory(prefix="pjrt_host_check_mp_") as tmp:
        argv = [sys.executable, "-m", "pjrt_host", "launch", "--nproc-per-node", "2", "-m",
                "pjrt_host._check._mp_worker", mode, tmp, *(extra or [])]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            return {"error": f"the 2 processes did not finish within {timeout:.0f} s (a hang in a collective?); "
                             f"last output: {_tail(output)}"}
        ranks = {}
        for r in (0, 1):
            path = Path(tmp) / f"rank{r}.json"
            if path.exists():
                ranks[str(r)] = json.loads(path.read_text())
        errors = [f"rank {r}: {out['error']}" for r, out in sorted(ranks.items()) if out.get("error")]
        if errors:
            return {"error": "; ".join(errors)}
        if proc.returncode != 0 or len(ranks) != 2:
            return {"error": f"exit status {proc.returncode}; {len(ranks)} of 2 ranks reported; "
                             f"last output: {_tail(output)}"}
        return {"ranks": ranks}


_NOISE = re.compile(r"^([WEI]\d{4} |\*+$|pjrt_host launch:|File |Traceback|\^+$)|grpc_|elastic/multiprocessing")


def _tail(output: str) -> str:
    """The lines of the ranks' output that say what went wrong: the first
    error lines, without the launcher's own reports."""
    lines = [line.strip() for line in (output or "").splitlines() if line.strip()]
    lines = [line for line in lines if not _NOISE.search(line)]
    interesting = [line for line in lines if re.search(r"Error|ERROR|error|Exception|Fatal|Check failed", line)]
    return " | ".join(interesting[:2] if interesting else lines[-3:])[:600]
