// cpu_ref's custom-call kernel: softmax of float32 rows (the last dimension),
// an XLA FFI handler registered for the CPU platform (softmax.py loads it;
// _build.py compiles it on first use against jax.ffi.include_dir()).
//
// Per row: its maximum, exp(x - max) written out, their sum, a scale by
// 1 / sum -- torch CPU's steps, so a row holding NaN or +inf gives NaN as
// torch's does.  It is an example of the FFI route, written to be read: on
// XLA:CPU it is slower than the host's lowering (benchmarks/bench_kernels.py
// and docs/writing-a-plugin.md say by how much and why).

#include <cmath>
#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// exp(x) for float, written so that the compiler vectorizes a loop of it
// (Cephes' expf: x = n ln2 + r with |r| <= ln2 / 2, a degree-6 polynomial for
// exp(r), 2^n built in the exponent bits; about 1 ulp).  exp(-inf) and
// anything below -87.3 is 0, as libm's; NaN stays NaN.
static inline float VectorExp(float x) {
  const float clamped = x > 88.7f ? 88.7f : (x < -87.3f ? -87.3f : x);
  const float n = std::floor(clamped * 1.44269504088896341f + 0.5f);
  float r = clamped - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  const float e = p * __builtin_bit_cast(float, bits);  // 2^n
  return x < -87.3f ? 0.0f : (x != x ? x : e);
}

static ffi::Error SoftmaxLastDim(ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> y) {
  auto dims = x.dimensions();
  if (dims.size() == 0) {
    return ffi::Error::InvalidArgument("pjrt_host_cpu_ref softmax: the input needs at least one dimension");
  }
  const int64_t n = dims.back();
  if (n == 0) return ffi::Error::Success();
  const int64_t rows = static_cast<int64_t>(x.element_count()) / n;
  const float* in = x.typed_data();
  float* out = y->typed_data();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = in + r * n;
    float* dst = out + r * n;
    // A NaN the maximum skips still makes its exp, the sum and so the row NaN, as torch's.
    float top = row[0];
#pragma omp simd reduction(max : top)
    for (int64_t i = 1; i < n; ++i) top = row[i] > top ? row[i] : top;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = VectorExp(row[i] - top);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; ++i) sum += dst[i];
    const float scale = 1.0f / sum;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] *= scale;
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(PjrtHostCpuRefSoftmax, SoftmaxLastDim,
                              ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>());
