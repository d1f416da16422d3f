"""The one contract a device vendor implements: :class:`DevicePlugin`.

A vendor ships a pip distribution whose entry point in the group
``torch_xla.plugins`` names a subclass of :class:`DevicePlugin`::

    [project.entry-points."torch_xla.plugins"]
    mydevice = "my_vendor_plugin:MyDevicePlugin"

Every member has a default that is right for the simplest device (one chip,
one process, no special cases), so a minimal plugin overrides
:meth:`DevicePlugin.library_path` and nothing else.

Every device special case lives here, as a property of the plugin that the
host reads through this contract; the host itself never branches on a device
name.  This module imports nothing heavy: listing plugins must not import
torch or jax, and neither should a plugin's module at import time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, NamedTuple, Union

from . import _env

__all__ = ["ClientOption", "DevicePlugin", "Kernel", "KernelDeclarations"]

class Kernel(NamedTuple):
    """One vendor kernel: on the plugin's device, an ATen op is this function.

    Declared by strings, so that declaring it imports nothing (``python -m
    pjrt_host list`` reads every plugin's class); the host imports ``fn``
    only once the plugin's client exists and an op is first lowered.
    """

    #: ``"module:function"``: a JAX-traceable function with the signature of
    #: the op's reference lowering (jax arrays for tensors, the op's other
    #: arguments unchanged), returning what the lowering returns, the same
    #: shapes and the dtypes torch gives.  It may call ``jax.ffi.ffi_call``
    #: into a custom-call target its module registers for the platform
    #: (``jax.ffi.register_ffi_target``) when imported, Pallas, or plain jax.
    fn: str
    #: torch dtype names (``"float32"``) the op's first tensor argument must
    #: have for the kernel to run; empty: any dtype.
    dtypes: tuple[str, ...] = ()
    #: Numbers of dimensions that first tensor argument must have; empty: any.
    ranks: tuple[int, ...] = ()
    #: ``"module:function"``: a predicate called with the op's arguments (as
    #: the kernel gets them, arrays abstract while traced) that says whether
    #: the kernel applies (e.g. "softmax over the last dimension"); None: it
    #: always applies once ``dtypes`` and ``ranks`` match.
    when: Union[str, None] = None


# NamedTuples, not dataclasses: the contract module is imported by
# `python -m pjrt_host list`: a frozen dataclass costs ~2 ms to make, a
# NamedTuple ~0.3 ms.
class KernelDeclarations(NamedTuple):
    """A plugin's kernels as the host reads them (:attr:`DevicePlugin.declared_kernels`):
    strings only, so its ``repr`` can key programs kept on disk."""

    #: The plugin, as messages name it: display name and class.
    plugin: str
    #: ``(normalised ATen op name, Kernel)``, in declaration order.
    kernels: "tuple[tuple[str, Kernel], ...]"
    #: ``PJRT_HOST_PLUGIN_KERNELS``: "on", "off" or "strict".
    mode: str = "on"
    #: Op names ``PJRT_HOST_PLUGIN_KERNELS`` drops (``-aten::_softmax``).
    dropped: "tuple[str, ...]" = ()


#: The value types a PJRT client create option may take (they become
#: ``PJRT_NamedValue`` entries on the C API side).
ClientOption = Union[str, int, float, bool, "list[int]"]


class DevicePlugin:
    """Base class of every device plugin.

    Subclasses are instantiated by the host with no arguments.  The
    constructor and every method should be cheap and must not import torch or
    jax: ``python -m pjrt_host list`` calls :meth:`library_path` and reads the
    class attributes below for every installed plugin.
    """

    #: Human-readable name shown by ``python -m pjrt_host list``.
    #: Default: the class name.
    display_name: ClassVar[str | None] = None

    #: Default-selection priority: with ``PJRT_DEVICE`` unset, the available
    #: plugin with the highest priority is chosen.  Default 100; the
    #: reference CPU plugin uses 0 so that any real device wins over it.
    priority: ClassVar[int] = 100

    #: jaxlib built-in backend used when :meth:`library_path` returns None.
    #: Default ``"cpu"``, the backend every jaxlib has.
    jaxlib_backend: ClassVar[str] = "cpu"

    #: Gathers whose index count is at most ``dense_gather_factor`` times the
    #: gathered dimension are lowered as a dense (one-hot matmul) gather,
    #: which is faster on devices with weak scatter/gather units.  Default 0:
    #: always use XLA's sparse gather.
    dense_gather_factor: ClassVar[int] = 0

    #: Convolutions (2-d, not transposed, ungrouped) whose output has at
    #: most this many positions per image (out height x out width) are
    #: lowered as image patches times the kernel (one matmul), which some
    #: compilers run far faster than their convolution when the image is
    #: small and the channels many.  Default 0: always the compiler's
    #: convolution.  (XLA:CPU, the reference plugin: 64.)
    conv_as_matmul_max_positions: ClassVar[int] = 0

    #: Whether the compiler cannot run a matrix product of 16-bit float
    #: operands with a float32 result (XLA:CPU's runtime refuses some such
    #: dots inside larger programs: "Unsupported element type for
    #: DotThunk::Execute: BF16 x BF16 = F32").  True: the matmul family
    #: widens 16-bit operands to float32 before the product -- the same
    #: values, as a 16-bit float is exact in float32.  Default False: the
    #: product takes the 16-bit operands and accumulates in float32.
    widen_16bit_matmul_operands: ClassVar[bool] = False

    #: XLA compile options (``DebugOptions`` fields, by name) for every
    #: program the host compiles on this device -- eager ops, fused
    #: segments, ``torch.compile`` graphs, ``assume_pure`` functions -- as
    #: jax's ``compiler_options``: a compiler's own trade of compile time
    #: against run time, e.g. ``{"xla_backend_optimization_level": 2}``
    #: (the reference plugin: XLA:CPU's LLVM pipeline at its default level 3
    #: takes 2.6x as long on a fused layer's program for no faster code,
    #: docs/writing-a-plugin.md).  A flag the user sets in ``XLA_FLAGS``
    #: wins over the plugin's.  Values: str, int, float or bool.  Default:
    #: none, the compiler's defaults.
    compile_options: ClassVar[Mapping[str, Union[str, int, float, bool]]] = {}

    #: dtypes the device cannot hold, mapped to the dtype used instead, by
    #: torch dtype name without the ``torch.`` prefix, e.g.
    #: ``{"float64": "float32"}``.  The host maps such tensors and warns once
    #: per mapping.  Default: every dtype is supported.
    unsupported_dtypes: ClassVar[Mapping[str, str]] = {}

    #: torch device types (``torch.device.type``) whose tensors the device can
    #: use in place through DLPack, with no copy, in both directions.
    #: Default: none; every transfer copies through host memory.
    zero_copy_torch_devices: ClassVar[tuple[str, ...]] = ()

    #: Whether the plugin's devices are this host's own CPU (a reference or
    #: test plugin such as cpu_ref), not an accelerator.  Libraries that
    #: choose their device themselves and fall back to ``'cpu'`` when they
    #: know none of the machine's (accelerate, and transformers' Trainer
    #: through it) are given ``'jax'`` instead only when this is False:
    #: moving a CPU program onto a stand-in for the same CPU gains nothing.
    #: Default False: a plugin is an accelerator.
    is_host_cpu: ClassVar[bool] = False

    #: Vendor kernels: ATen op name -> :class:`Kernel` (or its ``fn`` string
    #: alone), e.g. ``{"aten::_softmax": Kernel("acme._kernels:softmax",
    #: dtypes=("float32",))}``.  On this device the host runs a matching
    #: kernel instead of its own lowering of the op, in eager ops, fused
    #: segments, ``torch.compile(backend='jax')`` graphs and ``assume_pure``
    #: alike; autograd's backward ops are ops too (declare a kernel for
    #: ``aten::_softmax_backward_data``, or the reference backward runs).  A
    #: kernel that cannot be imported, raises while traced or returns another
    #: shape or dtype than the reference lowering falls back to the reference
    #: with one warning (``PJRT_HOST_PLUGIN_KERNELS=strict``: an error).
    #: Default: none.  docs/writing-a-plugin.md, "Vendor kernels".
    kernels: ClassVar[Mapping[str, Union[str, Kernel]]] = {}

    def library_path(self) -> str | None:
        """Absolute path of the PJRT C API shared library (``GetPjrtApi``).

        Return None for a backend built into jaxlib (see
        :attr:`jaxlib_backend`).  Raise with a message naming the package to
        install when the library cannot be found.  Default: None.
        """
        return None

    def physical_chip_count(self) -> int:
        """Number of chips attached to this host; 0 means none is present.

        Must not initialise the device runtime in the calling process.
        With ``PJRT_DEVICE`` unset, a plugin reporting 0 is never chosen.
        Default: 1.
        """
        return 1

    def client_create_options(self) -> Mapping[str, ClientOption]:
        """Named options passed to ``PJRT_Client_Create``.

        Called after :meth:`configure_single_process` or
        :meth:`configure_multiprocess`, so it may read what they set.
        Default: no options.
        """
        return {}

    def requires_xla_coordinator(self) -> bool:
        """Whether several processes need jax.distributed's coordination
        service (key-value store) before the client is created.  Called
        after :meth:`configure_multiprocess`, so it may depend on what that
        set.  The host starts the coordinator for several processes anyway
        (jax's cross-process collectives need it); True makes
        ``PJRT_HOST_XLA_COORDINATOR=off`` an error instead of a choice.
        Default: False.
        """
        return False

    def configure_single_process(self) -> None:
        """Prepare the process to own every local device, before the client
        exists (e.g. set topology environment variables).  Must not override
        what the user already set.  Default: nothing to do.
        """

    def configure_multiprocess(self, local_rank: int, local_world_size: int) -> None:
        """Prepare process ``local_rank`` of ``local_world_size`` processes on
        this host to own its share of the local devices, before the client
        exists (and before jax.distributed's coordinator is joined).  Must
        not override what the user already set.  An exception here fails
        this rank's set-up with an error naming the plugin.  Default:
        nothing to do.
        """

    def library_loaded(self, c_api: Any) -> None:
        """Called once :meth:`library_path`'s library is loaded, before the
        client is created, with jaxlib's handle on its ``PJRT_Api`` (a
        PyCapsule).  Register here what the library needs from the Python
        side, e.g. custom-call targets or FFI handlers that a companion
        package provides.  May import jax.  An exception fails the client's
        creation with an error naming the plugin.  Not called for a jaxlib
        built-in backend.  Default: nothing to do.
        """

    def host_index(self) -> int | None:
        """Index of this host among all hosts, if the device runtime knows it
        (e.g. a worker id set by the cluster).  Default: None, and the host
        derives it from the launcher's environment (node rank), else 0.
        """
        return None

    def mesh_device_order(self, mesh_shape: tuple[int, ...], devices: list[Any]) -> list[int] | None:
        """The order in which ``devices`` (all the plugin's jax devices of
        the job, ``devices[i]`` being device id i) should fill an SPMD mesh
        of shape ``mesh_shape`` (row-major), as device ids; called by
        ``pjrt_host.spmd.create_mesh`` / ``get_1d_mesh`` when the mesh spans
        every device.  A device whose interconnect has a shape (a torus)
        returns an order that keeps neighbours adjacent along each mesh
        axis.  May import jax.  Default: None, the devices in id order.
        """
        return None

    # -- helpers for the host; not meant to be overridden -------------------

    # a hook implementation: pjrt_host._hookspecs marks it (importing pluggy
    # here would add it to `python -m pjrt_host list`, which never needs it)
    def pjrt_host_client_created(self, name: str, plugin: Any, devices: list[Any]) -> None:
        """Import the modules of this plugin's :attr:`kernels` (those
        ``PJRT_HOST_PLUGIN_KERNELS`` allows) as its client comes up, so the
        custom-call targets they register exist before the host loads
        programs kept on disk that call them (it starts loading the last
        run's programs right after this hook).  A module that fails is left
        for the first op, which names it in a warning.  A subclass that
        implements this hook too calls ``super().pjrt_host_client_created(...)``."""
        if plugin is not self:
            return
        import importlib

        try:
            declared = self.declared_kernels
        except Exception:
            return  # the first op refuses the plugin, naming the problem
        if declared.mode == "off":
            return
        for op, kernel in declared.kernels:
            if op in declared.dropped:
                continue
            try:
                importlib.import_module(kernel.fn.partition(":")[0])
            except Exception:
                pass  # reported, with the plugin, op and kernel, when the op is first lowered

    def describe(self) -> str:
        """The name shown to users: :attr:`display_name` or the class name."""
        return self.display_name or type(self).__name__

    @property
    def declared_kernels(self) -> KernelDeclarations:
        """:attr:`kernels` normalised (op names as the lowering table writes
        them, bare strings as :class:`Kernel`), with the process's
        ``PJRT_HOST_PLUGIN_KERNELS`` setting.  Imports nothing.  Raises
        ``ValueError`` naming the plugin for a declaration that is not a
        :class:`Kernel` or a ``"module:function"`` string."""
        problems = kernel_problems(self)
        if problems:
            raise ValueError(f"pjrt_host: plugin {self.describe()} ({_class_name(self)}) declares kernels the host "
                             f"cannot read: {'; '.join(problems)}")
        mode, dropped = _env.plugin_kernels()
        return KernelDeclarations(f"{self.describe()} ({_class_name(self)})", _normalised_kernels(self), mode,
                                  tuple(sorted(dropped)))


def _class_name(plugin: Any) -> str:
    return f"{type(plugin).__module__}.{type(plugin).__qualname__}"


def _declared(plugin: Any) -> Mapping[str, Any]:
    kernels = getattr(plugin, "kernels", {})
    return kernels() if callable(kernels) else kernels


def _normalised_kernels(plugin: Any) -> tuple[tuple[str, Kernel], ...]:
    def normalised(spec: Any) -> Kernel:
        if isinstance(spec, str):
            return Kernel(spec)
        return spec._replace(dtypes=tuple(spec.dtypes), ranks=tuple(spec.ranks))  # lists are unhashable

    return tuple((_env.normalise_op_name(op), normalised(spec)) for op, spec in _declared(plugin).items())


def kernel_problems(plugin: Any) -> list[str]:
    """What is wrong with ``plugin``'s :attr:`DevicePlugin.kernels` (one
    sentence each), read without importing anything."""
    try:
        declared = _declared(plugin)
        items = list(declared.items())
    except Exception as err:
        return [f"kernels cannot be read ({type(err).__name__}: {err}); expected a mapping of ATen op name to "
                "Kernel or 'module:function'"]
    problems = []
    for op, spec in items:
        if not isinstance(op, str) or not op.strip():
            problems.append(f"kernel key {op!r} is not an ATen op name such as 'aten::_softmax'")
            continue
        if isinstance(spec, str):
            spec = Kernel(spec)
        if not isinstance(spec, Kernel):
            problems.append(f"the kernel for {op} is {spec!r}, expected pjrt_host.Kernel(...) or 'module:function'")
            continue
        for what, text in (("fn", spec.fn), ("when", spec.when)):
            if text is None and what == "when":
                continue
            if not isinstance(text, str) or text.count(":") != 1 or not all(text.split(":")):
                problems.append(f"the kernel for {op} has {what}={text!r}, expected 'module:function'")
        if not all(isinstance(d, str) for d in spec.dtypes):
            problems.append(f"the kernel for {op} has dtypes={spec.dtypes!r}, expected torch dtype names "
                            "such as 'float32'")
        if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in spec.ranks):
            problems.append(f"the kernel for {op} has ranks={spec.ranks!r}, expected numbers of dimensions")
    return problems


#: The DevicePlugin members that tune lowerings: each an int >= 0 (0: off).
INT_LOWERING_OPTIONS = ("dense_gather_factor", "conv_as_matmul_max_positions")

#: The DevicePlugin members that tune lowerings: each a bool.
BOOL_LOWERING_OPTIONS = ("widen_16bit_matmul_operands",)

#: What the device passes every lowering (``LoweringContext`` fields of these
#: names): the int and bool options and the plugin's
#: :attr:`DevicePlugin.declared_kernels`.
LOWERING_OPTIONS = (*INT_LOWERING_OPTIONS, *BOOL_LOWERING_OPTIONS, "declared_kernels")


def lowering_option_problems(plugin: Any) -> list[str]:
    """What is wrong with ``plugin``'s :data:`LOWERING_OPTIONS` (one
    sentence each; empty when nothing is).  Shared by the runtime, which refuses such
    a plugin at its first op, and ``python -m pjrt_host check``."""
    problems = kernel_problems(plugin)
    for attr in INT_LOWERING_OPTIONS:
        value = getattr(plugin, attr, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            problems.append(f"{attr} is {value!r}, expected an int >= 0 (0 turns it off)")
    for attr in BOOL_LOWERING_OPTIONS:
        value = getattr(plugin, attr, False)
        if not isinstance(value, bool):
            problems.append(f"{attr} is {value!r}, expected True or False")
    return problems
