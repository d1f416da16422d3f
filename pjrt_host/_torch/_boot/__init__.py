"""What runs inside ``import torch``: the device's registration with torch.

torch calls :func:`pjrt_host._torch.autoload` while ``import torch`` is
still running; everything that call imports must be cheap and must not
import jax, jaxlib or a plugin (they are imported when the first 'jax'
tensor is made).  The modules here are that code: ``_privateuse1`` (the
registration), the dispatcher kernels it installs (``_kernels``,
``_autocast``, ``_autograd_kernels``), ``torch.jax`` (``_torch_jax``,
``_amp``, ``_streams``) and ``_builtin`` (torch's own accelerator, asked
first).  The patches installed at import are the other folder that runs
then (``_torch/_patches``).

tests/test_layers.py holds the rule: at module level (what runs when a
module is imported; a function's imports run at its first call), these
modules import only each other, ``_patches``, and the few light modules it
names with why; nothing reached that way imports jax or jaxlib at module
level, and importing every one of them leaves jax unimported.
"""
