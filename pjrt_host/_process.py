"""Process set-up that must happen before the client exists: the plugin's
configure_single_process() / configure_multiprocess(), from the launcher's
environment.  (``pjrt_host.distributed`` builds on this.)"""

from __future__ import annotations

import os
from typing import Any

from ._discovery import PluginRecord

__all__ = ["client_options", "configure"]


def _int_env(*names: str, default: int) -> int:
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            try:
                return int(value)
            except ValueError:
                pass
    return default


def local_rank() -> int:
    """``LOCAL_RANK`` (torchrun), default 0."""
    return _int_env("LOCAL_RANK", default=0)


def local_world_size() -> int:
    """``LOCAL_WORLD_SIZE`` (torchrun), default 1."""
    return _int_env("LOCAL_WORLD_SIZE", default=1)


def configure(record: PluginRecord) -> None:
    plugin = record.plugin
    assert plugin is not None
    if local_world_size() > 1:
        plugin.configure_multiprocess(local_rank(), local_world_size())
    else:
        plugin.configure_single_process()


def client_options(record: PluginRecord) -> dict[str, Any]:
    """Create options the host adds for every plugin (none yet)."""
    return {}
