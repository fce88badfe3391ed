// Rotary position embedding in place on the query and key heads of qkv (backend.h's rope;
// Hugging Face's Llama form, rotate_half): at row n's position p, each rotated head's halves
// x1 = [0, D/2) and x2 = [D/2, D) become x1 cos - x2 sin and x2 cos + x1 sin, cos = table[p, i],
// sin = table[p, D/2 + i]; the inverse negates sin (the backward, on dqkv).
//
// One thread per (row, rotated head, i < D/2) pair: it reads and writes x1[i] and x2[i], so no
// two threads touch one element and the update is in place without a barrier. Consecutive
// threads take consecutive i (coalesced head halves and table row). A block covers up to 256
// pairs of one row (grid.x rows, grid.y chunks of a row's pairs), so the row's position is
// one uniform load. The rotated heads of group g are its R query heads and its key head, the
// first R + 1 of the group's R + 2: head j of group g starts at column (g*(R+2) + j)*D.
//
// positions lives in device memory: a position outside the table turns the row's rotated heads
// into NaN (visible at once) instead of reading out of bounds.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda_check.h"
#include "kernels.h"

namespace jumbo::cuda {
namespace {

#include "typed_io.cuh"

template <class T>
__global__ void __launch_bounds__(kThreads)
    rope_kernel(T* __restrict__ qkv, const float* __restrict__ table,
                const int32_t* __restrict__ positions, int pos_stride, int pos_col, int G,
                int R, int D, int P, float sin_sign) {
  const int half = D / 2, pairs = G * (R + 1) * half;  // per row
  const int64_t n = blockIdx.x;
  const int k = static_cast<int>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (k >= pairs) return;
  const int hh = k / half, i = k - hh * half;  // rotated head hh, pair i
  const int g = hh / (R + 1), j = hh - g * (R + 1);
  const int64_t ld = static_cast<int64_t>(G) * (R + 2) * D;
  T* x = qkv + n * ld + (static_cast<int64_t>(g) * (R + 2) + j) * D;
  const int p = positions[n * pos_stride + pos_col];
  float c = __int_as_float(0x7fc00000), s = c;  // quiet NaN for a position outside the table
  if (p >= 0 && p < P) {
    c = table[static_cast<int64_t>(p) * D + i];
    s = sin_sign * table[static_cast<int64_t>(p) * D + half + i];
  }
  const float x1 = to_f32(x[i]), x2 = to_f32(x[half + i]);
  x[i] = from_f32<T>(x1 * c - x2 * s);
  x[half + i] = from_f32<T>(x2 * c + x1 * s);
}

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument("rope: " + msg); }

}  // namespace

void rope(cudaStream_t stream, Tensor qkv, Tensor table, Tensor positions, int64_t kv_heads,
          RopeDirection direction) {
  for (const Tensor* t : {&qkv, &table, &positions}) {
    if (t->device != Device::cuda) fail(t->describe() + " is not on the GPU");
  }
  if (qkv.dtype != DType::f32 && qkv.dtype != DType::bf16) {
    fail("qkv must be f32 or bf16, got " + qkv.describe());
  }
  if (table.dtype != DType::f32 || table.ndim != 2 || table.dim(1) < 2 || table.dim(1) % 2 != 0) {
    fail("table must be f32 [P, D] with D even, got " + table.describe());
  }
  if (positions.dtype != DType::i32) fail("positions must be i32, got " + positions.describe());
  if (qkv.ndim < 1) fail("qkv must have rows, got " + qkv.describe());
  const int64_t d = table.dim(1), width = qkv.dim(-1), g = kv_heads;
  if (g < 1 || width % (g * d) != 0 || width / (g * d) < 3) {
    fail("qkv's rows of " + std::to_string(width) + " are not G*(R+2)*D with R >= 1 for G=" +
         std::to_string(g) + " kv heads and D=" + std::to_string(d) + " (table " +
         table.describe() + ")");
  }
  const int64_t r = width / (g * d) - 2;
  const int64_t n = width > 0 ? qkv.numel() / width : 0;
  // [N] positions, or [N, 2] rows of (slot, position): the position is column 1.
  int pos_stride = 1, pos_col = 0;
  if (positions.numel() == 2 * n && n > 0) {
    pos_stride = 2;
    pos_col = 1;
  } else if (positions.numel() != n) {
    fail("positions must be i32 [N] or [N, 2] for N=" + std::to_string(n) + " rows, got " +
         positions.describe());
  }
  const int64_t pairs = g * (r + 1) * (d / 2);  // per row
  const int64_t chunks = (pairs + kThreads - 1) / kThreads;
  if (n > (int64_t{1} << 31) - 1 || chunks > 65535 || table.dim(0) > (int64_t{1} << 31) - 1) {
    fail("N, the heads per row or P exceed the launch grid");
  }
  if (n == 0) return;
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(chunks));
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, (pairs + 31) / 32 * 32));
  const float sin_sign = direction == RopeDirection::inverse ? -1.0f : 1.0f;
  if (qkv.dtype == DType::bf16) {
    rope_kernel<bf16_t><<<grid, threads, 0, stream>>>(
        qkv.as<bf16_t>(), table.as<float>(), positions.as<int32_t>(), pos_stride, pos_col,
        static_cast<int>(g), static_cast<int>(r), static_cast<int>(d),
        static_cast<int>(table.dim(0)), sin_sign);
  } else {
    rope_kernel<float><<<grid, threads, 0, stream>>>(
        qkv.as<float>(), table.as<float>(), positions.as<int32_t>(), pos_stride, pos_col,
        static_cast<int>(g), static_cast<int>(r), static_cast<int>(d),
        static_cast<int>(table.dim(0)), sin_sign);
  }
  check_last("rope_kernel");
}

}  // namespace jumbo::cuda
