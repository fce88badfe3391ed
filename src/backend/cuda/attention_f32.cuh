#pragma once
// Flash attention in fp32 (SIMT, no TF32): forward, dK/dV and dQ kernels, held to the CPU's
// 1e-4 parity.
// Part of attention.cu's translation unit (included only there, inside its anonymous
// namespace); split out to keep each file readable.

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
// Packed sequences add the query tile's lo (int32, the size of a float).
template <int D, bool PACKED>
constexpr size_t dkdv_f32_smem() {
  return sizeof(float) * (static_cast<size_t>(2 * kSimtRows + 2 * kSimtStream) * (D + 1) +
                          2 * kSimtRows * kSimtLdp + 2 * kSimtStream +
                          (PACKED ? kSimtStream : 0));
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

// PACKED: positions (i32 [B*T]) mask each query to its own sequence (lo(t) .. t); otherwise
// positions is unused (nullptr) and the mask is plain causal.
// Packed: a thread's NI rows (row0 + 16 i) each see keys lo[i] .. row; returns the key tile
// holding the smallest lo of the block's rows (the tiles before it are masked for every row).
// Every thread of the block calls it (a block-wide minimum).
template <int NI, int BC>
__device__ __forceinline__ int packed_rows_first_tile(const int32_t* __restrict__ positions, int b,
                                                      int row0, int T, int (&lo)[NI]) {
  const int32_t* pos_b = positions + static_cast<int64_t>(b) * T;
  int mn = T;
#pragma unroll
  for (int i = 0; i < NI; ++i) {
    lo[i] = first_visible_key(pos_b, row0 + 16 * i, T);
    mn = min(mn, lo[i]);
  }
  __shared__ int slots[kSimtThreads / 32];
  return block_min_of_warps<kSimtThreads / 32>(warp_min(mn), slots) / BC;
}

template <int D, bool PACKED>
__global__ void __launch_bounds__(kSimtThreads)
    flash_fwd_f32(const float* __restrict__ qkv, float* __restrict__ out, float* __restrict__ lse,
                  int T, int H, int R, float scale_log2, const int32_t* __restrict__ positions) {
  constexpr int BR = kSimtRows, BC = kSimtStream, LDA = D + 1, LDP = kSimtLdp;
  constexpr int NI = BR / 16, NJ = BC / 16, ND = D / 16;
  float* sQ = reinterpret_cast<float*>(dynamic_smem());  // [BR][LDA]
  float* sK = sQ + BR * LDA;                             // [BC][LDA]
  float* sV = sK + BC * LDA;                             // [BC][D]
  float* sP = sV + BC * D;                               // [BR][LDP]

  const int q0 = (gridDim.x - 1 - blockIdx.x) * BR;
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / R;
  const int ty = threadIdx.x >> 4, tx = threadIdx.x & 15;
  const int64_t ld = gqa_row_width(H, R, D);
  // Query head h = kvh*R + r at column (h + 2*kvh)*D; its group's key head (R - r)*D further.
  const float* q_src =
      qkv + static_cast<int64_t>(b) * T * ld + static_cast<int64_t>(h + 2 * kvh) * D;
  const float* k_src = q_src + D * (R - (h - kvh * R));
  const float* v_src = k_src + D;
  load_rows_f32<BR, D, LDA>(sQ, q_src, ld, q0, T);

  // Packed: row ty + 16*i sees keys lo[i] .. row; the block starts at the key tile holding the
  // smallest lo of its rows (the tiles before it are masked for every row).
  int lo[NI] = {};
  int j_first = 0;
  if constexpr (PACKED) j_first = packed_rows_first_tile<NI, BC>(positions, b, q0 + ty, T, lo);

  float o[NI][ND], m[NI], l[NI];
#pragma unroll
  for (int i = 0; i < NI; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int c = 0; c < ND; ++c) o[i][c] = 0.f;
  }

  const int n_tiles = (min(T, q0 + BR) + BC - 1) / BC;
  for (int j = j_first; j < n_tiles; ++j) {
    const int k0 = j * BC;
    __syncthreads();  // the previous tile's K, V and P are no longer read
    load_rows_f32<BC, D, LDA>(sK, k_src, ld, k0, T);
    load_rows_f32<BC, D, D>(sV, v_src, ld, k0, T);
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

    // Online softmax (log2 domain). Causal: key 0 (tile 0) is visible to every row, so the max
    // is finite from the first tile on. Packed: a row may meet whole tiles before its sequence
    // starts, its max still -inf; 0 then stands in as the reference (exp2(-inf - 0) = 0, where
    // -inf - -inf would be NaN), and its first visible key makes it finite.
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      const int row = q0 + ty + 16 * i;
      float mx = -INFINITY;
#pragma unroll
      for (int jj = 0; jj < NJ; ++jj) {
        float v = s[i][jj] * scale_log2;
        const int key = k0 + tx + 16 * jj;
        if (key > row) v = -INFINITY;
        if constexpr (PACKED) {
          if (key < lo[i]) v = -INFINITY;
        }
        s[i][jj] = v;
        mx = fmaxf(mx, v);
      }
      const float mn = fmaxf(m[i], half_warp_max(mx));
      float ref = mn;
      if constexpr (PACKED) ref = mn == -INFINITY ? 0.f : mn;
      const float alpha = exp2f(m[i] - ref);
      m[i] = mn;
      float rs = 0.f;
#pragma unroll
      for (int jj = 0; jj < NJ; ++jj) {
        const float p = exp2f(s[i][jj] - ref);
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

template <int D, bool PACKED>
__global__ void __launch_bounds__(kSimtThreads)
    flash_bwd_dkdv_f32(const float* __restrict__ qkv, const float* __restrict__ dout,
                       const float* __restrict__ lse, const float* __restrict__ delta,
                       float* __restrict__ dqkv, int T, int H, int R, float scale,
                       float scale_log2, const int32_t* __restrict__ positions) {
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
  int* sLo = reinterpret_cast<int*>(sDl + BR);           // [BR] lo (packed only)

  // Block = (key tile, kv head kvh, batch row): dK and dV sum over the group's R query heads,
  // one after another (FlashAttention-2's MQA/GQA scheme: no atomics, a fixed order).
  const int k0 = blockIdx.x * BC;
  const int kvh = blockIdx.y, b = blockIdx.z;
  const int ty = threadIdx.x >> 4, tx = threadIdx.x & 15;
  const int64_t ld = gqa_row_width(H, R, D);
  const int64_t ldo = static_cast<int64_t>(H) * D;
  const int64_t grp = static_cast<int64_t>(b) * T * ld + gqa_group_col(kvh, R, D);
  const int64_t k_col = static_cast<int64_t>(R) * D;  // the key head; the value head follows

  load_rows_f32<BC, D, LDA>(sK, qkv + grp + k_col, ld, k0, T);
  load_rows_f32<BC, D, LDA>(sV, qkv + grp + k_col + D, ld, k0, T);

  float dk[NI][ND], dv[NI][ND];
#pragma unroll
  for (int i = 0; i < NI; ++i) {
#pragma unroll
    for (int c = 0; c < ND; ++c) dk[i][c] = dv[i][c] = 0.f;
  }

  const int32_t* pos_b = nullptr;
  if constexpr (PACKED) pos_b = positions + static_cast<int64_t>(b) * T;
  const int n_qt = (T + BR - 1) / BR;
  for (int r = 0; r < R; ++r) {
    const int h = kvh * R + r;
    const float* q_src = qkv + grp + static_cast<int64_t>(r) * D;
    const float* do_src = dout + static_cast<int64_t>(b) * T * ldo + static_cast<int64_t>(h) * D;
    const float* lse_bh = lse + (static_cast<int64_t>(b) * H + h) * T;
    const float* delta_bh = delta + (static_cast<int64_t>(b) * H + h) * T;
    for (int it = k0 / BR; it < n_qt; ++it) {
      const int q0 = it * BR;
      if constexpr (PACKED) {
        // lo is non-decreasing along a row (positions count up from 0 in each sequence, the
        // sequences one after another): once a query tile's first query starts its sequence past
        // the block's last key, no query from there on sees any of its keys. Block-uniform.
        if (first_visible_key(pos_b, q0, T) > k0 + BC - 1) break;
      }
      __syncthreads();  // the previous tile's Q, dO, P, dS are no longer read
      load_rows_f32<BR, D, LDA>(sQ, q_src, ld, q0, T);
      load_rows_f32<BR, D, LDA>(sdO, do_src, ldo, q0, T);
      if (threadIdx.x < BR) {
        const int t = q0 + threadIdx.x;
        sL[threadIdx.x] = t < T ? lse_bh[t] * kLog2e : 0.f;
        sDl[threadIdx.x] = t < T ? delta_bh[t] : 0.f;
        if constexpr (PACKED) sLo[threadIdx.x] = first_visible_key(pos_b, t, T);
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
          if constexpr (PACKED) {
            if (key < sLo[qc]) p = 0.f;  // the key precedes the query's sequence
          }
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
  }

#pragma unroll
  for (int i = 0; i < NI; ++i) {
    const int key = k0 + ty + 16 * i;
    if (key < T) {
      float* dst = dqkv + grp + k_col + static_cast<int64_t>(key) * ld;
#pragma unroll
      for (int c = 0; c < ND; ++c) {
        dst[tx + 16 * c] = dk[i][c] * scale;
        dst[D + tx + 16 * c] = dv[i][c];
      }
    }
  }
}

template <int D, bool PACKED>
__global__ void __launch_bounds__(kSimtThreads)
    flash_bwd_dq_f32(const float* __restrict__ qkv, const float* __restrict__ dout,
                     const float* __restrict__ lse, const float* __restrict__ delta,
                     float* __restrict__ dqkv, int T, int H, int R, float scale,
                     float scale_log2, const int32_t* __restrict__ positions) {
  constexpr int BR = kSimtRows, BC = kSimtStream, LDA = D + 1, LDP = kSimtLdp;
  constexpr int NI = BR / 16, NJ = BC / 16, ND = D / 16;
  float* sQ = reinterpret_cast<float*>(dynamic_smem());  // [BR][LDA]
  float* sdO = sQ + BR * LDA;                            // [BR][LDA]
  float* sK = sdO + BR * LDA;                            // [BC][LDA]
  float* sV = sK + BC * LDA;                             // [BC][LDA]
  float* sS = sV + BC * LDA;                             // [BR][LDP]  dS

  const int q0 = (gridDim.x - 1 - blockIdx.x) * BR;
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / R;
  const int ty = threadIdx.x >> 4, tx = threadIdx.x & 15;
  const int64_t ld = gqa_row_width(H, R, D);
  const int64_t ldo = static_cast<int64_t>(H) * D;
  // Query head h = kvh*R + r at column (h + 2*kvh)*D; its group's key head (R - r)*D further.
  const int64_t head = static_cast<int64_t>(b) * T * ld + static_cast<int64_t>(h + 2 * kvh) * D;
  const float* q_src = qkv + head;
  const float* k_src = q_src + D * (R - (h - kvh * R));
  const float* v_src = k_src + D;
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

  // Packed: as in the forward, row ty + 16*i sees keys lo[i] .. row, from key tile j_first on.
  int lo[NI] = {};
  int j_first = 0;
  if constexpr (PACKED) j_first = packed_rows_first_tile<NI, BC>(positions, b, q0 + ty, T, lo);

  const int n_tiles = (min(T, q0 + BR) + BC - 1) / BC;
  for (int j = j_first; j < n_tiles; ++j) {
    const int k0 = j * BC;
    __syncthreads();  // the previous tile's K, V, dS are no longer read
    load_rows_f32<BC, D, LDA>(sK, k_src, ld, k0, T);
    load_rows_f32<BC, D, LDA>(sV, v_src, ld, k0, T);
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
        if constexpr (PACKED) {
          if (key < lo[i]) p = 0.f;  // the key precedes the row's sequence
        }
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

