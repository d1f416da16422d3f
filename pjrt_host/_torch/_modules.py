"""``nn.Module`` conversions that involve the 'jax' device keep parameters
as torch keeps them for cuda: same objects, ties intact.

``nn.Module._apply`` (behind ``.to()``, ``.jax()``, ``.cpu()``, ``.half()``
...) keeps a parameter object only when torch's C++
``_has_compatible_shallow_copy_type`` holds for the old and the moved tensor
(then ``param.data = moved``).  It holds between any two dense tensors of
torch's built-in backends, never between a CPU and a PrivateUse1 tensor, so
each module that holds a parameter gets a new ``Parameter`` of its own: a
weight tied between two modules (GPT-2's ``lm_head.weight is wte.weight``)
becomes two independent parameters, and training silently diverges.

The fix wraps ``nn.Module._apply``.  For the outermost call it notes which
module slots hold which parameter objects, lets torch convert, and then, for
each parameter whose old or new tensor is on 'jax' and whose object changed:
swaps the converted values into the original object
(``torch.utils.swap_tensors``, torch's own mechanism for
``torch.__future__.set_swap_module_params_on_conversion``) and puts that
object back into every slot that held it.  Where a swap is impossible (a
weak reference or an autograd graph holds the old tensor) the first
converted parameter goes into every slot, so ties survive anyway.

Conversions with no 'jax' tensor on either side are left exactly as torch
did them.  Buffers are not touched (torch makes new buffer objects for cuda
too).  Cheap to import: no jax.

Two more rules for modules on 'jax' live here: an exported program's graph
module moved to or from 'jax' moves the devices burnt into its ops with its
weights (:func:`_move_graph_devices`), and ``nn.TransformerEncoder`` runs
'jax' inputs without packing them into nested tensors
(:func:`wrap_encoder_forward`).
"""

from __future__ import annotations

import threading
import types
from typing import Any

import torch

from ._devices import DEVICE_NAME, current_index

__all__ = ["moving_a_module", "wrap_apply", "wrap_encoder_forward"]

_local = threading.local()

# Attributes of a 'jax' tensor that belong to its class, not to the user.
_INTERNAL = frozenset(("_storage", "_view", "_is_param"))


def _on_device(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == DEVICE_NAME


def _slots(module: torch.nn.Module, recurse: bool) -> dict[int, tuple[torch.Tensor, list[tuple[Any, str]]]]:
    """id(param) -> (param, [(module, name), ...]) for every parameter slot."""
    found: dict[int, tuple[torch.Tensor, list[tuple[Any, str]]]] = {}
    for m in (module.modules() if recurse else (module,)):
        for name, p in m._parameters.items():
            if p is not None:
                found.setdefault(id(p), (p, []))[1].append((m, name))
    return found


def _restore(before: dict[int, tuple[torch.Tensor, list[tuple[Any, str]]]]) -> None:
    for old, places in before.values():
        first_module, first_name = places[0]
        new = first_module._parameters.get(first_name)
        if new is old or new is None:
            continue  # torch kept the object (same-type conversions), or the slot was emptied
        if not (_on_device(old) or _on_device(new)):
            continue  # not ours: exactly what torch did
        keep = new
        grad = old.grad
        attrs = {k: v for k, v in old.__dict__.items() if k not in _INTERNAL}
        try:
            # swap_tensors refuses while a .grad is attached (use count 2);
            # the converted gradient already sits on ``new``.
            old.grad = None
            torch.utils.swap_tensors(old, new)
            keep = old
        except RuntimeError:
            old.grad = grad
        else:
            # Attributes users (and libraries) set on the parameter stay on
            # it, as they do through cuda's ``param.data = moved``.
            for k, v in attrs.items():
                old.__dict__.setdefault(k, v)
        for m, name in places:
            m._parameters[name] = keep


def _aten_graphs(module: torch.nn.Module) -> list[torch.fx.GraphModule]:
    """The graph modules of ATen graphs (what ``ExportedProgram.module()``
    gives) in ``module``'s tree."""
    import torch.fx

    return [m for m in module.modules() if isinstance(m, torch.fx.GraphModule)
            and any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) for n in m.graph.nodes)]


def _state_devices(module: torch.nn.Module) -> list[tuple[Any, str, str, torch.device]]:
    return [(m, kind, name, t.device) for m in module.modules() for kind in ("_parameters", "_buffers")
            for name, t in getattr(m, kind).items() if isinstance(t, torch.Tensor)]


def _move_graph_devices(graphs: list[torch.fx.GraphModule], devices: list) -> None:
    """An exported program's graph has the devices it was traced on burnt
    into its ops (``arange(device=cpu)``, ``_assert_tensor_metadata(device=
    cpu)``, ``to(device=cpu)``), so after ``ep.module().to('jax')`` they
    would make CPU tensors beside the moved weights.  Where the weights
    moved between one device and 'jax', those arguments move with them, as
    torch.export.passes.move_to_device_pass does for the ExportedProgram
    (moves with no 'jax' side are left as torch leaves them)."""
    moves: dict[torch.device, set[torch.device]] = {}
    for m, kind, name, old in devices:
        new = getattr(m, kind).get(name)
        if isinstance(new, torch.Tensor) and new.device != old:
            moves.setdefault(old, set()).add(new.device)
    mapping = {old: next(iter(new)) for old, new in moves.items()
               if len(new) == 1 and DEVICE_NAME in (old.type, next(iter(new)).type)}
    if not mapping:
        return

    def moved(device: torch.device) -> torch.device:
        if device.type == DEVICE_NAME and device.index is None:
            device = torch.device(DEVICE_NAME, current_index())
        return mapping.get(device, device)

    for gm in graphs:
        changed = False
        for node in gm.graph.nodes:
            if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
                continue
            args = tuple(moved(a) if isinstance(a, torch.device) else a for a in node.args)
            kwargs = {k: moved(v) if isinstance(v, torch.device) else v for k, v in node.kwargs.items()}
            if args != node.args or kwargs != node.kwargs:
                node.args, node.kwargs = args, kwargs
                changed = True
        if changed:
            gm.recompile()


def wrap_encoder_forward(original: Any) -> Any:
    """``nn.TransformerEncoder`` in eval with a ``src_key_padding_mask``
    packs its input into a nested tensor (``_nested_tensor_from_mask``) for
    every device torch lists for its fast path, 'jax' (PrivateUse1) among
    them; nested tensors are C++ tensors over real memory, which the device
    has not.  For a 'jax' input the encoder runs as with
    ``enable_nested_tensor=False``: its layers get the padding mask (and take
    their own fast path, ``_transformer_encoder_layer_fwd``), which gives
    CPU's values at every position that is not padding (torch's nested path
    leaves zeros at padding positions; the unnested path, values there).  The
    module itself is not changed: the forward runs over a shallow copy of
    its attributes with ``use_nested_tensor`` False.  CPU and other devices
    take torch's path unchanged.  (``_patches`` installs it.)"""
    device_name, compiling = DEVICE_NAME, torch.compiler.is_compiling  # closure cells: see below

    def forward(self, src, *args, **kwargs):
        if (self.__dict__.get("use_nested_tensor") and getattr(src, "device", None) is not None
                and src.device.type == device_name and not compiling()):
            unnested = object.__new__(type(self))
            unnested.__dict__.update(self.__dict__)
            unnested.__dict__["use_nested_tensor"] = False
            return original(unnested, src, *args, **kwargs)
        return original(self, src, *args, **kwargs)

    # torch.jit.script reads the method's source through __wrapped__ (the
    # original's) and resolves its names in the function's globals: the
    # wrapper gets torch's module globals (and uses only its closure and
    # builtins), so scripting an encoder is unchanged.
    forward = types.FunctionType(forward.__code__, original.__globals__, original.__name__, original.__defaults__,
                                 forward.__closure__)
    forward.__doc__ = original.__doc__
    forward.__qualname__ = original.__qualname__
    forward.__module__ = original.__module__
    forward.__wrapped__ = original  # type: ignore[attr-defined]
    return forward


def moving_a_module() -> bool:
    """Whether this thread is inside ``nn.Module._apply`` (``module.to()``,
    ``.jax()``): its tensors are a module's own, of every size at one line
    (``_dynamic_dims.moved`` never pads them)."""
    return bool(getattr(_local, "depth", 0))


def wrap_apply(original: Any) -> Any:
    """``nn.Module._apply`` keeping parameter objects and tied weights
    (``_patches`` installs it)."""

    def _apply(self, fn, recurse=True):
        if getattr(_local, "depth", 0):
            return original(self, fn, recurse)  # a child of the call being handled
        before = _slots(self, recurse)
        graphs = _aten_graphs(self) if recurse else []
        devices = _state_devices(self) if graphs else []
        _local.depth = 1
        try:
            result = original(self, fn, recurse)
        finally:
            _local.depth = 0
        _restore(before)
        if graphs:
            _move_graph_devices(graphs, devices)
        return result

    _apply.__doc__ = original.__doc__
    _apply.__wrapped__ = original  # type: ignore[attr-defined]
    return _apply
