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

#include "storage_io.cuh"


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
                               const float* __restrict__ target_logit,
                               const int32_t* __restrict__ targets, int64_t n) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= n) return;
  losses[r] = targets && targets[r] < 0 ? 0.f : logf(sumexp[r]) + max[r] - target_logit[r];
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
  const bool ignored = targets[r] < 0;  // not in the loss: a zero row
  const float inv = ignored ? 0.f : scale / sumexp[r];
  const int64_t col = ignored ? -1 : static_cast<int64_t>(targets[r]) - vocab_start;  // may be outside
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

void ce_loss(cudaStream_t stream, Tensor losses, Tensor max, Tensor sumexp, Tensor target_logit,
             Tensor targets) {
  const char* op = "ce_loss";
  require_cuda(op, {&losses, &max, &sumexp, &target_logit});
  require(targets.empty() || (targets.dtype == DType::i32 && targets.numel() == losses.numel()),
          op, "targets must be empty or i32 [N]");
  const int64_t n = losses.numel();
  require_f32_rows(op, losses, n, "losses");
  require_f32_rows(op, max, n, "max");
  require_f32_rows(op, sumexp, n, "sumexp");
  require_f32_rows(op, target_logit, n, "target_logit");
  if (n == 0) return;
  constexpr int kThreadsFlat = 256;
  ce_loss_kernel<<<flat_blocks(n, kThreadsFlat), kThreadsFlat, 0, stream>>>(
      losses.as<float>(), max.as<float>(), sumexp.as<float>(), target_logit.as<float>(),
      targets.empty() ? nullptr : targets.as<int32_t>(), n);
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
