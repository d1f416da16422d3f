"""cpu_ref: the reference pjrt_host device plugin.

It runs on jaxlib's built-in CPU client, so it works on any machine, and it
is the lowest-priority plugin: any real device wins the default selection.
It is also the example vendors copy: a plugin shipping its own PJRT library
returns that library's absolute path from ``library_path()`` instead of None.

``PJRT_HOST_CPU_REF_DEVICES=N`` splits the CPU into N devices (default 1),
which lets multi-device code run anywhere.

Several processes (``python -m pjrt_host launch --nproc-per-node N``) each
get their own CPU client; jax's coordinator joins them into one job and
jax's gloo collectives (TCP, bootstrapped from the coordinator's key-value
store) carry the cross-process collectives.
"""

from __future__ import annotations

import os

from pjrt_host import DevicePlugin, Kernel, env

__all__ = ["CpuRefPlugin"]


def _device_count() -> int:
    """``PJRT_HOST_CPU_REF_DEVICES``: number of CPU devices, default 1 (0,
    a negative number or a typo is refused, naming the variable)."""
    return env.integer("PJRT_HOST_CPU_REF_DEVICES", 1, minimum=1, expected="a whole number of devices")


class CpuRefPlugin(DevicePlugin):
    """jaxlib's CPU backend as a pjrt_host device."""

    display_name = "CPU (reference)"
    priority = 0  # lowest: never chosen over a real device
    jaxlib_backend = "cpu"  # no library of its own: library_path() stays None
    # torch CPU tensors and jax CPU arrays can share memory through DLPack.
    zero_copy_torch_devices = ("cpu",)
    # The host's own CPU: accelerate / transformers' Trainer keep their 'cpu'.
    is_host_cpu = True
    # XLA:CPU's convolution falls off a cliff on small images with many
    # channels (ResNet-18's last stage, 2x2 positions and 512 channels: 27 ms
    # forward against 0.4 ms as patches x kernel); up to 8x8 output positions
    # the matmul form is as fast or faster (benchmarks/bench_lowering.py).
    conv_as_matmul_max_positions = 64
    # XLA:CPU's runtime refuses some bfloat16 x bfloat16 = float32 dots inside
    # larger programs ("Unsupported element type for DotThunk::Execute"):
    # the matmul family widens 16-bit operands first (the same values).
    widen_16bit_matmul_operands = True
    # compile_options: none. XLA:CPU at optimization level 2 instead of its
    # default 3 saved 9% of a GPT-2 training run's compile time and made
    # its steady fused step 3-4% slower (benchmarks/bench_compile_options.py,
    # docs/writing-a-plugin.md): not worth other low bits than today's.
    # Vendor kernels, by strings: nothing is imported (or compiled) until the
    # client exists and an op is lowered (pjrt_host_cpu_ref/_kernels).
    kernels = {
        # C++ through XLA's FFI, compiled on first use
        "aten::_softmax": Kernel("pjrt_host_cpu_ref._kernels.softmax:softmax", dtypes=("float32",),
                                 when="pjrt_host_cpu_ref._kernels.softmax:softmax_applies"),
        # plain jax
        "aten::_softmax_backward_data": Kernel("pjrt_host_cpu_ref._kernels.backward:softmax_backward",
                                               when="pjrt_host_cpu_ref._kernels.backward:applies"),
    }

    def __init__(self) -> None:
        self._multiprocess = False  # set by configure_multiprocess()

    def physical_chip_count(self) -> int:
        return _device_count()

    def configure_single_process(self) -> None:
        self._set_device_count(_device_count())

    def configure_multiprocess(self, local_rank: int, local_world_size: int) -> None:
        self._set_device_count(_device_count())
        import jax

        # Without a collectives implementation a CPU client cannot talk to
        # the other processes' clients.  gloo is jax's default; keep any
        # choice the user made (e.g. JAX_CPU_COLLECTIVES_IMPLEMENTATION=mpi).
        if jax.config.jax_cpu_collectives_implementation is None and not os.environ.get(
            "JAX_CPU_COLLECTIVES_IMPLEMENTATION"
        ):
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        self._multiprocess = True

    def requires_xla_coordinator(self) -> bool:
        # gloo finds its peers through jax.distributed's key-value store.
        return self._multiprocess

    @staticmethod
    def _set_device_count(count: int) -> None:
        # Called only when the client is about to be created, so importing
        # jax here keeps `python -m pjrt_host list` free of it.
        import jax
        from jax._src import xla_bridge

        if not xla_bridge.backends_are_initialized():
            jax.config.update("jax_num_cpu_devices", count)
            return
        # The program used jax before its first device tensor: jax's CPU
        # backend exists and its device count can no longer change.
        have = len(jax.local_devices(backend="cpu"))
        if have != count:
            raise RuntimeError(
                f"jax's CPU backend already exists with {have} device(s), so "
                f"PJRT_HOST_CPU_REF_DEVICES={count} cannot take effect; set it "
                "before the program first uses jax, or unset it"
            )
