"""The ``ops`` section: torch's OpInfo samples on the device against torch
CPU, counted by family."""

from __future__ import annotations

import re
import time
from typing import Any

from ._recorder import Recorder, first_line
from ._support import plugin_record

__all__ = ["ops"]


def ops(rec: Recorder, name: str, quick: bool, ops_filter: str | None = None, **_: Any) -> None:
    import collections

    import torch

    try:
        from .. import _opinfo
    except ImportError as err:
        rec.finish(status="skip", reason=f"torch's OpInfo database cannot be imported ({first_line(err)}); "
                                         "pip install 'pjrt-host[check]' (it needs expecttest)")
        return
    declared = dict(plugin_record(name).plugin.unsupported_dtypes)
    dtypes = [getattr(torch, n) for n in ("float32", "int64", "bool", "bfloat16") if n not in declared]
    cases = _opinfo.cases(tuple(dtypes))
    if ops_filter:
        pattern = re.compile(ops_filter)
        cases = [(op, dt) for op, dt in cases if pattern.search(_opinfo.case_id(op, dt))]
    limit = 1 if quick else 3
    by_family: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    failures: dict[str, list[str]] = collections.defaultdict(list)
    started = time.time()
    rec.progress(f"{len(cases)} cases ({', '.join(str(d).removeprefix('torch.') for d in dtypes)}), "
                 f"{limit} distinct sample(s) each")
    for i, (op, dtype) in enumerate(cases, 1):
        case = _opinfo.case_id(op, dtype)
        rec.result["running"] = case
        if i % 25 == 1:
            rec._write()
        outcome = _opinfo.run(op, dtype, limit=limit)
        fam = _opinfo.family(op)
        status = {"xfailed": "expected", "stale": "passed"}.get(outcome.status, outcome.status)
        by_family[fam][status] += 1
        if status == "failed":
            failures[fam].append(f"{case}: {first_line(outcome.detail)[:300]}")
        if i % 100 == 0 or i == len(cases):
            failed = sum(c["failed"] for c in by_family.values())
            rec.progress(f"{i}/{len(cases)} cases, {failed} failed ({time.time() - started:.0f} s)")
    rec.result["running"] = None
    totals: collections.Counter = collections.Counter()
    for fam in sorted(by_family):
        counts = by_family[fam]
        totals.update(counts)
        text = ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "expected", "skipped") if counts[k])
        if failures[fam]:
            text += "; " + "; ".join(failures[fam][:5]) + ("; ..." if len(failures[fam]) > 5 else "")
        rec.add(fam, "fail" if counts["failed"] else "pass", text, counts=dict(counts), failures=failures[fam])
    ran = totals["passed"] + totals["failed"]
    rec.figure("ops passed", 100.0 * totals["passed"] / ran if ran else None, "%",
               note=f"{totals['passed']} of {ran} cases run; {totals['expected']} reviewed expected failures, "
                    f"{totals['skipped']} skipped")
