"""Registration of the 'jax' device with torch, done once at autoload.

Everything here must stay cheap (it runs inside ``import torch``): no jax,
no plugin code, no op tables.  The kernels registered here are thin and
import the real implementation on their first call.
"""

from __future__ import annotations

import logging
import sys
import threading

import torch

from . import _accelerate, _accelerator, _backward, _device_module, _generators, _lightning, _modules, _storage_bridge
from ._devices import DEVICE_NAME

__all__ = ["AUTOCAST_FP32_OPS", "AUTOCAST_OPS", "DEVICE_OPS", "FACTORY_OPS", "PATCHES", "is_registered", "register"]

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_registered = False
_libraries: list[torch.library.Library] = []  # kept alive: dropping one unregisters its kernels

# Factory ops that get a kernel of their own on the device key.  Without one,
# torch runs its composite kernel (e.g. zeros = empty + zero_), which works
# but costs an extra op.  Names, not torch.ops attributes: an overload a torch
# release drops is skipped, never an import error.
FACTORY_OPS = (
    "empty.memory_format",
    "empty_strided",
    "zeros",
    "ones",
    "full",
    "scalar_tensor",
    "arange",
    "arange.start",
    "arange.start_step",
    "linspace",
    "eye",
    "eye.m",
    "randn",
    "rand",
    "randint",
    "randint.low",
    "randperm",
    # With generator= (torch.Generator(device='jax') or a CPU one): drawn on
    # the device, the key seeded from the generator.
    "randn.generator",
    "rand.generator",
    "randint.generator",
    "randint.low_generator",
    "randperm.generator",
)

# Ops that run in the autocast dtype under torch.autocast('jax') (torch's
# "lower precision" list); every other op passes through unchanged.
AUTOCAST_OPS = (
    "mm", "bmm", "matmul", "addmm", "addbmm", "baddbmm", "linear", "conv1d", "conv2d", "conv3d",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "prelu",
    "_scaled_dot_product_attention_math", "scaled_dot_product_attention", "chain_matmul", "addmv", "mv",
)

# Ops that run in float32 under torch.autocast('jax') when given float16 /
# bfloat16 inputs: torch's "fp32" autocast list for cuda (ops whose range or
# accumulation a 16-bit type would spoil: exp/log family, norms, softmax,
# losses, reductions).
AUTOCAST_FP32_OPS = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm", "group_norm",
    "frobenius_norm.dim", "nuclear_norm", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss",
    "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss",
    "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "softmax.int", "log_softmax.int", "cross_entropy_loss", "prod", "prod.dim_int", "sum", "sum.dim_IntList",
    "cumsum", "cumprod", "norm.Scalar", "norm.ScalarOpt_dim", "linalg_vector_norm",
)

# Ops torch runs on the device key itself, with Python dispatch turned off
# (``torch.tensor(data, device='jax')`` calls ``_to_copy`` that way).
DEVICE_OPS = ("_to_copy", "copy_")

# The backward formulas that build a sparse gradient (gather(sparse_grad=True),
# nn.Embedding(sparse=True)): the device has no sparse layout, and torch's
# composites reach its C++ sparse constructors from autograd's device thread,
# where the failure ended the process.  On 'jax' they give the dense gradient
# (the same values, as x.grad.to_dense() on CPU), through ops that autograd
# records, so double backward works.
def _gather_dense_backward(self, dim, index, grad):
    return torch.zeros_like(self, dtype=grad.dtype).scatter_add(dim, index, grad)


def _embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq, sparse):
    return torch.ops.aten.embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq)


DENSE_GRADIENT_OPS = (("_gather_sparse_backward", _gather_dense_backward),
                      ("embedding_backward", _embedding_dense_backward))


def _one_hot_checked(self, num_classes=-1):
    """one_hot's own composite kernel, after CPU's checks of the classes:
    torch leaves them to a device assert on accelerators, and the form it
    takes for them (``arange == x``) gives a zero row for a bad class."""
    from . import _config, _value_checks

    if self.dtype != torch.int64:
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    if num_classes == -1 and self.numel() == 0:
        raise RuntimeError("Can not infer total number of classes from empty tensor.")
    _value_checks.one_hot_classes(self, num_classes, _config.current().check_mode)
    if num_classes == -1:
        num_classes = int(self.max().item()) + 1
    return (self.unsqueeze(-1) == torch.arange(num_classes, dtype=self.dtype, device=self.device)).to(torch.int64)


def _sdpa_checked(*args, **kwargs):
    """scaled_dot_product_attention's own composite kernel (the math
    formulation on this device), after the check that sdpa_kernel allows
    the math backend: torch asks no backend choice of a PrivateUse1 device
    without a C++ stub (``_sdpa``)."""
    from . import _sdpa

    _sdpa.check_backends()
    return torch.ops.aten.scaled_dot_product_attention.default.decompose(*args, **kwargs)


#: Composite ops whose 'jax' form checks argument values first (autograd
#: key: a composite op decomposes there, before reaching the device).
CHECKED_COMPOSITE_OPS = (("one_hot", _one_hot_checked), ("scaled_dot_product_attention", _sdpa_checked))


#: Everything of torch's that registration replaces: name -> (its key in
#: PJRT_HOST_SKIP_PATCHES, why), besides the registrations torch offers (device
#: name, device module, hooks, kernels, serialization package).  Each
#: replacement carries ``_pjrt_host = True`` and defers to torch's original for
#: everything but 'jax'; tests/test_checkpoints.py checks this is exactly the set.
PATCHES = {
    "torch.Tensor.pin_memory": ("pin_memory", "pinning for 'jax' (DataLoader(pin_memory=True)) returns the "
                                              "tensor: no pinned allocator can be registered from Python"),
    "torch.UntypedStorage.__new__": ("storage", "UntypedStorage(n, device='jax') would dereference a null "
                                                "allocator"),
    "torch.UntypedStorage.new": ("storage", "storage.new() of a 'jax' storage would dereference a null allocator"),
    "torch.UntypedStorage.resize_": ("storage", "FSDP2 frees / re-allocates parameters by resizing their storage"),
    "torch.UntypedStorage.nbytes": ("storage", "a freed 'jax' storage reports 0 bytes"),
    "torch.nn.Module._apply": ("module_to", "module.to('jax') keeps parameter objects and tied weights"),
    "torch.autograd._engine_run_backward": ("backward", "a device error inside backward raises at backward(), "
                                                        "not abort() (installed at the first 'jax' tensor)"),
    "torch._C.Generator.__call__ (its metaclass)": ("generator", "torch.Generator(device='jax')"),
    **{f"torch.accelerator.{name}": ("accelerator", "answered by torch.jax: torch asks a C++ allocator / "
                                                    "device guard") for name in _accelerator.FUNCTIONS},
}


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    """What torch's C++ side asks a registered accelerator.  Answers without
    touching the device: torch.accelerator and dynamo call these on CPU-only
    programs too."""

    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _DeviceGuard(torch._C._acc.DeviceGuard):
    def type_(self):  # noqa: D401 - torch's name
        return torch._C._autograd.DeviceType.PrivateUse1


def is_registered() -> bool:
    return _registered


def register() -> None:
    """Name PrivateUse1 'jax', register ``torch.jax``, the accelerator hooks
    and the kernels.  Idempotent; a PrivateUse1 already taken by another
    backend is logged and left alone (torch has only one)."""
    global _registered
    with _lock:
        if _registered:
            return
        current = torch._C._get_privateuse1_backend_name()
        if current not in ("privateuseone", DEVICE_NAME):
            logger.warning(
                "torch's PrivateUse1 device is already named %r by another backend; "
                "the 'jax' device is not available in this process. Uninstall that backend or "
                "disable it to use pjrt_host's device.", current)
            return
        if current != DEVICE_NAME:
            from ._builtin import torch_own_accelerator

            own = torch_own_accelerator()
            if own is not None:
                logger.warning(
                    "pjrt_host: the 'jax' device becomes torch's accelerator in this process, in place of %s: "
                    "torch's autograd then fails backward passes over %s tensors (opt_ready_stream && "
                    "opt_parent_stream INTERNAL ASSERT FAILED, pytorch/pytorch#161129). Use %s and 'jax' "
                    "tensors in separate processes for training; DLPack and .to() between them work.",
                    own, own, own)
            torch.utils.rename_privateuse1_backend(DEVICE_NAME)
        # tensor.jax(), tensor.is_jax, module.jax(), as torch's built-in devices have.
        if not hasattr(torch.Tensor, f"is_{DEVICE_NAME}"):  # a failed earlier attempt may have made them
            torch.utils.generate_methods_for_privateuse1_backend(
                for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True)
        if not hasattr(torch, DEVICE_NAME):
            torch._register_device_module(DEVICE_NAME, _device_module)
        # torch.jax.amp as torch.cuda.amp: `from torch.jax.amp import autocast`.
        sys.modules.setdefault(f"torch.{DEVICE_NAME}.amp", _device_module.amp)
        # Without hooks and a device guard, torch.accelerator reports the
        # device but cannot answer current_stream(), and dynamo (which asks
        # for it on every compile, CPU included) fails.
        torch._C._acc.register_python_privateuseone_hook(_Hooks())
        torch._C._acc.register_python_privateuseone_device_guard(_DeviceGuard())
        _register_kernels()
        # Each of these serves one feature and leans on torch internals a
        # torch release may change: one that fails costs its feature (named
        # in the warning), never the device.  PJRT_HOST_SKIP_PATCHES skips
        # some or all of them.
        _install_optional(when="import")
        _registered = True


def skipped_patches() -> set[str]:
    """The patch keys ``PJRT_HOST_SKIP_PATCHES`` names (comma-separated, or
    ``all``); an unknown key is an error naming the known ones, at once."""
    import os

    raw = os.environ.get("PJRT_HOST_SKIP_PATCHES", "").strip()
    if not raw:
        return set()
    keys = {k.strip() for k in raw.split(",") if k.strip()}
    known = {key for key, *_ in _optional()}
    if "all" in keys:
        return known
    unknown = keys - known
    if unknown:
        raise ValueError(f"PJRT_HOST_SKIP_PATCHES names {sorted(unknown)}; the patches are {sorted(known)} "
                         f"(or 'all')")
    return keys


def _install_optional(when: str) -> None:
    try:
        skip = skipped_patches()
    except ValueError as err:
        logger.warning("pjrt_host: %s; no patch is skipped", err)
        skip = set()
    for key, phase, install, feature in _optional():
        if phase != when:
            continue
        if key in skip:
            logger.info("pjrt_host: %s is off (PJRT_HOST_SKIP_PATCHES=%s)", feature, key)
            continue
        try:
            install()
        except Exception as err:
            logger.warning("pjrt_host: %s is unavailable with this torch (%s): %s: %s. The 'jax' device "
                           "works without it; please report this with your torch version.",
                           feature, torch.__version__, type(err).__name__, err)


def _optional() -> list:
    """(key for PJRT_HOST_SKIP_PATCHES, when it is installed, install, the
    feature it serves).  'import': at registration, inside ``import torch``
    (what a program reaches before it has a 'jax' tensor: ``torch.load``,
    ``module.to``, ``torch.Generator``, ``init_process_group``); 'device':
    when the device loads, at the first 'jax' tensor (what only matters once
    one exists)."""
    return [
        ("pin_memory", "import", _patch_pin_memory, "tensor.pin_memory() for 'jax'"),
        ("serialization", "import", _storage_bridge.register_serialization, "torch.load(map_location='jax')"),
        ("storage", "import", _patch_untyped_storage, "torch.UntypedStorage(n, device='jax')"),
        ("accelerator", "import", _accelerator.install, "torch.accelerator memory figures and synchronize"),
        ("module_to", "import", _modules.install, "module.to('jax') keeping parameter objects and tied weights"),
        ("generator", "import", _generators.install, "torch.Generator(device='jax')"),
        ("c10d", "import", _c10d_register, "the 'pjrt' torch.distributed backend"),
        ("accelerate", "import", _accelerate.install, "accelerate's and Trainer's default device 'jax' on an "
                                                      "accelerator plugin (an import hook: neither is imported)"),
        ("lightning", "import", _lightning.install, "Trainer(accelerator='jax') and Fabric(accelerator='jax') "
                                                    "(an import hook: Lightning is not imported)"),
        ("backward", "device", _backward.install, "device errors inside backward() raised at backward()"),
    ]


def _c10d_register() -> None:
    from . import _c10d

    _c10d.register()


def _patch_pin_memory() -> None:
    """``tensor.pin_memory()`` with no device pins for the current
    accelerator, which is now 'jax'; torch's pinned allocator for it would
    have to come from C++ hooks a Python backend cannot register, and PJRT
    copies from any host memory anyway.  So pinning for 'jax' returns the
    tensor as it is (unpinned) -- what a CPU-only program got before the
    device existed (e.g. ``DataLoader(pin_memory=True)``)."""
    original = torch.Tensor.pin_memory
    if getattr(original, "_pjrt_host", False):
        return

    def pin_memory(self, device=None):
        target = device
        if target is None:
            acc = torch._C._accelerator_getAccelerator()
            target = acc.type if acc is not None else None
        elif not isinstance(target, str):
            target = torch.device(target).type
        if target is not None and str(target).split(":", 1)[0] == DEVICE_NAME:
            return self
        return original(self) if device is None else original(self, device)

    pin_memory.__doc__ = original.__doc__
    pin_memory._pjrt_host = True  # type: ignore[attr-defined]
    torch.Tensor.pin_memory = pin_memory  # type: ignore[method-assign]


def _patch_untyped_storage() -> None:
    """``torch.UntypedStorage(n, device='jax')`` (and ``(sequence, device=
    'jax')``): torch's constructor asks the device's C++ allocator, which a
    Python backend cannot register, and dereferences a null one (the process
    ends).  For 'jax' it makes a storage of _storage_bridge instead; every
    other device goes to torch's constructor as before."""
    cls = torch.UntypedStorage
    original = cls.__new__
    if getattr(original, "_pjrt_host", False):
        return

    def __new__(cls, *args, **kwargs):
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == DEVICE_NAME:
            return _new_device_storage(args, kwargs)
        return original(cls, *args, **kwargs)

    __new__._pjrt_host = True  # type: ignore[attr-defined]
    cls.__new__ = staticmethod(__new__)  # type: ignore[method-assign]
    original_new = cls.new

    def new(self):
        # storage.new(): an empty storage of the same device, through the
        # same missing allocator.
        if self.device.type == DEVICE_NAME:
            return _storage_bridge.new_staged(0, self.device.index or 0)
        return original_new(self)

    new.__doc__ = original_new.__doc__
    new._pjrt_host = True  # type: ignore[attr-defined]
    cls.new = new  # type: ignore[method-assign]
    # resize_ / nbytes: FSDP2 frees and re-allocates unsharded parameters
    # through their storage (resize_(0), resize_(n), size()); torch would ask
    # the device's C++ hooks, which a Python backend cannot fill.
    original_resize, original_nbytes = cls.resize_, cls.nbytes

    def resize_(self, size):
        if self.device.type == DEVICE_NAME and _storage_bridge.resize(self, size):
            return self
        return original_resize(self, size)

    def nbytes(self):
        if self.device.type == DEVICE_NAME:
            found = _storage_bridge.nbytes(self)
            if found is not None:
                return found
        return original_nbytes(self)

    for name, fn, original_fn in (("resize_", resize_, original_resize), ("nbytes", nbytes, original_nbytes)):
        fn.__doc__ = original_fn.__doc__
        fn._pjrt_host = True  # type: ignore[attr-defined]
        setattr(cls, name, fn)


def _new_device_storage(args: tuple, kwargs: dict) -> torch.UntypedStorage:
    from ._devices import device_index

    extra = sorted(set(kwargs) - {"device"})
    if extra or len(args) > 1:
        raise TypeError(f"pjrt_host: torch.UntypedStorage(..., device='{DEVICE_NAME}') takes a size or a "
                        f"sequence of bytes, not {extra or args[1:]}")
    index = device_index(kwargs["device"])
    data = args[0] if args else 0
    if isinstance(data, int):
        if data < 0:
            raise RuntimeError(f"Storage size must be non-negative, got {data}")
        return _storage_bridge.new_staged(data, index)
    host = torch.UntypedStorage(data)  # torch's checks of a byte sequence, on the CPU
    return _storage_bridge.staged(host, index)


def _register_kernels() -> None:
    from .. import _jax_settings

    scoped = _jax_settings.x64_scope
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(_never_traced(scoped(_factory_fallback)), "PrivateUse1")
    _libraries.append(fallback)
    # torch.autocast('jax'): ops pass through, except the matmul family.
    fallback.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    aten = torch.library.Library("aten", "IMPL")
    _libraries.append(aten)
    for names, make_kernel, key in ((AUTOCAST_OPS, _autocast_kernel, "AutocastPrivateUse1"),
                                    (AUTOCAST_FP32_OPS, _autocast_fp32_kernel, "AutocastPrivateUse1"),
                                    (FACTORY_OPS, _factory_kernel, "PrivateUse1"),
                                    (DEVICE_OPS, _device_kernel, "PrivateUse1")):
        for name in names:
            try:
                kernel = make_kernel(name)
                aten.impl(name, _never_traced(scoped(kernel)) if key == "PrivateUse1" else kernel, key)
            except Exception as err:  # a renamed overload must not stop the device
                logger.debug("no %s kernel for aten::%s: %s", key, name, err)
    for name, kernel in DENSE_GRADIENT_OPS + CHECKED_COMPOSITE_OPS:
        try:
            aten.impl(name, kernel, "AutogradPrivateUse1")
        except Exception as err:
            logger.debug("no dense-gradient kernel for aten::%s: %s", name, err)


# ---------------------------------------------------------------- the device, loaded on first use
#
# The kernels above are what torch calls first for 'jax' work; the device's
# implementation (which imports jax) is loaded by the first of them to run.

_engine_lock = threading.Lock()
_dispatch_fn = None


def _device():
    """The dispatcher, after loading the device once: installs it on the
    tensor class and lets the collectives take 'jax' tensors."""
    global _dispatch_fn
    if _dispatch_fn is None:
        with _engine_lock:
            if _dispatch_fn is None:
                from .. import _collectives
                from . import _dispatch, _tensor

                _tensor.install_dispatcher(_dispatch.dispatch)
                _install_optional(when="device")
                _collectives.register_array_type(
                    _tensor.JaxTensor, to_jax=_tensor.read,
                    from_jax=lambda array, like: _tensor.wrap_array(array, like._storage.device_index, None,
                                                                   like._storage.place))
                _dispatch_fn = _dispatch.dispatch
    return _dispatch_fn


def _factories():
    _device()
    from . import _factories as factories

    return factories


def _aten_op(name: str):
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def _factory_kernel(name: str):
    def kernel(*args, **kwargs):
        return _factories().run_named(name, args, kwargs)

    kernel.__name__ = f"jax_{name.replace('.', '_')}"
    return _never_traced(kernel)


def _device_kernel(name: str):
    op = None

    def kernel(*args, **kwargs):
        nonlocal op
        if op is None:
            op = _aten_op(name)
        return _device()(op, args, kwargs)

    kernel.__name__ = f"jax_{name.replace('.', '_')}"
    return _never_traced(kernel)


def _autocast_fp32_kernel(name: str):
    return _autocast_kernel(name, to_float32=True)


_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _autocast_kernel(name: str, to_float32: bool = False):
    op = None
    key = torch._C.DispatchKey.AutocastPrivateUse1

    def kernel(*args, **kwargs):
        nonlocal op
        if op is None:
            op = _aten_op(name)
        dtype = torch.float32 if to_float32 else torch.get_autocast_dtype(DEVICE_NAME)

        def cast(v):
            if isinstance(v, torch.Tensor) and v.is_floating_point() and v.device.type == DEVICE_NAME and (
                    not to_float32 or v.dtype in _LOW_PRECISION):
                return v.to(dtype)
            if isinstance(v, (list, tuple)):
                return type(v)(cast(x) for x in v)
            return v

        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(key)):
            return op(*cast(args), **{k: cast(v) for k, v in kwargs.items()})

    kernel.__name__ = f"jax_autocast_{name.replace('.', '_')}"
    return _never_traced(kernel)


def _never_traced(fn):
    # C++ -> Python entry points: dynamo must never trace them, also when a
    # compiled function's graph break runs an op eagerly.
    from . import _hiding

    return _hiding.never_traced(fn)


def _factory_fallback(op, *args, **kwargs):
    # Reached by ops dispatched on the device key with no tensor of ours among
    # their inputs: factories without a kernel of their own.
    return _factories().run(op, args, kwargs)


for _entry in (_factory_fallback, _Hooks.is_available, _Hooks.has_primary_context, _Hooks.is_built,
               _DeviceGuard.type_):
    _never_traced(_entry)
