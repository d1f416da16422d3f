"""cpu_ref's vendor kernels (``CpuRefPlugin.kernels``), one module each so
that one that cannot load (no C++ compiler) leaves the others working.

``softmax``: ``aten::_softmax`` over the last dimension of a float32 tensor,
as an XLA FFI custom call into C++ (``softmax.cc``, built on first use by
``_build``).

``softmax_backward``: ``aten::_softmax_backward_data`` in plain jax, the
pure-Python route.
"""
