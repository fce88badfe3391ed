// Layernorm and RMSNorm over the last dimension of x[N, C], forward and backward.
//
// Storage f32 or bf16 (bf16 as raw uint16_t bits, rounded exactly as jumbo::f32_to_bf16),
// statistics and math fp32, the CPU reference's formulas: mean = sum(x) / C, then
// var = sum((x - mean)^2) / C (two passes, no E[x^2] - mean^2 cancellation),
// rstd = 1 / sqrt(var + eps).
//
// Row kernels: C <= 1024 one warp per row (eight rows per 256-thread block); larger C one
// 256-thread block per row. Each pass re-reads the row (the second and third reads hit L1/L2).
// Reductions: __shfl_xor_sync butterflies (every lane ends with the same bits), then for a
// block the per-warp sums added by every thread in warp order. 16-byte vector loads when C is
// a multiple of the vector width and the pointers are 16-byte aligned; scalar otherwise.
//
// Backward: (1) the row kernel adds dx; (2) dweight/dbias partials: block (column tile of
// 32 vectors, chunk of rows), 8 thread rows striding the chunk's rows in order, combined in
// shared memory in thread-row order, written to scratch[chunk][C]; (3) one thread per column
// adds the chunks' partials in chunk order to dbias and dweight. No atomics anywhere, so the
// result depends only on (rows, C): bit-identical from run to run.
//
// RMSNorm (a template flag RMS on the same kernels): the mean is taken as 0 and there is no bias,
// so rstd = 1 / sqrt(sum(x^2) / C + eps), out = x * rstd * w, dx += (dnorm - norm *
// mean(dnorm * norm)) * rstd, dweight += sum of norm * dout; the mean pass, the dbias partials
// and the mean(dnorm) reduction are compiled out.
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


// ---- reductions ----

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the TPR threads of one row: TPR == 32 a warp, else the whole block (TPR ==
// blockDim.x, `sh` holds TPR / 32 floats). Every thread returns the same value.
template <int TPR>
__device__ __forceinline__ float row_sum(float v, float* sh) {
  v = warp_sum(v);
  if constexpr (TPR == 32) {
    return v;
  } else {
    constexpr int kWarps = TPR / 32;
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    float t = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) t += sh[w];
    __syncthreads();  // sh is reused by the next reduction
    return t;
  }
}

constexpr int kRowThreads = 256;     // block size of the row kernels
constexpr int kWarpRowMaxCols = 1024;  // C up to this: one warp per row

// ---- kernels ----

// RMS: mean and b are unused (nullptr).
template <class T, int V, int TPR, bool RMS>
__global__ void __launch_bounds__(kRowThreads)
    layernorm_fwd_kernel(T* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                         const T* __restrict__ x, const T* __restrict__ w,
                         const T* __restrict__ b, int64_t rows, int64_t c, float eps) {
  constexpr int kRowsPerBlock = kRowThreads / TPR;
  __shared__ float sh[kRowThreads / 32];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / TPR;
  const int t = static_cast<int>(threadIdx.x % TPR);
  if (row >= rows) return;  // a whole warp (TPR 32) or never (one row per block, grid = rows)
  const int64_t nvec = c / V;
  const T* xr = x + row * c;

  float m = 0.0f;
  if constexpr (!RMS) {
    float sum = 0.0f;
    for (int64_t i = t; i < nvec; i += TPR) {
      float v[V];
      load_n<V>(xr + i * V, v);
#pragma unroll
      for (int k = 0; k < V; ++k) sum += v[k];
    }
    m = row_sum<TPR>(sum, sh) / static_cast<float>(c);
  }

  float var = 0.0f;
  for (int64_t i = t; i < nvec; i += TPR) {
    float v[V];
    load_n<V>(xr + i * V, v);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float d = v[k] - m;
      var += d * d;
    }
  }
  const float s = 1.0f / sqrtf(row_sum<TPR>(var, sh) / static_cast<float>(c) + eps);

  T* orow = out + row * c;
  for (int64_t i = t; i < nvec; i += TPR) {
    float v[V], wv[V], o[V];
    load_n<V>(xr + i * V, v);
    load_n<V>(w + i * V, wv);
    if constexpr (RMS) {
#pragma unroll
      for (int k = 0; k < V; ++k) o[k] = v[k] * s * wv[k];
    } else {
      float bv[V];
      load_n<V>(b + i * V, bv);
#pragma unroll
      for (int k = 0; k < V; ++k) o[k] = (v[k] - m) * s * wv[k] + bv[k];
    }
    store_n<V>(orow + i * V, o);
  }
  if (t == 0) {
    if constexpr (!RMS) mean[row] = m;
    rstd[row] = s;
  }
}

// dx[r] += (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd, dnorm = w * dout.
// RMS: mean(dnorm) drops out (the mean is not subtracted) and `mean` is unused (nullptr).
template <class T, int V, int TPR, bool RMS>
__global__ void __launch_bounds__(kRowThreads)
    layernorm_bwd_dx_kernel(T* __restrict__ dx, const T* __restrict__ dout,
                            const T* __restrict__ x, const T* __restrict__ w,
                            const float* __restrict__ mean, const float* __restrict__ rstd,
                            int64_t rows, int64_t c) {
  constexpr int kRowsPerBlock = kRowThreads / TPR;
  __shared__ float sh[kRowThreads / 32];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / TPR;
  const int t = static_cast<int>(threadIdx.x % TPR);
  if (row >= rows) return;
  const int64_t nvec = c / V;
  const T* xr = x + row * c;
  const T* gr = dout + row * c;
  const float m = RMS ? 0.0f : mean[row], s = rstd[row];

  float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
  for (int64_t i = t; i < nvec; i += TPR) {
    float xv[V], gv[V], wv[V];
    load_n<V>(xr + i * V, xv);
    load_n<V>(gr + i * V, gv);
    load_n<V>(w + i * V, wv);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float norm = (xv[k] - m) * s;
      const float dnorm = wv[k] * gv[k];
      dnorm_sum += dnorm;
      dnorm_norm_sum += dnorm * norm;
    }
  }
  const float dnorm_mean = RMS ? 0.0f : row_sum<TPR>(dnorm_sum, sh) / static_cast<float>(c);
  const float dnorm_norm_mean = row_sum<TPR>(dnorm_norm_sum, sh) / static_cast<float>(c);

  T* dxr = dx + row * c;
  for (int64_t i = t; i < nvec; i += TPR) {
    float xv[V], gv[V], wv[V], d[V];
    load_n<V>(xr + i * V, xv);
    load_n<V>(gr + i * V, gv);
    load_n<V>(w + i * V, wv);
    load_n<V>(dxr + i * V, d);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float norm = (xv[k] - m) * s;
      const float dnorm = wv[k] * gv[k];
      d[k] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
    store_n<V>(dxr + i * V, d);
  }
}

constexpr int kTileX = 32;  // vectors of columns per partials block
constexpr int kTileY = 8;   // thread rows per partials block (kTileX * kTileY threads)

// part[chunk][col] = sum over the chunk's rows of dout (dbias part), and
// part[chunks + chunk][col] = sum of norm * dout (dweight part). RMS: only the dweight part, at
// part[chunk][col]; `mean` is unused (nullptr).
template <class T, int V, bool RMS>
__global__ void __launch_bounds__(kTileX * kTileY)
    layernorm_bwd_partials_kernel(float* __restrict__ part, const T* __restrict__ dout,
                                  const T* __restrict__ x, const float* __restrict__ mean,
                                  const float* __restrict__ rstd, int64_t rows, int64_t c,
                                  int64_t per_chunk, int64_t chunks) {
  constexpr int kCols = kTileX * V;  // columns of this block's tile
  __shared__ float sh_b[kTileY][kCols];
  __shared__ float sh_w[kTileY][kCols];
  const int tx = static_cast<int>(threadIdx.x % kTileX);
  const int ty = static_cast<int>(threadIdx.x / kTileX);
  const int64_t v = static_cast<int64_t>(blockIdx.x) * kTileX + tx;
  const int64_t chunk = blockIdx.y;
  const int64_t r0 = chunk * per_chunk;
  const int64_t r1 = r0 + per_chunk < rows ? r0 + per_chunk : rows;

  float sb[V], sw[V];
#pragma unroll
  for (int k = 0; k < V; ++k) sb[k] = sw[k] = 0.0f;
  if (v < c / V) {
    for (int64_t r = r0 + ty; r < r1; r += kTileY) {
      const float m = RMS ? 0.0f : mean[r], s = rstd[r];
      float xv[V], gv[V];
      load_n<V>(x + r * c + v * V, xv);
      load_n<V>(dout + r * c + v * V, gv);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        if constexpr (!RMS) sb[k] += gv[k];
        sw[k] += (xv[k] - m) * s * gv[k];
      }
    }
  }
#pragma unroll
  for (int k = 0; k < V; ++k) {
    sh_b[ty][tx * V + k] = sb[k];
    sh_w[ty][tx * V + k] = sw[k];
  }
  __syncthreads();
  for (int j = static_cast<int>(threadIdx.x); j < kCols; j += kTileX * kTileY) {
    const int64_t col = static_cast<int64_t>(blockIdx.x) * kCols + j;
    if (col >= c) break;
    float tb = 0.0f, tw = 0.0f;
#pragma unroll
    for (int y = 0; y < kTileY; ++y) {
      tb += sh_b[y][j];
      tw += sh_w[y][j];
    }
    if constexpr (RMS) {
      part[chunk * c + col] = tw;
    } else {
      part[chunk * c + col] = tb;
      part[(chunks + chunk) * c + col] = tw;
    }
  }
}

__global__ void layernorm_bwd_finish_kernel(float* __restrict__ dweight, float* __restrict__ dbias,
                                            const float* __restrict__ part, int64_t chunks,
                                            int64_t c) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= c) return;
  float tb = 0.0f, tw = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) {
    tb += part[k * c + col];
    tw += part[(chunks + k) * c + col];
  }
  dbias[col] += tb;
  dweight[col] += tw;
}

__global__ void rmsnorm_bwd_finish_kernel(float* __restrict__ dweight,
                                          const float* __restrict__ part, int64_t chunks,
                                          int64_t c) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= c) return;
  float tw = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) tw += part[k * c + col];
  dweight[col] += tw;
}

// C = x's last dimension (> 0); returns the rows x.numel() / C.
int64_t row_count(const char* op, const Tensor& x) {
  require(x.ndim >= 1 && x.dim(-1) > 0, op, "x must have a non-empty last dimension");
  return x.numel() / x.dim(-1);
}

// Grid of the row kernels for TPR threads per row.
unsigned row_blocks(int64_t rows, int tpr) {
  const int64_t per_block = kRowThreads / tpr;
  return static_cast<unsigned>((rows + per_block - 1) / per_block);
}

// The launches both norms share (RMS: no mean, no bias): the forward, dx, and the weight (and
// bias) gradient's per-chunk partials. A row of at most kWarpRowMaxCols columns takes a warp,
// a longer one a block; the vector width is the widest every pointer's alignment allows.
template <bool RMS>
void launch_norm_fwd(cudaStream_t stream, Tensor out, float* mean, Tensor rstd, Tensor x,
                     Tensor weight, const void* bias, int64_t rows, int64_t c, float eps) {
  const bool aligned = aligned16(out.data) && aligned16(x.data) && aligned16(weight.data) &&
                       (RMS || aligned16(bias));
  dispatch(x.dtype, aligned && c % kVec<float> == 0, aligned && c % kVec<uint16_t> == 0,
           [&](auto tag, auto vec) {
             using T = decltype(tag);
             constexpr int V = decltype(vec)::value ? kVec<T> : 1;
             auto* o = static_cast<T*>(out.data);
             auto* xp = static_cast<const T*>(x.data);
             auto* wp = static_cast<const T*>(weight.data);
             auto* bp = static_cast<const T*>(bias);
             if (c <= kWarpRowMaxCols) {
               layernorm_fwd_kernel<T, V, 32, RMS><<<row_blocks(rows, 32), kRowThreads, 0, stream>>>(
                   o, mean, rstd.as<float>(), xp, wp, bp, rows, c, eps);
             } else {
               layernorm_fwd_kernel<T, V, kRowThreads, RMS>
                   <<<row_blocks(rows, kRowThreads), kRowThreads, 0, stream>>>(
                       o, mean, rstd.as<float>(), xp, wp, bp, rows, c, eps);
             }
           });
  JUMBO_CUDA_CHECK_LAST(RMS ? "layernorm_fwd_kernel (rms)" : "layernorm_fwd_kernel");
}

template <bool RMS>
void launch_norm_bwd_dx(cudaStream_t stream, Tensor dx, Tensor dout, Tensor x, Tensor weight,
                        const float* mean, Tensor rstd, int64_t rows, int64_t c) {
  const bool aligned = aligned16(dx.data) && aligned16(dout.data) && aligned16(x.data) &&
                       aligned16(weight.data);
  dispatch(x.dtype, aligned && c % kVec<float> == 0, aligned && c % kVec<uint16_t> == 0,
           [&](auto tag, auto vec) {
             using T = decltype(tag);
             constexpr int V = decltype(vec)::value ? kVec<T> : 1;
             auto* d = static_cast<T*>(dx.data);
             auto* g = static_cast<const T*>(dout.data);
             auto* xp = static_cast<const T*>(x.data);
             auto* wp = static_cast<const T*>(weight.data);
             if (c <= kWarpRowMaxCols) {
               layernorm_bwd_dx_kernel<T, V, 32, RMS>
                   <<<row_blocks(rows, 32), kRowThreads, 0, stream>>>(
                       d, g, xp, wp, mean, rstd.as<float>(), rows, c);
             } else {
               layernorm_bwd_dx_kernel<T, V, kRowThreads, RMS>
                   <<<row_blocks(rows, kRowThreads), kRowThreads, 0, stream>>>(
                       d, g, xp, wp, mean, rstd.as<float>(), rows, c);
             }
           });
  JUMBO_CUDA_CHECK_LAST(RMS ? "layernorm_bwd_dx_kernel (rms)" : "layernorm_bwd_dx_kernel");
}

// scratch[chunk][col] partial sums (layernorm_bwd_partials_kernel), for the finish kernels.
template <bool RMS>
void launch_norm_bwd_partials(cudaStream_t stream, const char* op, float* scratch, Tensor dout,
                              Tensor x, const float* mean, Tensor rstd, int64_t rows, int64_t c) {
  const int64_t per_chunk = rows_per_chunk(rows);
  const int64_t chunks = chunk_count(rows);
  const bool aligned = aligned16(dout.data) && aligned16(x.data);
  dispatch(x.dtype, aligned && c % kVec<float> == 0, aligned && c % kVec<uint16_t> == 0,
           [&](auto tag, auto vec) {
             using T = decltype(tag);
             constexpr int V = decltype(vec)::value ? kVec<T> : 1;
             const int64_t tiles = (c / V + kTileX - 1) / kTileX;
             require(tiles <= (int64_t{1} << 31) - 1, op, "C too large");
             const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks));
             layernorm_bwd_partials_kernel<T, V, RMS><<<grid, kTileX * kTileY, 0, stream>>>(
                 scratch, static_cast<const T*>(dout.data), static_cast<const T*>(x.data), mean,
                 rstd.as<float>(), rows, c, per_chunk, chunks);
           });
  JUMBO_CUDA_CHECK_LAST(RMS ? "layernorm_bwd_partials_kernel (rms)"
                            : "layernorm_bwd_partials_kernel");
}

}  // namespace

size_t layernorm_bwd_scratch_floats(int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return 0;
  return static_cast<size_t>(2 * chunk_count(rows) * cols);
}

void layernorm_fwd(cudaStream_t stream, Tensor out, Tensor mean, Tensor rstd, Tensor x,
                   Tensor weight, Tensor bias, float eps) {
  const char* op = "layernorm_fwd";
  require_cuda(op, {&out, &mean, &rstd, &x, &weight, &bias});
  require(is_float(x.dtype) && out.dtype == x.dtype && weight.dtype == x.dtype &&
              bias.dtype == x.dtype,
          op, "out, x, weight and bias must share dtype f32 or bf16");
  require(mean.dtype == DType::f32 && rstd.dtype == DType::f32, op, "mean and rstd must be f32");
  const int64_t rows = row_count(op, x), c = x.dim(-1);
  require(out.numel() == x.numel(), op, "out must have x's shape");
  require(weight.numel() == c && bias.numel() == c, op, "weight and bias must be [C]");
  require(mean.numel() == rows && rstd.numel() == rows, op, "mean and rstd must be [N]");
  require(rows <= (int64_t{1} << 31) - 1, op, "too many rows");
  if (rows == 0) return;
  launch_norm_fwd<false>(stream, out, mean.as<float>(), rstd, x, weight, bias.data, rows, c, eps);
}

void layernorm_bwd(cudaStream_t stream, Tensor dx, Tensor dweight, Tensor dbias, Tensor dout,
                   Tensor x, Tensor weight, Tensor mean, Tensor rstd, float* scratch) {
  const char* op = "layernorm_bwd";
  require_cuda(op, {&dx, &dweight, &dbias, &dout, &x, &weight, &mean, &rstd});
  require(is_float(x.dtype) && dx.dtype == x.dtype && dout.dtype == x.dtype &&
              weight.dtype == x.dtype,
          op, "dx, dout, x and weight must share dtype f32 or bf16");
  require(dweight.dtype == DType::f32 && dbias.dtype == DType::f32, op,
          "dweight and dbias must be f32");
  require(mean.dtype == DType::f32 && rstd.dtype == DType::f32, op, "mean and rstd must be f32");
  const int64_t rows = row_count(op, x), c = x.dim(-1);
  require(dx.numel() == x.numel() && dout.numel() == x.numel(), op, "dx and dout must have x's shape");
  require(weight.numel() == c && dweight.numel() == c && dbias.numel() == c, op,
          "weight, dweight and dbias must be [C]");
  require(mean.numel() == rows && rstd.numel() == rows, op, "mean and rstd must be [N]");
  require(rows <= (int64_t{1} << 31) - 1, op, "too many rows");
  if (rows == 0) return;
  require(scratch != nullptr, op, "scratch (layernorm_bwd_scratch_floats floats) is null");
  const int64_t chunks = chunk_count(rows);
  launch_norm_bwd_dx<false>(stream, dx, dout, x, weight, mean.as<float>(), rstd, rows, c);
  launch_norm_bwd_partials<false>(stream, op, scratch, dout, x, mean.as<float>(), rstd, rows, c);

  constexpr int kFinishThreads = 256;
  layernorm_bwd_finish_kernel<<<static_cast<unsigned>((c + kFinishThreads - 1) / kFinishThreads),
                                kFinishThreads, 0, stream>>>(dweight.as<float>(), dbias.as<float>(),
                                                             scratch, chunks, c);
  JUMBO_CUDA_CHECK_LAST("layernorm_bwd_finish_kernel");
}

size_t rmsnorm_bwd_scratch_floats(int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return 0;
  return static_cast<size_t>(chunk_count(rows) * cols);
}

void rmsnorm_fwd(cudaStream_t stream, Tensor out, Tensor rstd, Tensor x, Tensor weight,
                 float eps) {
  const char* op = "rmsnorm_fwd";
  require_cuda(op, {&out, &rstd, &x, &weight});
  require(is_float(x.dtype) && out.dtype == x.dtype && weight.dtype == x.dtype, op,
          "out, x and weight must share dtype f32 or bf16");
  require(rstd.dtype == DType::f32, op, "rstd must be f32");
  const int64_t rows = row_count(op, x), c = x.dim(-1);
  require(out.numel() == x.numel(), op, "out must have x's shape");
  require(weight.numel() == c, op, "weight must be [C]");
  require(rstd.numel() == rows, op, "rstd must be [N]");
  require(rows <= (int64_t{1} << 31) - 1, op, "too many rows");
  if (rows == 0) return;
  launch_norm_fwd<true>(stream, out, nullptr, rstd, x, weight, nullptr, rows, c, eps);
}

void rmsnorm_bwd(cudaStream_t stream, Tensor dx, Tensor dweight, Tensor dout, Tensor x,
                 Tensor weight, Tensor rstd, float* scratch) {
  const char* op = "rmsnorm_bwd";
  require_cuda(op, {&dx, &dout, &x, &weight, &rstd});
  const bool with_dweight = !dweight.empty();  // empty: a frozen weight
  if (with_dweight) require_cuda(op, {&dweight});
  require(is_float(x.dtype) && dx.dtype == x.dtype && dout.dtype == x.dtype &&
              weight.dtype == x.dtype,
          op, "dx, dout, x and weight must share dtype f32 or bf16");
  require(rstd.dtype == DType::f32, op, "rstd must be f32");
  const int64_t rows = row_count(op, x), c = x.dim(-1);
  require(dx.numel() == x.numel() && dout.numel() == x.numel(), op,
          "dx and dout must have x's shape");
  require(weight.numel() == c, op, "weight must be [C]");
  require(!with_dweight || (dweight.dtype == DType::f32 && dweight.numel() == c), op,
          "dweight must be f32 [C] (or empty)");
  require(rstd.numel() == rows, op, "rstd must be [N]");
  require(rows <= (int64_t{1} << 31) - 1, op, "too many rows");
  if (rows == 0) return;
  launch_norm_bwd_dx<true>(stream, dx, dout, x, weight, nullptr, rstd, rows, c);
  if (!with_dweight) return;

  require(scratch != nullptr, op, "scratch (rmsnorm_bwd_scratch_floats floats) is null");
  const int64_t chunks = chunk_count(rows);
  launch_norm_bwd_partials<true>(stream, op, scratch, dout, x, nullptr, rstd, rows, c);

  constexpr int kFinishThreads = 256;
  rmsnorm_bwd_finish_kernel<<<static_cast<unsigned>((c + kFinishThreads - 1) / kFinishThreads),
                              kFinishThreads, 0, stream>>>(dweight.as<float>(), scratch, chunks, c);
  JUMBO_CUDA_CHECK_LAST("rmsnorm_bwd_finish_kernel");
}

}  // namespace jumbo::cuda
