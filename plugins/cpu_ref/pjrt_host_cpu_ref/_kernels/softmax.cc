// cpu_ref's custom-call kernel: softmax of float32 rows (the last dimension),
// an XLA FFI handler registered for the CPU platform (softmax.py loads it;
// _build.py compiles it on first use for this machine's CPU, against
// jax.ffi.include_dir()'s headers).
//
// Per row: its maximum, exp(x - max) written out and summed, a scale by
// 1 / sum -- torch CPU's steps, so a row holding NaN or +inf gives NaN as
// torch's does.  exp is computed 8 floats at a time with GCC / Clang vector
// extensions (a compiler vectorizes none of it by itself: the float -> int
// conversion and the exponent bits stop it).

#include <cmath>
#include <cstdint>
#include <cstring>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

typedef float Floats __attribute__((vector_size(32)));
typedef int32_t Ints __attribute__((vector_size(32)));

// exp of 8 floats (Cephes' expf: x = n ln2 + r with |r| <= ln2 / 2, a
// degree-6 polynomial for exp(r), 2^n built in the exponent bits; about 1
// ulp).  Below -87.3 (exp(-inf) included) it is 0; NaN stays NaN.
static inline Floats Exp8(Floats x) {
  Floats c = x > 88.7f ? Floats{} + 88.7f : x;
  c = c < -87.3f ? Floats{} + -87.3f : c;
  const Floats t = c * 1.44269504088896341f + 0.5f;
  Floats n = __builtin_convertvector(__builtin_convertvector(t, Ints), Floats);
  n = n > t ? n - 1.0f : n;  // floor(t): the conversion truncated toward 0
  Floats r = c - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  Floats p = Floats{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const Ints bits = (__builtin_convertvector(n, Ints) + 127) << 23;  // 2^n
  Floats e = p * reinterpret_cast<const Floats&>(bits);
  e = x < -87.3f ? Floats{} : e;
  return x != x ? x : e;
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
    // A NaN the maximum skips still makes its exp, the sum and so the row NaN.
    float top = row[0];
    for (int64_t i = 1; i < n; ++i) top = row[i] > top ? row[i] : top;
    Floats partial = {};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      Floats v;
      std::memcpy(&v, row + i, sizeof v);
      const Floats e = Exp8(v - top);
      std::memcpy(dst + i, &e, sizeof e);
      partial += e;
    }
    float sum = 0.0f;
    for (int k = 0; k < 8; ++k) sum += partial[k];
    for (; i < n; ++i) {
      const float e = Exp8(Floats{} + (row[i] - top))[0];
      dst[i] = e;
      sum += e;
    }
    const float scale = 1.0f / sum;
    for (int64_t j = 0; j < n; ++j) dst[j] *= scale;
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(PjrtHostCpuRefSoftmax, SoftmaxLastDim,
                              ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>());
