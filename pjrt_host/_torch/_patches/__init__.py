"""Every change pjrt_host makes to torch's own objects and to other
libraries, listed once and made only from this folder.

Besides the registrations torch offers (device name, device module, hooks,
kernels), a few features need a function of torch replaced, or a library
told about the device.  Each is a row of :data:`INVENTORY`: its key in
``PJRT_HOST_SKIP_PATCHES``, when it is installed, the feature it serves,
what it replaces and why.  The wrappers of torch's functions live with their
feature (``_storage_bridge``, ``_modules``, ``_generators``,
``_torch_accelerator``, ``_backward``, ``_hiding``); :func:`_replace` here
assigns them.  What changes another library is in this folder whole: the
'pjrt' backend's registration with torch.distributed
(``_c10d_registration``), accelerate's and transformers' default device
(``_huggingface``) and Lightning's registration (``_lightning``), both
through import hooks (``_import_hooks``).  Each replacement carries
``_pjrt_host = True`` and defers to the original for everything but 'jax';
tests/test_checkpoints.py checks that what is marked is exactly
:data:`PATCHES`, and tests/test_layers.py that no module outside this
folder assigns onto torch or another library.

Each serves one feature and leans on torch internals a torch release may
change: one that fails costs its feature (named in the warning), never the
device.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, NamedTuple

import torch

from .. import _backward, _generators, _hiding, _modules, _storage_bridge, _torch_accelerator
from . import _huggingface, _lightning

__all__ = ["INVENTORY", "PATCHES", "Patch", "install", "skipped_patches"]

logger = logging.getLogger(__name__)


class Patch(NamedTuple):
    """One row of the inventory."""

    #: Its key in ``PJRT_HOST_SKIP_PATCHES``.
    key: str
    #: 'import': at registration, inside ``import torch`` (what a program
    #: reaches before it has a 'jax' tensor: ``torch.load``, ``module.to``,
    #: ``torch.Generator``, ``init_process_group``; a target imported later
    #: -- a library, dynamo -- is replaced by a hook armed then); 'device':
    #: when the device loads, at the first 'jax' tensor (what only matters
    #: once one exists).
    phase: str
    #: The feature it serves (named when it is off or fails).
    feature: str
    #: (torch attribute replaced, why) -- empty for a registration through
    #: an API torch offers, or a change outside torch (accelerate's).
    replaces: tuple[tuple[str, str], ...]
    install: Callable[[], None]


def _replace(owner: Any, name: str, original: Any, make: Callable[[Any], Any], static: bool = False) -> Any:
    """``owner.name = make(original)``, once (a replacement is marked
    ``_pjrt_host``); returns the replacement, or None when there was
    nothing to replace or it is already ours.  ``original`` is passed
    written out, so that the internals scan (tests/test_internals.py) sees
    which attribute of torch each patch replaces."""
    if original is None or getattr(original, "_pjrt_host", False):
        return None
    new = make(original)
    new._pjrt_host = True
    setattr(owner, name, staticmethod(new) if static else new)
    return new


def _install_pin_memory() -> None:
    _replace(torch.Tensor, "pin_memory", torch.Tensor.pin_memory, _storage_bridge.wrap_pin_memory)


def _install_storage() -> None:
    cls = torch.UntypedStorage
    _replace(cls, "__new__", cls.__new__, _storage_bridge.wrap_storage_constructor, static=True)
    _replace(cls, "new", cls.new, _storage_bridge.wrap_storage_new)
    _replace(cls, "resize_", cls.resize_, _storage_bridge.wrap_storage_resize)
    _replace(cls, "nbytes", cls.nbytes, _storage_bridge.wrap_storage_nbytes)


def _install_accelerator() -> None:
    import torch.accelerator as accelerator

    memory = getattr(accelerator, "memory", None)
    for name in _torch_accelerator.FUNCTIONS:
        original = getattr(accelerator, name, None)
        new = _replace(accelerator, name, original, _torch_accelerator.wrap(name))
        if new is not None and memory is not None and getattr(memory, name, None) is original:
            setattr(memory, name, new)


def _install_module_to() -> None:
    encoder = torch.nn.TransformerEncoder
    _replace(encoder, "forward", encoder.forward, _modules.wrap_encoder_forward)
    _replace(torch.nn.Module, "_apply", torch.nn.Module._apply, _modules.wrap_apply)


def _install_generator() -> None:
    meta = type(torch._C.Generator)
    _replace(meta, "__call__", meta.__call__, _generators.wrap_generator_call)


def _install_backward() -> None:
    import torch.autograd as autograd

    # Gone in a later torch: nothing is replaced, and errors still surface,
    # as torch's own message.
    _replace(autograd, "_engine_run_backward", getattr(autograd, "_engine_run_backward", None),
             _backward.wrap_engine_run_backward)


def _install_foreach() -> None:
    # torch.optim and clip_grad_norm_ choose their foreach path only for
    # tensors whose type is on these lists; DTensor adds itself the same way.
    import torch.optim.optimizer as optimizer
    import torch.utils._foreach_utils as foreach_utils

    from .._tensor import JaxTensor

    for supported in (optimizer._foreach_supported_types, foreach_utils._foreach_supported_types):
        if JaxTensor not in supported:
            supported.append(JaxTensor)


def _install_c10d() -> None:
    from . import _c10d_registration  # imports torch.distributed: only when this row is installed

    _c10d_registration.register()


def _install_dynamo_attributes() -> None:
    # torch._dynamo is imported by the first compile, never here: the
    # replacement is made then, with the tensor class being compiled.
    _hiding.at_first_compile = _replace_dynamo_attributes


def _replace_dynamo_attributes(owner: type) -> None:
    try:
        from torch._dynamo.variables import torch_function as tf

        cls = tf.TensorWithTFOverrideVariable
        _replace(cls, "var_getattr", cls.var_getattr, _hiding.attributes_under_modes(owner))
    except Exception as err:  # pragma: no cover - depends on the torch build
        logger.warning("pjrt_host: torch %s's dynamo has no TensorWithTFOverrideVariable.var_getattr (%s: %s); "
                       "compiling under torch.device('jax') or set_default_device may fail",
                       torch.__version__, type(err).__name__, err)
    try:
        from torch._dynamo.variables import torch_function as tf

        cls = tf.TensorWithTFOverrideVariable
        _replace(cls, "richcompare_impl", cls.richcompare_impl, _hiding.comparisons_as_functions(owner))
    except Exception as err:  # pragma: no cover - depends on the torch build
        logger.warning("pjrt_host: torch %s's dynamo has no TensorWithTFOverrideVariable.richcompare_impl (%s: %s); "
                       "comparison operators on 'jax' tensors inside torch.compile may raise NameError "
                       "(torch.gt(x, 0) and x.gt(0) trace)", torch.__version__, type(err).__name__, err)


def _install_aot_compile_session() -> None:
    # torch._dynamo is imported by the first compile, never here: the
    # replacement is made when its AOT module is imported.
    from . import _import_hooks

    _import_hooks.after_import({"torch._dynamo.aot_compile": _replace_aot_compile})


def _replace_aot_compile(module: Any) -> None:
    from torch._dynamo import aot_compile  # the module the hook was given

    _replace(aot_compile, "aot_compile_fullgraph", aot_compile.aot_compile_fullgraph, _hiding.compile_session)


_STORAGE = "torch's constructor would dereference a null allocator (no C++ allocator can be registered from Python)"

INVENTORY: tuple[Patch, ...] = (
    Patch("pin_memory", "import", "tensor.pin_memory() for 'jax'",
          (("torch.Tensor.pin_memory", "pinning for 'jax' (DataLoader(pin_memory=True)) returns the tensor: no "
                                       "pinned allocator can be registered from Python"),),
          _install_pin_memory),
    Patch("serialization", "import", "torch.load(map_location='jax')", (), _storage_bridge.register_serialization),
    Patch("storage", "import", "torch.UntypedStorage(n, device='jax')",
          (("torch.UntypedStorage.__new__", f"UntypedStorage(n, device='jax'): {_STORAGE}"),
           ("torch.UntypedStorage.new", f"storage.new() of a 'jax' storage: {_STORAGE}"),
           ("torch.UntypedStorage.resize_", "FSDP2 frees / re-allocates parameters by resizing their storage"),
           ("torch.UntypedStorage.nbytes", "a freed 'jax' storage reports 0 bytes")),
          _install_storage),
    Patch("accelerator", "import", "torch.accelerator memory figures and synchronize",
          tuple((f"torch.accelerator.{name}", "answered by torch.jax: torch asks a C++ allocator / device guard")
                for name in _torch_accelerator.FUNCTIONS),
          _install_accelerator),
    Patch("module_to", "import", "module.to('jax') keeping parameter objects and tied weights",
          (("torch.nn.Module._apply", "module.to('jax') keeps parameter objects and tied weights"),
           ("torch.nn.TransformerEncoder.forward", "an encoder with a padding mask would pack a nested tensor, "
                                                   "which the device cannot hold")),
          _install_module_to),
    Patch("generator", "import", "torch.Generator(device='jax')",
          (("torch._C.Generator.__call__ (its metaclass)", "torch.Generator(device='jax')"),),
          _install_generator),
    Patch("c10d", "import", "the 'pjrt' torch.distributed backend", (), _install_c10d),
    Patch("accelerate", "import", "accelerate's and Trainer's default device 'jax' on an accelerator plugin (an "
                                  "import hook: neither is imported)", (), _huggingface.install),
    Patch("lightning", "import", "Trainer(accelerator='jax') and Fabric(accelerator='jax') (an import hook: "
                                 "Lightning is not imported)", (), _lightning.install),
    Patch("dynamo_attributes", "import", "a 'jax' tensor's attributes read by torch.compile under torch.device('jax') "
                                         "or set_default_device",
          (("torch._dynamo.variables.torch_function.TensorWithTFOverrideVariable.var_getattr (at the first compile)",
            "dynamo calls a tensor subclass's own __torch_function__ for an attribute under a mode, and 'jax' "
            "tensors have torch's disabled one (_hiding.attributes_under_modes)"),
           ("torch._dynamo.variables.torch_function.TensorWithTFOverrideVariable.richcompare_impl (at the first "
            "compile)",
            "dynamo's handler of `x > 0` on a tensor subclass names a class it never installs (NameError at run "
            "time); 'jax' tensors' comparisons trace as torch.gt(x, 0) (_hiding.comparisons_as_functions)")),
          _install_dynamo_attributes),
    Patch("aot_compile", "import", "torch.compile(..., backend='jax').aot_compile (an import hook: dynamo is not "
                                   "imported)",
          (("torch._dynamo.aot_compile.aot_compile_fullgraph (when imported)",
            "the AOT path's capture runs outside torch's compile session, so torch.compiler.is_compiling() is "
            "False while dynamo traces and a 'jax' tensor is not hidden from it (_hiding.compile_session)"),),
          _install_aot_compile_session),
    Patch("foreach", "device", "torch.optim's and clip_grad_norm_'s default foreach step on 'jax' (one program per "
                               "optimizer op over all parameters, not one per parameter shape)", (), _install_foreach),
    Patch("backward", "device", "device errors inside backward() raised at backward()",
          (("torch.autograd._engine_run_backward", "a device error inside backward raises at backward(), not "
                                                   "abort() (installed at the first 'jax' tensor)"),),
          _install_backward),
)

#: torch attribute replaced -> (its key in PJRT_HOST_SKIP_PATCHES, why).
PATCHES: dict[str, tuple[str, str]] = {name: (patch.key, why) for patch in INVENTORY for name, why in patch.replaces}


def skipped_patches() -> set[str]:
    """The patch keys ``PJRT_HOST_SKIP_PATCHES`` names (comma-separated, or
    ``all``); an unknown key is an EnvironmentSettingError naming the known
    ones."""
    from ... import _env
    from ..._errors import EnvironmentSettingError

    keys = _env.skipped_patch_keys()
    known = {patch.key for patch in INVENTORY}
    if "all" in keys:
        return known
    unknown = keys - known
    if unknown:
        err = EnvironmentSettingError(
            f"PJRT_HOST_SKIP_PATCHES names {sorted(unknown)}, which is no patch; the patches are "
            f"{sorted(known)} (or 'all')")
        err.skipping = keys & known  # type: ignore[attr-defined]
        raise err
    return keys


def install(phase: str) -> None:
    """Install the patches of ``phase`` ('import' or 'device') not skipped
    by ``PJRT_HOST_SKIP_PATCHES``; one that fails is a warning naming its
    feature."""
    try:
        skip = skipped_patches()
    except ValueError as err:
        # Inside `import torch`: said loudly, never raised (it would break torch
        # itself); the keys that do name a patch are still skipped.
        skip = set(getattr(err, "skipping", ()))
        if phase == "import":  # said once, not again when the device loads
            logger.warning("pjrt_host: %s; skipped: %s", err, sorted(skip) or "none")
    for patch in INVENTORY:
        if patch.phase != phase:
            continue
        if patch.key in skip:
            logger.info("pjrt_host: %s is off (PJRT_HOST_SKIP_PATCHES=%s)", patch.feature, patch.key)
            continue
        try:
            patch.install()
        except Exception as err:
            logger.warning("pjrt_host: %s is unavailable with this torch (%s): %s: %s. The 'jax' device "
                           "works without it; please report this with your torch version.",
                           patch.feature, torch.__version__, type(err).__name__, err)
