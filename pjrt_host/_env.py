"""Every environment variable pjrt_host reads, one small function each, over
the parsers of :mod:`pjrt_host.env` (the public ones plugins use too).

A value that cannot be read raises :class:`EnvironmentSettingError` (a
``ValueError``) naming the variable, the
value and what is accepted: a typo in a setting must not silently mean its
default.  Booleans accept one vocabulary everywhere: 1/true/yes/on and
0/false/no/off (any case).
"""

from __future__ import annotations

import os

from . import env
from ._errors import EnvironmentSettingError
from .env import flag, integer, seconds, text

__all__ = [
    "autoload_disabled",
    "check_timeout",
    "cluster_detection_enabled",
    "coordinator_address",
    "coordinator_mode",
    "coordinator_port",
    "coordination_service_mode",
    "coordinator_timeout",
    "dead_peer_grace",
    "donate_buffers",
    "dynamic_shapes",
    "eager_mode",
    "flag",
    "heartbeat_timeout",
    "integer",
    "normalise_op_name",
    "parse_plugin_kernels",
    "plugin_allow_list",
    "plugin_kernels",
    "probe_timeout",
    "program_cache_dir",
    "program_cache_enabled",
    "program_cache_max_bytes",
    "requested_device",
    "seconds",
    "skipped_patch_keys",
    "text",
]

# The parsers are the public ones plugins use too (pjrt_host.env).
_TRUE, _FALSE = env._TRUE, env._FALSE


# -- plugins ---------------------------------------------------------------------


def requested_device() -> str | None:
    """``PJRT_DEVICE``: the plugin name the user asks for, lower-cased.
    Default: unset, and the available plugin with the highest priority wins."""
    value = text("PJRT_DEVICE")
    return value.lower() if value else None


def autoload_disabled() -> bool:
    """``PJRT_HOST_DISABLE_PLUGIN_AUTOLOAD=1`` turns entry-point loading off;
    only plugins registered in code are seen.  Default: autoload on."""
    return flag("PJRT_HOST_DISABLE_PLUGIN_AUTOLOAD", False)


def plugin_allow_list() -> frozenset[str] | None:
    """``PJRT_HOST_PLUGINS=a,b``: load only these entry-point plugins
    (lower-cased names).  Default: unset, load all."""
    value = text("PJRT_HOST_PLUGINS")
    if value is None:
        return None
    return frozenset(part.strip().lower() for part in value.split(",") if part.strip())


def plugin_kernels() -> tuple[str, frozenset[str]]:
    """``PJRT_HOST_PLUGIN_KERNELS``: the selected plugin's vendor kernels
    (``DevicePlugin.kernels``) run instead of the host's lowerings (``1``,
    the default), none do (``0``), or a kernel that fails falls back to the
    reference lowering with an error instead of a warning (``strict``);
    ``-aten::_softmax`` (comma-separated, with ``strict`` or alone) drops one
    kernel.  Returns (mode: "on" / "off" / "strict", dropped op names)."""
    return parse_plugin_kernels(text("PJRT_HOST_PLUGIN_KERNELS"), "PJRT_HOST_PLUGIN_KERNELS")


def parse_plugin_kernels(value: object, name: str) -> tuple[str, frozenset[str]]:
    """The plugin-kernel setting ``value`` (None, a bool, or the text of
    :func:`plugin_kernels`), as (mode, dropped op names); ``name`` is where
    it came from, for the error a bad value raises.  Shared with
    ``pjrt_host.config(plugin_kernels=...)``."""
    if value is None or value is True:
        return "on", frozenset()
    if value is False:
        return "off", frozenset()
    if not isinstance(value, str):
        raise EnvironmentSettingError(f"{name}={value!r}: expected True, False, 'strict' or '-aten::OP' entries")
    mode, dropped = "on", set()
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        if item.startswith("-") and len(item) > 1:
            dropped.add(normalise_op_name(item[1:]))
        elif item.lower() == "strict":
            mode = "strict"
        elif item.lower() in _TRUE and len(value.split(",")) == 1:
            mode = "on"
        elif item.lower() in _FALSE and len(value.split(",")) == 1:
            mode = "off"
        else:
            raise EnvironmentSettingError(
                f"{name}={value!r}: {item!r} is not understood; expected 1 (the plugin's kernels run, the "
                "default), 0 (none run), 'strict' (a failing kernel is an error, not a fallback) and/or "
                "'-aten::OP' entries dropping one kernel, comma-separated")
    return mode, frozenset(dropped)


def normalise_op_name(name: str) -> str:
    """An op name as the lowering table writes it: ``_softmax`` and
    ``aten::_softmax.default`` are ``aten::_softmax``."""
    name = name.strip()
    if "::" not in name:
        name = "aten::" + name.removeprefix("aten.")
    return name.removesuffix(".default")


def probe_timeout() -> float:
    """``PJRT_HOST_PROBE_TIMEOUT``: seconds ``list --probe`` gives each
    plugin's client.  Default: 60."""
    return seconds("PJRT_HOST_PROBE_TIMEOUT", 60.0)


# -- the torch device ------------------------------------------------------------


def eager_mode() -> str:
    """``PJRT_HOST_EAGER``: ``fused`` (ops recorded and run in segments, one
    program each: the default), ``op`` (each eager op compiled and run as it
    comes) or ``sync`` (op by op, each op waited for and its index and
    value checks raised at the op: a debugging mode, as
    ``CUDA_LAUNCH_BLOCKING=1``); docs/torch-device.md."""
    value = (text("PJRT_HOST_EAGER") or "fused").lower()
    if value not in ("op", "fused", "sync"):
        raise EnvironmentSettingError(f"PJRT_HOST_EAGER={value!r}: expected 'op' (each op compiled and run as it "
                                      "comes), 'fused' (ops recorded and run in segments) or 'sync' (each op "
                                      "waited for, its checks raised at the op)")
    return value


def fused_compile() -> str:
    """``PJRT_HOST_FUSED_COMPILE``: how fused eager makes a new segment's
    program: ``inline`` (compiled where the segment first runs, the
    default) or ``background`` (compiled on a background thread while the
    segment, and its next occurrences until the program is ready, run op by
    op through each op's own program); docs/torch-device.md."""
    value = (text("PJRT_HOST_FUSED_COMPILE") or "inline").lower()
    if value not in ("inline", "background"):
        raise EnvironmentSettingError(f"PJRT_HOST_FUSED_COMPILE={value!r}: expected 'inline' (a new segment's "
                                      "program compiled where it first runs) or 'background' (compiled on a "
                                      "background thread, the segment run op by op meanwhile)")
    return value


def check_replay() -> bool:
    """``PJRT_HOST_CHECK_REPLAY=1``: every call fused eager replays without
    the engine (its replay lane) is checked against the key the engine
    would build for it, and a difference raises (the test suite runs with
    it; slower).  Default: off."""
    return flag("PJRT_HOST_CHECK_REPLAY", False)


def dynamic_shapes() -> bool | str:
    """``PJRT_HOST_DYNAMIC_SHAPES``: ``1`` (a dimension that takes a third
    size at the same place becomes dynamic: padded to a bucket, one program per
    bucket), ``0`` (every new shape compiles its own programs) or ``all``
    (every dimension of every input of an op that knows padding is dynamic,
    padded to odd buckets: the test mode that shows padding leaking);
    docs/dynamic-shapes.md.  Default: 1."""
    value = (text("PJRT_HOST_DYNAMIC_SHAPES") or "1").lower()
    if value == "all":
        return "all"
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise EnvironmentSettingError(f"PJRT_HOST_DYNAMIC_SHAPES={value!r}: expected 1 (dimensions that change become "
                                  "dynamic, padded to buckets), 0 (off) or 'all' (every dimension dynamic, "
                                  "padded to odd buckets: a test mode)")


def jax_x64_mode() -> str:
    """``PJRT_HOST_JAX_X64``: ``scoped`` (64-bit types only inside pjrt_host's
    own jax calls, the default) or ``process`` (``jax_enable_x64`` for the
    whole process); docs/torch-device.md, "jax's 64-bit types"."""
    mode = (text("PJRT_HOST_JAX_X64") or "scoped").lower()
    if mode not in ("scoped", "process"):
        raise EnvironmentSettingError(f"PJRT_HOST_JAX_X64={mode!r}: use 'scoped' (64-bit types only inside "
                                      "pjrt_host's own jax calls, the default) or 'process' (jax_enable_x64 for "
                                      "the whole process)")
    return mode


def skipped_patch_keys() -> set[str]:
    """``PJRT_HOST_SKIP_PATCHES=a,b`` (or ``all``): the torch patches not to
    install, by key (``pjrt_host._torch._patches.INVENTORY``).  Default: none."""
    value = text("PJRT_HOST_SKIP_PATCHES")
    return {k.strip() for k in (value or "").split(",") if k.strip()}


def donate_buffers() -> bool:
    """``PJRT_HOST_DONATE=0`` never gives an op or a compiled graph the
    buffers it overwrites (for comparisons of memory and speed).  Default: on."""
    return flag("PJRT_HOST_DONATE", True)


def check_timeout(default: float) -> float:
    """``PJRT_HOST_CHECK_TIMEOUT``: seconds each ``pjrt_host check`` section
    may take (default: the section's own limit)."""
    return seconds("PJRT_HOST_CHECK_TIMEOUT", default)


# -- the program cache -----------------------------------------------------------


def program_cache_enabled() -> bool:
    """``PJRT_HOST_PROGRAM_CACHE=0`` keeps compiled programs in memory only
    (nothing read from or written to disk).  Default: on."""
    return flag("PJRT_HOST_PROGRAM_CACHE", True)


def program_cache_dir() -> str:
    """``PJRT_HOST_CACHE_DIR``: the directory compiled programs are kept in
    across processes.  Default: ``$XDG_CACHE_HOME/pjrt_host``, else
    ``~/.cache/pjrt_host`` (per user: whoever can write the cache can run
    code in every process that reads it)."""
    value = text("PJRT_HOST_CACHE_DIR")
    if value is not None:
        return os.path.expanduser(value)
    base = text("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pjrt_host")


def program_cache_prefetch() -> bool:
    """``PJRT_HOST_CACHE_PREFETCH=0``: load a program from disk only when an
    op asks for it.  Default: on -- as the device's client starts, a
    background thread loads the programs the last run of the same script
    used, in the order it used them."""
    return flag("PJRT_HOST_CACHE_PREFETCH", True)


def program_cache_max_bytes() -> int:
    """``PJRT_HOST_CACHE_MAX_BYTES``: the size the program cache of one
    plugin and jaxlib version is kept under (least recently used programs
    go first).  Default: 2 GiB."""
    value = integer("PJRT_HOST_CACHE_MAX_BYTES")
    if value is None:
        return 2 << 30
    if value <= 0:
        raise EnvironmentSettingError(f"PJRT_HOST_CACHE_MAX_BYTES={value!r} must be more than 0 "
                                      "(PJRT_HOST_PROGRAM_CACHE=0 turns the cache off)")
    return value


# -- multi-process ---------------------------------------------------------------


def coordinator_timeout() -> float:
    """``PJRT_HOST_COORDINATOR_TIMEOUT``: seconds the processes of a job wait
    for each other at start-up (reaching the coordinator, every process
    joining it, the launcher's rendezvous).  Default: 300, as jax's."""
    return seconds("PJRT_HOST_COORDINATOR_TIMEOUT", 300.0)


def heartbeat_timeout() -> float:
    """``PJRT_HOST_HEARTBEAT_TIMEOUT``: seconds without a heartbeat after
    which the coordinator declares a process dead and every other process
    exits with an error instead of waiting for it.  Default: 10."""
    return seconds("PJRT_HOST_HEARTBEAT_TIMEOUT", 10.0)


def coordination_service_mode() -> str:
    """``PJRT_HOST_COORDINATION_SERVICE``: where jax's coordination service
    runs.  ``process`` (default): in a child process of rank 0 that outlives
    it, with every task recoverable, so a dead rank (rank 0 included) does
    not end the others; ``rank0``: inside rank 0, as jax.distributed does,
    where a dead rank ends every other one (jax's behaviour)."""
    value = (text("PJRT_HOST_COORDINATION_SERVICE") or "process").lower()
    if value not in ("process", "rank0"):
        raise EnvironmentSettingError(f"PJRT_HOST_COORDINATION_SERVICE={value!r}: expected 'process' or 'rank0'")
    return value


def dead_peer_grace() -> float:
    """``PJRT_HOST_DEAD_PEER_GRACE``: seconds a process may go on after it
    heard that a rank of the job died (to save its state and exit by
    itself) before pjrt_host ends it (exit status 134).  0: at once.
    Default: 300."""
    result = env.number("PJRT_HOST_DEAD_PEER_GRACE", 300.0, minimum=0, expected="a number of seconds")
    assert result is not None
    return result


def coordinator_address() -> str | None:
    """``PJRT_HOST_COORDINATOR_ADDRESS`` (``host:port``), else jax's own
    ``JAX_COORDINATOR_ADDRESS``: where process 0 runs jax.distributed's
    coordinator.  Default: unset, and it is derived from ``MASTER_ADDR``."""
    return text("PJRT_HOST_COORDINATOR_ADDRESS") or text("JAX_COORDINATOR_ADDRESS")


def coordinator_port() -> int | None:
    """``PJRT_HOST_COORDINATOR_PORT``: port of the coordinator on
    ``MASTER_ADDR``.  Default: unset, meaning ``MASTER_PORT + 1`` (torchrun's
    own store already listens on ``MASTER_PORT``)."""
    return integer("PJRT_HOST_COORDINATOR_PORT")


def coordinator_mode() -> str:
    """``PJRT_HOST_XLA_COORDINATOR``: ``auto`` (default; a true flag means the
    same) starts jax's coordinator whenever there is more than one process,
    so that jax sees every process's devices and cross-process collectives
    work; ``off`` (a false flag) never starts it (each process then has its
    own independent client), which a plugin that requires it refuses."""
    value = text("PJRT_HOST_XLA_COORDINATOR")
    if value is None or value.lower() == "auto":
        return "auto"
    if value.lower() in _TRUE:
        return "auto"
    if value.lower() in _FALSE:
        return "off"
    raise EnvironmentSettingError(f"PJRT_HOST_XLA_COORDINATOR={value!r}: expected 'auto' or 'off'")


def cluster_detection_enabled() -> bool:
    """``PJRT_HOST_CLUSTER_DETECTION=0`` stops pjrt_host from asking jax's
    cluster detection (SLURM, Open MPI, ...) for the layout when no torchrun
    variables are set.  Default: on."""
    return flag("PJRT_HOST_CLUSTER_DETECTION", True)
