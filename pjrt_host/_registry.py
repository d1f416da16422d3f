"""The registry: the one place that knows every plugin and decides which one
is in use.

Discovery runs lazily, on the first question asked.  Selection follows, in
order: :func:`select` from code, ``PJRT_DEVICE``, else the available plugin
with the highest priority.  Once a client exists the choice is frozen.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from typing import TYPE_CHECKING

from . import _env
from ._discovery import SOURCE_CODE, PluginRecord, Status, discover, record_for_object
from ._errors import EnvironmentSettingError, PluginLoadError, PluginNotFoundError, SelectionError

__all__ = [
    "plugin_manager",
    "plugins",
    "register_plugin",
    "select",
    "selected_record",
]

logger = logging.getLogger(__name__)

INSTALL_HINT = (
    "Install a plugin distribution (e.g. `pip install pjrt-host-cpu-ref`), or "
    "register one in code with pjrt_host.register_plugin(name, plugin)."
)


class _Registry:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.records: dict[str, PluginRecord] | None = None
        self.discovered: list[PluginRecord] = []
        self.code_records: dict[str, PluginRecord] = {}
        self.chosen: str | None = None  # set by select()
        self.frozen_reason: str | None = None  # set once a client exists
        self.pm: pluggy.PluginManager | None = None
        self.announced: list[PluginRecord] = []

    def all(self) -> dict[str, PluginRecord]:
        with self.lock:
            if self.records is None:
                self.discovered = discover()
                records: dict[str, PluginRecord] = {}
                for record in self.discovered:
                    # Conflicting records share a name and a status; lookup
                    # by name needs one of them, plugins() shows them all.
                    records.setdefault(record.name, record)
                    self._announce(record)
                self.records = records
            merged = dict(self.records)
            for name, record in self.code_records.items():
                shadowed = merged.get(name)
                if shadowed is not None and shadowed.source != SOURCE_CODE:
                    shadowed.status = Status.SHADOWED
                    shadowed.reason = "a plugin of the same name registered in code is used instead"
                merged[name] = record
            return merged

    def plugin_manager(self) -> pluggy.PluginManager:
        # pluggy is imported on first use: `list` never needs it.
        with self.lock:
            if self.pm is None:
                import pluggy

                from . import _hookspecs

                self.pm = pluggy.PluginManager("pjrt_host")
                self.pm.add_hookspecs(_hookspecs)
                for record in self.announced:
                    self._register_with(self.pm, record)
            return self.pm

    def _announce(self, record: PluginRecord) -> None:
        """Tell the hooks about a record; replayed when the plugin manager
        is created later."""
        self.announced.append(record)
        if self.pm is not None:
            self._register_with(self.pm, record)

    def _register_with(self, pm: pluggy.PluginManager, record: PluginRecord) -> None:
        if record.plugin is not None and record.ok and not pm.is_registered(record.plugin):
            try:
                pm.register(record.plugin, name=f"device-plugin:{record.name}")
            except Exception as err:  # bad hookimpls on the plugin class
                record.status, record.error = Status.NOT_A_PLUGIN, err
                record.reason = f"its pluggy hook implementations are invalid: {err}"
        pm.hook.pjrt_host_plugin_registered(name=record.name, record=record)


_REGISTRY = _Registry()

if TYPE_CHECKING:  # pragma: no cover
    import pluggy


def plugin_manager() -> pluggy.PluginManager:
    """The host's pluggy plugin manager (hookspecs in ``pjrt_host._hookspecs``)."""
    return _REGISTRY.plugin_manager()


def plugins() -> list[PluginRecord]:
    """Every known plugin, broken ones included, sorted by name."""
    _REGISTRY.all()
    records = _REGISTRY.discovered + list(_REGISTRY.code_records.values())
    return sorted(records, key=lambda r: (r.name, r.source, r.distribution or ""))


def register_plugin(name: str, plugin: Any) -> PluginRecord:
    """Register ``plugin`` (a DevicePlugin subclass or instance) as ``name``
    from code, with no entry point.  It takes precedence over an installed
    plugin of the same name.  Refused once a client exists."""
    with _REGISTRY.lock:
        _refuse_if_frozen(f"register plugin {name!r}")
        record = record_for_object(name, plugin)
        _REGISTRY.code_records[record.name] = record
        _REGISTRY._announce(record)
        return record


def select(name: str | None) -> PluginRecord:
    """Choose the plugin to run on, as ``PJRT_DEVICE`` does (None: back to
    the default).  Fails loudly for an unknown or broken plugin, and once a
    client exists."""
    with _REGISTRY.lock:
        _refuse_if_frozen(f"select {name!r}")
        if name is None:
            _REGISTRY.chosen = None
            return selected_record()
        record = _lookup(name.lower(), how=f"pjrt_host.select({name!r})")
        _REGISTRY.chosen = record.name
        return record


def selected_record() -> PluginRecord:
    """The plugin in use (or that would be used), raising if it is unusable."""
    with _REGISTRY.lock:
        if _REGISTRY.chosen is not None:
            return _lookup(_REGISTRY.chosen, how=f"pjrt_host.select({_REGISTRY.chosen!r})")
        requested = _env.requested_device()
        if requested is not None:
            return _lookup(requested, how=f"PJRT_DEVICE={requested}")
        return _default()


def default_name() -> str | None:
    """The plugin that would be chosen now, or None; never raises."""
    try:
        return selected_record().name
    except Exception:
        return None


def freeze(reason: str) -> None:
    """Called by the runtime when a client exists: selection is final."""
    with _REGISTRY.lock:
        _REGISTRY.frozen_reason = reason


def reset_for_tests() -> None:
    """Forget discovery, selection and code registrations (tests only)."""
    global _REGISTRY
    _REGISTRY = _Registry()


def _refuse_if_frozen(action: str) -> None:
    if _REGISTRY.frozen_reason is not None:
        raise SelectionError(
            f"pjrt_host: cannot {action}: {_REGISTRY.frozen_reason}, and a process "
            "has one client for its whole life. Choose the plugin before the first "
            "device is used (PJRT_DEVICE=NAME or pjrt_host.select(NAME) at start-up).")


def _lookup(name: str, how: str) -> PluginRecord:
    records = _REGISTRY.all()
    record = records.get(name)
    if record is None:
        raise PluginNotFoundError(name, f"pjrt_host: {how}: no plugin named {name!r}. {_installed_text(records)} {INSTALL_HINT}")
    if not record.ok:
        raise PluginLoadError(
            record.name, record.distribution,
            f"pjrt_host: {how}: plugin {record.name!r} from {record.origin()} cannot be used: "
            f"{record.status}: {record.reason}. Fix or reinstall "
            f"{record.distribution or 'it'}, or choose another plugin. {_installed_text(records)}",
        ) from record.error
    return record


def _default() -> PluginRecord:
    records = _REGISTRY.all()
    candidates = []
    for record in records.values():
        if not record.ok:
            continue
        try:
            chips = record.plugin.physical_chip_count()  # type: ignore[union-attr]
        except EnvironmentSettingError:
            raise  # the user's setting is wrong: say so, not "no usable plugin"
        except Exception as err:
            logger.info("plugin %r: physical_chip_count() raised %s; not a default choice", record.name, err)
            continue
        if chips > 0:
            candidates.append(record)
    if not candidates:
        raise PluginNotFoundError(
            "", f"pjrt_host: no usable device plugin is installed. {_installed_text(records)} {INSTALL_HINT}")
    candidates.sort(key=lambda r: (-r.plugin.priority, r.name))  # type: ignore[union-attr]
    choice = candidates[0]
    logger.info("PJRT_DEVICE is not set; chose plugin %r from %s (priority %d)",
                choice.name, choice.origin(), choice.plugin.priority)  # type: ignore[union-attr]
    return choice


def _installed_text(records: dict[str, PluginRecord]) -> str:
    if not records:
        return "No plugins are installed."
    parts = [f"{r.name} ({'ok' if r.ok else r.status})" for r in sorted(records.values(), key=lambda r: r.name)]
    return "Installed plugins: " + ", ".join(parts) + "."
