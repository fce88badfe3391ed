// Attention over a KV cache: the decode and prefill steps of generation (backend.h's
// attention_kv_cache; the CPU reference is src/backend/cpu/kernels_attention_cache.cpp).
//
// Two launches on the caller's stream, in this order because a prefill's rows attend to each
// other's keys:
//   1. kv_cache_store: every row's k and v (its slice of qkv) copied, bits as they are, to
//      (slot, position) of k_cache and v_cache, one element per thread (grid-stride).
//   2. kv_cache_attend: one block per (row, head). A decode row has one query, so there is no
//      query tile to put on tensor cores: this is SIMT, memory-bound by the cache rows it reads.
//      Each of the block's warps streams its own tiles of kTile consecutive positions
//      (warp w takes tiles w, w + kWarps, ...), lanes split the head dimension (coalesced rows;
//      bf16x2 / float2 loads when D is even), keeps its own running max, sum and fp32
//      accumulator (online softmax, one rescale per tile), and the warps' states are merged at
//      the end in warp order through shared memory (the split-KV merge of flash decoding).
// Deterministic: the partition of positions is fixed by the shape, every sum (shuffle trees,
// the merge) has a fixed order, no atomics. Exponentials are expf (the CPU's fast_expf is
// accurate to ~1e-7 relative; so is expf without --use_fast_math).
//
// rows lives in device memory, so the host cannot check it without a synchronisation: a row
// whose slot or position is outside the cache stores nothing and gets NaN output (visible at
// once) instead of writing out of bounds. The CPU reference throws for such a row.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "cuda_check.h"
#include "kernels.h"

namespace jumbo::cuda {
namespace {

#include "typed_io.cuh"

constexpr int kMaxHeadDim = 256;
constexpr int kWarps = 8;  // 256 threads: enough warps in flight for long contexts
constexpr int kTile = 4;   // positions per warp step: 4 independent row loads in flight

// ---- loads of VEC consecutive elements as floats (VEC = 2 needs a 2-element-aligned p) ----
template <int VEC>
__device__ __forceinline__ void load_vec(const float* p, float (&o)[VEC]) {
  if constexpr (VEC == 2) {
    const float2 f = *reinterpret_cast<const float2*>(p);
    o[0] = f.x;
    o[1] = f.y;
  } else {
    o[0] = *p;
  }
}
template <int VEC>
__device__ __forceinline__ void load_vec(const bf16_t* p, float (&o)[VEC]) {
  if constexpr (VEC == 2) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
    o[0] = f.x;
    o[1] = f.y;
  } else {
    o[0] = __bfloat162float(*p);
  }
}

__device__ __forceinline__ bool row_in_cache(int slot, int pos, int slots, int p) {
  return slot >= 0 && slot < slots && pos >= 0 && pos < p;
}

// ---- 1. k, v of each row into the caches ----
template <class T>
__global__ void kv_cache_store(T* __restrict__ kc, T* __restrict__ vc, const T* __restrict__ qkv,
                               const int32_t* __restrict__ rows, int64_t total, int H, int P,
                               int D, int slots) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += stride) {
    const int64_t rh = e / D, j = e - rh * D;  // rh = row * H + head
    const int64_t row = rh / H, head = rh - row * H;
    const int slot = rows[2 * row], pos = rows[2 * row + 1];
    if (!row_in_cache(slot, pos, slots, P)) continue;
    const T* src = qkv + rh * 3 * D;
    const int64_t at = ((static_cast<int64_t>(slot) * H + head) * P + pos) * D + j;
    kc[at] = src[D + j];
    vc[at] = src[2 * D + j];
  }
}

// ---- 2. attention of each (row, head) over its slot's positions 0..pos ----
// DF: the head size when fixed at compile time (64, 128, 144), 0 for any D <= 256 at run time.
// VEC: elements per lane load (2 needs D even and 2-element-aligned qkv and caches).
template <class T, int DF, int VEC>
__global__ void __launch_bounds__(kWarps * 32)
    kv_cache_attend(T* __restrict__ out, const T* __restrict__ qkv, const T* __restrict__ kc,
                    const T* __restrict__ vc, const int32_t* __restrict__ rows, int H, int P,
                    int d_runtime, int slots, float scale) {
  constexpr int kLaneSpan = 32 * VEC;  // elements one warp covers per chunk
  constexpr int kChunks = DF > 0 ? (DF + kLaneSpan - 1) / kLaneSpan : kMaxHeadDim / kLaneSpan;
  constexpr bool kFullChunks = DF > 0 && DF % kLaneSpan == 0;
  const int D = DF > 0 ? DF : d_runtime;

  __shared__ float sm_acc[kWarps][kMaxHeadDim];
  __shared__ float sm_m[kWarps], sm_l[kWarps];

  const int64_t rh = blockIdx.x;  // row * H + head
  const int64_t row = rh / H, head = rh - row * H;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int slot = rows[2 * row], pos = rows[2 * row + 1];
  T* dst = out + rh * D;
  if (!row_in_cache(slot, pos, slots, P)) {  // uniform across the block: no barrier is skipped
    for (int j = threadIdx.x; j < D; j += blockDim.x) {
      dst[j] = from_f32<T>(__int_as_float(0x7fc00000));  // quiet NaN
    }
    return;
  }
  const int len = pos + 1;
  const int64_t base = (static_cast<int64_t>(slot) * H + head) * P * D;
  const T* kbase = kc + base;
  const T* vbase = vc + base;

  // This lane's elements: chunk c covers VEC elements at c * kLaneSpan + lane * VEC.
  auto in_row = [&](int c) { return kFullChunks || c * kLaneSpan + lane * VEC < D; };
  float q[kChunks][VEC], acc[kChunks][VEC];
  const T* qrow = qkv + rh * 3 * D;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
#pragma unroll
    for (int v = 0; v < VEC; ++v) q[c][v] = 0.f, acc[c][v] = 0.f;
    if (in_row(c)) load_vec<VEC>(qrow + c * kLaneSpan + lane * VEC, q[c]);
  }

  float m = -INFINITY, l = 0.f;  // this warp's running max and sum of exp(score - m)
  for (int t0 = warp * kTile; t0 < len; t0 += kWarps * kTile) {
    float s[kTile];
    float vals[kTile][kChunks][VEC];
#pragma unroll
    for (int i = 0; i < kTile; ++i) {
      const int t = t0 + i;
      s[i] = 0.f;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
#pragma unroll
        for (int v = 0; v < VEC; ++v) vals[i][c][v] = 0.f;
        if (t < len && in_row(c)) {
          const int64_t at = static_cast<int64_t>(t) * D + c * kLaneSpan + lane * VEC;
          float k[VEC];
          load_vec<VEC>(kbase + at, k);
          load_vec<VEC>(vbase + at, vals[i][c]);
#pragma unroll
          for (int v = 0; v < VEC; ++v) s[i] = fmaf(q[c][v], k[v], s[i]);
        }
      }
    }
    // The same butterfly for every lane, so all lanes hold the same bits of each score.
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
      for (int i = 0; i < kTile; ++i) s[i] += __shfl_xor_sync(0xffffffffu, s[i], off);
    }
    float tile_max = -INFINITY;
#pragma unroll
    for (int i = 0; i < kTile; ++i) {
      s[i] = t0 + i < len ? s[i] * scale : -INFINITY;
      tile_max = fmaxf(tile_max, s[i]);
    }
    const float m_new = fmaxf(m, tile_max);  // finite: position t0 < len is in the tile
    const float alpha = expf(m - m_new);      // 0 on the first tile (m = -inf)
    l *= alpha;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
#pragma unroll
      for (int v = 0; v < VEC; ++v) acc[c][v] *= alpha;
    }
#pragma unroll
    for (int i = 0; i < kTile; ++i) {
      const float p = expf(s[i] - m_new);  // 0 past the end
      l += p;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
#pragma unroll
        for (int v = 0; v < VEC; ++v) acc[c][v] = fmaf(p, vals[i][c][v], acc[c][v]);
      }
    }
    m = m_new;
  }

  // Merge the warps in warp order. A warp that had no positions has l = 0 and m = -inf.
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    if (!in_row(c)) continue;
#pragma unroll
    for (int v = 0; v < VEC; ++v) sm_acc[warp][c * kLaneSpan + lane * VEC + v] = acc[c][v];
  }
  if (lane == 0) {
    sm_m[warp] = m;
    sm_l[warp] = l;
  }
  __syncthreads();
  float mx = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sm_m[w]);  // finite: warp 0 has position 0
  float factor[kWarps], sum = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    factor[w] = sm_l[w] > 0.f ? expf(sm_m[w] - mx) : 0.f;
    sum = fmaf(sm_l[w], factor[w], sum);
  }
  const float inv = 1.f / sum;
  for (int j = threadIdx.x; j < D; j += blockDim.x) {
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) o = fmaf(sm_acc[w][j], factor[w], o);
    dst[j] = from_f32<T>(o * inv);
  }
}

// ---- host side ----

[[noreturn]] void fail(const std::string& msg) {
  throw std::invalid_argument("attention_kv_cache: " + msg);
}

struct CacheDims {
  int64_t n, slots, h, p, d;
};

template <class T, int DF, int VEC>
void launch_attend(cudaStream_t stream, const CacheDims& s, Tensor out, Tensor qkv, Tensor kc,
                   Tensor vc, Tensor rows, float scale) {
  kv_cache_attend<T, DF, VEC><<<static_cast<unsigned>(s.n * s.h), kWarps * 32, 0, stream>>>(
      out.as<T>(), qkv.as<T>(), kc.as<T>(), vc.as<T>(), rows.as<int32_t>(),
      static_cast<int>(s.h), static_cast<int>(s.p), static_cast<int>(s.d),
      static_cast<int>(s.slots), scale);
  check_last("kv_cache_attend");
}

template <class T>
void launch(cudaStream_t stream, const CacheDims& s, Tensor out, Tensor qkv, Tensor kc, Tensor vc,
            Tensor rows) {
  const int64_t total = s.n * s.h * s.d;
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, kMaxBlocks);
  kv_cache_store<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      kc.as<T>(), vc.as<T>(), qkv.as<T>(), rows.as<int32_t>(), total, static_cast<int>(s.h),
      static_cast<int>(s.p), static_cast<int>(s.d), static_cast<int>(s.slots));
  check_last("kv_cache_store");

  const float scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  // Pair loads need every row start 2-element aligned: D even and aligned base pointers.
  auto aligned = [](const Tensor& t) {
    return reinterpret_cast<uintptr_t>(t.data) % (2 * sizeof(T)) == 0;
  };
  if (s.d % 2 != 0 || !aligned(qkv) || !aligned(kc) || !aligned(vc)) {
    launch_attend<T, 0, 1>(stream, s, out, qkv, kc, vc, rows, scale);
    return;
  }
  switch (s.d) {
    case 64:
      launch_attend<T, 64, 2>(stream, s, out, qkv, kc, vc, rows, scale);
      break;
    case 128:
      launch_attend<T, 128, 2>(stream, s, out, qkv, kc, vc, rows, scale);
      break;
    case 144:
      launch_attend<T, 144, 2>(stream, s, out, qkv, kc, vc, rows, scale);
      break;
    default:
      launch_attend<T, 0, 2>(stream, s, out, qkv, kc, vc, rows, scale);
      break;
  }
}

}  // namespace

void attention_kv_cache(cudaStream_t stream, Tensor out, Tensor qkv, Tensor k_cache,
                        Tensor v_cache, Tensor rows) {
  for (const Tensor* t : {&out, &qkv, &k_cache, &v_cache, &rows}) {
    if (t->device != Device::cuda) fail(t->describe() + " is not on the GPU");
  }
  if (qkv.ndim != 2 || k_cache.ndim != 4 || rows.ndim != 2 || rows.dim(1) != 2 ||
      rows.dtype != DType::i32) {
    fail("qkv [N, H*3*D], caches [slots, H, P, D], rows i32 [N, 2]; got qkv " + qkv.describe() +
         ", k_cache " + k_cache.describe() + ", rows " + rows.describe());
  }
  if ((qkv.dtype != DType::f32 && qkv.dtype != DType::bf16) || k_cache.dtype != qkv.dtype ||
      v_cache.dtype != qkv.dtype || out.dtype != qkv.dtype) {
    fail("out, qkv and the caches must share one compute dtype (f32 or bf16); got out " +
         out.describe() + ", qkv " + qkv.describe() + ", k_cache " + k_cache.describe() +
         ", v_cache " + v_cache.describe());
  }
  const CacheDims s{qkv.dim(0), k_cache.dim(0), k_cache.dim(1), k_cache.dim(2), k_cache.dim(3)};
  if (v_cache.ndim != 4 || v_cache.shape != k_cache.shape) {
    fail("v_cache " + v_cache.describe() + " must have k_cache's shape " + k_cache.describe());
  }
  if (s.d < 1 || s.d > kMaxHeadDim) {
    fail("head size D=" + std::to_string(s.d) + " outside 1.." + std::to_string(kMaxHeadDim));
  }
  if (qkv.dim(1) != s.h * 3 * s.d || rows.dim(0) != s.n || out.numel() != s.n * s.h * s.d) {
    fail("sizes: qkv " + qkv.describe() + " must be [N, H*3*D], rows " + rows.describe() +
         " [N, 2] and out " + out.describe() + " N*H*D for caches " + k_cache.describe());
  }
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  if (s.n * s.h > kIntMax || s.slots > kIntMax || s.p > kIntMax) {
    fail("N*H, slots and P must fit the launch grid and int32 positions");
  }
  if (s.n == 0 || s.h == 0) return;
  if (qkv.dtype == DType::bf16) {
    launch<bf16_t>(stream, s, out, qkv, k_cache, v_cache, rows);
  } else {
    launch<float>(stream, s, out, qkv, k_cache, v_cache, rows);
  }
}

}  // namespace jumbo::cuda
