"""``python -m pjrt_host doctor``: version skew and library checks, each
finding with what to do about it.  Reads metadata; the one check that loads
a library (its PJRT C API version) runs in a child process."""

from __future__ import annotations

import re
from typing import Any, Callable

import importlib_metadata

from ._discovery import SOURCE_JAX, PluginRecord

__all__ = ["read_capi_version", "run"]

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
