#pragma once
// Device helpers of the flash-attention kernels: cp.async, ldmatrix, mma.sync (bf16), lane
// layouts, warp reductions, and the bf16 tile shapes.
// Part of attention.cu's translation unit (included only there, inside its anonymous
// namespace); split out to keep each file readable.

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

__device__ __forceinline__ int warp_min(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ int warp_max(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The minimum over a block of WARPS warps of each warp's (warp-uniform) `v`, through one shared
// slot per warp; every thread of the block must call it (it holds a __syncthreads).
template <int WARPS>
__device__ __forceinline__ int block_min_of_warps(int v, int* slots) {
  if ((threadIdx.x & 31) == 0) slots[threadIdx.x >> 5] = v;
  __syncthreads();
  int r = slots[0];
#pragma unroll
  for (int w = 1; w < WARPS; ++w) r = min(r, slots[w]);
  return r;
}

// ---------------------------------------------------------------------------------------------
// Grouped-query layout (backend.h): a qkv row holds G = H / R groups, each R query heads, then
// one key head, then one value head, D wide each. Query head h = kvh * R + r of group kvh.
// ---------------------------------------------------------------------------------------------

// Elements in one token's row of qkv.
__device__ __forceinline__ int64_t gqa_row_width(int H, int R, int D) {
  return static_cast<int64_t>(H / R) * (R + 2) * D;
}
// The column where group kvh starts; its query head r is at + r * D, the key head at + R * D,
// the value head at + (R + 1) * D.
__device__ __forceinline__ int64_t gqa_group_col(int kvh, int R, int D) {
  return static_cast<int64_t>(kvh) * (R + 2) * D;
}

// ---------------------------------------------------------------------------------------------
// Packed sequences (positions, backend.h): query t sees keys lo(t) .. t, lo(t) = t - position[t].
// lo is clamped to [0, t], so every query keeps at least its own key whatever the positions.
// Tile padding (rows at or past T) gets lo = T - 1: such a row then sees key T - 1 (a real,
// loaded key), so no row of any tile is left with nothing to attend to, and a padding row never
// lowers a tile's smallest lo.
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ int visible_from(int t, int position) {
  return min(max(t - position, 0), t);
}

// lo(t) from the batch row's positions (pos_b = positions + b * T).
__device__ __forceinline__ int first_visible_key(const int32_t* __restrict__ pos_b, int t, int T) {
  return t < T ? visible_from(t, __ldg(pos_b + t)) : T - 1;
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

// Minimum blocks per SM for __launch_bounds__ (0: none, ptxas's own choice). Unbounded, the
// register counts swung with small changes of the address arithmetic (dQ at D = 128 between
// 128 and 186, a block per SM fewer than shared memory allows); these bounds hold each kernel
// to the occupancy its shared memory allows on A100 and H100, without spills (ptxas -v,
// sm_80 and sm_90; a bound of 4 on the packed D = 64 forward, or of 3 at D = 144, spilled).
template <int D, bool PACKED>
constexpr int fwd_min_blocks() {
  return D == 128 ? 3 : (D == 64 && !PACKED) ? 4 : 0;
}
template <int D>
constexpr int dq_min_blocks() {
  return D == 128 ? 4 : 0;
}

template <int D>
constexpr size_t fwd_bf16_smem() {
  return static_cast<size_t>(kRowsPerBlock + 4 * streamed_rows<D>()) * (D + 8) * sizeof(hbf16);
}
// Packed sequences add the query tiles' positions (two buffers of int32).
template <int D, bool PACKED>
constexpr size_t dkdv_bf16_smem() {
  return static_cast<size_t>(2 * kRowsPerBlock + 4 * dkdv_query_rows<D>()) * (D + 8) *
             sizeof(hbf16) +
         4 * dkdv_query_rows<D>() * sizeof(float) +
         (PACKED ? 2 * dkdv_query_rows<D>() * sizeof(int32_t) : 0);
}
template <int D>
constexpr size_t dq_bf16_smem() {
  return static_cast<size_t>(2 * kRowsPerBlock + 4 * streamed_rows<D>()) * (D + 8) * sizeof(hbf16);
}

