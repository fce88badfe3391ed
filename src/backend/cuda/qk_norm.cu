// qk-norm (backend.h): RMSNorm over each query head and each key head of the grouped qkv rows,
// value heads passed through; forward and backward.
//
// One warp per (row, head) of the G*(R+2) heads of a row: a query or key head is one
// contiguous D-vector, normed with lanes striding over it (16-byte vectors when D and the
// pointers allow) and a __shfl_xor_sync butterfly; a value head is copied (nothing to do in
// place). Statistics f32 rstd [N, H + G]: a row's query heads in order (h = g*R + r), then its
// key heads. out may be qkv and dqkv may be dout (in place): no pointer is __restrict__, and
// each lane rewrites only the elements it read itself, after the warp's reduction.
//
// The weights' gradients (f32, += over every row and head, each optional) reuse layernorm's
// deterministic scheme over "head instances" (one (row, query head) or (row, key head) pair
// each): per-chunk partials of a fixed partition, combined in a fixed order, then the chunks
// added in order. No atomics: the bits depend only on the shape. They run before the dx
// kernel, which may overwrite dout.
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda_check.h"
#include "kernels.h"

namespace jumbo::cuda {
namespace {

#include "chunked_sum.cuh"
#include "storage_io.cuh"

constexpr int kThreads = 256;  // 8 warps, one (row, head) each
constexpr int kWarpsPerBlock = kThreads / 32;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The shape of the grouped rows: G groups of R query heads, a key head, a value head, D wide.
struct HeadShape {
  int64_t rows;
  int g, r, d;
  __host__ __device__ int64_t width() const { return static_cast<int64_t>(g) * (r + 2) * d; }
  __host__ __device__ int normed() const { return g * (r + 1); }  // H + G per row
};

// A warp's (row, head of the row) and where its rstd goes (-1: a value head).
struct WarpHead {
  int64_t row;
  int head;  // 0 .. G*(R+2)-1: at column head * D
  int j;     // its place in the group: < R query, R key, R + 1 value
  int stat;  // rstd column
};

__device__ __forceinline__ WarpHead warp_head(const HeadShape& s, int64_t wid) {
  const int per_row = s.g * (s.r + 2);
  WarpHead w;
  w.row = wid / per_row;
  w.head = static_cast<int>(wid - w.row * per_row);
  const int grp = w.head / (s.r + 2);
  w.j = w.head - grp * (s.r + 2);
  w.stat = w.j < s.r ? grp * s.r + w.j : w.j == s.r ? s.g * s.r + grp : -1;
  return w;
}

template <class T, int V>
__global__ void __launch_bounds__(kThreads)
    qk_norm_fwd_kernel(T* out, float* __restrict__ rstd, const T* x, const T* __restrict__ wq,
                       const T* __restrict__ wk, HeadShape s, float eps) {
  const int64_t wid = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (wid >= s.rows * s.g * (s.r + 2)) return;  // warp-uniform
  const WarpHead h = warp_head(s, wid);
  const int64_t at = h.row * s.width() + static_cast<int64_t>(h.head) * s.d;
  const T* xr = x + at;
  T* orow = out + at;
  const int nvec = s.d / V;
  if (h.stat < 0) {  // a value head: copied
    if (out == x) return;
    for (int i = lane; i < nvec; i += 32) {
      float v[V];
      load_n<V>(xr + i * V, v);
      store_n<V>(orow + i * V, v);
    }
    return;
  }
  const T* w = h.j < s.r ? wq : wk;
  float ss = 0.0f;
  for (int i = lane; i < nvec; i += 32) {
    float v[V];
    load_n<V>(xr + i * V, v);
#pragma unroll
    for (int k = 0; k < V; ++k) ss += v[k] * v[k];
  }
  const float sc = 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(s.d) + eps);
  for (int i = lane; i < nvec; i += 32) {
    float v[V], wv[V], o[V];
    load_n<V>(xr + i * V, v);
    load_n<V>(w + i * V, wv);
#pragma unroll
    for (int k = 0; k < V; ++k) o[k] = v[k] * sc * wv[k];
    store_n<V>(orow + i * V, o);
  }
  if (lane == 0) rstd[h.row * s.normed() + h.stat] = sc;
}

// dx = rstd (dnorm - norm mean(dnorm norm)), dnorm = dout w, norm = x rstd (written, not
// accumulated); value heads' dout copied.
template <class T, int V>
__global__ void __launch_bounds__(kThreads)
    qk_norm_bwd_dx_kernel(T* dx, const T* dout, const T* x,
                          const T* __restrict__ wq, const T* __restrict__ wk,
                          const float* __restrict__ rstd, HeadShape s) {
  const int64_t wid = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (wid >= s.rows * s.g * (s.r + 2)) return;
  const WarpHead h = warp_head(s, wid);
  const int64_t at = h.row * s.width() + static_cast<int64_t>(h.head) * s.d;
  const T* gr = dout + at;
  T* dxr = dx + at;
  const int nvec = s.d / V;
  if (h.stat < 0) {
    if (dx == dout) return;
    for (int i = lane; i < nvec; i += 32) {
      float v[V];
      load_n<V>(gr + i * V, v);
      store_n<V>(dxr + i * V, v);
    }
    return;
  }
  const T* w = h.j < s.r ? wq : wk;
  const T* xr = x + at;
  const float sc = rstd[h.row * s.normed() + h.stat];
  float acc = 0.0f;
  for (int i = lane; i < nvec; i += 32) {
    float xv[V], gv[V], wv[V];
    load_n<V>(xr + i * V, xv);
    load_n<V>(gr + i * V, gv);
    load_n<V>(w + i * V, wv);
#pragma unroll
    for (int k = 0; k < V; ++k) acc += wv[k] * gv[k] * xv[k] * sc;
  }
  const float mean = warp_sum(acc) / static_cast<float>(s.d);
  for (int i = lane; i < nvec; i += 32) {
    float xv[V], gv[V], wv[V], d[V];
    load_n<V>(xr + i * V, xv);
    load_n<V>(gr + i * V, gv);
    load_n<V>(w + i * V, wv);
#pragma unroll
    for (int k = 0; k < V; ++k) d[k] = (wv[k] * gv[k] - xv[k] * sc * mean) * sc;
    store_n<V>(dxr + i * V, d);
  }
}

// ---- weight gradients over head instances ----
constexpr int kTileX = 32;  // columns per partials block
constexpr int kTileY = 8;   // thread rows striding the chunk's instances

// part[chunk][col] = sum over the chunk's instances of x * rstd * dout at column col of the
// instance's head. KEY: the instances are (row, key head), else (row, query head).
template <class T, bool KEY>
__global__ void __launch_bounds__(kTileX * kTileY)
    qk_norm_dw_partials_kernel(float* __restrict__ part, const T* x, const T* dout,
                               const float* __restrict__ rstd, HeadShape s, int64_t instances,
                               int64_t per) {
  __shared__ float sh[kTileY][kTileX];
  const int tx = static_cast<int>(threadIdx.x % kTileX);
  const int ty = static_cast<int>(threadIdx.x / kTileX);
  const int col = static_cast<int>(blockIdx.x) * kTileX + tx;
  const int64_t chunk = blockIdx.y;
  const int64_t m0 = chunk * per;
  const int64_t m1 = m0 + per < instances ? m0 + per : instances;
  const int heads = KEY ? s.g : s.g * s.r;  // instances per row
  float acc = 0.0f;
  if (col < s.d) {
    for (int64_t m = m0 + ty; m < m1; m += kTileY) {
      const int64_t row = m / heads;
      const int hi = static_cast<int>(m - row * heads);
      // Query head hi = g*R + r at column (hi + 2g)*D; key head g at (g*(R+2) + R)*D.
      const int head_col = KEY ? hi * (s.r + 2) + s.r : hi + 2 * (hi / s.r);
      const int stat = KEY ? s.g * s.r + hi : hi;
      const int64_t at = row * s.width() + static_cast<int64_t>(head_col) * s.d + col;
      float xv[1], gv[1];
      load_n<1>(x + at, xv);
      load_n<1>(dout + at, gv);
      acc += xv[0] * rstd[row * s.normed() + stat] * gv[0];
    }
  }
  sh[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && col < s.d) {
    float t = 0.0f;
#pragma unroll
    for (int y = 0; y < kTileY; ++y) t += sh[y][tx];
    part[chunk * s.d + col] = t;
  }
}

__global__ void qk_norm_dw_finish_kernel(float* __restrict__ dw, const float* __restrict__ part,
                                         int64_t chunks, int d) {
  const int col = static_cast<int>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= d) return;
  float t = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) t += part[k * d + col];
  dw[col] += t;
}

// The grouped shape from qkv's rows and the weight width D; throws naming `op` if it is not one.
HeadShape head_shape(const char* op, const Tensor& qkv, const Tensor& q_weight,
                     const Tensor& k_weight, int64_t kv_heads) {
  require(is_float(qkv.dtype) && qkv.ndim >= 1, op, "qkv must be f32 or bf16 [N, G*(R+2)*D]");
  require(q_weight.dtype == qkv.dtype && k_weight.dtype == qkv.dtype, op,
          "the weights must have qkv's dtype");
  const int64_t d = q_weight.numel(), width = qkv.dim(-1);
  require(d > 0 && k_weight.numel() == d, op, "q_weight and k_weight must both be [D]");
  require(kv_heads > 0 && width % (kv_heads * d) == 0 && width / (kv_heads * d) >= 3, op,
          "qkv's rows must be G*(R+2)*D wide (R >= 1) for kv_heads G and the weights' D");
  require(width <= (int64_t{1} << 31) - 1, op, "rows too wide");
  HeadShape s;
  s.rows = qkv.numel() / width;
  s.g = static_cast<int>(kv_heads);
  s.r = static_cast<int>(width / (kv_heads * d) - 2);
  s.d = static_cast<int>(d);
  return s;
}

unsigned warp_blocks(const HeadShape& s) {
  const int64_t warps = s.rows * s.g * (s.r + 2);
  return static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

size_t qk_norm_bwd_scratch_floats(int64_t rows, int64_t heads, int64_t kv_heads,
                                  int64_t head_dim) {
  if (rows <= 0 || head_dim <= 0) return 0;
  return static_cast<size_t>((chunk_count(rows * heads) + chunk_count(rows * kv_heads)) * head_dim);
}

void qk_norm_fwd(cudaStream_t stream, Tensor out, Tensor rstd, Tensor qkv, Tensor q_weight,
                 Tensor k_weight, int64_t kv_heads, float eps) {
  const char* op = "qk_norm_fwd";
  require_cuda(op, {&out, &rstd, &qkv, &q_weight, &k_weight});
  const HeadShape s = head_shape(op, qkv, q_weight, k_weight, kv_heads);
  require(out.dtype == qkv.dtype && out.numel() == qkv.numel(), op, "out must be like qkv");
  require(rstd.dtype == DType::f32 && rstd.numel() == s.rows * s.normed(), op,
          "rstd must be f32 [N, H + G]");
  require(s.rows * s.g * (s.r + 2) / kWarpsPerBlock < (int64_t{1} << 31) - 1, op,
          "too many heads for the launch grid");
  if (s.rows == 0) return;
  const bool aligned = aligned16(out.data) && aligned16(qkv.data) && aligned16(q_weight.data) &&
                       aligned16(k_weight.data);
  dispatch(qkv.dtype, aligned && s.d % kVec<float> == 0, aligned && s.d % kVec<uint16_t> == 0,
           [&](auto tag, auto vec) {
             using T = decltype(tag);
             constexpr int V = decltype(vec)::value ? kVec<T> : 1;
             qk_norm_fwd_kernel<T, V><<<warp_blocks(s), kThreads, 0, stream>>>(
                 static_cast<T*>(out.data), rstd.as<float>(), static_cast<const T*>(qkv.data),
                 static_cast<const T*>(q_weight.data), static_cast<const T*>(k_weight.data), s,
                 eps);
           });
  JUMBO_CUDA_CHECK_LAST("qk_norm_fwd_kernel");
}

void qk_norm_bwd(cudaStream_t stream, Tensor dqkv, Tensor dq_weight, Tensor dk_weight,
                 Tensor dout, Tensor qkv, Tensor q_weight, Tensor k_weight, Tensor rstd,
                 int64_t kv_heads, float* scratch) {
  const char* op = "qk_norm_bwd";
  require_cuda(op, {&dqkv, &dout, &qkv, &q_weight, &k_weight, &rstd});
  const HeadShape s = head_shape(op, qkv, q_weight, k_weight, kv_heads);
  require(dqkv.dtype == qkv.dtype && dout.dtype == qkv.dtype && dqkv.numel() == qkv.numel() &&
              dout.numel() == qkv.numel(),
          op, "dqkv and dout must be like qkv");
  require(rstd.dtype == DType::f32 && rstd.numel() == s.rows * s.normed(), op,
          "rstd must be f32 [N, H + G]");
  for (const Tensor* dw : {&dq_weight, &dk_weight}) {
    if (dw->empty()) continue;  // a frozen weight
    require_cuda(op, {dw});
    require(dw->dtype == DType::f32 && dw->numel() == s.d, op,
            "dq_weight and dk_weight must be f32 [D] (or empty)");
  }
  require(s.rows * s.g * (s.r + 2) / kWarpsPerBlock < (int64_t{1} << 31) - 1, op,
          "too many heads for the launch grid");
  if (s.rows == 0) return;

  // The weights' gradients first: dqkv may be dout.
  const int64_t q_inst = s.rows * s.g * s.r, k_inst = s.rows * s.g;
  const int64_t q_chunks = chunk_count(q_inst), k_chunks = chunk_count(k_inst);
  require(q_chunks <= 65535 && k_chunks <= 65535, op, "too many chunks");
  if (!dq_weight.empty() || !dk_weight.empty()) {
    require(scratch != nullptr, op, "scratch (qk_norm_bwd_scratch_floats floats) is null");
  }
  const unsigned col_tiles = static_cast<unsigned>((s.d + kTileX - 1) / kTileX);
  constexpr int kFinishThreads = 256;
  const unsigned finish_blocks = static_cast<unsigned>((s.d + kFinishThreads - 1) / kFinishThreads);
  dispatch(qkv.dtype, false, false, [&](auto tag, auto) {
    using T = decltype(tag);
    auto* xp = static_cast<const T*>(qkv.data);
    auto* gp = static_cast<const T*>(dout.data);
    if (!dq_weight.empty()) {
      qk_norm_dw_partials_kernel<T, false>
          <<<dim3(col_tiles, static_cast<unsigned>(q_chunks)), kTileX * kTileY, 0, stream>>>(
              scratch, xp, gp, rstd.as<float>(), s, q_inst, rows_per_chunk(q_inst));
      qk_norm_dw_finish_kernel<<<finish_blocks, kFinishThreads, 0, stream>>>(
          dq_weight.as<float>(), scratch, q_chunks, s.d);
    }
    if (!dk_weight.empty()) {
      float* kpart = scratch + q_chunks * s.d;
      qk_norm_dw_partials_kernel<T, true>
          <<<dim3(col_tiles, static_cast<unsigned>(k_chunks)), kTileX * kTileY, 0, stream>>>(
              kpart, xp, gp, rstd.as<float>(), s, k_inst, rows_per_chunk(k_inst));
      qk_norm_dw_finish_kernel<<<finish_blocks, kFinishThreads, 0, stream>>>(
          dk_weight.as<float>(), kpart, k_chunks, s.d);
    }
  });
  JUMBO_CUDA_CHECK_LAST("qk_norm_dw_partials_kernel");

  const bool aligned = aligned16(dqkv.data) && aligned16(dout.data) && aligned16(qkv.data) &&
                       aligned16(q_weight.data) && aligned16(k_weight.data);
  dispatch(qkv.dtype, aligned && s.d % kVec<float> == 0, aligned && s.d % kVec<uint16_t> == 0,
           [&](auto tag, auto vec) {
             using T = decltype(tag);
             constexpr int V = decltype(vec)::value ? kVec<T> : 1;
             qk_norm_bwd_dx_kernel<T, V><<<warp_blocks(s), kThreads, 0, stream>>>(
                 static_cast<T*>(dqkv.data), static_cast<const T*>(dout.data),
                 static_cast<const T*>(qkv.data), static_cast<const T*>(q_weight.data),
                 static_cast<const T*>(k_weight.data), rstd.as<float>(), s);
           });
  JUMBO_CUDA_CHECK_LAST("qk_norm_bwd_dx_kernel");
}

}  // namespace jumbo::cuda
