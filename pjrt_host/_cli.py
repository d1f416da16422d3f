"""``python -m pjrt_host``: a thin layer over the library.

``list`` and ``info`` read metadata and library files only (never torch or
jax); ``--probe`` and ``doctor`` create clients in child processes with a
timeout, so a plugin that crashes or hangs cannot take the CLI down.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from . import _env, _launch, _plugin, _registry
from ._errors import EnvironmentSettingError
from ._discovery import PluginRecord

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except EnvironmentSettingError as err:
        print(f"pjrt_host: {err}", file=sys.stderr)
        return 2


class _Commands(dict):
    """The subcommands: every one runs, but an unknown command's error lists
    only the public ones (argparse iterates over these to list them)."""

    def __iter__(self) -> Any:
        return (name for name in dict.__iter__(self) if not name.startswith("_"))


def _internal(sub: Any, name: str) -> argparse.ArgumentParser:
    """A subcommand the package runs in its own child processes, not one for
    users: argparse lists a subparser in ``--help`` only when it is given
    ``help=`` (``argparse.SUPPRESS`` would be printed as it is)."""
    return sub.add_parser(name)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pjrt_host", description="PJRT device plugins for PyTorch.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("list", help="list discovered plugins")
    p.add_argument("--probe", action="store_true", help="create each plugin's client in a subprocess and show its devices")
    p.add_argument("--timeout", type=float, default=None, help="seconds per probe (default: PJRT_HOST_PROBE_TIMEOUT or 60)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("info", help="everything about one plugin")
    p.add_argument("name")
    p.add_argument("--probe", action="store_true", help="also create its client in a subprocess")
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser("doctor", help="check versions and plugin libraries, and say what to do")
    p.add_argument("--json", action="store_true")
    p.add_argument("--verify", action="store_true",
                   help="also check the installed files of pjrt-host and each plugin's distribution against the "
                        "sha256 hashes in their RECORD")
    p.set_defaults(func=_cmd_doctor)

    p = sub.add_parser("check", help="a conformance and performance report card for one plugin",
                       description="Run conformance sections (contract, dtypes, ops, compile, kernels, memory, "
                                   "collectives) and performance probes against a plugin, each in its own process. "
                                   "Exit 0 when every conformance section passes, 1 when one fails, 2 when the "
                                   "plugin cannot be used. See docs/writing-a-plugin.md.")
    p.add_argument("name", nargs="?", default=None, help="the plugin (default: the one PJRT_DEVICE or priority selects)")
    p.add_argument("--quick", action="store_true", help="one OpInfo sample per case, smaller probes (minutes)")
    p.add_argument("--json", dest="json_path", metavar="PATH", help="write the JSON document here")
    p.add_argument("--report", dest="report_path", metavar="PATH.md", help="write a Markdown report here")
    p.add_argument("--only", metavar="SECTION,...", help="run only these sections (contract always runs first)")
    p.add_argument("--ops", dest="ops_filter", metavar="REGEX",
                   help="only OpInfo cases whose id (e.g. 'linalg.det-float32') matches")
    p.set_defaults(func=_cmd_check)

    p = _internal(sub, "_check_section")
    p.add_argument("section")
    p.add_argument("name")
    p.add_argument("result_file")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--ops", dest="ops_filter", default=None)
    p.set_defaults(func=_cmd_check_section)

    p = sub.add_parser("launch", help="run a script in several processes (torchrun's launcher)",
                       description="Run SCRIPT in --nproc-per-node processes on this host, as host --node-rank of "
                                   "--nnodes, through torchrun's elastic agent. See docs/distributed.md.")
    _launch.add_launch_arguments(p)
    p.set_defaults(func=_launch.run_launch_command)

    p = _internal(sub, "_probe")
    p.add_argument("name")
    p.set_defaults(func=_cmd_probe_child)

    p = _internal(sub, "_capi_version")
    p.add_argument("library")
    p.set_defaults(func=_cmd_capi_version_child)
    sub.choices = _Commands(sub.choices)
    return parser


# -- list ---------------------------------------------------------------------


def _cmd_list(args: argparse.Namespace) -> int:
    records = _registry.plugins()
    chosen = _registry.default_name()
    rows = [_row(r, chosen) for r in records]
    if args.probe:
        timeout = args.timeout or _env.probe_timeout()
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(records)))) as pool:
            results = list(pool.map(lambda r: _probe(r, timeout), records))
        for row, result in zip(rows, results):
            row["probe"] = result
    if args.json:
        print(json.dumps({"plugins": rows, "selected": chosen}, indent=2))
        return 0
    if not rows:
        print("No PJRT plugins found. " + _registry.INSTALL_HINT)
        return 0
    headers = ["NAME", "DISTRIBUTION", "SOURCE", "LIBRARY", "SELECTED", "STATUS"]
    table = [[
        r["name"],
        f"{r['distribution']} {r['version']}" if r["distribution"] else "-",
        r["source"],
        _library_text(r),
        "*" if r["selected"] else "",
        _status_text(r),
    ] for r in rows]
    _print_table(headers, table)
    if chosen is None:
        print("\nNo plugin can be selected. " + _registry.INSTALL_HINT)
    return 0


def _row(record: PluginRecord, chosen: str | None) -> dict[str, Any]:
    row = record.as_dict()
    row["selected"] = record.name == chosen and record.ok
    return row


def _library_text(row: dict[str, Any]) -> str:
    """The library path; a usable plugin without one uses a jaxlib backend."""
    if row["library"]:
        return row["library"]
    return "(built into jaxlib)" if row["status"] == "ok" else "-"


def _status_text(row: dict[str, Any]) -> str:
    text = row["status"]
    if row["reason"]:
        text += f": {row['reason']}"
    probe = row.get("probe")
    if probe is not None:
        if probe.get("devices") is not None:
            text += f"; {probe['devices']} device(s) ({probe.get('device_kind')}, platform {probe.get('platform')})"
        else:
            text += f"; no devices: {probe.get('error')}"
    return text


def _print_table(headers: list[str], table: list[list[str]]) -> None:
    widths = [max(len(h), *(len(str(row[i])) for row in table)) for i, h in enumerate(headers)]
    # The last column (status) is free text: do not pad it.
    fmt = "  ".join(f"{{:<{w}}}" for w in widths[:-1]) + "  {}"
    print(fmt.format(*headers))
    for row in table:
        print(fmt.format(*row))


# -- probing, in a child process ---------------------------------------------


def _probe(record: PluginRecord, timeout: float) -> dict[str, Any]:
    if not record.ok:
        return {"devices": None, "error": f"not probed: {record.status}"}
    return _run_child(["_probe", record.name], timeout, env={"PJRT_DEVICE": record.name})


def _run_child(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    child_env = dict(os.environ)
    child_env.update(env or {})
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pjrt_host", *argv],
            capture_output=True, text=True, timeout=timeout, env=child_env, stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return {"devices": None, "error": f"timed out after {timeout:g} s (the client hung; raise --timeout if it is just slow)"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if lines:
        try:
            return json.loads(lines[-1])
        except ValueError:
            pass
    tail = " ".join(proc.stderr.strip().splitlines()[-3:]) or f"exit code {proc.returncode}"
    if proc.returncode < 0:
        return {"devices": None, "error": f"the client crashed the process (signal {-proc.returncode}): {tail}"}
    return {"devices": None, "error": f"exit code {proc.returncode}: {tail}"}


def _cmd_probe_child(args: argparse.Namespace) -> int:
    from . import _runtime

    try:
        _registry.select(args.name)
        rt = _runtime.runtime()
        devs = rt.devices
        result = {
            "devices": len(devs),
            "platform": devs[0].platform,
            "device_kind": devs[0].device_kind,
            "backend": rt.backend,
        }
    except Exception as err:
        # The row already names the plugin and its library: keep the cause.
        result = {"devices": None, "error": re.sub(r"^pjrt_host: (plugin '[^']*' \(from [^)]*\): )?", "", str(err))}
    print(json.dumps(result), flush=True)
    return 0


# -- info ---------------------------------------------------------------------


def _cmd_info(args: argparse.Namespace) -> int:
    name = args.name.lower()
    records = [r for r in _registry.plugins() if r.name == name]
    if not records:
        try:
            _registry._lookup(name, how=f"info {name}")
        except Exception as err:
            print(str(err), file=sys.stderr)
        return 1
    chosen = _registry.default_name()
    infos = []
    for record in records:
        info = _row(record, chosen)
        info.update(_plugin_members(record))
        if args.probe:
            info["probe"] = _probe(record, args.timeout or _env.probe_timeout())
        infos.append(info)
    if args.json:
        print(json.dumps(infos if len(infos) > 1 else infos[0], indent=2, default=str))
        return 0
    for info in infos:
        for key, value in info.items():
            if key == "kernels" and isinstance(value, list):  # one kernel a line
                value = ("\n" + " " * 28).join(value) or "-"
            print(f"{key:>26}: {value if value not in (None, '') else '-'}")
        print()
    return 0


def _plugin_members(record: PluginRecord) -> dict[str, Any]:
    plugin = record.plugin
    if plugin is None or not record.ok:
        return {"cause": repr(record.error) if record.error else None}
    members: dict[str, Any] = {
        "class": f"{type(plugin).__module__}.{type(plugin).__qualname__}",
        "jaxlib_backend": plugin.jaxlib_backend if record.library is None else None,
        "dense_gather_factor": plugin.dense_gather_factor,
        "conv_as_matmul_max_positions": plugin.conv_as_matmul_max_positions,
        "widen_16bit_matmul_operands": plugin.widen_16bit_matmul_operands,
        "compile_options": dict(plugin.compile_options),
        "unsupported_dtypes": dict(plugin.unsupported_dtypes),
        "zero_copy_torch_devices": list(plugin.zero_copy_torch_devices),
        "is_host_cpu": bool(plugin.is_host_cpu),
        "kernels": _kernels_text(plugin),
    }
    for method in ("physical_chip_count", "requires_xla_coordinator", "host_index", "client_create_options"):
        try:
            value = getattr(plugin, method)()
            members[method] = dict(value) if method == "client_create_options" else value
        except Exception as err:
            members[method] = f"raised {type(err).__name__}: {err}"
    return members


def _kernels_text(plugin: Any) -> list[str] | str:
    """The plugin's vendor kernels, one line each (``aten::_softmax ->
    module:function [float32; when module:predicate]``), from the
    declaration alone: nothing is imported."""
    problems = _plugin.kernel_problems(plugin)
    if problems:
        return "cannot be read: " + "; ".join(problems)
    declared = plugin.declared_kernels if isinstance(plugin, _plugin.DevicePlugin) else None
    if declared is None:
        return []
    lines = []
    for op, kernel in declared.kernels:
        conditions = [", ".join(kernel.dtypes)] if kernel.dtypes else []
        conditions += [f"ranks {', '.join(map(str, kernel.ranks))}"] if kernel.ranks else []
        conditions += [f"when {kernel.when}"] if kernel.when else []
        off = declared.mode == "off" or op in declared.dropped
        lines.append(f"{op} -> {kernel.fn}" + (f" [{'; '.join(conditions)}]" if conditions else "")
                     + (" (off: PJRT_HOST_PLUGIN_KERNELS)" if off else ""))
    return lines


# -- check --------------------------------------------------------------------


def _cmd_check(args: argparse.Namespace) -> int:
    from . import _check

    only = [s.strip() for s in args.only.split(",") if s.strip()] if args.only else None
    name = args.name or os.environ.get("PJRT_DEVICE") or None
    return _check.run(name, quick=args.quick, only=only, json_path=args.json_path, report_path=args.report_path,
                      ops_filter=args.ops_filter)


def _cmd_check_section(args: argparse.Namespace) -> int:
    from . import _check

    return _check.child_main(args.section, args.name, args.result_file, args.quick, args.ops_filter)


# -- doctor -------------------------------------------------------------------


def _cmd_doctor(args: argparse.Namespace) -> int:
    from . import _doctor

    records = _registry.plugins()
    findings = _doctor.run(records, capi_version=lambda lib: _run_child(["_capi_version", lib], 30))
    if args.verify:
        findings += _doctor.verify(["pjrt-host", *(r.distribution for r in records if r.distribution)])
    if args.json:
        print(json.dumps(findings, indent=2))
    else:
        for finding in findings:
            print(f"[{finding['level']}] {finding['what']}")
            if finding.get("fix"):
                print(f"        fix: {finding['fix']}")
    return 1 if any(f["level"] == "error" for f in findings) else 0


def _cmd_capi_version_child(args: argparse.Namespace) -> int:
    from . import _doctor

    print(json.dumps(_doctor.read_capi_version(args.library)), flush=True)
    return 0
