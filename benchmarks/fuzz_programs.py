"""The long run of the differential fuzzer (tests/fuzz_programs.py): seeds in
chunks, each chunk a child process, so that a program that ends its process
(a crash in jaxlib or torch) is recorded by its seed and the run goes on with
the next one.  Prints the totals and writes them to ``--out``/summary.json.

    python benchmarks/fuzz_programs.py --seed 1000000 --count 20000 --minutes 40 --out DIR
    python benchmarks/fuzz_programs.py --count 2000 --modes op,fused,sync --jobs 2

Reproducers of mismatches go to ``--out``/repros (one standalone script
each); docs/fuzzing.md lists the runs and what they found.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FUZZER = REPO / "tests" / "fuzz_programs.py"


def run_chunk(first: int, count: int, args: argparse.Namespace, deadline: float) -> dict:
    """Seeds first..first+count-1 in one child; after a crash, the rest of
    the chunk in a new child.  Returns the chunk's counts."""
    out = Path(args.out)
    totals = {"programs": 0, "runs": {}, "mismatches": {}, "known": {}, "found": [], "crashes": []}
    seed, left = first, count
    while left > 0 and time.monotonic() < deadline:
        stats_file = out / f"chunk_{seed}.json"
        cmd = [sys.executable, str(FUZZER), "--seed", str(seed), "--count", str(left), "--modes", args.modes,
               "--compile-every", str(args.compile_every), "--shrink-budget", str(args.shrink_budget),
               "--save", str(out / "repros"), "--json", str(stats_file), "--trace", "--quiet",
               "--time-limit", str(max(1.0, deadline - time.monotonic()))]
        # faulthandler: a child that a signal ends (an abort inside jaxlib or
        # torch) prints every thread's Python stack, kept with its crash
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(REPO),
                              env={**os.environ, "PYTHONFAULTHANDLER": "1"})
        started = [int(line.split()[-1]) for line in proc.stderr.splitlines() if line.startswith("start seed ")]
        if stats_file.exists():
            stats = json.loads(stats_file.read_text())
            totals["programs"] += stats["programs"]
            for key in ("runs", "mismatches", "known"):
                for mode, n in stats[key].items():
                    totals[key][mode] = totals[key].get(mode, 0) + n
            totals["found"] += stats["found"]
            break
        # the child ended without its counts: the last seed it started ended it
        crashed = started[-1] if started else seed
        lines = proc.stderr.strip().splitlines()
        # from the seed's start: what it printed and, after a signal, every thread's stack
        begun = max((i for i, line in enumerate(lines) if line.startswith("start seed ")), default=len(lines) - 3)
        tail = "\n".join(lines[max(0, begun - 2):][-120:])
        totals["crashes"].append({"seed": crashed, "returncode": proc.returncode, "stderr": tail})
        totals["programs"] += crashed - seed  # those before it ran (their mismatches are lost with the child)
        left -= crashed + 1 - seed
        seed = crashed + 1
    return totals


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1_000_000)
    ap.add_argument("--count", type=int, default=20_000)
    ap.add_argument("--modes", default="op,fused,sync,replay,compile")
    ap.add_argument("--compile-every", type=int, default=5)
    ap.add_argument("--shrink-budget", type=int, default=40)
    ap.add_argument("--chunk", type=int, default=200, help="seeds per child process")
    ap.add_argument("--jobs", type=int, default=1, help="children at once")
    ap.add_argument("--minutes", type=float, default=40.0, help="start no chunk after this long")
    ap.add_argument("--out", default="fuzz_out")
    args = ap.parse_args(argv)
    os.makedirs(Path(args.out) / "repros", exist_ok=True)
    started = time.monotonic()
    deadline = started + args.minutes * 60
    chunks = [(s, min(args.chunk, args.seed + args.count - s)) for s in range(args.seed, args.seed + args.count,
                                                                             args.chunk)]
    totals = {"programs": 0, "runs": {}, "mismatches": {}, "known": {}, "found": [], "crashes": []}
    with ThreadPoolExecutor(args.jobs) as pool:
        for part in pool.map(lambda c: run_chunk(c[0], c[1], args, deadline)
                             if time.monotonic() < deadline else None, chunks):
            if part is None:
                continue
            totals["programs"] += part["programs"]
            for key in ("runs", "mismatches", "known"):
                for mode, n in part[key].items():
                    totals[key][mode] = totals[key].get(mode, 0) + n
            totals["found"] += part["found"]
            totals["crashes"] += part["crashes"]
            print(f"[{time.monotonic() - started:.0f} s] {totals['programs']} programs, mismatches "
                  f"{totals['mismatches']}, crashes {len(totals['crashes'])}", flush=True)
    totals["seconds"] = round(time.monotonic() - started, 1)
    (Path(args.out) / "summary.json").write_text(json.dumps(totals, indent=1))
    print(f"programs run: {totals['programs']} in {totals['seconds']} s; runs per mode {totals['runs']}")
    print(f"mismatches per mode {totals['mismatches']}; known differences {totals['known']}")
    for f in totals["found"]:
        print(f"  seed {f['seed']} {f['mode']}: {f['diffs'][0][:150]} [{f['statements']} stmts] {f['path']}")
    for c in totals["crashes"]:
        print(f"  CRASH seed {c['seed']} (returncode {c['returncode']}): {c['stderr'][-200:]}")
    return 1 if totals["found"] or totals["crashes"] else 0


if __name__ == "__main__":
    sys.exit(main())
