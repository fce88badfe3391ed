// Attention over a KV cache: the decode and prefill steps of generation (backend.h's
// attention_kv_cache; the CPU reference is src/backend/cpu/kernels_attention_cache.cpp).
//
// Two launches on the caller's stream, in this order because a prefill's rows attend to each
// other's keys:
//   1. kv_cache_store: every row's k and v heads (slices of qkv, backend.h's grouped layout)
//      copied, bits as they are, to (slot, kv head, position) of k_cache and v_cache, one
//      element per thread (grid-stride).
//   2. kv_cache_attend: one block per (row, kv head, chunk of up to 4 of the group's query
//      heads): the chunk's heads share every load of the cached keys and values (grouped-query
//      attention's saving: no per-query-head copy). A decode row has one query, so there is no
//      query tile to put on tensor cores: this is SIMT, memory-bound by the cache rows it reads.
//      Each of the block's warps streams its own tiles of kTile consecutive positions
//      (warp w takes tiles w, w + kWarps, ...), lanes split the head dimension (coalesced rows;
//      bf16x2 / float2 loads when D is even), keeps per head its own running max, sum and fp32
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
// Element e = ((row * G) + kvh) * D + j: group kvh's key head sits at column kvh*(R+2)*D + R*D
// of the row (backend.h's grouped layout), its value head D further.
template <class T>
__global__ void kv_cache_store(T* __restrict__ kc, T* __restrict__ vc, const T* __restrict__ qkv,
                               const int32_t* __restrict__ rows, int64_t total, int G, int R,
                               int P, int D, int slots) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t ld = static_cast<int64_t>(G) * (R + 2) * D;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += stride) {
    const int64_t rg = e / D, j = e - rg * D;  // rg = row * G + kvh
    const int64_t row = rg / G, kvh = rg - row * G;
    const int slot = rows[2 * row], pos = rows[2 * row + 1];
    if (!row_in_cache(slot, pos, slots, P)) continue;
    const T* src = qkv + row * ld + (kvh * (R + 2) + R) * D;
    const int64_t at = ((static_cast<int64_t>(slot) * G + kvh) * P + pos) * D + j;
    kc[at] = src[j];
    vc[at] = src[D + j];
  }
}

// ---- 2. attention of each (row, query head) over its slot's positions 0..pos ----
// One block per (row, kv head, chunk of RB of the group's R query heads): each cached key and
// value row is loaded once for the chunk's heads (no per-query-head copy), each head keeping its
// own online softmax. A head's arithmetic does not depend on RB or on the other heads, so the
// result is the same whatever the chunking. Heads past R in the last chunk compute on zeros and
// store nothing.
// DF: the head size when fixed at compile time (64, 128, 144), 0 for any D <= 256 at run time.
// VEC: elements per lane load (2 needs D even and 2-element-aligned qkv and caches).
template <class T, int DF, int VEC, int RB>
__global__ void __launch_bounds__(kWarps * 32)
    kv_cache_attend(T* __restrict__ out, const T* __restrict__ qkv, const T* __restrict__ kc,
                    const T* __restrict__ vc, const int32_t* __restrict__ rows, int G, int R,
                    int P, int d_runtime, int slots, float scale) {
  constexpr int kLaneSpan = 32 * VEC;  // elements one warp covers per chunk
  constexpr int kChunks = DF > 0 ? (DF + kLaneSpan - 1) / kLaneSpan : kMaxHeadDim / kLaneSpan;
  constexpr bool kFullChunks = DF > 0 && DF % kLaneSpan == 0;
  const int D = DF > 0 ? DF : d_runtime;

  __shared__ float sm_acc[kWarps][kMaxHeadDim];
  __shared__ float sm_m[kWarps], sm_l[kWarps];

  const int n_hc = (R + RB - 1) / RB;  // head chunks per group
  const int64_t rg = blockIdx.x / n_hc;  // row * G + kvh
  const int r0 = static_cast<int>(blockIdx.x - rg * n_hc) * RB;
  const int nh = min(RB, R - r0);  // this block's heads r0 .. r0 + nh - 1
  const int64_t row = rg / G, kvh = rg - row * G;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int slot = rows[2 * row], pos = rows[2 * row + 1];
  const int H = G * R;
  T* dst = out + (row * H + kvh * R + r0) * D;  // the chunk's heads are consecutive in out
  if (!row_in_cache(slot, pos, slots, P)) {  // uniform across the block: no barrier is skipped
    for (int j = threadIdx.x; j < nh * D; j += blockDim.x) {
      dst[j] = from_f32<T>(__int_as_float(0x7fc00000));  // quiet NaN
    }
    return;
  }
  const int len = pos + 1;
  const int64_t base = (static_cast<int64_t>(slot) * G + kvh) * P * D;
  const T* kbase = kc + base;
  const T* vbase = vc + base;

  // This lane's elements: chunk c covers VEC elements at c * kLaneSpan + lane * VEC.
  auto in_row = [&](int c) { return kFullChunks || c * kLaneSpan + lane * VEC < D; };
  float q[RB][kChunks][VEC], acc[RB][kChunks][VEC];
  const T* qrow = qkv + row * (static_cast<int64_t>(G) * (R + 2) * D) +
                  (kvh * (R + 2) + r0) * D;  // query head r0 of group kvh
#pragma unroll
  for (int hd = 0; hd < RB; ++hd) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
#pragma unroll
      for (int v = 0; v < VEC; ++v) q[hd][c][v] = 0.f, acc[hd][c][v] = 0.f;
      if (hd < nh && in_row(c)) load_vec<VEC>(qrow + hd * D + c * kLaneSpan + lane * VEC, q[hd][c]);
    }
  }

  // This warp's running max and sum of exp(score - m), per head.
  float m[RB], l[RB];
#pragma unroll
  for (int hd = 0; hd < RB; ++hd) m[hd] = -INFINITY, l[hd] = 0.f;
  for (int t0 = warp * kTile; t0 < len; t0 += kWarps * kTile) {
    float s[RB][kTile];
    float vals[kTile][kChunks][VEC];
#pragma unroll
    for (int i = 0; i < kTile; ++i) {
      const int t = t0 + i;
#pragma unroll
      for (int hd = 0; hd < RB; ++hd) s[hd][i] = 0.f;
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
          for (int hd = 0; hd < RB; ++hd) {
#pragma unroll
            for (int v = 0; v < VEC; ++v) s[hd][i] = fmaf(q[hd][c][v], k[v], s[hd][i]);
          }
        }
      }
    }
    // The same butterfly for every lane, so all lanes hold the same bits of each score.
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
      for (int hd = 0; hd < RB; ++hd) {
#pragma unroll
        for (int i = 0; i < kTile; ++i) s[hd][i] += __shfl_xor_sync(0xffffffffu, s[hd][i], off);
      }
    }
#pragma unroll
    for (int hd = 0; hd < RB; ++hd) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int i = 0; i < kTile; ++i) {
        s[hd][i] = t0 + i < len ? s[hd][i] * scale : -INFINITY;
        tile_max = fmaxf(tile_max, s[hd][i]);
      }
      const float m_new = fmaxf(m[hd], tile_max);  // finite: position t0 < len is in the tile
      const float alpha = expf(m[hd] - m_new);      // 0 on the first tile (m = -inf)
      l[hd] *= alpha;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
#pragma unroll
        for (int v = 0; v < VEC; ++v) acc[hd][c][v] *= alpha;
      }
#pragma unroll
      for (int i = 0; i < kTile; ++i) {
        const float p = expf(s[hd][i] - m_new);  // 0 past the end
        l[hd] += p;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
#pragma unroll
          for (int v = 0; v < VEC; ++v) acc[hd][c][v] = fmaf(p, vals[i][c][v], acc[hd][c][v]);
        }
      }
      m[hd] = m_new;
    }
  }

  // Merge the warps in warp order, one head at a time through the same shared memory. A warp
  // that had no positions has l = 0 and m = -inf.
#pragma unroll
  for (int hd = 0; hd < RB; ++hd) {
    if (hd >= nh) break;  // block-uniform
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      if (!in_row(c)) continue;
#pragma unroll
      for (int v = 0; v < VEC; ++v) sm_acc[warp][c * kLaneSpan + lane * VEC + v] = acc[hd][c][v];
    }
    if (lane == 0) {
      sm_m[warp] = m[hd];
      sm_l[warp] = l[hd];
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
      dst[hd * D + j] = from_f32<T>(o * inv);
    }
    __syncthreads();  // sm_acc, sm_m and sm_l are rewritten for the next head
  }
}

// ---- host side ----

[[noreturn]] void fail(const std::string& msg) {
  throw std::invalid_argument("attention_kv_cache: " + msg);
}

struct CacheDims {
  int64_t n, slots, g, p, d;
  int64_t h, r;  // query heads, and per kv head (h = g * r)
};

// Query heads per attend block: the smallest power of two holding the group's R heads, at most
// 4; larger groups take several blocks, consecutive, so their repeated reads of the group's
// cache rows mostly hit L2. Why not 8: at 8 heads a lane holds 8 accumulators and queries and
// a block takes 180-255 registers per thread (ptxas, D = 128 and the run-time D), one block of
// 8 warps per SM, too few loads in flight for a memory-bound kernel; at 4, two blocks fit.
int heads_per_block(int64_t r) { return r > 2 ? 4 : static_cast<int>(r); }

template <class T, int DF, int VEC, int RB>
void launch_attend_rb(cudaStream_t stream, const CacheDims& s, Tensor out, Tensor qkv, Tensor kc,
                      Tensor vc, Tensor rows, float scale) {
  const int64_t blocks = s.n * s.g * ((s.r + RB - 1) / RB);
  kv_cache_attend<T, DF, VEC, RB><<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(
      out.as<T>(), qkv.as<T>(), kc.as<T>(), vc.as<T>(), rows.as<int32_t>(),
      static_cast<int>(s.g), static_cast<int>(s.r), static_cast<int>(s.p),
      static_cast<int>(s.d), static_cast<int>(s.slots), scale);
  check_last("kv_cache_attend");
}

template <class T, int DF, int VEC>
void launch_attend(cudaStream_t stream, const CacheDims& s, Tensor out, Tensor qkv, Tensor kc,
                   Tensor vc, Tensor rows, float scale) {
  switch (heads_per_block(s.r)) {
    case 1:
      launch_attend_rb<T, DF, VEC, 1>(stream, s, out, qkv, kc, vc, rows, scale);
      break;
    case 2:
      launch_attend_rb<T, DF, VEC, 2>(stream, s, out, qkv, kc, vc, rows, scale);
      break;
    default:
      launch_attend_rb<T, DF, VEC, 4>(stream, s, out, qkv, kc, vc, rows, scale);
      break;
  }
}

template <class T>
void launch(cudaStream_t stream, const CacheDims& s, Tensor out, Tensor qkv, Tensor kc, Tensor vc,
            Tensor rows) {
  const int64_t total = s.n * s.g * s.d;
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, kMaxBlocks);
  kv_cache_store<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      kc.as<T>(), vc.as<T>(), qkv.as<T>(), rows.as<int32_t>(), total, static_cast<int>(s.g),
      static_cast<int>(s.r), static_cast<int>(s.p), static_cast<int>(s.d),
      static_cast<int>(s.slots));
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
      rows.dtype != DType::i32 || out.ndim < 1) {
    fail("qkv [N, G*(R+2)*D], caches [slots, G, P, D], rows i32 [N, 2], out [N, H*D]; got qkv " +
         qkv.describe() + ", k_cache " + k_cache.describe() + ", rows " + rows.describe() +
         ", out " + out.describe());
  }
  if ((qkv.dtype != DType::f32 && qkv.dtype != DType::bf16) || k_cache.dtype != qkv.dtype ||
      v_cache.dtype != qkv.dtype || out.dtype != qkv.dtype) {
    fail("out, qkv and the caches must share one compute dtype (f32 or bf16); got out " +
         out.describe() + ", qkv " + qkv.describe() + ", k_cache " + k_cache.describe() +
         ", v_cache " + v_cache.describe());
  }
  CacheDims s{qkv.dim(0), k_cache.dim(0), k_cache.dim(1), k_cache.dim(2), k_cache.dim(3), 0, 0};
  if (v_cache.ndim != 4 || v_cache.shape != k_cache.shape) {
    fail("v_cache " + v_cache.describe() + " must have k_cache's shape " + k_cache.describe());
  }
  if (s.d < 1 || s.d > kMaxHeadDim) {
    fail("head size D=" + std::to_string(s.d) + " outside 1.." + std::to_string(kMaxHeadDim));
  }
  // H from out's width, R = H / G query heads per cached kv head.
  s.h = out.dim(-1) / s.d;
  s.r = s.g > 0 ? s.h / s.g : 0;
  if (s.g < 1 || out.dim(-1) != s.h * s.d || s.r < 1 || s.h != s.g * s.r) {
    fail("out " + out.describe() + " must be [N, H*D] with H a multiple of the caches' G kv "
         "heads, caches " + k_cache.describe());
  }
  if (qkv.dim(1) != s.g * (s.r + 2) * s.d || rows.dim(0) != s.n || out.numel() != s.n * s.h * s.d) {
    fail("sizes: qkv " + qkv.describe() + " must be [N, G*(R+2)*D], rows " + rows.describe() +
         " [N, 2] and out " + out.describe() + " [N, H*D] for caches " + k_cache.describe() +
         " (G=" + std::to_string(s.g) + ", R=" + std::to_string(s.r) + ")");
  }
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  if (s.n * s.h > kIntMax || s.slots > kIntMax || s.p > kIntMax) {
    fail("N*H, slots and P must fit the launch grid and int32 positions");
  }
  if (s.n == 0) return;
  if (qkv.dtype == DType::bf16) {
    launch<bf16_t>(stream, s, out, qkv, k_cache, v_cache, rows);
  } else {
    launch<float>(stream, s, out, qkv, k_cache, v_cache, rows);
  }
}

}  // namespace jumbo::cuda
