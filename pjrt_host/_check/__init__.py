"""``python -m pjrt_host check [NAME]``: a conformance and performance report
card a vendor runs on its own plugin.

Each section runs in its own child process (``python -m pjrt_host
_check_section``), under a time limit, so a plugin that crashes or hangs
fails that one section and the report still comes out.  The child writes
its result file after every check, so a crash keeps what ran before it and
names the check it died in.

This module is the parent side: it imports neither torch nor jax (the
plugin may not even load).  The checks themselves are in ``_sections/``.

Exit status: 0 when every conformance section passes, 1 when one fails, 2
when the plugin cannot be used at all (not installed, its library missing
or not loadable, no client or no device), with the plugin's own reason.

The JSON document (``--json``) has the schema named by :data:`SCHEMA`,
documented in docs/writing-a-plugin.md ("The report card").
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from .. import _env, _registry

__all__ = ["SCHEMA", "SECTIONS", "run"]

#: Version of the JSON document; bumped on any incompatible change.
SCHEMA = "pjrt_host.check/1"

#: (name, title, conformance?, time limit in seconds quick / full)
SECTIONS: tuple[tuple[str, str, bool, tuple[int, int]], ...] = (
    ("contract", "Contract: plugin properties, library, client, devices", True, (180, 300)),
    ("dtypes", "Dtypes: each torch dtype round-trips bit-exactly, or is declared", True, (300, 600)),
    ("ops", "Ops: torch's OpInfo database against torch CPU", True, (1800, 14400)),
    ("compile", "Compile and interop: torch.compile, assume_pure, call_jax, DLPack", True, (900, 1800)),
    ("kernels", "Vendor kernels: each against the reference lowering (values, autograd, time)", True, (600, 1200)),
    ("memory", "Memory: statistics, out-of-memory, recovery", True, (300, 600)),
    ("collectives", "Collectives: local devices and 2 processes", True, (600, 1200)),
    ("performance", "Performance probes (figures, not pass/fail)", False, (900, 1800)),
)
_BY_NAME = {s[0]: s for s in SECTIONS}


def section_names() -> list[str]:
    return [s[0] for s in SECTIONS]


def _host() -> dict[str, Any]:
    import importlib_metadata

    versions = {}
    for dist in ("pjrt-host", "torch", "jax", "jaxlib"):
        try:
            versions[dist] = importlib_metadata.version(dist)
        except importlib_metadata.PackageNotFoundError:
            versions[dist] = None
    return {"python": platform.python_version(), "platform": platform.platform(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "versions": versions}


def _skipped(name: str, reason: str) -> dict[str, Any]:
    return {"name": name, "title": _BY_NAME[name][1], "conformance": _BY_NAME[name][2], "status": "skip",
            "reason": reason, "checks": [], "figures": [], "seconds": 0.0}


def run(name: str | None, quick: bool = False, only: Sequence[str] | None = None, json_path: str | None = None,
        report_path: str | None = None, ops_filter: str | None = None, out: Any = None) -> int:
    """Run the report card; print it, write the requested files, return the
    exit status."""
    out = out or sys.stdout
    started = time.time()
    wanted = list(only) if only else section_names()
    unknown = [w for w in wanted if w not in _BY_NAME]
    if unknown:
        print(f"pjrt_host check: no section {', '.join(map(repr, unknown))}; sections: "
              f"{', '.join(section_names())}", file=sys.stderr)
        return 2

    record, unusable = _resolve(name)
    doc: dict[str, Any] = {
        "schema": SCHEMA, "plugin": _plugin_row(record, name), "host": _host(), "quick": quick,
        "only": wanted if only else None, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "sections": [],
    }
    print(f"pjrt_host check: plugin {doc['plugin']['name']!r}"
          + (f" ({doc['plugin']['origin']})" if doc['plugin'].get('origin') else "")
          + (", quick" if quick else ""), file=out, flush=True)

    # The contract section runs first whenever anything runs: it says whether
    # the plugin can be used at all.
    order = ["contract"] + [w for w in section_names() if w in wanted and w != "contract"]
    for index, section in enumerate(order, 1):
        if unusable is not None:
            result = _skipped(section, "the plugin cannot be used (see contract)")
            if section == "contract":
                result.update(status="fail", reason=unusable,
                              checks=[{"name": "plugin", "status": "fail", "detail": unusable}])
        else:
            print(f"[{index}/{len(order)}] {_BY_NAME[section][1]}", file=out, flush=True)
            result = _run_section(section, record.name, quick, ops_filter, out)  # type: ignore[union-attr]
            if section == "contract":
                unusable = result.get("unusable") or _no_client(result)
        if section == "contract" and "contract" not in wanted and result["status"] == "pass":
            continue  # ran only to learn whether the plugin is usable
        doc["sections"].append(result)
        _print_section(result, out)

    conformance = [s for s in doc["sections"] if s["conformance"]]
    if unusable is not None:
        status, code = "unusable", 2
    elif any(s["status"] == "fail" for s in conformance):
        status, code = "fail", 1
    else:
        status, code = "pass", 0
    doc["summary"] = {
        "status": status, "exit_code": code, "reason": unusable,
        "sections": {s["name"]: s["status"] for s in doc["sections"]},
    }
    doc["seconds"] = round(time.time() - started, 1)
    print("", file=out)
    print(_summary_line(doc), file=out, flush=True)
    if json_path:
        Path(json_path).write_text(json.dumps(doc, indent=2, default=str) + "\n")
    if report_path:
        from ._report import markdown

        Path(report_path).write_text(markdown(doc))
    return code


def _resolve(name: str | None) -> tuple[Any, str | None]:
    """(record, why it cannot be used or None), reading metadata only."""
    records = _registry.plugins()
    if name is None:
        name = _registry.default_name()
        if name is None:
            return None, "no usable plugin is installed. " + _registry.INSTALL_HINT
    matches = [r for r in records if r.name == name.lower()]
    if not matches:
        known = ", ".join(sorted({r.name for r in records})) or "none"
        return None, f"no plugin named {name!r} is installed (installed: {known}). " + _registry.INSTALL_HINT
    usable = [r for r in matches if r.ok]
    if not usable:
        r = matches[0]
        return r, (f"plugin {r.name!r} ({r.origin()}) is not usable: {r.status}: {r.reason}; reinstall "
                   f"{r.distribution or 'it'} or ask its vendor")
    return usable[0], None


def _plugin_row(record: Any, name: str | None) -> dict[str, Any]:
    if record is None:
        return {"name": (name or "").lower() or None}
    row = record.as_dict()
    row["origin"] = record.origin()
    plugin = record.plugin
    if plugin is not None:
        row["class"] = f"{type(plugin).__module__}.{type(plugin).__qualname__}"
        row["display_name"] = getattr(plugin, "display_name", None)
    return row


def _run_section(section: str, name: str, quick: bool, ops_filter: str | None, out: Any) -> dict[str, Any]:
    limit = _BY_NAME[section][3][0 if quick else 1]
    limit = _env.check_timeout(limit)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="pjrt_host_check_") as tmp:
        result_file = Path(tmp) / "result.json"
        argv = [sys.executable, "-m", "pjrt_host", "_check_section", section, name, str(result_file)]
        if quick:
            argv.append("--quick")
        if ops_filter:
            argv += ["--ops", ops_filter]
        env = dict(os.environ, PJRT_DEVICE=name)
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        tail: list[str] = []
        reader = threading.Thread(target=_relay, args=(proc.stdout, out, tail), daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=limit)
            timed_out = False
        except subprocess.TimeoutExpired:
            _kill(proc)
            rc, timed_out = proc.wait(), True
        reader.join(5)
        result = _read(result_file)
    result.setdefault("checks", [])
    result.setdefault("figures", [])
    result.update(name=section, title=_BY_NAME[section][1], conformance=_BY_NAME[section][2],
                  seconds=round(time.time() - started, 1))
    if timed_out or rc != 0 or "status" not in result:
        running = result.pop("running", None)
        where = f" in check {running!r}" if running else ""
        if timed_out:
            why = (f"the section did not finish within {limit:g} s{where} (a hang, or a slow device: raise "
                   "PJRT_HOST_CHECK_TIMEOUT)")
        elif rc < 0:
            why = f"the process crashed (signal {-rc}){where}"
        else:
            why = f"the process exited with status {rc}{where}"
        last = " | ".join(line for line in tail[-3:] if line.strip())
        detail = f"{why}; its last output: {last}" if last else why
        result["checks"].append({"name": running or "section", "status": "fail", "detail": detail})
        result["status"] = "fail"
        result["reason"] = why
    result.pop("running", None)
    return result


def _no_client(contract: dict[str, Any]) -> str | None:
    """Why the contract section shows no working client (it crashed or hung
    before or while creating one), or None when the client came up."""
    client = [c for c in contract["checks"] if c["name"] == "client"]
    if client and client[0]["status"] == "pass":
        return None
    if client:
        return f"no client: {client[0].get('detail', '')}"
    return f"the client never came up: {contract.get('reason', 'the contract section did not reach it')}"


def _relay(stream: Any, out: Any, tail: list[str]) -> None:
    """Show the child's progress lines, indented; keep the last few."""
    for line in stream:
        line = line.rstrip("\n")
        tail.append(line)
        del tail[:-20]
        if line.startswith("progress: "):
            print("    " + line[len("progress: "):], file=out, flush=True)


def _kill(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the section and whatever it launched
    except (ProcessLookupError, PermissionError):
        proc.kill()


def _read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


_MARK = {"pass": "PASS", "fail": "FAIL", "skip": "skip", "info": "info"}


def _print_section(result: dict[str, Any], out: Any) -> None:
    checks = result["checks"]
    counts = {k: sum(1 for c in checks if c["status"] == k) for k in ("pass", "fail", "expected", "skip")}
    parts = [f"{v} {k}" for k, v in counts.items() if v]
    status = "info" if not result["conformance"] and result["status"] == "pass" else result["status"]
    head = f"  {_MARK.get(status, status):4}  {result['name']:<12} {', '.join(parts) or result.get('reason', '')}"
    print(f"{head}  ({result['seconds']:.0f} s)", file=out, flush=True)
    for c in checks:
        if c["status"] == "fail":
            print(f"        FAIL {c['name']}: {_first_line(c.get('detail', ''))}", file=out)
    for f in result["figures"]:
        print(f"        {_figure_text(f)}", file=out)
    out.flush()


def _first_line(text: str, width: int = 200) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= width else line[: width - 3] + "..."


def _figure_text(f: dict[str, Any]) -> str:
    value = f.get("value")
    text = f"{f['name']}: " + ("n/a" if value is None else f"{value:,.4g} {f.get('unit', '')}".rstrip())
    if f.get("reference") is not None:
        text += f"  (reference {f['reference_name']}: {f['reference']:,.4g} {f.get('unit', '')})".rstrip()
    if f.get("peak") is not None:
        text += f"  (peak {f['peak']:,.4g})"
    if f.get("note"):
        text += f"  [{f['note']}]"
    return text


def _summary_line(doc: dict[str, Any]) -> str:
    s = doc["summary"]
    if s["status"] == "unusable":
        return f"UNUSABLE: plugin {doc['plugin'].get('name')!r} cannot be used: {s['reason']}"
    failed = [n for n, st in s["sections"].items() if st == "fail"]
    if failed:
        return f"FAIL: {', '.join(failed)} ({doc['seconds']:.0f} s)"
    skipped = [sec["name"] for sec in doc["sections"] if sec["conformance"] and sec["status"] == "skip"]
    if skipped:
        return (f"PASS, but not run: {', '.join(skipped)} (see above) -- the other conformance sections passed "
                f"({doc['seconds']:.0f} s)")
    return f"PASS: every conformance section passed ({doc['seconds']:.0f} s)"


def child_main(section: str, name: str, result_file: str, quick: bool, ops_filter: str | None) -> int:
    """``python -m pjrt_host _check_section``: run one section here."""
    from . import _sections

    return _sections.run_section(section, name, Path(result_file), quick=quick, ops_filter=ops_filter)
