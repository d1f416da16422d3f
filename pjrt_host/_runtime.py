"""The runtime: the selected plugin becomes a real PJRT client, through jaxlib.

This is the only module that touches jaxlib's plugin API.  A plugin with a
library is loaded with ``jax._src.xla_bridge.register_plugin`` (dlopen,
``GetPjrtApi``, ``PJRT_Plugin_Initialize``) and its client created with the
plugin's create options; a plugin without one uses a jaxlib built-in backend.
jax is told to use that backend (``jax_platforms``), so ``jax.jit`` and
friends run on the plugin's devices too.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import Any

from . import _jax_settings, _program_cache, _registry
from ._discovery import PluginRecord
from ._errors import ClientCreationError, PjrtHostError, cause_text

__all__ = ["Runtime", "backend_name", "client", "devices", "forked_error", "in_bad_fork", "is_initialized", "plugin",
           "runtime"]

logger = logging.getLogger(__name__)


class Runtime:
    """The process's one client: which plugin, the jax backend name it is
    registered under, and its addressable devices."""

    __slots__ = ("record", "backend", "client", "devices")

    def __init__(self, record: PluginRecord, backend: str, client: Any, devices: list[Any]) -> None:
        self.record = record  #: the selected plugin's record
        self.backend = backend  #: jax backend / platform name to pass to jax APIs
        self.client = client  #: the jaxlib client object
        self.devices = devices  #: addressable devices, in jax order


_lock = threading.Lock()
_runtime: Runtime | None = None
_failure: ClientCreationError | None = None
# In a child of os.fork() made after this process had (or was creating) its
# client: what the parent had.  The child inherits the client's memory but
# not its threads, so any call into it can wait forever; runtime() raises.
_forked_from: str | None = None


def _after_fork_in_child() -> None:
    global _lock, _runtime, _forked_from
    if _runtime is not None:
        _forked_from = f"created the PJRT client of plugin {_runtime.record.name!r}"
        _runtime = None  # runtime() takes the slow path, which raises
    elif _lock.locked():
        _forked_from = "was creating its PJRT client"
    _lock = threading.Lock()  # a thread of the parent may have held it


os.register_at_fork(after_in_child=_after_fork_in_child)


def in_bad_fork() -> bool:
    """Whether this process is a fork() child of one that had its client: the
    device cannot be used here (torch.cuda's ``_is_in_bad_fork``)."""
    return _forked_from is not None


def forked_error() -> PjrtHostError:
    """The error for using the device in a fork() child (see in_bad_fork)."""
    return PjrtHostError(
        f"pjrt_host: this process was made by fork() after its parent {_forked_from}; a forked child "
        f"cannot use that client (its threads do not survive fork(), so device calls would hang).  "
        f"To use the device in worker processes, use the "
        f"'spawn' start method: DataLoader(..., multiprocessing_context='spawn'), "
        f"multiprocessing.get_context('spawn') or torch.multiprocessing.spawn; or keep forked workers on "
        f"CPU tensors and move their results to the device in the parent.")


def runtime() -> Runtime:
    """The process's runtime, creating the client on first use.  A failure is
    remembered and raised again: a process gets one attempt."""
    global _runtime, _failure
    if _runtime is not None:
        return _runtime
    with _lock:
        if _runtime is not None:
            return _runtime
        if _forked_from is not None:
            raise forked_error()
        if _failure is not None:
            raise _failure
        record = _registry.selected_record()
        try:
            _runtime = _create(record)
        except ClientCreationError as err:
            _failure = err
            raise
        _registry.freeze(f"the PJRT client of plugin {record.name!r} already exists")
        return _runtime


def client() -> Any:
    """The jaxlib client of the selected plugin."""
    return runtime().client


def devices() -> list[Any]:
    """The selected plugin's addressable jax devices."""
    return list(runtime().devices)


def plugin() -> Any:
    """The selected DevicePlugin instance (creates the client)."""
    return runtime().record.plugin


def backend_name() -> str:
    """The jax backend name of the selected plugin (for ``jax.devices(...)``)."""
    return runtime().backend


def is_initialized() -> bool:
    return _runtime is not None


def _create(record: PluginRecord) -> Runtime:
    from . import _process  # configures the process before the client exists

    plugin = record.plugin
    assert plugin is not None
    pm = _registry.plugin_manager()
    pm.hook.pjrt_host_plugin_selected(name=record.name, plugin=plugin)

    try:
        _process.configure(record)
        options = dict(plugin.client_create_options())
        options.update(_process.client_options(record))
    except PjrtHostError:
        raise
    except Exception as err:
        raise _error(record, "configuring the process for the plugin failed", err) from err
    pm.hook.pjrt_host_before_client_create(name=record.name, plugin=plugin, options=options)

    try:
        import jax
        from jax._src import xla_bridge
    except Exception as err:  # pragma: no cover - broken jax install
        raise _error(record, "jax could not be imported", err, fix="pip install the versions in constraints.txt") from err

    _skip_jax_plugin_discovery(xla_bridge)
    # before the first program compiles
    _program_cache.configure(record.name, f"{record.distribution} {record.version} {record.target}",
                             _kernel_modules(plugin), _compile_options(record))
    if record.library is None:
        backend = plugin.jaxlib_backend
    else:
        backend = _register_library(record, options, xla_bridge)

    try:
        # When jax's backends already exist, this creates the client.
        _use_backend(backend, xla_bridge, jax)
        devs = jax.local_devices(backend=backend)
        client_obj = xla_bridge.get_backend(backend)
    except Exception as err:
        err = _skipped_backend_error(backend, xla_bridge, err) or err
        raise _error(record, "the PJRT client could not be created", err) from err
    if not devs:
        raise _error(record, "the PJRT client has no addressable devices", None)
    _check_compile_options(record, devs[0])
    logger.info("plugin %r: %d device(s) on backend %r", record.name, len(devs), backend)
    pm.hook.pjrt_host_client_created(name=record.name, plugin=plugin, devices=list(devs))
    _program_cache.prefetch(list(devs))  # what the last run of this script loaded, on a thread
    return Runtime(record, backend, client_obj, list(devs))


def _kernel_modules(plugin: Any) -> tuple[str, ...]:
    """The modules of the plugin's vendor kernels (and their conditions):
    their source keys the programs kept on disk, as pjrt_host's own does, so
    a kernel changed without a new plugin version is traced anew."""
    try:
        declared = plugin.declared_kernels
    except Exception:
        return ()  # the first op refuses the plugin, naming the problem
    names = set()
    for _, kernel in declared.kernels:
        for target in (kernel.fn, kernel.when):
            if target:
                names.add(target.partition(":")[0])
    return tuple(sorted(names))


def _compile_options(record: PluginRecord) -> dict[str, Any]:
    """The plugin's ``compile_options``, less the flags the user set in
    ``XLA_FLAGS`` (theirs win); a value of another type is refused here,
    naming the plugin, not by XLA at the first op."""
    options = dict(getattr(record.plugin, "compile_options", None) or {})
    for name, value in options.items():
        if not isinstance(name, str) or not isinstance(value, (str, int, float, bool)):
            raise _error(record, f"its compile_options[{name!r}] is {value!r}", None,
                         fix="give compile_options as XLA option names mapped to str, int, float or bool values")
    user = os.environ.get("XLA_FLAGS", "")
    return {name: value for name, value in options.items() if f"--{name}=" not in user and f"--{name} " not in user
            and not user.endswith(f"--{name}")}


def _check_compile_options(record: PluginRecord, device: Any) -> None:
    """The plugin's compile options tried on one empty program, so that an
    option the compiler does not know fails here, naming the plugin, and
    not at the user's first op (a warm process finds the program in jax's
    cache)."""
    options = _program_cache.compile_options()
    if not options:
        return
    try:
        _program_cache.try_options(device)
    except Exception as err:
        raise _error(record, f"its compile_options {options} are refused by the compiler", err,
                     fix="remove or rename the options the compiler does not know") from err


def _skip_jax_plugin_discovery(xla_bridge: Any) -> None:
    """The host has chosen the backend: stop jax from importing and
    initialising every other installed jax plugin when its backends start
    (a plugin for absent hardware would fail, log a traceback, or hang).
    jax plugins stay usable by selecting them through pjrt_host."""
    with xla_bridge._plugin_lock:
        xla_bridge._plugins_registered = True


def _register_library(record: PluginRecord, options: dict[str, Any], xla_bridge: Any) -> str:
    problem = _api_problem(record.library)  # type: ignore[arg-type]
    if problem:
        raise _error(record, f"the PJRT library {record.library} is not usable: {problem}", None, fix=(
            f"The library is broken or not a PJRT plugin: reinstall {record.distribution or 'the plugin'} "
            "or ask its vendor; choose another plugin with PJRT_DEVICE=NAME meanwhile.")) from None
    # jax may already know this name (e.g. jax plugins registered before the
    # host was asked): register ours beside it rather than replace it.
    backend = record.name
    if backend in xla_bridge._backend_factories:
        backend = f"pjrt_host_{record.name}"
    try:
        c_api = xla_bridge.register_plugin(backend, priority=1000, library_path=record.library, options=options)
    except Exception as err:
        raise _error(record, f"the PJRT library {record.library} could not be loaded and initialised", err) from err
    if backend not in xla_bridge._backend_factories:
        raise _error(record, f"jaxlib refused to register the PJRT library {record.library}", None)
    try:
        record.plugin.library_loaded(c_api)  # type: ignore[union-attr]
    except Exception as err:
        raise _error(record, f"{type(record.plugin).__name__}.library_loaded() failed", err) from err
    return backend


def _api_problem(library: str) -> str | None:
    """Call ``GetPjrtApi()`` once to catch a library that returns no API
    before jaxlib turns that into an opaque type error."""
    import ctypes

    try:
        get_api = ctypes.CDLL(library).GetPjrtApi
    except (OSError, AttributeError) as err:
        return f"it cannot be loaded: {err}"
    get_api.restype = ctypes.c_void_p
    api = get_api()
    if not api:
        return "GetPjrtApi() returned NULL"
    # struct PJRT_Api: struct_size, extension_start, a 24-byte version, then
    # the function pointers, PJRT_Error_Destroy first.  jaxlib calls the
    # first ones (errors, plugin initialisation, events, PJRT_Client_Create)
    # without checking them: a NULL there would crash the process.
    size = ctypes.c_size_t.from_address(api).value
    if size < _FIRST_FUNCTION + 8 * _REQUIRED_FUNCTIONS:
        return f"its PJRT_Api struct is {size} bytes, too small for a PJRT C API"
    missing = [i for i in range(_REQUIRED_FUNCTIONS)
               if not ctypes.c_void_p.from_address(api + _FIRST_FUNCTION + 8 * i).value]
    if missing:
        return (f"its PJRT_Api struct has NULL where the first {_REQUIRED_FUNCTIONS} functions (PJRT_Error_Destroy ... "
                f"PJRT_Client_Create) must be ({len(missing)} of them)")
    return None


#: Offset of the first function pointer in struct PJRT_Api, and how many of
#: the first ones (through PJRT_Client_Create) every PJRT library provides.
_FIRST_FUNCTION = 40
_REQUIRED_FUNCTIONS = 11


def _skipped_backend_error(backend: str, xla_bridge: Any, err: BaseException) -> BaseException | None:
    """jax skips some backends by name without trying them (it starts
    ``cuda`` only when ``/dev/nvidia0`` or ``/dev/nvidiactl`` exists) and
    then reports only 'Unknown backend'.  Create the skipped client directly
    to report what the library itself says (and to prove that it loads and
    initialises); None when jax did try it (a client is never created
    twice), or the direct attempt works."""
    if "Unknown backend" not in str(err):
        return None
    if backend in xla_bridge._backends or backend not in xla_bridge._backend_factories:
        return None
    try:
        xla_bridge._init_backend(backend)
    except Exception as err:
        return err
    return None


def _use_backend(backend: str, xla_bridge: Any, jax: Any) -> None:
    """Make ``backend`` jax's default: before jax's backends exist, through
    ``jax_platforms``; after, by initialising it alongside them."""
    if not xla_bridge._backends:
        platforms = backend if backend == "cpu" else f"{backend},cpu"
        _jax_settings.use_platforms(platforms)
        return
    if backend in xla_bridge._backends:
        return
    with xla_bridge._backend_lock:
        xla_bridge._backends[backend] = xla_bridge._init_backend(backend)


def _error(record: PluginRecord, what: str, err: BaseException | None, fix: str | None = None) -> ClientCreationError:
    plugin = record.plugin
    cause = cause_text(err, strip=_JAX_ADVICE)
    if fix is None:
        try:
            chips = plugin.physical_chip_count() if plugin is not None else None
        except Exception:
            chips = None
        if chips == 0:
            what = f"no {plugin.describe()} device was found on this machine ({what})"  # type: ignore[union-attr]
            fix = ("Run on a machine with the device, check that it is visible to this "
                   "process, or choose another plugin with PJRT_DEVICE=NAME "
                   "(`python -m pjrt_host list` shows them).")
        else:
            fix = (f"Check the device and the plugin with `python -m pjrt_host info {record.name}` "
                   "and `python -m pjrt_host doctor`, or choose another plugin with PJRT_DEVICE=NAME.")
    library = f", library {record.library}" if record.library else ""
    message = f"pjrt_host: plugin {record.name!r} (from {record.origin()}{library}): {what}"
    if cause:
        message += f": {cause.rstrip('.')}"
    return ClientCreationError(record.name, record.distribution, f"{message}. {fix}")


# jax's own advice names its own switches; ours is PJRT_DEVICE.
_JAX_ADVICE = re.compile(r"\s*\((?:set JAX_PLATFORMS|you may need to uninstall)[^)]*\)\.?")
