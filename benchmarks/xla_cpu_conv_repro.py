"""Plain-JAX repro of XLA:CPU's convolution cliff (no pjrt_host, no torch):
ResNet-18's convolution shapes at batch 2 on a 64x64 image, each timed as
``lax.conv_general_dilated`` and as the same convolution written as image
patches times the kernel (one matmul), forward and gradient, with the
largest difference between the two results.

On XLA:CPU (jaxlib 0.10.2) the last stage, (2, 512, 2, 2) with a
512x512x3x3 kernel, takes 27 ms forward where the matmul form takes 0.4 ms.
This is the report for XLA; pjrt_host's cpu_ref plugin works around it with
``conv_as_matmul_max_positions`` (docs/compile.md).

    python benchmarks/xla_cpu_conv_repro.py
"""

import time

import jax
import jax.numpy as jnp
from jax import lax


def conv(x, w, stride, pad):
    return lax.conv_general_dilated(x, w, (stride, stride), [(pad, pad), (pad, pad)],
                                    dimension_numbers=("NCHW", "OIHW", "NCHW"))


def conv_as_matmul(x, w, stride, pad):
    n, c, h, width = x.shape
    o, _, kh, kw = w.shape
    xp = jnp.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho = (h + 2 * pad - kh) // stride + 1
    wo = (width + 2 * pad - kw) // stride + 1
    taps = [xp[:, :, i:i + stride * (ho - 1) + 1:stride, j:j + stride * (wo - 1) + 1:stride]
            for i in range(kh) for j in range(kw)]
    patches = jnp.stack(taps, axis=2).reshape(n, c * kh * kw, ho * wo)
    out = jnp.einsum("ok,nkp->nop", w.reshape(o, c * kh * kw), patches)
    return out.reshape(n, o, ho, wo)


def best_ms(fn, *args):
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(5):
            out = fn(*args)
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - t) / 5)
    return best * 1e3


# (batch, in channels, image size, out channels, kernel, stride, padding): ResNet-18 at 64x64
SHAPES = [(2, 3, 64, 64, 7, 2, 3), (2, 64, 16, 64, 3, 1, 1), (2, 64, 16, 128, 3, 2, 1), (2, 128, 8, 128, 3, 1, 1),
          (2, 128, 8, 256, 3, 2, 1), (2, 256, 4, 256, 3, 1, 1), (2, 256, 4, 512, 3, 2, 1), (2, 512, 2, 512, 3, 1, 1),
          (2, 256, 4, 512, 1, 2, 0)]


def main() -> None:
    key = jax.random.key(0)
    for n, c, size, o, k, stride, pad in SHAPES:
        x = jax.random.normal(key, (n, c, size, size))
        w = jax.random.normal(key, (o, c, k, k)) * 0.05
        times = {}
        for name, f in (("lax", conv), ("matmul", conv_as_matmul)):
            forward = jax.jit(lambda x, w, f=f: f(x, w, stride, pad))
            grad = jax.jit(jax.grad(lambda x, w, f=f: f(x, w, stride, pad).sum(), argnums=(0, 1)))
            times[name] = (best_ms(forward, x, w), best_ms(grad, x, w))
        err = float(jnp.abs(conv(x, w, stride, pad) - conv_as_matmul(x, w, stride, pad)).max())
        print(f"x{(n, c, size, size)} w{(o, c, k, k)} stride {stride}: forward lax {times['lax'][0]:.2f} ms, "
              f"matmul {times['matmul'][0]:.2f} ms | gradient lax {times['lax'][1]:.2f} ms, matmul "
              f"{times['matmul'][1]:.2f} ms | max difference {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
