// cpu_ref's custom-call kernel: softmax of float32 rows (the last dimension),
// an XLA FFI handler registered for the CPU platform (see __init__.py beside
// this file for how it is built and registered).
//
// One pass finds each row's maximum, a second writes exp(x - max) and sums it,
// a third scales by 1 / sum: the row is read from cache twice after the first
// read, where the reference lowering (jax.nn.softmax) is three XLA loops.
// torch CPU's softmax takes the same three steps, so a row of -inf gives NaN
// as torch's does, and a row holding +inf gives NaN too.

#include <cmath>
#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

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
    float top = row[0];
    for (int64_t i = 1; i < n; ++i) top = row[i] > top || std::isnan(row[i]) ? row[i] : top;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      const float e = std::exp(row[i] - top);
      dst[i] = e;
      sum += e;
    }
    const float scale = 1.0f / sum;
    for (int64_t i = 0; i < n; ++i) dst[i] *= scale;
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(PjrtHostCpuRefSoftmax, SoftmaxLastDim,
                              ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>());
