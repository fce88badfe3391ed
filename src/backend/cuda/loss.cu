// Vocab-parallel cross-entropy from parts (logits[N, Vl] = this rank's vocabulary slice).
//
// Storage f32 or bf16 (bf16 as raw uint16_t bits, rounded exactly as jumbo::f32_to_bf16),
// math fp32, the CPU reference's formulas. Row kernels (max, sum of exp, backward): one
// 256-thread block per row, 16-byte vector loads when Vl is a multiple of the vector width
// and the pointers are 16-byte aligned, scalar otherwise. Padded vocabulary columns hold -inf
// (fill_columns): they never win the max, exp(-inf - max) = 0 adds nothing to the sum and
// gives a zero gradient. Reductions are warp butterflies (__shfl_xor_sync, full mask) and the
// per-warp results combined in warp order: deterministic.
//
// ce_bwd may run in place (dlogits == logits): every element is read and then written by the
// same thread, and nothing else reads it, so the pointers are not __restrict__.
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda_check.h"
#include "kernels.h"

namespace jumbo::cuda {
namespace {

// ---- storage helpers (f32 or bf16 bits), kept local to this file ----

__device__ __forceinline__ float to_f32(uint16_t v) {
  return __uint_as_float(static_cast<uint32_t>(v) << 16);
}
// Round to nearest even, NaN stays a quiet NaN: jumbo::f32_to_bf16 bit for bit.
__device__ __forceinline__ uint16_t bf16_bits(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) {
    return static_cast<uint16_t>((u >> 16) | 0x40u);
  }
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ void from_f32(uint16_t& dst, float v) { dst = bf16_bits(v); }

// Elements of T in one 16-byte vector.
template <class T>
inline constexpr int kVec = static_cast<int>(16 / sizeof(T));

// N consecutive elements at p as floats. N == 1: one scalar; otherwise N * sizeof(T) is a
// multiple of 16 and p is 16-byte aligned.
template <int N>
__device__ __forceinline__ void load_n(const float* p, float (&o)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int k = 0; k < N / 4; ++k) {
      const float4 r = reinterpret_cast<const float4*>(p)[k];
      o[4 * k + 0] = r.x;
      o[4 * k + 1] = r.y;
      o[4 * k + 2] = r.z;
      o[4 * k + 3] = r.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) o[k] = p[k];
  }
}
template <int N>
__device__ __forceinline__ void load_n(const uint16_t* p, float (&o)[N]) {
  if constexpr (N % 8 == 0) {
#pragma unroll
    for (int k = 0; k < N / 8; ++k) {
      const uint4 r = reinterpret_cast<const uint4*>(p)[k];
      const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        o[8 * k + 2 * j] = __uint_as_float(w[j] << 16);
        o[8 * k + 2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
      }
    }
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) o[k] = to_f32(p[k]);
  }
}
template <int N>
__device__ __forceinline__ void store_n(float* p, const float (&v)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int k = 0; k < N / 4; ++k) {
      reinterpret_cast<float4*>(p)[k] =
          make_float4(v[4 * k + 0], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) p[k] = v[k];
  }
}
template <int N>
__device__ __forceinline__ void store_n(uint16_t* p, const float (&v)[N]) {
  if constexpr (N % 8 == 0) {
#pragma unroll
    for (int k = 0; k < N / 8; ++k) {
      uint32_t w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        w[j] = static_cast<uint32_t>(bf16_bits(v[8 * k + 2 * j])) |
               (static_cast<uint32_t>(bf16_bits(v[8 * k + 2 * j + 1])) << 16);
      }
      reinterpret_cast<uint4*>(p)[k] = make_uint4(w[0], w[1], w[2], w[3]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) from_f32(p[k], v[k]);
  }
}

// ---- validation ----

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

void require(bool ok, const char* op, const char* what) {
  if (!ok) fail(std::string(op) + ": " + what);
}

void require_cuda(const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    if (t->device != Device::cuda) fail(std::string(op) + ": " + t->describe() + " is not on the GPU");
    if (t->data == nullptr && t->numel() > 0) fail(std::string(op) + ": null tensor " + t->describe());
  }
}

bool is_float(DType t) { return t == DType::f32 || t == DType::bf16; }

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Calls f with a value of T (float or uint16_t for bf16) and of whether the vector path applies.
template <class F>
void dispatch(DType dtype, bool vector_ok_f32, bool vector_ok_bf16, F&& f) {
  if (dtype == DType::f32) {
    if (vector_ok_f32) f(float{}, std::true_type{});
    else f(float{}, std::false_type{});
  } else {
    if (vector_ok_bf16) f(uint16_t{}, std::true_type{});
    else f(uint16_t{}, std::false_type{});
  }
}


// The value a store of v into T keeps.
__device__ __forceinline__ float rounded(float v, float) { return v; }
__device__ __forceinline__ float rounded(float v, uint16_t) { return to_f32(bf16_bits(v)); }

// ---- block reductions (blockDim.x == kCeThreads) ----

constexpr int kCeThreads = 256;
constexpr int kCeWarps = kCeThreads / 32;

__device__ __forceinline__ float max_of(float a, float b) { return b > a ? b : a; }  // NaN: ignored

__device__ __forceinline__ float block_max(float v, float* sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max_of(v, __shfl_xor_sync(0xffffffffu, v, o));
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = sh[0];
#pragma unroll
  for (int w = 1; w < kCeWarps; ++w) t = max_of(t, sh[w]);
  __syncthreads();
  return t;
}

__device__ __forceinline__ float block_sum(float v, float* sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = 0.0f;
#pragma unroll
  for (int w = 0; w < kCeWarps; ++w) t += sh[w];
  __syncthreads();
  return t;
}

// ---- kernels: block r handles row r ----

template <class T, int V>
__global__ void __launch_bounds__(kCeThreads)
    ce_local_max_kernel(float* __restrict__ max, const T* __restrict__ logits, int64_t cols) {
  __shared__ float sh[kCeWarps];
  const int64_t r = blockIdx.x;
  const T* row = logits + r * cols;
  const int64_t nvec = cols / V;
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < nvec; i += kCeThreads) {
    float x[V];
    load_n<V>(row + i * V, x);
#pragma unroll
    for (int k = 0; k < V; ++k) mx = max_of(mx, x[k]);
  }
  mx = block_max(mx, sh);
  if (threadIdx.x == 0) max[r] = mx;
}

template <class T, int V>
__global__ void __launch_bounds__(kCeThreads)
    ce_local_sumexp_kernel(float* __restrict__ sumexp, const T* __restrict__ logits,
                           const float* __restrict__ max, int64_t cols) {
  __shared__ float sh[kCeWarps];
  const int64_t r = blockIdx.x;
  const T* row = logits + r * cols;
  const int64_t nvec = cols / V;
  const float mx = max[r];
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < nvec; i += kCeThreads) {
    float x[V];
    load_n<V>(row + i * V, x);
#pragma unroll
    for (int k = 0; k < V; ++k) sum += expf(x[k] - mx);
  }
  sum = block_sum(sum, sh);
  if (threadIdx.x == 0) sumexp[r] = sum;
}

template <class T>
__global__ void ce_target_logit_kernel(float* __restrict__ target_logit,
                                       const T* __restrict__ logits,
                                       const int32_t* __restrict__ targets, int64_t rows,
                                       int64_t cols, int64_t vocab_start) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const int64_t col = static_cast<int64_t>(targets[r]) - vocab_start;
  float v = 0.0f;
  if (col >= 0 && col < cols) {
    float x[1];
    load_n<1>(logits + r * cols + col, x);
    v = x[0];
  }
  target_logit[r] = v;
}

__global__ void ce_loss_kernel(float* __restrict__ losses, const float* __restrict__ max,
                               const float* __restrict__ sumexp,
                               const float* __restrict__ target_logit, int64_t n) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= n) return;
  losses[r] = logf(sumexp[r]) + max[r] - target_logit[r];
}

// dlogits = exp(logits - max) * (scale / sumexp), then scale subtracted at the target column
// from the stored (rounded) value, as the CPU does. dlogits may be logits.
template <class T, int V>
__global__ void __launch_bounds__(kCeThreads)
    ce_bwd_kernel(T* dlogits, const T* logits, const float* __restrict__ max,
                  const float* __restrict__ sumexp, const int32_t* __restrict__ targets,
                  int64_t cols, int64_t vocab_start, float scale) {
  const int64_t r = blockIdx.x;
  const T* row = logits + r * cols;
  T* drow = dlogits + r * cols;
  const int64_t nvec = cols / V;
  const float mx = max[r];
  const float inv = scale / sumexp[r];
  const int64_t col = static_cast<int64_t>(targets[r]) - vocab_start;  // may be outside
  for (int64_t i = threadIdx.x; i < nvec; i += kCeThreads) {
    float x[V];
    load_n<V>(row + i * V, x);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      x[k] = expf(x[k] - mx) * inv;
      if (i * V + k == col) x[k] = rounded(x[k], T{}) - scale;
    }
    store_n<V>(drow + i * V, x);
  }
}

int64_t rows_of(const char* op, const Tensor& logits) {
  require(logits.ndim >= 1 && logits.dim(-1) > 0, op, "logits must have a non-empty last dimension");
  return logits.numel() / logits.dim(-1);
}

void require_f32_rows(const char* op, const Tensor& t, int64_t rows, const char* what) {
  if (t.dtype != DType::f32 || t.numel() != rows) {
    fail(std::string(op) + ": " + what + " must be f32 [N] with N = " + std::to_string(rows) +
         " logits rows, got " + t.describe());
  }
}

unsigned flat_blocks(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace

void ce_local_max(cudaStream_t stream, Tensor max, Tensor logits) {
  const char* op = "ce_local_max";
  require_cuda(op, {&max, &logits});
  require(is_float(logits.dtype), op, "logits must be f32 or bf16");
  const int64_t rows = rows_of(op, logits), cols = logits.dim(-1);
  require_f32_rows(op, max, rows, "max");
  require(rows <= (int64_t{1} << 31) - 1, op, "too many rows");
  if (rows == 0) return;
  const bool aligned = aligned16(logits.data);
  dispatch(logits.dtype, aligned && cols % kVec<float> == 0, aligned && cols % kVec<uint16_t> == 0,
           [&](auto tag, auto vec) {
             using T = decltype(tag);
             constexpr int V = decltype(vec)::value ? kVec<T> : 1;
             ce_local_max_kernel<T, V><<<static_cast<unsigned>(rows), kCeThreads, 0, stream>>>(
                 max.as<float>(), static_cast<const T*>(logits.data), cols);
           });
  JUMBO_CUDA_CHECK_LAST("ce_local_max_kernel");
}

void ce_local_sumexp(cudaStream_t stream, Tensor sumexp, Tensor logits, Tensor max) {
  const char* op = "ce_local_sumexp";
  require_cuda(op, {&sumexp, &logits, &max});
  require(is_float(logits.dtype), op, "logits must be f32 or bf16");
  const int64_t rows = rows_of(op, logits), cols = logits.dim(-1);
  require_f32_rows(op, sumexp, rows, "sumexp");
  require_f32_rows(op, max, rows, "max");
  require(rows <= (int64_t{1} << 31) - 1, op, "too many rows");
  if (rows == 0) return;
  const bool aligned = aligned16(logits.data);
  dispatch(logits.dtype, aligned && cols % kVec<float> == 0, aligned && cols % kVec<uint16_t> == 0,
           [&](auto tag, auto vec) {
             using T = decltype(tag);
             constexpr int V = decltype(vec)::value ? kVec<T> : 1;
             ce_local_sumexp_kernel<T, V><<<static_cast<unsigned>(rows), kCeThreads, 0, stream>>>(
                 sumexp.as<float>(), static_cast<const T*>(logits.data), max.as<float>(), cols);
           });
  JUMBO_CUDA_CHECK_LAST("ce_local_sumexp_kernel");
}

void ce_target_logit(cudaStream_t stream, Tensor target_logit, Tensor logits, Tensor targets,
                     int64_t vocab_start) {
  const char* op = "ce_target_logit";
  require_cuda(op, {&target_logit, &logits, &targets});
  require(is_float(logits.dtype), op, "logits must be f32 or bf16");
  require(targets.dtype == DType::i32, op, "targets must be i32");
  const int64_t rows = rows_of(op, logits), cols = logits.dim(-1);
  require(targets.numel() == rows, op, "targets must be [N], one per logits row");
  require_f32_rows(op, target_logit, rows, "target_logit");
  if (rows == 0) return;
  constexpr int kThreadsFlat = 256;
  dispatch(logits.dtype, false, false, [&](auto tag, auto) {
    using T = decltype(tag);
    ce_target_logit_kernel<T><<<flat_blocks(rows, kThreadsFlat), kThreadsFlat, 0, stream>>>(
        target_logit.as<float>(), static_cast<const T*>(logits.data), targets.as<int32_t>(), rows,
        cols, vocab_start);
  });
  JUMBO_CUDA_CHECK_LAST("ce_target_logit_kernel");
}

void ce_loss(cudaStream_t stream, Tensor losses, Tensor max, Tensor sumexp, Tensor target_logit) {
  const char* op = "ce_loss";
  require_cuda(op, {&losses, &max, &sumexp, &target_logit});
  const int64_t n = losses.numel();
  require_f32_rows(op, losses, n, "losses");
  require_f32_rows(op, max, n, "max");
  require_f32_rows(op, sumexp, n, "sumexp");
  require_f32_rows(op, target_logit, n, "target_logit");
  if (n == 0) return;
  constexpr int kThreadsFlat = 256;
  ce_loss_kernel<<<flat_blocks(n, kThreadsFlat), kThreadsFlat, 0, stream>>>(
      losses.as<float>(), max.as<float>(), sumexp.as<float>(), target_logit.as<float>(), n);
  JUMBO_CUDA_CHECK_LAST("ce_loss_kernel");
}

void ce_bwd(cudaStream_t stream, Tensor dlogits, Tensor logits, Tensor max, Tensor sumexp,
            Tensor targets, int64_t vocab_start, float scale) {
  const char* op = "ce_bwd";
  require_cuda(op, {&dlogits, &logits, &max, &sumexp, &targets});
  require(is_float(logits.dtype) && dlogits.dtype == logits.dtype, op,
          "dlogits and logits must share dtype f32 or bf16");
  require(targets.dtype == DType::i32, op, "targets must be i32");
  const int64_t rows = rows_of(op, logits), cols = logits.dim(-1);
  require(dlogits.numel() == logits.numel(), op, "dlogits must have logits' shape");
  require(targets.numel() == rows, op, "targets must be [N], one per logits row");
  require_f32_rows(op, max, rows, "max");
  require_f32_rows(op, sumexp, rows, "sumexp");
  require(rows <= (int64_t{1} << 31) - 1, op, "too many rows");
  // In place or disjoint: a partial overlap would let one row's writes reach another's reads.
  const auto lo = reinterpret_cast<uintptr_t>(logits.data);
  const auto dl = reinterpret_cast<uintptr_t>(dlogits.data);
  require(lo == dl || dl + dlogits.bytes() <= lo || lo + logits.bytes() <= dl, op,
          "dlogits must be logits itself or not overlap it");
  if (rows == 0) return;
  const bool aligned = aligned16(logits.data) && aligned16(dlogits.data);
  dispatch(logits.dtype, aligned && cols % kVec<float> == 0, aligned && cols % kVec<uint16_t> == 0,
           [&](auto tag, auto vec) {
             using T = decltype(tag);
             constexpr int V = decltype(vec)::value ? kVec<T> : 1;
             ce_bwd_kernel<T, V><<<static_cast<unsigned>(rows), kCeThreads, 0, stream>>>(
                 static_cast<T*>(dlogits.data), static_cast<const T*>(logits.data),
                 max.as<float>(), sumexp.as<float>(), targets.as<int32_t>(), cols, vocab_start,
                 scale);
           });
  JUMBO_CUDA_CHECK_LAST("ce_bwd_kernel");
}

}  // namespace jumbo::cuda
