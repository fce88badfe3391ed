#pragma once
// Flash attention on tensor cores (bf16 storage): forward, dK/dV and dQ kernels.
// Part of attention.cu's translation unit (included only there, inside its anonymous
// namespace); split out to keep each file readable.

// Packed sequences in a 64-query block of 4 warps (the forward and dQ kernels): lane 4*g + tq's
// rows row0 = q0 + 16*warp + g and row1 = row0 + 8 see keys lo0 .. row0 and lo1 .. row1; the
// warp's rows start their sequences at warp_lo at the earliest and warp_hi at the latest; the
// block's first key tile with a visible key is j_first. All 0 (plain causal) unless PACKED.
struct PackedRows {
  int lo0, lo1, warp_lo, warp_hi, j_first;
};

template <bool PACKED, int BC>
__device__ __forceinline__ PackedRows packed_rows(const int32_t* __restrict__ positions, int b,
                                                  int T, int q0, int warp, int g) {
  if constexpr (!PACKED) {
    return {0, 0, 0, 0, 0};
  } else {
    const int32_t* pos_b = positions + static_cast<int64_t>(b) * T;
    const int row0 = q0 + warp * 16 + g;
    PackedRows r;
    r.lo0 = first_visible_key(pos_b, row0, T);
    r.lo1 = first_visible_key(pos_b, row0 + 8, T);
    r.warp_lo = warp_min(min(r.lo0, r.lo1));
    r.warp_hi = warp_max(max(r.lo0, r.lo1));
    __shared__ int slots[kWarps];
    r.j_first = block_min_of_warps<kWarps>(r.warp_lo, slots) / BC;
    return r;
  }
}

// ---------------------------------------------------------------------------------------------
// bf16 forward: block = (64 queries, query head, batch); key tiles of BC from 0 to the diagonal,
// from the query head's group's key and value heads.
// PACKED: positions (i32 [B*T]) mask each query to its own sequence (keys lo(t) .. t) and the
// block starts at the key tile of its smallest lo; otherwise positions is unused (nullptr).
// ---------------------------------------------------------------------------------------------

template <int D, int BC, bool PACKED>
__global__ void __launch_bounds__(kMmaThreads, fwd_min_blocks<D, PACKED>())
    flash_fwd_bf16(const hbf16* __restrict__ qkv, hbf16* __restrict__ out, float* __restrict__ lse,
                   int T, int H, int R, float scale_log2, const int32_t* __restrict__ positions) {
  constexpr int BR = kRowsPerBlock, LD = D + 8;
  constexpr int NTD = D / 8, KSD = D / 16, NTC = BC / 8, KSC = BC / 16;
  static_assert(D % 16 == 0 && BC % 16 == 0, "tiles are whole mma steps");

  hbf16* sQ = reinterpret_cast<hbf16*>(dynamic_smem());  // [BR][LD]
  hbf16* sK = sQ + BR * LD;                              // [2][BC][LD]
  hbf16* sV = sK + 2 * BC * LD;                          // [2][BC][LD]

  const int q0 = (gridDim.x - 1 - blockIdx.x) * BR;  // the longest rows first
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / R;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int64_t ld = gqa_row_width(H, R, D);
  // Query head h = kvh*R + r sits at column (kvh*(R+2) + r)*D = (h + 2*kvh)*D; its group's key
  // head (R - r)*D further (this form, an int offset from q_src, costs ptxas the fewest
  // registers of those tried).
  const hbf16* q_src =
      qkv + static_cast<int64_t>(b) * T * ld + static_cast<int64_t>(h + 2 * kvh) * D;
  const hbf16* k_src = q_src + D * (R - (h - kvh * R));
  const hbf16* v_src = k_src + D;

  const int n_tiles = (min(T, q0 + BR) + BC - 1) / BC;
  load_rows_async<BR, D, LD, kMmaThreads>(sQ, q_src, ld, q0, T);
  const PackedRows pk = packed_rows<PACKED, BC>(positions, b, T, q0, warp, g);
  const int lo0 = pk.lo0, lo1 = pk.lo1, warp_lo = pk.warp_lo, warp_hi = pk.warp_hi;
  const int j_first = pk.j_first;
  load_rows_async<BC, D, LD, kMmaThreads>(sK, k_src, ld, j_first * BC, T);
  load_rows_async<BC, D, LD, kMmaThreads>(sV, v_src, ld, j_first * BC, T);
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

  for (int j = j_first; j < n_tiles; ++j) {
    cp_async_wait_all();
    __syncthreads();  // tile j is in; every warp is done with tile j-1's buffer
    if (j + 1 < n_tiles) {
      const int nb = PACKED ? (j + 1 - j_first) & 1 : (j + 1) & 1;  // tile j+1's buffer
      load_rows_async<BC, D, LD, kMmaThreads>(sK + nb * BC * LD, k_src, ld, (j + 1) * BC, T);
      load_rows_async<BC, D, LD, kMmaThreads>(sV + nb * BC * LD, v_src, ld, (j + 1) * BC, T);
      cp_async_commit();
    }
    if (j == j_first) {
#pragma unroll
      for (int kd = 0; kd < KSD; ++kd) ldsm_x4(qf[kd], uQ + el<LD>(0, kd * 16));
    }
    const int k0 = j * BC;
    if (k0 > warp_last) continue;  // the whole tile lies above this warp's diagonal
    if constexpr (PACKED) {
      if (k0 + BC - 1 < warp_lo) continue;  // ... or before every sequence of this warp's rows
    }
    const int jb = PACKED ? (j - j_first) & 1 : j & 1;  // tile j's buffer
    const uint32_t cK = uK + jb * el<LD>(BC, 0);
    const uint32_t cV = uV + jb * el<LD>(BC, 0);

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

    // Online softmax in the log2 domain. Causal: tile 0 holds key 0, visible to every row, so
    // the running max is finite from the first tile on and no -inf - -inf arises. Packed: a row
    // may meet whole tiles before its sequence starts, its max still -inf; 0 then stands in as
    // the reference (exp2(-inf - 0) = 0 where -inf - -inf would be NaN) until its first visible
    // key (it has one: its own) makes the max finite.
    const bool masked = k0 + BC - 1 > warp_first || (PACKED && k0 < warp_hi);
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < NTC; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = s[nt][e] * scale_log2;
        const int key = k0 + nt * 8 + 2 * tq + (e & 1);
        if (masked && key > (e < 2 ? row0 : row1)) v = -INFINITY;
        if constexpr (PACKED) {
          if (masked && key < (e < 2 ? lo0 : lo1)) v = -INFINITY;
        }
        s[nt][e] = v;
      }
      mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
      mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
    }
    const float mn0 = fmaxf(m0, quad_max(mx0)), mn1 = fmaxf(m1, quad_max(mx1));
    float ref0 = mn0, ref1 = mn1;
    if constexpr (PACKED) {
      ref0 = mn0 == -INFINITY ? 0.f : mn0;
      ref1 = mn1 == -INFINITY ? 0.f : mn1;
    }
    const float alpha0 = exp2f(m0 - ref0), alpha1 = exp2f(m1 - ref1);
    m0 = mn0;
    m1 = mn1;
    float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
    for (int nt = 0; nt < NTC; ++nt) {
      s[nt][0] = exp2f(s[nt][0] - ref0);
      s[nt][1] = exp2f(s[nt][1] - ref0);
      s[nt][2] = exp2f(s[nt][2] - ref1);
      s[nt][3] = exp2f(s[nt][3] - ref1);
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
// bf16 backward, dK and dV: block = (64 keys, kv head, batch); for each of the group's query
// heads, query tiles of BR from the diagonal to T. Each warp owns 16 keys and works on
// transposed scores S^T = K Q^T.
// PACKED: the query tiles' positions stream in with their lse and delta; the block stops at the
// first query tile whose sequences all start past its last key (lo is non-decreasing along a
// row: positions count up from 0 in each sequence, the sequences one after another).
// ---------------------------------------------------------------------------------------------

template <int D, int BR, bool PACKED>
__global__ void __launch_bounds__(kMmaThreads)
    flash_bwd_dkdv_bf16(const hbf16* __restrict__ qkv, const hbf16* __restrict__ dout,
                        const float* __restrict__ lse, const float* __restrict__ delta,
                        hbf16* __restrict__ dqkv, int T, int H, int R, float scale,
                        float scale_log2, const int32_t* __restrict__ positions) {
  constexpr int BC = kRowsPerBlock, LD = D + 8;
  constexpr int NTD = D / 8, KSD = D / 16, NTR = BR / 8, KSR = BR / 16;
  static_assert(D % 16 == 0 && BR % 16 == 0 && BC % BR == 0, "tiles are whole mma steps");

  hbf16* sK = reinterpret_cast<hbf16*>(dynamic_smem());     // [BC][LD]
  hbf16* sV = sK + BC * LD;                                 // [BC][LD]
  hbf16* sQ = sV + BC * LD;                                 // [2][BR][LD]
  hbf16* sdO = sQ + 2 * BR * LD;                            // [2][BR][LD]
  float* sL = reinterpret_cast<float*>(sdO + 2 * BR * LD);  // [2][BR] lse
  float* sDl = sL + 2 * BR;                                 // [2][BR] delta
  int32_t* sPos = reinterpret_cast<int32_t*>(sDl + 2 * BR); // [2][BR] positions (packed only)

  const int k0 = blockIdx.x * BC;  // key tile 0 sees every query: the longest first
  const int kvh = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int64_t ld = gqa_row_width(H, R, D);
  const int64_t ldo = static_cast<int64_t>(H) * D;
  const int64_t grp = static_cast<int64_t>(b) * T * ld + gqa_group_col(kvh, R, D);
  const int64_t k_col = static_cast<int64_t>(R) * D;  // the key head; the value head follows
  const int32_t* pos_b = nullptr;
  if constexpr (PACKED) pos_b = positions + static_cast<int64_t>(b) * T;

  load_rows_async<BC, D, LD, kMmaThreads>(sK, qkv + grp + k_col, ld, k0, T);
  load_rows_async<BC, D, LD, kMmaThreads>(sV, qkv + grp + k_col + D, ld, k0, T);

  // Query tile i of the group's query head qh (h = kvh * R + qh) into buffer buf.
  auto load_query_tile = [&](int qh, int i, int buf) {
    const int h = kvh * R + qh;
    const hbf16* q_src = qkv + grp + static_cast<int64_t>(qh) * D;
    const hbf16* do_src = dout + static_cast<int64_t>(b) * T * ldo + static_cast<int64_t>(h) * D;
    const float* lse_bh = lse + (static_cast<int64_t>(b) * H + h) * T;
    const float* delta_bh = delta + (static_cast<int64_t>(b) * H + h) * T;
    const int q0 = i * BR;
    load_rows_async<BR, D, LD, kMmaThreads>(sQ + buf * BR * LD, q_src, ld, q0, T);
    load_rows_async<BR, D, LD, kMmaThreads>(sdO + buf * BR * LD, do_src, ldo, q0, T);
    for (int r = threadIdx.x; r < BR; r += kMmaThreads) {
      if (q0 + r < T) {
        cp_async4(sL + buf * BR + r, lse_bh + q0 + r);
        cp_async4(sDl + buf * BR + r, delta_bh + q0 + r);
        if constexpr (PACKED) cp_async4(sPos + buf * BR + r, pos_b + q0 + r);
      } else {
        sL[buf * BR + r] = 0.f;
        sDl[buf * BR + r] = 0.f;
        if constexpr (PACKED) sPos[buf * BR + r] = q0 + r - (T - 1);  // lo = T - 1 (padding)
      }
    }
  };

  const int i_first = k0 / BR;  // the first query tile that sees key k0
  const int n_qt = (T + BR - 1) / BR;
  load_query_tile(0, i_first, 0);
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

  // Steps (qh, i): the group's query heads qh = 0 .. R-1 one after another (dK and dV sum over
  // them in that fixed order: FlashAttention-2's MQA/GQA scheme, no atomics), each over its
  // query tiles from i_first on; one double-buffered pipeline across all, so the next head's
  // first tile loads while this head's last computes. Packed: a head's tiles end before the
  // first tile (past i_first, which holds query k0) whose first query starts its sequence past
  // the block's last key; next_live says whether tile i + 1 is before that end, read one step
  // ahead so its latency hides behind a tile. The positions are the same for every head.
  const int k_last = k0 + BC - 1;
  bool next_live = true;
  if constexpr (PACKED) next_live = first_visible_key(pos_b, (i_first + 1) * BR, T) <= k_last;

  int qh_next = 0, i_next = i_first;
  for (int qh = 0, i = i_first, buf = 0; qh < R; qh = qh_next, i = i_next, buf ^= 1) {
    cp_async_wait_all();
    __syncthreads();  // step (qh, i) is in; every warp is done with the previous step's buffer
    if (i + 1 < n_qt && next_live) {  // block-uniform
      qh_next = qh;
      i_next = i + 1;
    } else {
      qh_next = qh + 1;
      i_next = i_first;
    }
    if constexpr (PACKED) next_live = first_visible_key(pos_b, (i_next + 1) * BR, T) <= k_last;
    if (qh_next < R) {
      load_query_tile(qh_next, i_next, buf ^ 1);
      cp_async_commit();
    }
    const int q0 = i * BR;
    if (q0 + BR - 1 < warp_first) continue;  // every query precedes every key of this warp
    const uint32_t cQ = uQ + buf * el<LD>(BR, 0), cdO = udO + buf * el<LD>(BR, 0);
    const float* cL = sL + buf * BR;
    const float* cDl = sDl + buf * BR;
    const int32_t* cPos = sPos + buf * BR;
    // Packed: the tile's queries start their sequences at q_lo at the earliest, q_hi at the
    // latest (padding counts as T - 1).
    int q_lo = 0, q_hi = 0;
    if constexpr (PACKED) {
      q_lo = T;
      q_hi = 0;
#pragma unroll
      for (int r = lane; r < BR; r += 32) {
        const int lo = visible_from(q0 + r, cPos[r]);
        q_lo = min(q_lo, lo);
        q_hi = max(q_hi, lo);
      }
      q_lo = warp_min(q_lo);
      q_hi = warp_max(q_hi);
      if (q_lo > warp_first + 15) continue;  // every query's sequence starts past this warp's keys
    }

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
    const bool masked = q0 < warp_first + 15 || q0 + BR > T || (PACKED && q_hi > warp_first);
#pragma unroll
    for (int nt = 0; nt < NTR; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qc = nt * 8 + 2 * tq + (e & 1);
        const int query = q0 + qc;
        float p = exp2f(fmaf(s[nt][e], scale_log2, -cL[qc] * kLog2e));
        if (masked && (query < (e < 2 ? key0 : key1) || query >= T)) p = 0.f;
        if constexpr (PACKED) {
          // The key precedes the query's sequence.
          if (masked && (e < 2 ? key0 : key1) < visible_from(query, cPos[qc])) p = 0.f;
        }
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
  store_warp_rows<D, LD>(dqkv + grp + k_col, ld, staged_k, warp_first, T, lane);
  store_warp_rows<D, LD>(dqkv + grp + k_col + D, ld, staged_v, warp_first, T, lane);
}

// ---------------------------------------------------------------------------------------------
// bf16 backward, dQ: block = (64 queries, query head, batch); key tiles of BC up to the diagonal.
// PACKED: masked as the forward, from the key tile of the block's smallest lo.
// ---------------------------------------------------------------------------------------------

template <int D, int BC, bool PACKED>
__global__ void __launch_bounds__(kMmaThreads, dq_min_blocks<D>())
    flash_bwd_dq_bf16(const hbf16* __restrict__ qkv, const hbf16* __restrict__ dout,
                      const float* __restrict__ lse, const float* __restrict__ delta,
                      hbf16* __restrict__ dqkv, int T, int H, int R, float scale,
                      float scale_log2, const int32_t* __restrict__ positions) {
  constexpr int BR = kRowsPerBlock, LD = D + 8;
  constexpr int NTD = D / 8, KSD = D / 16, NTC = BC / 8, KSC = BC / 16;
  static_assert(D % 16 == 0 && BC % 16 == 0, "tiles are whole mma steps");

  hbf16* sQ = reinterpret_cast<hbf16*>(dynamic_smem());  // [BR][LD]
  hbf16* sdO = sQ + BR * LD;                             // [BR][LD]
  hbf16* sK = sdO + BR * LD;                             // [2][BC][LD]
  hbf16* sV = sK + 2 * BC * LD;                          // [2][BC][LD]

  const int q0 = (gridDim.x - 1 - blockIdx.x) * BR;
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / R;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int64_t ld = gqa_row_width(H, R, D);
  const int64_t ldo = static_cast<int64_t>(H) * D;
  // Query head h = kvh*R + r sits at column (kvh*(R+2) + r)*D = (h + 2*kvh)*D; its group's key
  // head (R - r)*D further (as in the forward).
  const int64_t head = static_cast<int64_t>(b) * T * ld + static_cast<int64_t>(h + 2 * kvh) * D;
  const hbf16* q_src = qkv + head;
  const hbf16* k_src = q_src + D * (R - (h - kvh * R));
  const hbf16* v_src = k_src + D;
  const float* lse_bh = lse + (static_cast<int64_t>(b) * H + h) * T;
  const float* delta_bh = delta + (static_cast<int64_t>(b) * H + h) * T;

  const int n_tiles = (min(T, q0 + BR) + BC - 1) / BC;
  load_rows_async<BR, D, LD, kMmaThreads>(sQ, q_src, ld, q0, T);
  load_rows_async<BR, D, LD, kMmaThreads>(
      sdO, dout + static_cast<int64_t>(b) * T * ldo + static_cast<int64_t>(h) * D, ldo, q0, T);
  const PackedRows pk = packed_rows<PACKED, BC>(positions, b, T, q0, warp, g);
  const int lo0 = pk.lo0, lo1 = pk.lo1, warp_lo = pk.warp_lo, warp_hi = pk.warp_hi;
  const int j_first = pk.j_first;
  load_rows_async<BC, D, LD, kMmaThreads>(sK, k_src, ld, j_first * BC, T);
  load_rows_async<BC, D, LD, kMmaThreads>(sV, v_src, ld, j_first * BC, T);
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

  for (int j = j_first; j < n_tiles; ++j) {
    cp_async_wait_all();
    __syncthreads();
    if (j + 1 < n_tiles) {
      const int nb = PACKED ? (j + 1 - j_first) & 1 : (j + 1) & 1;  // tile j+1's buffer
      load_rows_async<BC, D, LD, kMmaThreads>(sK + nb * BC * LD, k_src, ld, (j + 1) * BC, T);
      load_rows_async<BC, D, LD, kMmaThreads>(sV + nb * BC * LD, v_src, ld, (j + 1) * BC, T);
      cp_async_commit();
    }
    const int k0 = j * BC;
    if (k0 > warp_last) continue;
    if constexpr (PACKED) {
      if (k0 + BC - 1 < warp_lo) continue;  // the tile precedes every sequence of this warp
    }
    const int jb = PACKED ? (j - j_first) & 1 : j & 1;  // tile j's buffer
    const uint32_t cK = uK + jb * el<LD>(BC, 0), cV = uV + jb * el<LD>(BC, 0);

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

    // dS = P * (dP - delta), P = exp(S * scale - lse), zero above the diagonal and past T
    // (and, packed, before the row's sequence).
    const bool masked = k0 + BC - 1 > warp_first || warp_last >= T || (PACKED && k0 < warp_hi);
#pragma unroll
    for (int nt = 0; nt < NTC; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + nt * 8 + 2 * tq + (e & 1);
        const int row = e < 2 ? row0 : row1;
        float p = exp2f(fmaf(s[nt][e], scale_log2, -(e < 2 ? lq0 : lq1)));
        if (masked && (key > row || row >= T)) p = 0.f;
        if constexpr (PACKED) {
          if (masked && key < (e < 2 ? lo0 : lo1)) p = 0.f;
        }
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

