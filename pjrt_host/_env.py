"""Every environment variable pjrt_host reads, one small function each."""

from __future__ import annotations

import os

__all__ = [
    "autoload_disabled",
    "plugin_allow_list",
    "probe_timeout",
    "requested_device",
]

_TRUE = {"1", "true", "yes", "on"}


def requested_device() -> str | None:
    """``PJRT_DEVICE``: the plugin name the user asks for, lower-cased.
    Default: unset, and the available plugin with the highest priority wins."""
    value = os.environ.get("PJRT_DEVICE", "").strip()
    return value.lower() or None


def autoload_disabled() -> bool:
    """``PJRT_HOST_DISABLE_PLUGIN_AUTOLOAD=1`` turns entry-point loading off;
    only plugins registered in code are seen.  Default: autoload on."""
    return os.environ.get("PJRT_HOST_DISABLE_PLUGIN_AUTOLOAD", "").strip().lower() in _TRUE


def plugin_allow_list() -> frozenset[str] | None:
    """``PJRT_HOST_PLUGINS=a,b``: load only these entry-point plugins
    (lower-cased names).  Default: unset, load all."""
    value = os.environ.get("PJRT_HOST_PLUGINS", "").strip()
    if not value:
        return None
    return frozenset(part.strip().lower() for part in value.split(",") if part.strip())


def probe_timeout() -> float:
    """``PJRT_HOST_PROBE_TIMEOUT``: seconds ``list --probe`` gives each
    plugin's client.  Default: 60."""
    value = os.environ.get("PJRT_HOST_PROBE_TIMEOUT", "").strip()
    try:
        return float(value) if value else 60.0
    except ValueError:
        return 60.0
