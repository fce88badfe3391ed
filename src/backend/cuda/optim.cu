// AdamW (one fused pass over master, grad, m, v and the compute copy) and the deterministic
// sum of squares behind the global gradient norm. Semantics are the CPU reference's
// (src/backend/cpu/kernels_optim.cpp) exactly: the gradient is scaled first, bias corrections
// are computed on the host in double and rounded to float, and the decoupled weight decay
// (Loshchilov & Hutter) is applied to the weight before the step.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda_check.h"
#include "kernels.h"

namespace jumbo::cuda {
namespace {

#include "typed_io.cuh"

constexpr int kPartials = 1024;        // blocks of the first sum_squares pass (fixed)
constexpr int kFinalThreads = 1024;    // one block reduces the partials
static_assert(kPartials == kFinalThreads, "the final pass gives each partial one thread");

// ---- AdamW ----
struct AdamParams {
  float beta1, beta2, eps, grad_scale;
  float step_size;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  float decay;         // lr * weight_decay
};

__device__ __forceinline__ void adamw_one(float& p, float g, float& m, float& v,
                                          const AdamParams& a) {
  const float gi = g * a.grad_scale;
  const float mi = a.beta1 * m + (1.0f - a.beta1) * gi;
  const float vi = a.beta2 * v + (1.0f - a.beta2) * gi * gi;
  m = mi;
  v = vi;
  p -= a.decay * p + a.step_size * mi / (sqrtf(vi) * a.inv_sqrt_bc2 + a.eps);
}

// N = 4: float4 accesses to master, grad, m, v (and 4 elements of the copy); N = 1: scalar.
// TC is the compute copy's element type; kCopy false: there is none.
template <int N, class TC, bool kCopy>
__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ g,
                             float* __restrict__ m, float* __restrict__ v, TC* __restrict__ copy,
                             int64_t n, AdamParams a) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / N;
  for (int64_t i = tid; i < packs; i += stride) {
    Pack<float, N> pp = reinterpret_cast<const Pack<float, N>*>(p)[i];
    const Pack<float, N> pg = reinterpret_cast<const Pack<float, N>*>(g)[i];
    Pack<float, N> pm = reinterpret_cast<const Pack<float, N>*>(m)[i];
    Pack<float, N> pv = reinterpret_cast<const Pack<float, N>*>(v)[i];
#pragma unroll
    for (int j = 0; j < N; ++j) adamw_one(pp.v[j], pg.v[j], pm.v[j], pv.v[j], a);
    reinterpret_cast<Pack<float, N>*>(p)[i] = pp;
    reinterpret_cast<Pack<float, N>*>(m)[i] = pm;
    reinterpret_cast<Pack<float, N>*>(v)[i] = pv;
    if constexpr (kCopy) {
      Pack<TC, N> pc;
#pragma unroll
      for (int j = 0; j < N; ++j) pc.v[j] = from_f32<TC>(pp.v[j]);
      reinterpret_cast<Pack<TC, N>*>(copy)[i] = pc;
    }
  }
  for (int64_t i = packs * N + tid; i < n; i += stride) {
    float pi = p[i], mi = m[i], vi = v[i];
    adamw_one(pi, g[i], mi, vi, a);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if constexpr (kCopy) copy[i] = from_f32<TC>(pi);
  }
}

// ---- sum of squares ----
// Block-wide sum in double: warp shuffles, then the first warp over the warps' sums. The
// combining order is fixed, so the result is too.
__device__ double block_sum(double x) {
  __shared__ double warp_sums[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x += __shfl_down_sync(0xffffffffu, x, off);
  if (lane == 0) warp_sums[warp] = x;
  __syncthreads();
  double total = 0.0;
  if (warp == 0) {
    total = lane < warps ? warp_sums[lane] : 0.0;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) total += __shfl_down_sync(0xffffffffu, total, off);
  }
  return total;  // valid in thread 0
}

// Pass 1: a fixed grid of kPartials blocks; each thread sums its grid-stride share (each
// pack's squares in fp32, added into a double), each block writes one double partial.
template <int N, class T>
__global__ void sum_squares_partials_kernel(const T* __restrict__ x, int64_t n,
                                            double* __restrict__ partials) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / N;
  double acc = 0.0;
  for (int64_t i = tid; i < packs; i += stride) {
    const Pack<T, N> pk = reinterpret_cast<const Pack<T, N>*>(x)[i];
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float f = to_f32(pk.v[j]);
      s += f * f;
    }
    acc += static_cast<double>(s);
  }
  for (int64_t i = packs * N + tid; i < n; i += stride) {
    const float f = to_f32(x[i]);
    acc += static_cast<double>(f * f);
  }
  const double total = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// Pass 2: one block adds the kPartials partials.
__global__ void sum_squares_final_kernel(const double* __restrict__ partials,
                                         double* __restrict__ result) {
  const double total = block_sum(partials[threadIdx.x]);
  if (threadIdx.x == 0) *result = total;
}

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument(what); }

bool aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

int grid_for(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<int>(std::clamp<int64_t>(blocks, 1, kMaxBlocks));
}

template <class TC, bool kCopy>
void launch_adamw(cudaStream_t stream, float* p, const float* g, float* m, float* v, TC* copy,
                  int64_t n, const AdamParams& a) {
  const bool vec = aligned(p, 16) && aligned(g, 16) && aligned(m, 16) && aligned(v, 16) &&
                   (!kCopy || aligned(copy, sizeof(TC) * 4));
  if (vec) {
    adamw_kernel<4, TC, kCopy><<<grid_for(n / 4), kThreads, 0, stream>>>(p, g, m, v, copy, n, a);
  } else {
    adamw_kernel<1, TC, kCopy><<<grid_for(n), kThreads, 0, stream>>>(p, g, m, v, copy, n, a);
  }
  check_last("adamw");
}

template <class T>
void launch_sum_squares(cudaStream_t stream, const T* x, int64_t n, double* result,
                        double* partials) {
  constexpr int N = static_cast<int>(16 / sizeof(T));
  if (aligned(x, 16)) {
    sum_squares_partials_kernel<N, T><<<kPartials, kThreads, 0, stream>>>(x, n, partials);
  } else {
    sum_squares_partials_kernel<1, T><<<kPartials, kThreads, 0, stream>>>(x, n, partials);
  }
  check_last("sum_squares (partials)");
  sum_squares_final_kernel<<<1, kFinalThreads, 0, stream>>>(partials, result);
  check_last("sum_squares (final)");
}

}  // namespace

void adamw(cudaStream_t stream, Tensor master, Tensor grad, Tensor m, Tensor v,
           Tensor compute_copy, const AdamWStep& s) {
  const int64_t n = master.numel();
  auto expect_f32 = [&](const char* name, Tensor t) {
    if (t.dtype != DType::f32 || t.numel() != n) {
      bad(std::string("adamw: ") + name + " is " + t.describe() + ", expected f32 with " +
          std::to_string(n) + " elements (master " + master.describe() + ")");
    }
  };
  expect_f32("master", master);
  expect_f32("grad", grad);
  expect_f32("m", m);
  expect_f32("v", v);
  if (!compute_copy.empty()) {
    if (compute_copy.numel() != n ||
        (compute_copy.dtype != DType::f32 && compute_copy.dtype != DType::bf16)) {
      bad("adamw: compute copy is " + compute_copy.describe() + ", expected f32 or bf16 with " +
          std::to_string(n) + " elements");
    }
  }
  if (n == 0) return;
  // The host-side constants exactly as the CPU computes them.
  const float bc1 = 1.0f - static_cast<float>(std::pow(s.beta1, static_cast<double>(s.step)));
  const float bc2 = 1.0f - static_cast<float>(std::pow(s.beta2, static_cast<double>(s.step)));
  AdamParams a{};
  a.beta1 = s.beta1;
  a.beta2 = s.beta2;
  a.eps = s.eps;
  a.grad_scale = s.grad_scale;
  a.step_size = s.lr / bc1;
  a.inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
  a.decay = s.lr * s.weight_decay;
  float* p = master.as<float>();
  const float* g = grad.as<float>();
  float* pm = m.as<float>();
  float* pv = v.as<float>();
  if (compute_copy.empty()) {
    launch_adamw<float, false>(stream, p, g, pm, pv, nullptr, n, a);
  } else if (compute_copy.dtype == DType::bf16) {
    launch_adamw<bf16_t, true>(stream, p, g, pm, pv, compute_copy.as<bf16_t>(), n, a);
  } else {
    launch_adamw<float, true>(stream, p, g, pm, pv, compute_copy.as<float>(), n, a);
  }
}

size_t sum_squares_partials() { return kPartials; }

void sum_squares(cudaStream_t stream, Tensor t, double* result, double* partials) {
  if (result == nullptr || partials == nullptr) bad("sum_squares: null result/partials");
  const int64_t n = t.numel();
  if (t.dtype == DType::f32) {
    launch_sum_squares(stream, t.as<float>(), n, result, partials);
  } else if (t.dtype == DType::bf16) {
    launch_sum_squares(stream, t.as<bf16_t>(), n, result, partials);
  } else {
    bad("sum_squares: expected f32 or bf16, got " + t.describe());
  }
}

}  // namespace jumbo::cuda
