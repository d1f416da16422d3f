"""``python -m pjrt_host doctor``: version skew and library checks, each
finding with what to do about it.  Reads metadata; the one check that loads
a library (its PJRT C API version) runs in a child process."""

from __future__ import annotations

import re
from typing import Any, Callable

import importlib_metadata

from ._discovery import SOURCE_JAX, PluginRecord

__all__ = ["read_capi_version", "run", "verify"]

Finding = dict[str, Any]


def run(records: list[PluginRecord], capi_version: Callable[[str], dict[str, Any]]) -> list[Finding]:
    findings: list[Finding] = []
    versions = {name: _installed(name) for name in ("jax", "jaxlib", "pjrt-host", "torch")}
    for name in ("jax", "jaxlib"):
        if versions[name] is None:
            findings.append(_f("error", f"{name} is not installed: no PJRT client can be created",
                               "pip install -c constraints.txt 'pjrt-host[runtime]'"))
    if versions["jax"] and versions["jaxlib"] and _release(versions["jax"]) != _release(versions["jaxlib"]):
        findings.append(_f("warning", f"jax {versions['jax']} and jaxlib {versions['jaxlib']} differ",
                           f"pip install jaxlib=={versions['jax']}"))
    for name in ("jax", "jaxlib", "torch"):
        if versions[name]:
            findings.append(_f("ok", f"{name} {versions[name]} is installed"))

    for record in records:
        label = f"plugin {record.name!r} ({record.origin()})"
        if not record.ok:
            findings.append(_f("error", f"{label}: {record.status}: {record.reason}",
                               f"reinstall or uninstall {record.distribution or 'it'}"))
            continue
        findings.extend(_requirement_skew(record, label, versions))
        if record.source == SOURCE_JAX and record.version and versions["jaxlib"] \
                and _release(record.version) != _release(versions["jaxlib"]):
            findings.append(_f("warning", f"{label} is version {record.version} but jaxlib is {versions['jaxlib']}; "
                               "jax plugins must match jaxlib", f"pip install {record.distribution}=={versions['jaxlib']}"))
        if record.library:
            result = capi_version(record.library)
            if "major" in result:
                findings.append(_f("ok", f"{label}: {record.library} implements PJRT C API "
                                   f"{result['major']}.{result['minor']}"))
            else:
                findings.append(_f("error", f"{label}: reading the PJRT C API version of {record.library} failed: "
                                   f"{result.get('error')}", f"reinstall {record.distribution or 'the plugin'}"))
        else:
            findings.append(_f("ok", f"{label}: uses jaxlib's built-in '{record.plugin.jaxlib_backend}' backend"))  # type: ignore[union-attr]
    if not records:
        findings.append(_f("warning", "no plugins are installed", "pip install pjrt-host-cpu-ref (or a vendor's plugin)"))
    return findings


def read_capi_version(library: str) -> dict[str, Any]:
    """The (major, minor) PJRT C API version a library implements, read from
    the ``PJRT_Api`` struct that ``GetPjrtApi()`` returns.  Does not call
    ``PJRT_Plugin_Initialize``; still, run it in a child process."""
    import ctypes

    try:
        lib = ctypes.CDLL(library, mode=getattr(ctypes, "RTLD_LOCAL", 0))
        get_api = lib.GetPjrtApi
        get_api.restype = ctypes.c_void_p
        api = get_api()
        if not api:
            return {"error": "GetPjrtApi() returned NULL"}
        # struct PJRT_Api { size_t struct_size; void* extension_start;
        #   PJRT_Api_Version { size_t struct_size; void* extension_start;
        #                      int major_version; int minor_version; } ... }
        major = ctypes.c_int.from_address(api + 32).value
        minor = ctypes.c_int.from_address(api + 36).value
        return {"major": major, "minor": minor}
    except Exception as err:
        return {"error": f"{type(err).__name__}: {err}"}


def _requirement_skew(record: PluginRecord, label: str, versions: dict[str, str | None]) -> list[Finding]:
    if not record.distribution:
        return []
    try:
        requires = importlib_metadata.distribution(record.distribution).requires or []
    except importlib_metadata.PackageNotFoundError:
        return []
    findings = []
    for line in requires:
        if ";" in line and "extra" in line.split(";", 1)[1]:
            continue  # optional extras are not required
        match = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*\(?([^;)]*)\)?", line)
        if not match:
            continue
        name = match.group(1).lower().replace("_", "-")
        spec = match.group(2).strip()
        installed = versions.get(name)
        if name not in versions or not spec or installed is None:
            continue
        if not _satisfies(installed, spec):
            findings.append(_f("warning", f"{label} requires {name}{spec} but {name} {installed} is installed",
                               f"pip install '{name}{spec}' or a {record.distribution} built for {name} {installed}"))
    return findings


def _satisfies(version: str, spec: str) -> bool:
    try:
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version

        return Version(version) in SpecifierSet(spec)
    except ImportError:  # packaging is optional: compare plain releases
        pass
    for clause in spec.split(","):
        m = re.match(r"\s*(==|>=|<=|!=|~=|<|>)\s*([\w.]+)", clause)
        if not m:
            continue
        op, want = m.group(1), _release(m.group(2))
        have = _release(version)
        ok = {"==": have == want, ">=": have >= want, "<=": have <= want, "!=": have != want,
              "<": have < want, ">": have > want, "~=": have >= want}[op]
        if not ok:
            return False
    return True


def _release(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split("."):
        m = re.match(r"\d+", piece)
        if not m:
            break
        parts.append(int(m.group()))
    return tuple(parts)


def _installed(name: str) -> str | None:
    try:
        return importlib_metadata.version(name)
    except importlib_metadata.PackageNotFoundError:
        return None


def _f(level: str, what: str, fix: str | None = None) -> Finding:
    return {"level": level, "what": what, "fix": fix}


# -- doctor --verify ------------------------------------------------------------


def verify(distributions: list[str]) -> list[Finding]:
    """Each distribution's installed files against the hashes pip wrote in
    its ``RECORD``: a file that differs or is missing is an error naming it
    (exit code 1); what could not be checked -- files listed without a hash,
    an editable install whose sources RECORD does not list -- is said.
    Reads files only: imports neither torch nor jax."""
    findings: list[Finding] = []
    for name in dict.fromkeys(distributions):
        try:
            dist = importlib_metadata.distribution(name)
        except importlib_metadata.PackageNotFoundError:
            findings.append(_f("warning", f"{name} is not installed as a distribution: its files cannot be verified"))
            continue
        findings.extend(_verify_one(name, dist))
    return findings


def _verify_one(name: str, dist: Any) -> list[Finding]:
    label = f"{name} {dist.version}"
    fix = f"pip install --force-reinstall --no-deps '{name}=={dist.version}'"
    # RECORD read here, not through dist.files: that leaves out the files
    # that are missing (importlib_metadata's skip_missing_files)
    record = dist.read_text("RECORD")
    if record is None:
        return [_f("warning", f"{label}: has no RECORD: none of its files can be verified", fix)]
    import csv

    findings: list[Finding] = []
    checked = unhashed = 0
    for row in csv.reader(record.splitlines()):
        if not row:
            continue
        mode, _, value = (row[1] if len(row) > 1 else "").partition("=")
        if not value:
            unhashed += 1  # RECORD itself, compiled bytecode, files made at install
            continue
        path = dist.locate_file(row[0])
        digest = _digest(str(path), mode)
        if digest is None:
            findings.append(_f("error", f"{label}: {path} is missing (RECORD lists it)", fix))
        elif digest == "unknown":
            unhashed += 1
        elif digest != value:
            findings.append(_f("error", f"{label}: {path} differs from the sha256 in its RECORD "
                                        "(changed after it was installed)", fix))
        else:
            checked += 1
    bad = len(findings)
    text = f"{label}: {checked} of {checked + bad} files listed with a hash match their RECORD"
    if unhashed:
        text += f" ({unhashed} listed without one, not checked)"
    if _editable(dist):  # nothing to fix: said so that no one takes the sources as checked
        findings.append(_f("ok", text + "; an editable install: its sources live in its project directory, "
                                        "which RECORD does not list, so they were not checked"))
    elif checked + bad == 0:
        findings.append(_f("warning", text + ": nothing could be verified", fix))
    else:
        findings.append(_f("ok", text) if not bad else _f("error", text, fix))
    return findings


def _digest(path: str, mode: str) -> str | None:
    """The urlsafe base64 digest RECORD uses; None: no such file;
    ``"unknown"``: a hash this Python does not have."""
    import base64
    import hashlib

    try:
        h = hashlib.new(mode)
    except ValueError:
        return "unknown"
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        return None
    return base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()


def _editable(dist: Any) -> bool:
    import json

    try:
        data = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        return False
    return bool(data.get("dir_info", {}).get("editable"))
