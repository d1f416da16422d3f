"""The Markdown report of ``python -m pjrt_host check --report PATH.md``."""

from __future__ import annotations

from typing import Any

__all__ = ["markdown"]


def _cell(text: Any) -> str:
    return str(text if text is not None else "").replace("|", "\\|").replace("\n", " ")


def markdown(doc: dict[str, Any]) -> str:
    plugin = doc["plugin"]
    host = doc["host"]
    s = doc["summary"]
    lines = [
        f"# pjrt_host report card: `{plugin.get('name')}`",
        "",
        f"**{s['status'].upper()}**" + (f": {_cell(s['reason'])}" if s.get("reason") else ""),
        "",
        "| | |",
        "|---|---|",
        f"| plugin | `{plugin.get('name')}` {_cell(plugin.get('display_name') or '')} |",
        f"| distribution | {_cell(plugin.get('distribution'))} {_cell(plugin.get('version'))} |",
        f"| library | {_cell(plugin.get('library') or '(built into jaxlib)')} |",
        "| versions | " + ", ".join(f"{k} {v}" for k, v in host["versions"].items() if v) + " |",
        f"| host | {_cell(host['platform'])}, {host['cpus']} CPUs, Python {host['python']} |",
        f"| run | {doc['started']}, {'--quick, ' if doc['quick'] else ''}{doc['seconds']:.0f} s |",
        "",
        "| section | result | checks | time |",
        "|---|---|---|---|",
    ]
    for sec in doc["sections"]:
        counts: dict[str, int] = {}
        for c in sec["checks"]:
            counts[c["status"]] = counts.get(c["status"], 0) + 1
        status = sec["status"] if sec["conformance"] or sec["status"] == "fail" else "figures"
        lines.append(f"| {sec['name']} | **{status}** | "
                     + (", ".join(f"{v} {k}" for k, v in counts.items()) or _cell(sec.get("reason", "")))
                     + f" | {sec['seconds']:.0f} s |")
    for sec in doc["sections"]:
        lines += ["", f"## {sec['title']}", ""]
        if sec.get("reason"):
            lines += [f"{_cell(sec['reason'])}", ""]
        if sec["checks"]:
            lines += ["| check | result | detail |", "|---|---|---|"]
            lines += [f"| {_cell(c['name'])} | {c['status']} | {_cell(c.get('detail', ''))[:600]} |"
                      for c in sec["checks"]]
        if sec["figures"]:
            lines += ["", "| figure | value | reference | note |", "|---|---|---|---|"]
            for f in sec["figures"]:
                value = "n/a" if f.get("value") is None else f"{f['value']:.4g} {f['unit']}"
                ref = ""
                if f.get("reference") is not None:
                    ref = f"{f['reference_name']}: {f['reference']:.4g} {f['unit']}"
                lines.append(f"| {_cell(f['name'])} | {value} | {_cell(ref)} | {_cell(f.get('note', ''))} |")
    lines += ["", f"Produced by `python -m pjrt_host check` (JSON schema `{doc['schema']}`).", ""]
    return "\n".join(lines)
