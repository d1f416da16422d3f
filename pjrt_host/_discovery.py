"""Discovery: entry points -> :class:`PluginRecord`, one per plugin.

Two ecosystems are read: ``torch_xla.plugins`` (a DevicePlugin class each)
and jax's own ``jax_plugins`` (a module each, e.g. jax-cuda13-pjrt).  Discovery
never raises because of one plugin: whatever goes wrong is kept on the record
as its status and the original exception, and shown by ``list``.

jax plugin modules are never imported here (they import jax); their library
is found in the distribution's file list instead.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any

import importlib_metadata

from . import _env
from ._errors import cause_text
from ._library import library_problem
from ._plugin import DevicePlugin

__all__ = [
    "SOURCE_CODE",
    "SOURCE_JAX",
    "SOURCE_TORCH_XLA",
    "PluginRecord",
    "Status",
    "discover",
    "record_for_object",
]

logger = logging.getLogger(__name__)

TORCH_XLA_GROUP = "torch_xla.plugins"
JAX_GROUP = "jax_plugins"

SOURCE_TORCH_XLA = "torch_xla entry point"
SOURCE_JAX = "jax plugin"
SOURCE_CODE = "registered in code"


class Status:
    """The statuses a record can have; only ``OK`` can be selected."""

    OK = "ok"
    IMPORT_FAILED = "import failed"
    NOT_A_PLUGIN = "not a DevicePlugin"
    CONSTRUCTOR_FAILED = "constructor failed"
    LIBRARY_PATH_FAILED = "library_path() failed"
    LIBRARY_UNUSABLE = "bad library"
    CONFLICT = "name conflict"
    SHADOWED = "shadowed"


@dataclasses.dataclass(slots=True)
class PluginRecord:
    """Everything the host knows about one plugin, whatever its state."""

    #: Lower-cased plugin name, what ``PJRT_DEVICE`` matches.
    name: str
    #: Where it came from: SOURCE_TORCH_XLA, SOURCE_JAX or SOURCE_CODE.
    source: str
    #: Distribution name and version, None when registered in code.
    distribution: str | None = None
    version: str | None = None
    #: The entry point's value ("module:Class"), or the object's qualname.
    target: str = ""
    #: The DevicePlugin instance, None when it could not be made.
    plugin: DevicePlugin | None = None
    #: One of :class:`Status`.
    status: str = Status.OK
    #: A sentence saying why the status is not OK (and what to do).
    reason: str = ""
    #: The original exception, kept to chain into the selection error.
    error: BaseException | None = None
    #: Absolute library path, None for a jaxlib built-in backend.
    library: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == Status.OK

    def origin(self) -> str:
        """'distribution version' or the source, for messages."""
        if self.distribution:
            return f"{self.distribution} {self.version or ''}".strip()
        return self.source

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "distribution": self.distribution,
            "version": self.version,
            "target": self.target,
            "library": self.library,
            "status": self.status,
            "reason": self.reason,
            "display_name": self.plugin.describe() if self.plugin is not None else None,
            "priority": self.plugin.priority if self.plugin is not None else None,
        }


def discover() -> list[PluginRecord]:
    """Records for every entry-point plugin, honouring the autoload switches."""
    if _env.autoload_disabled():
        logger.debug("PJRT_HOST_DISABLE_PLUGIN_AUTOLOAD is set: not reading entry points")
        return []
    allowed = _env.plugin_allow_list()
    records: list[PluginRecord] = []
    for ep in _unique_entry_points(TORCH_XLA_GROUP):
        if allowed is None or ep.name.lower() in allowed:
            records.append(_load_torch_xla_plugin(ep))
    for ep in _unique_entry_points(JAX_GROUP):
        if allowed is None or ep.name.lower() in allowed:
            records.append(_jax_plugin_record(ep))
    _mark_conflicts(records)
    return records


def record_for_object(name: str, obj: Any) -> PluginRecord:
    """A record for a plugin registered in code (a class or an instance)."""
    record = PluginRecord(name=name.lower(), source=SOURCE_CODE, target=_qualname(obj))
    if isinstance(obj, type):
        _instantiate(record, obj)
    else:
        record.plugin = obj
        _check_contract(record, type(obj))
    if record.ok:
        _resolve_library(record)
    return record


# -- torch_xla.plugins --------------------------------------------------------


def _load_torch_xla_plugin(ep: Any) -> PluginRecord:
    record = PluginRecord(
        name=ep.name.lower(),
        source=SOURCE_TORCH_XLA,
        distribution=_dist_name(ep),
        version=_dist_version(ep),
        target=ep.value,
    )
    try:
        cls = ep.load()
    except BaseException as err:  # a plugin's import may raise anything, SystemExit included
        if isinstance(err, KeyboardInterrupt):
            raise
        _fail(record, Status.IMPORT_FAILED, err,
              f"importing {ep.value} raised {cause_text(err)}; reinstall or upgrade "
              f"{record.distribution or 'the package'}, or uninstall it")
        return record
    _instantiate(record, cls)
    if record.ok:
        _resolve_library(record)
    return record


def _instantiate(record: PluginRecord, cls: Any) -> None:
    if not _check_contract(record, cls):
        return
    try:
        record.plugin = cls()
    except Exception as err:
        _fail(record, Status.CONSTRUCTOR_FAILED, err,
              f"{_qualname(cls)}() raised {cause_text(err)}")


def _check_contract(record: PluginRecord, cls: Any) -> bool:
    """Accept DevicePlugin subclasses, and classes written against
    torch_xla's DevicePlugin that have the same members."""
    if isinstance(cls, type) and (issubclass(cls, DevicePlugin) or callable(getattr(cls, "library_path", None))):
        return True
    _fail(record, Status.NOT_A_PLUGIN, None,
          f"{record.target or _qualname(cls)} is {type(cls).__name__} {_qualname(cls)!r}, "
          "not a subclass of pjrt_host.DevicePlugin")
    return False


def _resolve_library(record: PluginRecord) -> None:
    plugin = record.plugin
    assert plugin is not None
    if not isinstance(plugin, DevicePlugin):
        record.plugin = plugin = _adapt(plugin)
    try:
        path = plugin.library_path()
    except Exception as err:
        _fail(record, Status.LIBRARY_PATH_FAILED, err,
              f"{type(plugin).__name__}.library_path() raised {cause_text(err)}")
        return
    if path is None:
        return
    record.library = str(path)
    problem = library_problem(record.library)
    if problem:
        _fail(record, Status.LIBRARY_UNUSABLE, None, problem)


def _adapt(obj: Any) -> DevicePlugin:
    """Wrap a duck-typed plugin so the host sees every contract member."""

    class Adapted(DevicePlugin):
        display_name = getattr(obj, "display_name", None) or type(obj).__name__

        def __getattribute__(self, attr: str) -> Any:
            if not attr.startswith("__") and hasattr(obj, attr):
                return getattr(obj, attr)
            return object.__getattribute__(self, attr)

    return Adapted()


# -- jax_plugins --------------------------------------------------------------


class JaxPluginAdapter(DevicePlugin):
    """A jax plugin (``jax_plugins`` entry point) seen through the contract:
    its library is the PJRT shared object its distribution ships."""

    priority = 50

    def __init__(self, module: str, library: str | None) -> None:
        self._module = module
        self._library = library
        self.display_name = f"jax plugin {module}"  # type: ignore[misc]

    def physical_chip_count(self) -> int:
        # A jax plugin says nothing about its hardware without being
        # imported (which imports jax): it is chosen only when asked for.
        return 0

    def library_path(self) -> str | None:
        if self._library is None:
            raise FileNotFoundError(
                f"the distribution of jax plugin {self._module} ships no PJRT "
                "shared library (no .so exporting GetPjrtApi)")
        return self._library


def _jax_plugin_record(ep: Any) -> PluginRecord:
    record = PluginRecord(
        name=ep.name.lower(),
        source=SOURCE_JAX,
        distribution=_dist_name(ep),
        version=_dist_version(ep),
        target=ep.value,
    )
    record.plugin = JaxPluginAdapter(ep.value, _find_pjrt_library(ep))
    _resolve_library(record)
    return record


def _find_pjrt_library(ep: Any) -> str | None:
    dist = getattr(ep, "dist", None)
    files = (dist.files or []) if dist is not None else []
    candidates = [f for f in files if re.search(r"\.so(\.\d+)*$", f.name)]
    # Prefer names that say what they are; check the ELF only if needed.
    candidates.sort(key=lambda f: ("pjrt" not in f.name and "plugin" not in f.name, len(str(f))))
    for f in candidates:
        path = str(f.locate())
        if library_problem(path) is None:
            return path
    return None


# -- shared -------------------------------------------------------------------


def _unique_entry_points(group: str) -> list[Any]:
    """Entry points of ``group``, once per (distribution, name): the same
    distribution reachable twice on sys.path is not a conflict."""
    seen: set[tuple[str | None, str]] = set()
    result = []
    for ep in importlib_metadata.entry_points(group=group):
        key = (_dist_name(ep), ep.name.lower())
        if key not in seen:
            seen.add(key)
            result.append(ep)
    return result


def _mark_conflicts(records: list[PluginRecord]) -> None:
    by_name: dict[str, list[PluginRecord]] = {}
    for record in records:
        by_name.setdefault(record.name, []).append(record)
    for name, group in by_name.items():
        if len(group) < 2:
            continue
        native = [r for r in group if r.source == SOURCE_TORCH_XLA]
        if native and len(native) < len(group):
            for r in group:
                if r.source != SOURCE_TORCH_XLA:
                    r.status, r.reason = Status.SHADOWED, (
                        f"the torch_xla plugin of the same name from "
                        f"{native[0].origin()} is used instead")
            group = native
        if len(group) < 2:
            continue
        origins = ", ".join(r.origin() for r in group)
        for r in group:
            r.status = Status.CONFLICT
            r.reason = (f"plugin name {name!r} is claimed by several distributions "
                        f"({origins}); uninstall all but one")


def _fail(record: PluginRecord, status: str, err: BaseException | None, reason: str) -> None:
    record.status, record.error, record.reason = status, err, reason
    logger.debug("plugin %r from %s: %s", record.name, record.origin(), reason)


def _dist_name(ep: Any) -> str | None:
    return _dist_name_version(ep)[0]


def _dist_version(ep: Any) -> str | None:
    return _dist_name_version(ep)[1]


def _dist_name_version(ep: Any) -> tuple[str | None, str | None]:
    """Name and version of the entry point's distribution.  Parsing METADATA
    costs more than the rest of ``list`` together, so the ``name-version``
    of a ``.dist-info`` folder is used when there is one."""
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None, None
    folder = getattr(getattr(dist, "_path", None), "name", "")
    match = re.fullmatch(r"([^-]+)-([^-]+)\.dist-info", folder)
    if match:
        return match.group(1).replace("_", "-"), match.group(2)
    return dist.metadata["Name"], dist.version


def _qualname(obj: Any) -> str:
    target = obj if isinstance(obj, type) else type(obj)
    return f"{target.__module__}.{target.__qualname__}"
