// Causal flash attention, forward and backward (Dao 2022; FlashAttention-2's work split).
//
// Layout (backend.h): qkv [B, T, H*3*D], each token's H heads consecutive, each head's 3*D
// values (q, k, v); out [B, T, H*D]; lse f32 [B, H, T, 1] = log sum_j exp(scale * q_t . k_j)
// over j <= t, the only statistic the backward needs. No T x T matrix is ever stored.
//
// bf16 storage runs on tensor cores: mma.sync.m16n8k16 (bf16 in, fp32 accumulate) fed by
// ldmatrix from padded shared memory (row stride D + 8 halves: 16-byte aligned rows, no bank
// conflicts for D = 64, 128, 144). A block has 4 warps; each warp owns 16 rows of the block's
// resident tile and keeps its accumulators in registers, in the mma C layout:
//   lane = 4*g + tq holds rows g and g+8, columns 2*tq and 2*tq+1 of every 8-wide n-tile.
// Two n-tiles of that C layout are exactly one A operand of the next mma (the FlashAttention-2
// register reuse), so P and dS never touch shared memory.
// The streamed tiles (K, V in the forward and the dQ pass; Q, dO, lse, delta in the dK/dV pass)
// are double-buffered with cp.async: tile j+1 loads while tile j computes, one __syncthreads
// per tile.
//
// f32 storage runs a SIMT path with the same tiling and fp32 FMA throughout (TF32 would miss the
// 1e-4 parity the CPU reference is held to): 256 threads as a 16 x 16 grid, each owning 4 rows
// of the resident tile, scores staged through shared memory.
//
// Backward: delta = rowsum(dout * out) first (one warp per row); then one kernel per key tile
// accumulating dK and dV over the query tiles from the diagonal down, and one kernel per query
// tile accumulating dQ over the key tiles up to the diagonal (recomputing P and dS). No atomics:
// every sum has a fixed order, so the same inputs give bit-identical gradients.
//
// Everything is queued on the caller's stream: no allocation, no host synchronisation.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels.h"

namespace jumbo::cuda {
namespace {

using hbf16 = __nv_bfloat16;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ---------------------------------------------------------------------------------------------
// Device helpers
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ unsigned char* dynamic_smem() {
  extern __shared__ __align__(128) unsigned char jumbo_attention_smem[];
  return jumbo_attention_smem;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(smem)), "l"(gmem)
               : "memory");
}

__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_u32(smem)), "l"(gmem)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits for this thread's copies; a __syncthreads after it publishes everyone's.
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// Four 8x8 b16 matrices; lane l gives the address of row (l % 8) of matrix (l / 8).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// c[16x8] += a[16x16] * b[16x8], bf16 operands, fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as a bf16x2 register: `lo` in the low half (the lower column index).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ldmatrix addresses. Lane l gives row rr = l % 8 of matrix mi = l / 8; an operand's address is
// (32-bit shared base of the tile) + (this lane's offset) + el<LD>(row, col) of its corner, the
// last a compile-time constant in the unrolled loops (an immediate offset of the instruction).
// Three ways an operand sits in a row-major shared tile s of leading dimension LD:
//
// A operand, 16x16 at (r0, c0): matrices (r0,c0) (r0+8,c0) (r0,c0+8) (r0+8,c0+8) are registers
// a0..a3 of the m16n8k16 A fragment: non-transposed, lane offset lane_rows.
// B operands of n-tiles n0 and n0+8 at k-step k0 where B[k][n] = s[n][k] (rows are the n index,
// e.g. K in S = Q K^T): matrices (n0,k0) (n0,k0+8) (n0+8,k0) (n0+8,k0+8), non-transposed, lane
// offset lane_cols; registers {b0, b1} of n-tile n0, then {b0, b1} of n-tile n0+8. Corner (n0, k0).
// B operands of n-tiles n0 and n0+8 at k-step k0 where B[k][n] = s[k][n] (rows are the k index,
// e.g. V in O = P V): matrices (k0,n0) (k0+8,n0) (k0,n0+8) (k0+8,n0+8), transposed (lane
// 4*g+tq then holds s[k0+2tq][n0+g] and s[k0+2tq+1][n0+g]: b0), lane offset lane_rows; same
// register order. Corner (k0, n0).
template <int LD>
__device__ __forceinline__ constexpr uint32_t el(int row, int col) {
  return static_cast<uint32_t>((row * LD + col) * 2);
}

template <int LD>
__device__ __forceinline__ uint32_t lane_rows(int lane) {
  const int mi = lane >> 3, rr = lane & 7;
  return el<LD>(rr + (mi & 1) * 8, (mi >> 1) * 8);
}

template <int LD>
__device__ __forceinline__ uint32_t lane_cols(int lane) {
  const int mi = lane >> 3, rr = lane & 7;
  return el<LD>(rr + (mi >> 1) * 8, (mi & 1) * 8);
}

// Queues the copy of rows [t0, t0 + ROWS) of a [T, ld] bf16 matrix (D columns from `src`) into
// shared rows of stride LD with 16-byte cp.async; rows at or past T are zeroed (so masked
// probabilities never multiply garbage).
template <int ROWS, int D, int LD, int NTHREADS>
__device__ __forceinline__ void load_rows_async(hbf16* dst, const hbf16* src, int64_t ld, int t0,
                                                int T) {
  constexpr int kChunks = D / 8;
  for (int i = threadIdx.x; i < ROWS * kChunks; i += NTHREADS) {
    const int r = i / kChunks, c = i - r * kChunks;
    hbf16* d = dst + r * LD + c * 8;
    const int t = t0 + r;
    if (t < T) {
      cp_async16(d, src + static_cast<int64_t>(t) * ld + c * 8);
    } else {
      *reinterpret_cast<uint4*>(d) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
}

// Writes 16 staged rows (bf16, stride LD) of this warp to global rows t0.. (stride ld), rows < T.
template <int D, int LD>
__device__ __forceinline__ void store_warp_rows(hbf16* dst, int64_t ld, const hbf16* staged, int t0,
                                                int T, int lane) {
  constexpr int kChunks = D / 8;
  for (int i = lane; i < 16 * kChunks; i += 32) {
    const int r = i / kChunks, c = i - r * kChunks;
    const int t = t0 + r;
    if (t < T) {
      *reinterpret_cast<uint4*>(dst + static_cast<int64_t>(t) * ld + c * 8) =
          *reinterpret_cast<const uint4*>(staged + r * LD + c * 8);
    }
  }
}

// Stages a warp's 16 x D accumulator (mma C layout, times `mul`) as bf16 rows of stride LD.
template <int D, int LD>
__device__ __forceinline__ void stage_acc(hbf16* staged, const float (&acc)[D / 8][4], float mul0,
                                          float mul1, int g, int tq) {
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd) {
    *reinterpret_cast<uint32_t*>(staged + g * LD + nd * 8 + 2 * tq) =
        pack_bf16(acc[nd][0] * mul0, acc[nd][1] * mul0);
    *reinterpret_cast<uint32_t*>(staged + (g + 8) * LD + nd * 8 + 2 * tq) =
        pack_bf16(acc[nd][2] * mul1, acc[nd][3] * mul1);
  }
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Over the 16 lanes of a half warp (the SIMT kernels' rows).
__device__ __forceinline__ float half_warp_max(float v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float half_warp_sum(float v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---------------------------------------------------------------------------------------------
// bf16 tile shapes (tensor cores)
// ---------------------------------------------------------------------------------------------

constexpr int kWarps = 4;
constexpr int kMmaThreads = 32 * kWarps;
constexpr int kRowsPerBlock = 16 * kWarps;  // the resident tile: 64 rows, 16 per warp

// Streamed-tile sizes: 64 for D = 64, 32 for the wider heads (registers and shared memory).
template <int D>
constexpr int streamed_rows() {
  return D <= 64 ? 64 : 32;
}

// Query rows per dK/dV step. At D = 144 the 2 x 72 fp32 accumulators per thread put the kernel
// at 255 registers with ~40 bytes of spill (ptxas -v); 16 rows would not spill but would read
// K and V fragments from shared memory twice as often, and this kernel is bound by shared
// memory bandwidth (about 90 ldmatrix.x4 per 144 mma per step), so 32 it is.
template <int D>
constexpr int dkdv_query_rows() {
  return D <= 64 ? 64 : 32;
}

template <int D>
constexpr size_t fwd_bf16_smem() {
  return static_cast<size_t>(kRowsPerBlock + 4 * streamed_rows<D>()) * (D + 8) * sizeof(hbf16);
}
template <int D>
constexpr size_t dkdv_bf16_smem() {
  return static_cast<size_t>(2 * kRowsPerBlock + 4 * dkdv_query_rows<D>()) * (D + 8) *
             sizeof(hbf16) +
         4 * dkdv_query_rows<D>() * sizeof(float);
}
template <int D>
constexpr size_t dq_bf16_smem() {
  return static_cast<size_t>(2 * kRowsPerBlock + 4 * streamed_rows<D>()) * (D + 8) * sizeof(hbf16);
}

// ---------------------------------------------------------------------------------------------
// bf16 forward: block = (64 queries, head, batch); key tiles of BC from 0 to the diagonal.
// ---------------------------------------------------------------------------------------------

template <int D, int BC>
__global__ void __launch_bounds__(kMmaThreads)
    flash_fwd_bf16(const hbf16* __restrict__ qkv, hbf16* __restrict__ out, float* __restrict__ lse,
                   int T, int H, float scale_log2) {
  constexpr int BR = kRowsPerBlock, LD = D + 8;
  constexpr int NTD = D / 8, KSD = D / 16, NTC = BC / 8, KSC = BC / 16;
  static_assert(D % 16 == 0 && BC % 16 == 0, "tiles are whole mma steps");

  hbf16* sQ = reinterpret_cast<hbf16*>(dynamic_smem());  // [BR][LD]
  hbf16* sK = sQ + BR * LD;                              // [2][BC][LD]
  hbf16* sV = sK + 2 * BC * LD;                          // [2][BC][LD]

  const int q0 = (gridDim.x - 1 - blockIdx.x) * BR;  // the longest rows first
  const int h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int64_t ld = static_cast<int64_t>(H) * 3 * D;
  const hbf16* q_src = qkv + static_cast<int64_t>(b) * T * ld + static_cast<int64_t>(h) * 3 * D;
  const hbf16* k_src = q_src + D;
  const hbf16* v_src = q_src + 2 * D;

  const int n_tiles = (min(T, q0 + BR) + BC - 1) / BC;
  load_rows_async<BR, D, LD, kMmaThreads>(sQ, q_src, ld, q0, T);
  load_rows_async<BC, D, LD, kMmaThreads>(sK, k_src, ld, 0, T);
  load_rows_async<BC, D, LD, kMmaThreads>(sV, v_src, ld, 0, T);
  cp_async_commit();

  const int warp_first = q0 + warp * 16, warp_last = warp_first + 15;
  const int row0 = warp_first + g, row1 = row0 + 8;
  const uint32_t lr = lane_rows<LD>(lane), lc = lane_cols<LD>(lane);
  const uint32_t uQ = smem_u32(sQ) + el<LD>(warp * 16, 0) + lr;  // this warp's A rows
  const uint32_t uK = smem_u32(sK) + lc, uV = smem_u32(sV) + lr;

  float o[NTD][4];
#pragma unroll
  for (int nd = 0; nd < NTD; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.f;
  // Running max (log2 domain, scaled) and this lane's share of the running sum, rows g, g+8.
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  uint32_t qf[KSD][4];

  for (int j = 0; j < n_tiles; ++j) {
    cp_async_wait_all();
    __syncthreads();  // tile j is in; every warp is done with tile j-1's buffer
    if (j + 1 < n_tiles) {
      const int nb = (j + 1) & 1;
      load_rows_async<BC, D, LD, kMmaThreads>(sK + nb * BC * LD, k_src, ld, (j + 1) * BC, T);
      load_rows_async<BC, D, LD, kMmaThreads>(sV + nb * BC * LD, v_src, ld, (j + 1) * BC, T);
      cp_async_commit();
    }
    if (j == 0) {
#pragma unroll
      for (int kd = 0; kd < KSD; ++kd) ldsm_x4(qf[kd], uQ + el<LD>(0, kd * 16));
    }
    const int k0 = j * BC;
    if (k0 > warp_last) continue;  // the whole tile lies above this warp's diagonal
    const uint32_t cK = uK + (j & 1) * el<LD>(BC, 0);
    const uint32_t cV = uV + (j & 1) * el<LD>(BC, 0);

    float s[NTC][4];
#pragma unroll
    for (int nt = 0; nt < NTC; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int kd = 0; kd < KSD; ++kd) {
#pragma unroll
      for (int np = 0; np < NTC / 2; ++np) {
        uint32_t kb[4];
        ldsm_x4(kb, cK + el<LD>(np * 16, kd * 16));
        mma_bf16(s[2 * np], qf[kd], kb[0], kb[1]);
        mma_bf16(s[2 * np + 1], qf[kd], kb[2], kb[3]);
      }
    }

    // Online softmax in the log2 domain. Tile 0 holds key 0, visible to every row, so the
    // running max is finite from the first tile on and no -inf - -inf arises.
    const bool masked = k0 + BC - 1 > warp_first;
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < NTC; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = s[nt][e] * scale_log2;
        const int key = k0 + nt * 8 + 2 * tq + (e & 1);
        if (masked && key > (e < 2 ? row0 : row1)) v = -INFINITY;
        s[nt][e] = v;
      }
      mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
      mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
    }
    const float mn0 = fmaxf(m0, quad_max(mx0)), mn1 = fmaxf(m1, quad_max(mx1));
    const float alpha0 = exp2f(m0 - mn0), alpha1 = exp2f(m1 - mn1);
    m0 = mn0;
    m1 = mn1;
    float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
    for (int nt = 0; nt < NTC; ++nt) {
      s[nt][0] = exp2f(s[nt][0] - mn0);
      s[nt][1] = exp2f(s[nt][1] - mn0);
      s[nt][2] = exp2f(s[nt][2] - mn1);
      s[nt][3] = exp2f(s[nt][3] - mn1);
      rs0 += s[nt][0] + s[nt][1];
      rs1 += s[nt][2] + s[nt][3];
    }
    l0 = l0 * alpha0 + rs0;
    l1 = l1 * alpha1 + rs1;
#pragma unroll
    for (int nd = 0; nd < NTD; ++nd) {
      o[nd][0] *= alpha0;
      o[nd][1] *= alpha0;
      o[nd][2] *= alpha1;
      o[nd][3] *= alpha1;
    }

    // O += P V, P straight from the score registers.
#pragma unroll
    for (int kk = 0; kk < KSC; ++kk) {
      const uint32_t pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]),
                              pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                              pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int np = 0; np < NTD / 2; ++np) {
        uint32_t vb[4];
        ldsm_x4_trans(vb, cV + el<LD>(kk * 16, np * 16));
        mma_bf16(o[2 * np], pa, vb[0], vb[1]);
        mma_bf16(o[2 * np + 1], pa, vb[2], vb[3]);
      }
    }
  }

  l0 = quad_sum(l0);
  l1 = quad_sum(l1);
  if (tq == 0) {
    float* lse_bh = lse + (static_cast<int64_t>(b) * H + h) * T;
    if (row0 < T) lse_bh[row0] = (m0 + log2f(l0)) * kLn2;
    if (row1 < T) lse_bh[row1] = (m1 + log2f(l1)) * kLn2;
  }
  // Only this warp ever reads its 16 rows of sQ, so it can stage its output there.
  hbf16* staged = sQ + warp * 16 * LD;
  stage_acc<D, LD>(staged, o, 1.f / l0, 1.f / l1, g, tq);
  __syncwarp();
  const int64_t ldo = static_cast<int64_t>(H) * D;
  store_warp_rows<D, LD>(out + static_cast<int64_t>(b) * T * ldo + static_cast<int64_t>(h) * D, ldo,
                         staged, warp_first, T, lane);
}

// ---------------------------------------------------------------------------------------------
// bf16 backward, dK and dV: block = (64 keys, head, batch); query tiles of BR from the diagonal
// to T. Each warp owns 16 keys and works on transposed scores S^T = K Q^T.
// ---------------------------------------------------------------------------------------------

template <int D, int BR>
__global__ void __launch_bounds__(kMmaThreads)
    flash_bwd_dkdv_bf16(const hbf16* __restrict__ qkv, const hbf16* __restrict__ dout,
                        const float* __restrict__ lse, const float* __restrict__ delta,
                        hbf16* __restrict__ dqkv, int T, int H, float scale, float scale_log2) {
  constexpr int BC = kRowsPerBlock, LD = D + 8;
  constexpr int NTD = D / 8, KSD = D / 16, NTR = BR / 8, KSR = BR / 16;
  static_assert(D % 16 == 0 && BR % 16 == 0 && BC % BR == 0, "tiles are whole mma steps");

  hbf16* sK = reinterpret_cast<hbf16*>(dynamic_smem());     // [BC][LD]
  hbf16* sV = sK + BC * LD;                                 // [BC][LD]
  hbf16* sQ = sV + BC * LD;                                 // [2][BR][LD]
  hbf16* sdO = sQ + 2 * BR * LD;                            // [2][BR][LD]
  float* sL = reinterpret_cast<float*>(sdO + 2 * BR * LD);  // [2][BR] lse
  float* sDl = sL + 2 * BR;                                 // [2][BR] delta

  const int k0 = blockIdx.x * BC;  // key tile 0 sees every query: the longest first
  const int h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int64_t ld = static_cast<int64_t>(H) * 3 * D;
  const int64_t ldo = static_cast<int64_t>(H) * D;
  const int64_t head = static_cast<int64_t>(b) * T * ld + static_cast<int64_t>(h) * 3 * D;
  const hbf16* q_src = qkv + head;
  const hbf16* do_src = dout + static_cast<int64_t>(b) * T * ldo + static_cast<int64_t>(h) * D;
  const float* lse_bh = lse + (static_cast<int64_t>(b) * H + h) * T;
  const float* delta_bh = delta + (static_cast<int64_t>(b) * H + h) * T;

  load_rows_async<BC, D, LD, kMmaThreads>(sK, q_src + D, ld, k0, T);
  load_rows_async<BC, D, LD, kMmaThreads>(sV, q_src + 2 * D, ld, k0, T);

  auto load_query_tile = [&](int i, int buf) {
    const int q0 = i * BR;
    load_rows_async<BR, D, LD, kMmaThreads>(sQ + buf * BR * LD, q_src, ld, q0, T);
    load_rows_async<BR, D, LD, kMmaThreads>(sdO + buf * BR * LD, do_src, ldo, q0, T);
    for (int r = threadIdx.x; r < BR; r += kMmaThreads) {
      if (q0 + r < T) {
        cp_async4(sL + buf * BR + r, lse_bh + q0 + r);
        cp_async4(sDl + buf * BR + r, delta_bh + q0 + r);
      } else {
        sL[buf * BR + r] = 0.f;
        sDl[buf * BR + r] = 0.f;
      }
    }
  };

  const int i_first = k0 / BR;  // the first query tile that sees key k0
  const int n_qt = (T + BR - 1) / BR;
  load_query_tile(i_first, 0);
  cp_async_commit();

  const int warp_first = k0 + warp * 16;  // this warp's keys: warp_first .. warp_first + 15
  const int key0 = warp_first + g, key1 = key0 + 8;
  const uint32_t lr = lane_rows<LD>(lane), lc = lane_cols<LD>(lane);
  const uint32_t uK = smem_u32(sK) + el<LD>(warp * 16, 0) + lr;  // this warp's A rows
  const uint32_t uV = smem_u32(sV) + el<LD>(warp * 16, 0) + lr;
  const uint32_t uQ = smem_u32(sQ), udO = smem_u32(sdO);

  float dk[NTD][4], dv[NTD][4];
#pragma unroll
  for (int nd = 0; nd < NTD; ++nd) {
    dk[nd][0] = dk[nd][1] = dk[nd][2] = dk[nd][3] = 0.f;
    dv[nd][0] = dv[nd][1] = dv[nd][2] = dv[nd][3] = 0.f;
  }

  for (int i = i_first; i < n_qt; ++i) {
    const int buf = (i - i_first) & 1;
    cp_async_wait_all();
    __syncthreads();  // tile i is in; every warp is done with tile i-1's buffer
    if (i + 1 < n_qt) {
      load_query_tile(i + 1, buf ^ 1);
      cp_async_commit();
    }
    const int q0 = i * BR;
    if (q0 + BR - 1 < warp_first) continue;  // every query precedes every key of this warp
    const uint32_t cQ = uQ + buf * el<LD>(BR, 0), cdO = udO + buf * el<LD>(BR, 0);
    const float* cL = sL + buf * BR;
    const float* cDl = sDl + buf * BR;

    // S^T = K Q^T (16 keys x BR queries per warp), then P^T = exp(S^T * scale - lse[query]),
    // zero where query < key or query >= T.
    float s[NTR][4];
#pragma unroll
    for (int nt = 0; nt < NTR; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int kd = 0; kd < KSD; ++kd) {
      uint32_t ka[4];
      ldsm_x4(ka, uK + el<LD>(0, kd * 16));
#pragma unroll
      for (int np = 0; np < NTR / 2; ++np) {
        uint32_t qb[4];
        ldsm_x4(qb, cQ + lc + el<LD>(np * 16, kd * 16));
        mma_bf16(s[2 * np], ka, qb[0], qb[1]);
        mma_bf16(s[2 * np + 1], ka, qb[2], qb[3]);
      }
    }
    const bool masked = q0 < warp_first + 15 || q0 + BR > T;
#pragma unroll
    for (int nt = 0; nt < NTR; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qc = nt * 8 + 2 * tq + (e & 1);
        const int query = q0 + qc;
        float p = exp2f(fmaf(s[nt][e], scale_log2, -cL[qc] * kLog2e));
        if (masked && (query < (e < 2 ? key0 : key1) || query >= T)) p = 0.f;
        s[nt][e] = p;
      }
    }

    // dV += P^T dO (k = the tile's queries).
#pragma unroll
    for (int kq = 0; kq < KSR; ++kq) {
      const uint32_t pa[4] = {pack_bf16(s[2 * kq][0], s[2 * kq][1]),
                              pack_bf16(s[2 * kq][2], s[2 * kq][3]),
                              pack_bf16(s[2 * kq + 1][0], s[2 * kq + 1][1]),
                              pack_bf16(s[2 * kq + 1][2], s[2 * kq + 1][3])};
#pragma unroll
      for (int np = 0; np < NTD / 2; ++np) {
        uint32_t ob[4];
        ldsm_x4_trans(ob, cdO + lr + el<LD>(kq * 16, np * 16));
        mma_bf16(dv[2 * np], pa, ob[0], ob[1]);
        mma_bf16(dv[2 * np + 1], pa, ob[2], ob[3]);
      }
    }

    // dP^T = V dO^T, then dS^T = P^T * (dP^T - delta[query]) in place.
    float dp[NTR][4];
#pragma unroll
    for (int nt = 0; nt < NTR; ++nt) dp[nt][0] = dp[nt][1] = dp[nt][2] = dp[nt][3] = 0.f;
#pragma unroll
    for (int kd = 0; kd < KSD; ++kd) {
      uint32_t va[4];
      ldsm_x4(va, uV + el<LD>(0, kd * 16));
#pragma unroll
      for (int np = 0; np < NTR / 2; ++np) {
        uint32_t ob[4];
        ldsm_x4(ob, cdO + lc + el<LD>(np * 16, kd * 16));
        mma_bf16(dp[2 * np], va, ob[0], ob[1]);
        mma_bf16(dp[2 * np + 1], va, ob[2], ob[3]);
      }
    }
#pragma unroll
    for (int nt = 0; nt < NTR; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        dp[nt][e] = s[nt][e] * (dp[nt][e] - cDl[nt * 8 + 2 * tq + (e & 1)]);
    }

    // dK += dS^T Q (k = the tile's queries; the scale is applied once at the end).
#pragma unroll
    for (int kq = 0; kq < KSR; ++kq) {
      const uint32_t da[4] = {pack_bf16(dp[2 * kq][0], dp[2 * kq][1]),
                              pack_bf16(dp[2 * kq][2], dp[2 * kq][3]),
                              pack_bf16(dp[2 * kq + 1][0], dp[2 * kq + 1][1]),
                              pack_bf16(dp[2 * kq + 1][2], dp[2 * kq + 1][3])};
#pragma unroll
      for (int np = 0; np < NTD / 2; ++np) {
        uint32_t qb[4];
        ldsm_x4_trans(qb, cQ + lr + el<LD>(kq * 16, np * 16));
        mma_bf16(dk[2 * np], da, qb[0], qb[1]);
        mma_bf16(dk[2 * np + 1], da, qb[2], qb[3]);
      }
    }
  }

  // Only this warp reads its 16 rows of sK and sV: stage dK and dV there, then store.
  hbf16* staged_k = sK + warp * 16 * LD;
  hbf16* staged_v = sV + warp * 16 * LD;
  stage_acc<D, LD>(staged_k, dk, scale, scale, g, tq);
  stage_acc<D, LD>(staged_v, dv, 1.f, 1.f, g, tq);
  __syncwarp();
  store_warp_rows<D, LD>(dqkv + head + D, ld, staged_k, warp_first, T, lane);
  store_warp_rows<D, LD>(dqkv + head + 2 * D, ld, staged_v, warp_first, T, lane);
}

// ---------------------------------------------------------------------------------------------
// bf16 backward, dQ: block = (64 queries, head, batch); key tiles of BC up to the diagonal.
// ---------------------------------------------------------------------------------------------

template <int D, int BC>
__global__ void __launch_bounds__(kMmaThreads)
    flash_bwd_dq_bf16(const hbf16* __restrict__ qkv, const hbf16* __restrict__ dout,
                      const float* __restrict__ lse, const float* __restrict__ delta,
                      hbf16* __restrict__ dqkv, int T, int H, float scale, float scale_log2) {
  constexpr int BR = kRowsPerBlock, LD = D + 8;
  constexpr int NTD = D / 8, KSD = D / 16, NTC = BC / 8, KSC = BC / 16;
  static_assert(D % 16 == 0 && BC % 16 == 0, "tiles are whole mma steps");

  hbf16* sQ = reinterpret_cast<hbf16*>(dynamic_smem());  // [BR][LD]
  hbf16* sdO = sQ + BR * LD;                             // [BR][LD]
  hbf16* sK = sdO + BR * LD;                             // [2][BC][LD]
  hbf16* sV = sK + 2 * BC * LD;                          // [2][BC][LD]

  const int q0 = (gridDim.x - 1 - blockIdx.x) * BR;
  const int h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int64_t ld = static_cast<int64_t>(H) * 3 * D;
  const int64_t ldo = static_cast<int64_t>(H) * D;
  const int64_t head = static_cast<int64_t>(b) * T * ld + static_cast<int64_t>(h) * 3 * D;
  const hbf16* q_src = qkv + head;
  const hbf16* k_src = q_src + D;
  const hbf16* v_src = q_src + 2 * D;
  const float* lse_bh = lse + (static_cast<int64_t>(b) * H + h) * T;
  const float* delta_bh = delta + (static_cast<int64_t>(b) * H + h) * T;

  const int n_tiles = (min(T, q0 + BR) + BC - 1) / BC;
  load_rows_async<BR, D, LD, kMmaThreads>(sQ, q_src, ld, q0, T);
  load_rows_async<BR, D, LD, kMmaThreads>(
      sdO, dout + static_cast<int64_t>(b) * T * ldo + static_cast<int64_t>(h) * D, ldo, q0, T);
  load_rows_async<BC, D, LD, kMmaThreads>(sK, k_src, ld, 0, T);
  load_rows_async<BC, D, LD, kMmaThreads>(sV, v_src, ld, 0, T);
  cp_async_commit();

  const int warp_first = q0 + warp * 16, warp_last = warp_first + 15;
  const int row0 = warp_first + g, row1 = row0 + 8;
  const float lq0 = row0 < T ? lse_bh[row0] * kLog2e : 0.f;
  const float lq1 = row1 < T ? lse_bh[row1] * kLog2e : 0.f;
  const float dl0 = row0 < T ? delta_bh[row0] : 0.f;
  const float dl1 = row1 < T ? delta_bh[row1] : 0.f;
  const uint32_t lr = lane_rows<LD>(lane), lc = lane_cols<LD>(lane);
  const uint32_t uQ = smem_u32(sQ) + el<LD>(warp * 16, 0) + lr;  // this warp's A rows
  const uint32_t udO = smem_u32(sdO) + el<LD>(warp * 16, 0) + lr;
  const uint32_t uK = smem_u32(sK), uV = smem_u32(sV);

  float dq[NTD][4];
#pragma unroll
  for (int nd = 0; nd < NTD; ++nd) dq[nd][0] = dq[nd][1] = dq[nd][2] = dq[nd][3] = 0.f;

  for (int j = 0; j < n_tiles; ++j) {
    cp_async_wait_all();
    __syncthreads();
    if (j + 1 < n_tiles) {
      const int nb = (j + 1) & 1;
      load_rows_async<BC, D, LD, kMmaThreads>(sK + nb * BC * LD, k_src, ld, (j + 1) * BC, T);
      load_rows_async<BC, D, LD, kMmaThreads>(sV + nb * BC * LD, v_src, ld, (j + 1) * BC, T);
      cp_async_commit();
    }
    const int k0 = j * BC;
    if (k0 > warp_last) continue;
    const uint32_t cK = uK + (j & 1) * el<LD>(BC, 0), cV = uV + (j & 1) * el<LD>(BC, 0);

    // S = Q K^T and dP = dO V^T (16 queries x BC keys per warp).
    float s[NTC][4], dp[NTC][4];
#pragma unroll
    for (int nt = 0; nt < NTC; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
      dp[nt][0] = dp[nt][1] = dp[nt][2] = dp[nt][3] = 0.f;
    }
#pragma unroll
    for (int kd = 0; kd < KSD; ++kd) {
      uint32_t qa[4], oa[4];
      ldsm_x4(qa, uQ + el<LD>(0, kd * 16));
      ldsm_x4(oa, udO + el<LD>(0, kd * 16));
#pragma unroll
      for (int np = 0; np < NTC / 2; ++np) {
        uint32_t kb[4], vb[4];
        ldsm_x4(kb, cK + lc + el<LD>(np * 16, kd * 16));
        mma_bf16(s[2 * np], qa, kb[0], kb[1]);
        mma_bf16(s[2 * np + 1], qa, kb[2], kb[3]);
        ldsm_x4(vb, cV + lc + el<LD>(np * 16, kd * 16));
        mma_bf16(dp[2 * np], oa, vb[0], vb[1]);
        mma_bf16(dp[2 * np + 1], oa, vb[2], vb[3]);
      }
    }

    // dS = P * (dP - delta), P = exp(S * scale - lse), zero above the diagonal and past T.
    const bool masked = k0 + BC - 1 > warp_first || warp_last >= T;
#pragma unroll
    for (int nt = 0; nt < NTC; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + nt * 8 + 2 * tq + (e & 1);
        const int row = e < 2 ? row0 : row1;
        float p = exp2f(fmaf(s[nt][e], scale_log2, -(e < 2 ? lq0 : lq1)));
        if (masked && (key > row || row >= T)) p = 0.f;
        s[nt][e] = p * (dp[nt][e] - (e < 2 ? dl0 : dl1));
      }
    }

    // dQ += dS K (k = the tile's keys).
#pragma unroll
    for (int kk = 0; kk < KSC; ++kk) {
      const uint32_t da[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]),
                              pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                              pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int np = 0; np < NTD / 2; ++np) {
        uint32_t kb[4];
        ldsm_x4_trans(kb, cK + lr + el<LD>(kk * 16, np * 16));
        mma_bf16(dq[2 * np], da, kb[0], kb[1]);
        mma_bf16(dq[2 * np + 1], da, kb[2], kb[3]);
      }
    }
  }

  hbf16* staged = sQ + warp * 16 * LD;  // only this warp reads these rows
  stage_acc<D, LD>(staged, dq, scale, scale, g, tq);
  __syncwarp();
  store_warp_rows<D, LD>(dqkv + head, ld, staged, warp_first, T, lane);
}

// ---------------------------------------------------------------------------------------------
// f32 (SIMT) kernels: 256 threads, ty = tid / 16 and tx = tid % 16. A thread owns the resident
// tile's rows ty + 16*i (i < 4) and columns tx + 16*c of whatever it accumulates; a row's 16
// threads are one half warp, so row reductions are 4 shuffles. Rows of tiles read down a
// column (Q, K in dot products) have stride D + 1 (odd: no bank conflicts).
// ---------------------------------------------------------------------------------------------

constexpr int kSimtThreads = 256;
constexpr int kSimtRows = 64;               // the resident tile
constexpr int kSimtStream = 32;             // the streamed tile
constexpr int kSimtLdp = kSimtStream + 16;  // staged scores: rows ty and ty+1 in other banks

template <int D>
constexpr size_t fwd_f32_smem() {
  return sizeof(float) * (static_cast<size_t>(kSimtRows + kSimtStream) * (D + 1) +
                          static_cast<size_t>(kSimtStream) * D + kSimtRows * kSimtLdp);
}
template <int D>
constexpr size_t dkdv_f32_smem() {
  return sizeof(float) * (static_cast<size_t>(2 * kSimtRows + 2 * kSimtStream) * (D + 1) +
                          2 * kSimtRows * kSimtLdp + 2 * kSimtStream);
}
template <int D>
constexpr size_t dq_f32_smem() {
  return sizeof(float) *
         (static_cast<size_t>(2 * kSimtRows + 2 * kSimtStream) * (D + 1) + kSimtRows * kSimtLdp);
}

// Rows [t0, t0 + ROWS) of a [T, ld] f32 matrix (D columns from `src`) into shared rows of stride
// LDS; rows at or past T are zeroed. Synchronous (a __syncthreads must follow).
template <int ROWS, int D, int LDS>
__device__ __forceinline__ void load_rows_f32(float* dst, const float* src, int64_t ld, int t0,
                                              int T) {
  constexpr int kChunks = D / 4;
  for (int i = threadIdx.x; i < ROWS * kChunks; i += kSimtThreads) {
    const int r = i / kChunks, c = i - r * kChunks;
    const int t = t0 + r;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (t < T) v = *reinterpret_cast<const float4*>(src + static_cast<int64_t>(t) * ld + c * 4);
    float* d = dst + r * LDS + c * 4;
    if constexpr (LDS % 4 == 0) {
      *reinterpret_cast<float4*>(d) = v;
    } else {
      d[0] = v.x;
      d[1] = v.y;
      d[2] = v.z;
      d[3] = v.w;
    }
  }
}

template <int D>
__global__ void __launch_bounds__(kSimtThreads)
    flash_fwd_f32(const float* __restrict__ qkv, float* __restrict__ out, float* __restrict__ lse,
                  int T, int H, float scale_log2) {
  constexpr int BR = kSimtRows, BC = kSimtStream, LDA = D + 1, LDP = kSimtLdp;
  constexpr int NI = BR / 16, NJ = BC / 16, ND = D / 16;
  float* sQ = reinterpret_cast<float*>(dynamic_smem());  // [BR][LDA]
  float* sK = sQ + BR * LDA;                             // [BC][LDA]
  float* sV = sK + BC * LDA;                             // [BC][D]
  float* sP = sV + BC * D;                               // [BR][LDP]

  const int q0 = (gridDim.x - 1 - blockIdx.x) * BR;
  const int h = blockIdx.y, b = blockIdx.z;
  const int ty = threadIdx.x >> 4, tx = threadIdx.x & 15;
  const int64_t ld = static_cast<int64_t>(H) * 3 * D;
  const float* q_src = qkv + static_cast<int64_t>(b) * T * ld + static_cast<int64_t>(h) * 3 * D;
  load_rows_f32<BR, D, LDA>(sQ, q_src, ld, q0, T);

  float o[NI][ND], m[NI], l[NI];
#pragma unroll
  for (int i = 0; i < NI; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int c = 0; c < ND; ++c) o[i][c] = 0.f;
  }

  const int n_tiles = (min(T, q0 + BR) + BC - 1) / BC;
  for (int j = 0; j < n_tiles; ++j) {
    const int k0 = j * BC;
    __syncthreads();  // the previous tile's K, V and P are no longer read
    load_rows_f32<BC, D, LDA>(sK, q_src + D, ld, k0, T);
    load_rows_f32<BC, D, D>(sV, q_src + 2 * D, ld, k0, T);
    __syncthreads();

    float s[NI][NJ];
#pragma unroll
    for (int i = 0; i < NI; ++i) {
#pragma unroll
      for (int jj = 0; jj < NJ; ++jj) s[i][jj] = 0.f;
    }
#pragma unroll 4
    for (int d = 0; d < D; ++d) {
      float qv[NI], kv[NJ];
#pragma unroll
      for (int i = 0; i < NI; ++i) qv[i] = sQ[(ty + 16 * i) * LDA + d];
#pragma unroll
      for (int jj = 0; jj < NJ; ++jj) kv[jj] = sK[(tx + 16 * jj) * LDA + d];
#pragma unroll
      for (int i = 0; i < NI; ++i) {
#pragma unroll
        for (int jj = 0; jj < NJ; ++jj) s[i][jj] = fmaf(qv[i], kv[jj], s[i][jj]);
      }
    }

    // Online softmax (log2 domain). Key 0 (tile 0) is visible to every row: the max is finite
    // from the first tile on.
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      const int row = q0 + ty + 16 * i;
      float mx = -INFINITY;
#pragma unroll
      for (int jj = 0; jj < NJ; ++jj) {
        float v = s[i][jj] * scale_log2;
        if (k0 + tx + 16 * jj > row) v = -INFINITY;
        s[i][jj] = v;
        mx = fmaxf(mx, v);
      }
      const float mn = fmaxf(m[i], half_warp_max(mx));
      const float alpha = exp2f(m[i] - mn);
      m[i] = mn;
      float rs = 0.f;
#pragma unroll
      for (int jj = 0; jj < NJ; ++jj) {
        const float p = exp2f(s[i][jj] - mn);
        rs += p;
        sP[(ty + 16 * i) * LDP + tx + 16 * jj] = p;
      }
      l[i] = l[i] * alpha + rs;
#pragma unroll
      for (int c = 0; c < ND; ++c) o[i][c] *= alpha;
    }
    __syncthreads();

#pragma unroll 4
    for (int kk = 0; kk < BC; ++kk) {
      float pv[NI];
#pragma unroll
      for (int i = 0; i < NI; ++i) pv[i] = sP[(ty + 16 * i) * LDP + kk];
#pragma unroll
      for (int c = 0; c < ND; ++c) {
        const float vv = sV[kk * D + tx + 16 * c];
#pragma unroll
        for (int i = 0; i < NI; ++i) o[i][c] = fmaf(pv[i], vv, o[i][c]);
      }
    }
  }

  const int64_t ldo = static_cast<int64_t>(H) * D;
  float* o_dst = out + static_cast<int64_t>(b) * T * ldo + static_cast<int64_t>(h) * D;
  float* lse_bh = lse + (static_cast<int64_t>(b) * H + h) * T;
#pragma unroll
  for (int i = 0; i < NI; ++i) {
    const float li = half_warp_sum(l[i]);
    const int row = q0 + ty + 16 * i;
    if (row < T) {
      const float inv = 1.f / li;
#pragma unroll
      for (int c = 0; c < ND; ++c)
        o_dst[static_cast<int64_t>(row) * ldo + tx + 16 * c] = o[i][c] * inv;
      if (tx == 0) lse_bh[row] = (m[i] + log2f(li)) * kLn2;
    }
  }
}

template <int D>
__global__ void __launch_bounds__(kSimtThreads)
    flash_bwd_dkdv_f32(const float* __restrict__ qkv, const float* __restrict__ dout,
                       const float* __restrict__ lse, const float* __restrict__ delta,
                       float* __restrict__ dqkv, int T, int H, float scale, float scale_log2) {
  constexpr int BC = kSimtRows, BR = kSimtStream, LDA = D + 1, LDP = kSimtLdp;
  constexpr int NI = BC / 16, NJ = BR / 16, ND = D / 16;
  static_assert(BC % BR == 0, "query tiles start on key-tile boundaries");
  float* sK = reinterpret_cast<float*>(dynamic_smem());  // [BC][LDA]
  float* sV = sK + BC * LDA;                             // [BC][LDA]
  float* sQ = sV + BC * LDA;                             // [BR][LDA]
  float* sdO = sQ + BR * LDA;                            // [BR][LDA]
  float* sP = sdO + BR * LDA;                            // [BC][LDP]  P^T
  float* sS = sP + BC * LDP;                             // [BC][LDP]  dS^T
  float* sL = sS + BC * LDP;                             // [BR] lse * log2(e)
  float* sDl = sL + BR;                                  // [BR] delta

  const int k0 = blockIdx.x * BC;
  const int h = blockIdx.y, b = blockIdx.z;
  const int ty = threadIdx.x >> 4, tx = threadIdx.x & 15;
  const int64_t ld = static_cast<int64_t>(H) * 3 * D;
  const int64_t ldo = static_cast<int64_t>(H) * D;
  const int64_t head = static_cast<int64_t>(b) * T * ld + static_cast<int64_t>(h) * 3 * D;
  const float* q_src = qkv + head;
  const float* do_src = dout + static_cast<int64_t>(b) * T * ldo + static_cast<int64_t>(h) * D;
  const float* lse_bh = lse + (static_cast<int64_t>(b) * H + h) * T;
  const float* delta_bh = delta + (static_cast<int64_t>(b) * H + h) * T;

  load_rows_f32<BC, D, LDA>(sK, q_src + D, ld, k0, T);
  load_rows_f32<BC, D, LDA>(sV, q_src + 2 * D, ld, k0, T);

  float dk[NI][ND], dv[NI][ND];
#pragma unroll
  for (int i = 0; i < NI; ++i) {
#pragma unroll
    for (int c = 0; c < ND; ++c) dk[i][c] = dv[i][c] = 0.f;
  }

  const int n_qt = (T + BR - 1) / BR;
  for (int it = k0 / BR; it < n_qt; ++it) {
    const int q0 = it * BR;
    __syncthreads();  // the previous tile's Q, dO, P, dS are no longer read
    load_rows_f32<BR, D, LDA>(sQ, q_src, ld, q0, T);
    load_rows_f32<BR, D, LDA>(sdO, do_src, ldo, q0, T);
    if (threadIdx.x < BR) {
      const int t = q0 + threadIdx.x;
      sL[threadIdx.x] = t < T ? lse_bh[t] * kLog2e : 0.f;
      sDl[threadIdx.x] = t < T ? delta_bh[t] : 0.f;
    }
    __syncthreads();

    float s[NI][NJ], dp[NI][NJ];
#pragma unroll
    for (int i = 0; i < NI; ++i) {
#pragma unroll
      for (int jj = 0; jj < NJ; ++jj) s[i][jj] = dp[i][jj] = 0.f;
    }
#pragma unroll 4
    for (int d = 0; d < D; ++d) {
      float kv[NI], vv[NI], qv[NJ], ov[NJ];
#pragma unroll
      for (int i = 0; i < NI; ++i) {
        kv[i] = sK[(ty + 16 * i) * LDA + d];
        vv[i] = sV[(ty + 16 * i) * LDA + d];
      }
#pragma unroll
      for (int jj = 0; jj < NJ; ++jj) {
        qv[jj] = sQ[(tx + 16 * jj) * LDA + d];
        ov[jj] = sdO[(tx + 16 * jj) * LDA + d];
      }
#pragma unroll
      for (int i = 0; i < NI; ++i) {
#pragma unroll
        for (int jj = 0; jj < NJ; ++jj) {
          s[i][jj] = fmaf(kv[i], qv[jj], s[i][jj]);
          dp[i][jj] = fmaf(vv[i], ov[jj], dp[i][jj]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      const int key = k0 + ty + 16 * i;
#pragma unroll
      for (int jj = 0; jj < NJ; ++jj) {
        const int qc = tx + 16 * jj;
        const int query = q0 + qc;
        float p = exp2f(fmaf(s[i][jj], scale_log2, -sL[qc]));
        if (query < key || query >= T) p = 0.f;
        sP[(ty + 16 * i) * LDP + qc] = p;
        sS[(ty + 16 * i) * LDP + qc] = p * (dp[i][jj] - sDl[qc]);
      }
    }
    __syncthreads();

#pragma unroll 4
    for (int q = 0; q < BR; ++q) {
      float pv[NI], sv[NI];
#pragma unroll
      for (int i = 0; i < NI; ++i) {
        pv[i] = sP[(ty + 16 * i) * LDP + q];
        sv[i] = sS[(ty + 16 * i) * LDP + q];
      }
#pragma unroll
      for (int c = 0; c < ND; ++c) {
        const float ov = sdO[q * LDA + tx + 16 * c];
        const float qv = sQ[q * LDA + tx + 16 * c];
#pragma unroll
        for (int i = 0; i < NI; ++i) {
          dv[i][c] = fmaf(pv[i], ov, dv[i][c]);
          dk[i][c] = fmaf(sv[i], qv, dk[i][c]);
        }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < NI; ++i) {
    const int key = k0 + ty + 16 * i;
    if (key < T) {
      float* dst = dqkv + head + static_cast<int64_t>(key) * ld;
#pragma unroll
      for (int c = 0; c < ND; ++c) {
        dst[D + tx + 16 * c] = dk[i][c] * scale;
        dst[2 * D + tx + 16 * c] = dv[i][c];
      }
    }
  }
}

template <int D>
__global__ void __launch_bounds__(kSimtThreads)
    flash_bwd_dq_f32(const float* __restrict__ qkv, const float* __restrict__ dout,
                     const float* __restrict__ lse, const float* __restrict__ delta,
                     float* __restrict__ dqkv, int T, int H, float scale, float scale_log2) {
  constexpr int BR = kSimtRows, BC = kSimtStream, LDA = D + 1, LDP = kSimtLdp;
  constexpr int NI = BR / 16, NJ = BC / 16, ND = D / 16;
  float* sQ = reinterpret_cast<float*>(dynamic_smem());  // [BR][LDA]
  float* sdO = sQ + BR * LDA;                            // [BR][LDA]
  float* sK = sdO + BR * LDA;                            // [BC][LDA]
  float* sV = sK + BC * LDA;                             // [BC][LDA]
  float* sS = sV + BC * LDA;                             // [BR][LDP]  dS

  const int q0 = (gridDim.x - 1 - blockIdx.x) * BR;
  const int h = blockIdx.y, b = blockIdx.z;
  const int ty = threadIdx.x >> 4, tx = threadIdx.x & 15;
  const int64_t ld = static_cast<int64_t>(H) * 3 * D;
  const int64_t ldo = static_cast<int64_t>(H) * D;
  const int64_t head = static_cast<int64_t>(b) * T * ld + static_cast<int64_t>(h) * 3 * D;
  const float* q_src = qkv + head;
  const float* lse_bh = lse + (static_cast<int64_t>(b) * H + h) * T;
  const float* delta_bh = delta + (static_cast<int64_t>(b) * H + h) * T;

  load_rows_f32<BR, D, LDA>(sQ, q_src, ld, q0, T);
  load_rows_f32<BR, D, LDA>(
      sdO, dout + static_cast<int64_t>(b) * T * ldo + static_cast<int64_t>(h) * D, ldo, q0, T);

  float lq[NI], dl[NI], dq[NI][ND];
#pragma unroll
  for (int i = 0; i < NI; ++i) {
    const int row = q0 + ty + 16 * i;
    lq[i] = row < T ? lse_bh[row] * kLog2e : 0.f;
    dl[i] = row < T ? delta_bh[row] : 0.f;
#pragma unroll
    for (int c = 0; c < ND; ++c) dq[i][c] = 0.f;
  }

  const int n_tiles = (min(T, q0 + BR) + BC - 1) / BC;
  for (int j = 0; j < n_tiles; ++j) {
    const int k0 = j * BC;
    __syncthreads();  // the previous tile's K, V, dS are no longer read
    load_rows_f32<BC, D, LDA>(sK, q_src + D, ld, k0, T);
    load_rows_f32<BC, D, LDA>(sV, q_src + 2 * D, ld, k0, T);
    __syncthreads();

    float s[NI][NJ], dp[NI][NJ];
#pragma unroll
    for (int i = 0; i < NI; ++i) {
#pragma unroll
      for (int jj = 0; jj < NJ; ++jj) s[i][jj] = dp[i][jj] = 0.f;
    }
#pragma unroll 4
    for (int d = 0; d < D; ++d) {
      float qv[NI], ov[NI], kv[NJ], vv[NJ];
#pragma unroll
      for (int i = 0; i < NI; ++i) {
        qv[i] = sQ[(ty + 16 * i) * LDA + d];
        ov[i] = sdO[(ty + 16 * i) * LDA + d];
      }
#pragma unroll
      for (int jj = 0; jj < NJ; ++jj) {
        kv[jj] = sK[(tx + 16 * jj) * LDA + d];
        vv[jj] = sV[(tx + 16 * jj) * LDA + d];
      }
#pragma unroll
      for (int i = 0; i < NI; ++i) {
#pragma unroll
        for (int jj = 0; jj < NJ; ++jj) {
          s[i][jj] = fmaf(qv[i], kv[jj], s[i][jj]);
          dp[i][jj] = fmaf(ov[i], vv[jj], dp[i][jj]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      const int row = q0 + ty + 16 * i;
#pragma unroll
      for (int jj = 0; jj < NJ; ++jj) {
        const int key = k0 + tx + 16 * jj;
        float p = exp2f(fmaf(s[i][jj], scale_log2, -lq[i]));
        if (key > row || row >= T) p = 0.f;
        sS[(ty + 16 * i) * LDP + tx + 16 * jj] = p * (dp[i][jj] - dl[i]);
      }
    }
    __syncthreads();

#pragma unroll 4
    for (int kk = 0; kk < BC; ++kk) {
      float sv[NI];
#pragma unroll
      for (int i = 0; i < NI; ++i) sv[i] = sS[(ty + 16 * i) * LDP + kk];
#pragma unroll
      for (int c = 0; c < ND; ++c) {
        const float kv = sK[kk * LDA + tx + 16 * c];
#pragma unroll
        for (int i = 0; i < NI; ++i) dq[i][c] = fmaf(sv[i], kv, dq[i][c]);
      }
    }
  }

#pragma unroll
  for (int i = 0; i < NI; ++i) {
    const int row = q0 + ty + 16 * i;
    if (row < T) {
      float* dst = dqkv + head + static_cast<int64_t>(row) * ld;
#pragma unroll
      for (int c = 0; c < ND; ++c) dst[tx + 16 * c] = dq[i][c] * scale;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// delta[b, h, t] = sum_d dout[b, t, h*D + d] * out[b, t, h*D + d]: one warp per (b, t, h) row,
// 16-byte loads, a fixed shuffle tree (deterministic).
// ---------------------------------------------------------------------------------------------

constexpr int kDeltaThreads = 256;

template <class TS>
__global__ void __launch_bounds__(kDeltaThreads)
    attention_delta(const TS* __restrict__ dout, const TS* __restrict__ out,
                    float* __restrict__ delta, int64_t rows, int T, int H, int D) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (kDeltaThreads / 32) + (threadIdx.x >> 5);
  if (r >= rows) return;  // warp-uniform
  const int lane = threadIdx.x & 31;
  float acc = 0.f;
  if constexpr (sizeof(TS) == 2) {
    const uint4* a = reinterpret_cast<const uint4*>(dout + r * D);
    const uint4* o = reinterpret_cast<const uint4*>(out + r * D);
    for (int c = lane; c < D / 8; c += 32) {
      const uint4 x = a[c], y = o[c];
      const __nv_bfloat162* xa = reinterpret_cast<const __nv_bfloat162*>(&x);
      const __nv_bfloat162* ya = reinterpret_cast<const __nv_bfloat162*>(&y);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 fx = __bfloat1622float2(xa[k]), fy = __bfloat1622float2(ya[k]);
        acc = fmaf(fx.x, fy.x, acc);
        acc = fmaf(fx.y, fy.y, acc);
      }
    }
  } else {
    const float4* a = reinterpret_cast<const float4*>(dout + r * D);
    const float4* o = reinterpret_cast<const float4*>(out + r * D);
    for (int c = lane; c < D / 4; c += 32) {
      const float4 x = a[c], y = o[c];
      acc = fmaf(x.x, y.x, acc);
      acc = fmaf(x.y, y.y, acc);
      acc = fmaf(x.z, y.z, acc);
      acc = fmaf(x.w, y.w, acc);
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) {
    const int64_t h = r % H, t = (r / H) % T, b = r / (static_cast<int64_t>(H) * T);
    delta[(b * H + h) * T + t] = acc;
  }
}

// ---------------------------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------------------------

struct Dims {
  int b, t, h, d;
};

std::string op_prefix(const char* op) { return std::string(op) + ": "; }

void require_cuda(const char* op, const char* name, const Tensor& t) {
  if (t.device != Device::cuda) {
    throw std::invalid_argument(op_prefix(op) + name + " must be CUDA device memory, got " +
                                t.describe());
  }
}

void require_aligned(const char* op, const char* name, const Tensor& t, size_t bytes) {
  if (reinterpret_cast<uintptr_t>(t.data) % bytes != 0) {
    throw std::invalid_argument(op_prefix(op) + name + " must be " + std::to_string(bytes) +
                                "-byte aligned, got " + t.describe());
  }
}

void require_dtype(const char* op, const char* name, const Tensor& t, DType want) {
  if (t.dtype != want) {
    throw std::invalid_argument(op_prefix(op) + name + " must be " + to_string(want) + ", got " +
                                t.describe());
  }
}

// B, T, H, D from qkv [B, T, H*3*D] and a per-row statistic [B, H, T, 1]; checks what every
// attention launcher needs (D instantiated, grid limits).
Dims attention_dims(const char* op, const Tensor& qkv, const Tensor& stats,
                    const char* stats_name) {
  if (qkv.ndim != 3) {
    throw std::invalid_argument(op_prefix(op) + "qkv must be [B, T, H*3*D], got " + qkv.describe());
  }
  if (qkv.dtype != DType::f32 && qkv.dtype != DType::bf16) {
    throw std::invalid_argument(op_prefix(op) + "qkv must be f32 or bf16, got " + qkv.describe());
  }
  if (stats.ndim != 4 || stats.dim(0) != qkv.dim(0) || stats.dim(2) != qkv.dim(1) ||
      stats.dim(3) != 1 || stats.dim(1) < 1) {
    throw std::invalid_argument(op_prefix(op) + stats_name + " must be f32 [B, H, T, 1] for qkv " +
                                qkv.describe() + ", got " + stats.describe());
  }
  require_dtype(op, stats_name, stats, DType::f32);
  const int64_t b = qkv.dim(0), t = qkv.dim(1), h = stats.dim(1);
  if (qkv.dim(2) % (3 * h) != 0) {
    throw std::invalid_argument(op_prefix(op) + "qkv's last dim " + std::to_string(qkv.dim(2)) +
                                " is not H*3*D for H=" + std::to_string(h));
  }
  const int64_t d = qkv.dim(2) / (3 * h);
  if (!flash_attention_supports(d)) {
    throw std::invalid_argument(op_prefix(op) + "head size D=" + std::to_string(d) +
                                " is not instantiated (flash attention supports D = 64, 128, 144)");
  }
  if (b > 65535 || h > 65535 || t > (int64_t{1} << 30)) {
    throw std::invalid_argument(op_prefix(op) + "B=" + std::to_string(b) +
                                ", H=" + std::to_string(h) + ", T=" + std::to_string(t) +
                                " exceed the launch grid (B, H <= 65535, T <= 2^30)");
  }
  return {static_cast<int>(b), static_cast<int>(t), static_cast<int>(h), static_cast<int>(d)};
}

void check_launch(const char* kernel, int d) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("flash attention: launching ") + kernel +
                             "<D=" + std::to_string(d) + "> failed: " + cudaGetErrorString(e));
  }
}

// Raises one kernel's dynamic shared memory limit, once per device (the attribute is per device).
class SmemOptIn {
 public:
  void ensure(const void* kernel, size_t bytes, const char* name, int d) {
    if (bytes <= 48u * 1024u) return;
    int device = 0;
    cudaError_t e = cudaGetDevice(&device);
    const uint64_t bit = device >= 0 && device < 64 ? uint64_t{1} << device : 0;
    if (e == cudaSuccess && bit != 0 && (done_.load(std::memory_order_acquire) & bit) != 0) return;
    if (e == cudaSuccess) {
      e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(bytes));
    }
    if (e != cudaSuccess) {
      throw std::runtime_error(std::string("flash attention: ") + name + "<D=" + std::to_string(d) +
                               "> needs " + std::to_string(bytes) +
                               " bytes of shared memory per block: " + cudaGetErrorString(e));
    }
    done_.fetch_or(bit, std::memory_order_release);
  }

 private:
  std::atomic<uint64_t> done_{0};
};

dim3 tile_grid(const Dims& s, int rows_per_block) {
  return dim3(static_cast<unsigned>((s.t + rows_per_block - 1) / rows_per_block),
              static_cast<unsigned>(s.h), static_cast<unsigned>(s.b));
}

template <int D>
void launch_fwd(cudaStream_t stream, const Dims& s, Tensor out, Tensor lse, Tensor qkv) {
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(D));
  if (qkv.dtype == DType::bf16) {
    constexpr int BC = streamed_rows<D>();
    constexpr size_t smem = fwd_bf16_smem<D>();
    static SmemOptIn opt_in;
    opt_in.ensure(reinterpret_cast<const void*>(&flash_fwd_bf16<D, BC>), smem, "flash_fwd_bf16", D);
    flash_fwd_bf16<D, BC><<<tile_grid(s, kRowsPerBlock), kMmaThreads, smem, stream>>>(
        qkv.as<hbf16>(), out.as<hbf16>(), lse.as<float>(), s.t, s.h, scale_log2);
    check_launch("flash_fwd_bf16", D);
  } else {
    constexpr size_t smem = fwd_f32_smem<D>();
    static SmemOptIn opt_in;
    opt_in.ensure(reinterpret_cast<const void*>(&flash_fwd_f32<D>), smem, "flash_fwd_f32", D);
    flash_fwd_f32<D><<<tile_grid(s, kSimtRows), kSimtThreads, smem, stream>>>(
        qkv.as<float>(), out.as<float>(), lse.as<float>(), s.t, s.h, scale_log2);
    check_launch("flash_fwd_f32", D);
  }
}

template <int D>
void launch_bwd(cudaStream_t stream, const Dims& s, Tensor dqkv, Tensor delta, Tensor dout,
                Tensor qkv, Tensor out, Tensor lse) {
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const float scale_log2 = kLog2e * scale;
  const int64_t rows = static_cast<int64_t>(s.b) * s.t * s.h;
  const unsigned delta_blocks =
      static_cast<unsigned>((rows + kDeltaThreads / 32 - 1) / (kDeltaThreads / 32));
  if (qkv.dtype == DType::bf16) {
    attention_delta<hbf16><<<delta_blocks, kDeltaThreads, 0, stream>>>(
        dout.as<hbf16>(), out.as<hbf16>(), delta.as<float>(), rows, s.t, s.h, D);
    check_launch("attention_delta_bf16", D);

    constexpr int BQ = dkdv_query_rows<D>();
    constexpr size_t smem_kv = dkdv_bf16_smem<D>();
    static SmemOptIn opt_kv;
    opt_kv.ensure(reinterpret_cast<const void*>(&flash_bwd_dkdv_bf16<D, BQ>), smem_kv,
                  "flash_bwd_dkdv_bf16", D);
    flash_bwd_dkdv_bf16<D, BQ><<<tile_grid(s, kRowsPerBlock), kMmaThreads, smem_kv, stream>>>(
        qkv.as<hbf16>(), dout.as<hbf16>(), lse.as<float>(), delta.as<float>(), dqkv.as<hbf16>(),
        s.t, s.h, scale, scale_log2);
    check_launch("flash_bwd_dkdv_bf16", D);

    constexpr int BS = streamed_rows<D>();
    constexpr size_t smem_q = dq_bf16_smem<D>();
    static SmemOptIn opt_q;
    opt_q.ensure(reinterpret_cast<const void*>(&flash_bwd_dq_bf16<D, BS>), smem_q,
                 "flash_bwd_dq_bf16", D);
    flash_bwd_dq_bf16<D, BS><<<tile_grid(s, kRowsPerBlock), kMmaThreads, smem_q, stream>>>(
        qkv.as<hbf16>(), dout.as<hbf16>(), lse.as<float>(), delta.as<float>(), dqkv.as<hbf16>(),
        s.t, s.h, scale, scale_log2);
    check_launch("flash_bwd_dq_bf16", D);
  } else {
    attention_delta<float><<<delta_blocks, kDeltaThreads, 0, stream>>>(
        dout.as<float>(), out.as<float>(), delta.as<float>(), rows, s.t, s.h, D);
    check_launch("attention_delta_f32", D);

    constexpr size_t smem_kv = dkdv_f32_smem<D>();
    static SmemOptIn opt_kv;
    opt_kv.ensure(reinterpret_cast<const void*>(&flash_bwd_dkdv_f32<D>), smem_kv,
                  "flash_bwd_dkdv_f32", D);
    flash_bwd_dkdv_f32<D><<<tile_grid(s, kSimtRows), kSimtThreads, smem_kv, stream>>>(
        qkv.as<float>(), dout.as<float>(), lse.as<float>(), delta.as<float>(), dqkv.as<float>(),
        s.t, s.h, scale, scale_log2);
    check_launch("flash_bwd_dkdv_f32", D);

    constexpr size_t smem_q = dq_f32_smem<D>();
    static SmemOptIn opt_q;
    opt_q.ensure(reinterpret_cast<const void*>(&flash_bwd_dq_f32<D>), smem_q, "flash_bwd_dq_f32",
                 D);
    flash_bwd_dq_f32<D><<<tile_grid(s, kSimtRows), kSimtThreads, smem_q, stream>>>(
        qkv.as<float>(), dout.as<float>(), lse.as<float>(), delta.as<float>(), dqkv.as<float>(),
        s.t, s.h, scale, scale_log2);
    check_launch("flash_bwd_dq_f32", D);
  }
}

}  // namespace

bool flash_attention_supports(int64_t head_dim) {
  return head_dim == 64 || head_dim == 128 || head_dim == 144;
}

void flash_attention_fwd(cudaStream_t stream, Tensor out, Tensor lse, Tensor qkv) {
  const char* op = "flash_attention_fwd";
  require_cuda(op, "qkv", qkv);
  require_cuda(op, "out", out);
  require_cuda(op, "lse", lse);
  const Dims s = attention_dims(op, qkv, lse, "lse");
  require_dtype(op, "out", out, qkv.dtype);
  if (out.numel() != static_cast<int64_t>(s.b) * s.t * s.h * s.d) {
    throw std::invalid_argument(op_prefix(op) + "out must hold B*T*H*D elements for qkv " +
                                qkv.describe() + ", got " + out.describe());
  }
  require_aligned(op, "qkv", qkv, 16);
  require_aligned(op, "out", out, 16);
  require_aligned(op, "lse", lse, 4);
  if (s.b == 0 || s.t == 0) return;
  switch (s.d) {
    case 64:
      launch_fwd<64>(stream, s, out, lse, qkv);
      break;
    case 128:
      launch_fwd<128>(stream, s, out, lse, qkv);
      break;
    case 144:
      launch_fwd<144>(stream, s, out, lse, qkv);
      break;
    default:
      break;  // attention_dims admits only the sizes above
  }
}

void flash_attention_bwd(cudaStream_t stream, Tensor dqkv, Tensor delta, Tensor dout, Tensor qkv,
                         Tensor out, Tensor lse) {
  const char* op = "flash_attention_bwd";
  require_cuda(op, "dqkv", dqkv);
  require_cuda(op, "delta", delta);
  require_cuda(op, "dout", dout);
  require_cuda(op, "qkv", qkv);
  require_cuda(op, "out", out);
  require_cuda(op, "lse", lse);
  const Dims s = attention_dims(op, qkv, lse, "lse");
  require_dtype(op, "delta", delta, DType::f32);
  if (delta.ndim != 4 || delta.shape != lse.shape) {
    throw std::invalid_argument(op_prefix(op) + "delta must have lse's shape " + lse.describe() +
                                ", got " + delta.describe());
  }
  require_dtype(op, "dqkv", dqkv, qkv.dtype);
  require_dtype(op, "dout", dout, qkv.dtype);
  require_dtype(op, "out", out, qkv.dtype);
  const int64_t n_out = static_cast<int64_t>(s.b) * s.t * s.h * s.d;
  if (dqkv.numel() != qkv.numel() || dout.numel() != n_out || out.numel() != n_out) {
    throw std::invalid_argument(op_prefix(op) + "dqkv must match qkv " + qkv.describe() +
                                " and dout, out hold B*T*H*D elements; got dqkv " +
                                dqkv.describe() + ", dout " + dout.describe() + ", out " +
                                out.describe());
  }
  require_aligned(op, "dqkv", dqkv, 16);
  require_aligned(op, "dout", dout, 16);
  require_aligned(op, "qkv", qkv, 16);
  require_aligned(op, "out", out, 16);
  require_aligned(op, "lse", lse, 4);
  require_aligned(op, "delta", delta, 4);
  if (s.b == 0 || s.t == 0) return;
  switch (s.d) {
    case 64:
      launch_bwd<64>(stream, s, dqkv, delta, dout, qkv, out, lse);
      break;
    case 128:
      launch_bwd<128>(stream, s, dqkv, delta, dout, qkv, out, lse);
      break;
    case 144:
      launch_bwd<144>(stream, s, dqkv, delta, dout, qkv, out, lse);
      break;
    default:
      break;
  }
}

}  // namespace jumbo::cuda
