// Attention over a KV cache: the decode and prefill steps of generation. Each query row
// attends to the cached keys and values of its own sequence (its slot) up to its position.
// The exponentials are the training kernel's, so a cached decode matches the full forward to
// rounding.
//
// A step's rows come as runs: consecutive rows of one slot at consecutive positions (a prefill
// chunk) or single rows (decode). A run of a few rows or more is a causal attention of its
// queries against the slot's cache up to its last position, computed in blocks like the
// training kernel's, one (run, head, block of queries) per OpenMP task: the block's keys
// transposed once into [D, keys], scores 6 queries x 64 keys at a time, the row softmax, then
// the probabilities times the values 6 queries x D at a time (AVX-512 tiles; 2 queries for
// D = 128). A decode row, a run too short for tiles, or a head size without tiles (not 16,
// 32, 64 or 128) is one (row, head) task: a single pass of dot products over the cache rows,
// which are contiguous per (slot, head). Measured on 2 cores, GPT-2 small's 12 heads over a
// 128-row prefill: 0.33-0.5 ms against 1.4-1.7 ms row by row.
//
// Grouped-query attention (caches [slots, G, P, D], R = H / G query heads per kv head): a
// task is a (row or query block, kv head) and takes the kv head's R query heads together, so
// a decode row streams the group's cached keys and values once for all R (decode is bound by
// that stream), and a block transposes its keys once. With R = 1 every task runs exactly the
// multi-head code. Tasks number rows x G: a batch-1 decode of few kv heads uses few cores.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "simd_avx512.h"
#include "simd_math.h"

namespace jumbo::cpu {
namespace {

// Rows row .. row + len - 1 of a step: one slot, positions pos .. pos + len - 1.
struct Run {
  int64_t row, len, slot, pos;
};

std::vector<Run> runs_of(const int32_t* r, int64_t n) {
  std::vector<Run> runs;
  for (int64_t i = 0; i < n; ++i) {
    if (!runs.empty()) {
      Run& last = runs.back();
      if (r[2 * i] == last.slot && r[2 * i + 1] == last.pos + last.len) {
        ++last.len;
        continue;
      }
    }
    runs.push_back({i, 1, r[2 * i], r[2 * i + 1]});
  }
  return runs;
}

// Row i of head `head` against positions 0 .. len - 1 of its slot: kc, vc point at the
// (slot, head) cache rows, q at its query, dst at its output.
template <class T>
void attend_row(const T* src, const T* kc, const T* vc, T* dst, int64_t len, int64_t d,
                float scale) {
  static thread_local std::vector<float> q, scores, acc;
  q.resize(static_cast<size_t>(d));
  acc.assign(static_cast<size_t>(d), 0.0f);
  if (scores.size() < static_cast<size_t>(len)) scores.resize(static_cast<size_t>(len));
  for (int64_t j = 0; j < d; ++j) q[j] = load(src, j);
  float mx = -INFINITY;
  for (int64_t t = 0; t < len; ++t) {
    const T* k = kc + t * d;
    float dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < d; ++j) dot += q[j] * load(k, j);
    scores[t] = dot * scale;
    mx = std::fmax(mx, scores[t]);
  }
  float sum = 0;
  for (int64_t t = 0; t < len; ++t) {
    scores[t] = fast_expf(scores[t] - mx);
    sum += scores[t];
  }
  const float inv = 1.0f / sum;
  for (int64_t t = 0; t < len; ++t) {
    const T* v = vc + t * d;
    const float w = scores[t] * inv;
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) acc[j] += w * load(v, j);
  }
  for (int64_t j = 0; j < d; ++j) store(dst, j, acc[j]);
}

// attend_row for the R > 1 query heads of one kv head (contiguous in src and dst, d apart):
// each cache row is widened once and used by all R heads, so the cache streams once.
template <class T>
void attend_row_group(const T* src, const T* kc, const T* vc, T* dst, int64_t len, int64_t d,
                      int64_t heads, float scale) {
  static thread_local std::vector<float> q, scores, acc, row, mx, inv;
  q.resize(static_cast<size_t>(heads * d));
  acc.assign(static_cast<size_t>(heads * d), 0.0f);
  row.resize(static_cast<size_t>(d));
  mx.assign(static_cast<size_t>(heads), -INFINITY);
  inv.resize(static_cast<size_t>(heads));
  if (scores.size() < static_cast<size_t>(heads * len)) {
    scores.resize(static_cast<size_t>(heads * len));
  }
  for (int64_t j = 0; j < heads * d; ++j) q[j] = load(src, j);
  for (int64_t t = 0; t < len; ++t) {
    for (int64_t j = 0; j < d; ++j) row[j] = load(kc + t * d, j);
    for (int64_t r = 0; r < heads; ++r) {
      const float* qr = q.data() + r * d;
      float dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < d; ++j) dot += qr[j] * row[j];
      scores[r * len + t] = dot * scale;
      mx[r] = std::fmax(mx[r], dot * scale);
    }
  }
  for (int64_t r = 0; r < heads; ++r) {
    float* sr = scores.data() + r * len;
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t t = 0; t < len; ++t) {
      sr[t] = fast_expf(sr[t] - mx[r]);
      sum += sr[t];
    }
    inv[r] = 1.0f / sum;
  }
  for (int64_t t = 0; t < len; ++t) {
    for (int64_t j = 0; j < d; ++j) row[j] = load(vc + t * d, j);
    for (int64_t r = 0; r < heads; ++r) {
      float* ar = acc.data() + r * d;
      const float w = scores[r * len + t] * inv[r];
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) ar[j] += w * row[j];
    }
  }
  for (int64_t j = 0; j < heads * d; ++j) store(dst, j, acc[j]);
}

constexpr int64_t kMinRun = 4;       // shorter runs go row by row
constexpr int64_t kQueryBlock = 64;  // queries per task

#ifdef JUMBO_AVX512
using namespace avx512;

constexpr int64_t kKeyGroup = 64;  // keys per score tile (4 vectors)

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// p[0, len) = softmax(p[0, len)) in place: the max in vectors, then exp and sum, then scale.
void softmax_in_place(float* p, int64_t len) {
  __m512 vmx = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < len; j += 16) {
    vmx = _mm512_mask_max_ps(vmx, first_lanes(len - j), vmx, _mm512_loadu_ps(p + j));
  }
  const float mx = _mm512_reduce_max_ps(vmx);
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < len; ++j) {
    p[j] = fast_expf(p[j] - mx);
    sum += p[j];
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int64_t j = 0; j < len; ++j) p[j] *= inv;
}

// Queries t0 .. t1 - 1 of `run` (run-relative) of one query head, D = 16 DV; R queries per
// tile, against kt [D, kp] (the keys transposed) and v (the values as f32). q rows of qkv are
// `stride` apart; out rows `ostride`.
template <int DV, int R, class T>
void attend_block_head(const T* q_rows, int64_t stride, const float* kt, int64_t kp,
                       const float* v, T* out, int64_t ostride, int64_t pos, int64_t t0,
                       int64_t t1, float scale) {
  constexpr int64_t D = 16 * DV;
  const int64_t nq = t1 - t0, nq_pad = round_up(nq, R);
  static thread_local std::vector<float> qb, sb;
  if (qb.size() < static_cast<size_t>(nq_pad * D)) qb.resize(static_cast<size_t>(nq_pad * D));
  if (sb.size() < static_cast<size_t>(R * kp)) sb.resize(static_cast<size_t>(R * kp));
  for (int64_t t = 0; t < nq_pad; ++t) {
    for (int64_t c = 0; c < D; c += 16) {
      const __m512 x = t < nq ? load16(q_rows + (t0 + t) * stride + c, first_lanes(16))
                              : _mm512_setzero_ps();
      _mm512_storeu_ps(qb.data() + t * D + c, x);
    }
  }
  for (int64_t tt = 0; tt < nq; tt += R) {
    const int64_t rows = std::min<int64_t>(R, nq - tt);
    const int64_t last = pos + t0 + tt + rows;  // keys of the tile's last query
    const float* qt = qb.data() + tt * D;
    // Scores of the tile's R queries, kKeyGroup keys at a time.
    for (int64_t j0 = 0; j0 < last; j0 += kKeyGroup) {
      __m512 acc[R][4];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        for (int g = 0; g < 4; ++g) acc[r][g] = _mm512_setzero_ps();
      }
      const float* kcol = kt + j0;
      for (int64_t c = 0; c < D; ++c) {
        const __m512 k0 = _mm512_loadu_ps(kcol + c * kp), k1 = _mm512_loadu_ps(kcol + c * kp + 16),
                     k2 = _mm512_loadu_ps(kcol + c * kp + 32), k3 = _mm512_loadu_ps(kcol + c * kp + 48);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m512 x = _mm512_set1_ps(qt[r * D + c]);
          acc[r][0] = _mm512_fmadd_ps(k0, x, acc[r][0]);
          acc[r][1] = _mm512_fmadd_ps(k1, x, acc[r][1]);
          acc[r][2] = _mm512_fmadd_ps(k2, x, acc[r][2]);
          acc[r][3] = _mm512_fmadd_ps(k3, x, acc[r][3]);
        }
      }
      const __m512 s = _mm512_set1_ps(scale);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        for (int g = 0; g < 4; ++g) {
          _mm512_storeu_ps(sb.data() + r * kp + j0 + 16 * g, _mm512_mul_ps(acc[r][g], s));
        }
      }
    }
    // Row softmax over each query's own prefix; zero probability past it, up to `last`.
    for (int64_t r = 0; r < rows; ++r) {
      float* p = sb.data() + r * kp;
      const int64_t len = pos + t0 + tt + r + 1;
      softmax_in_place(p, len);
      for (int64_t j = len; j < last; ++j) p[j] = 0.0f;
    }
    for (int64_t r = rows; r < R; ++r) std::fill(sb.data() + r * kp, sb.data() + r * kp + last, 0.0f);
    // out = p v for the tile's queries, all D columns at once.
    __m512 acc[R][DV];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      for (int g = 0; g < DV; ++g) acc[r][g] = _mm512_setzero_ps();
    }
    for (int64_t j = 0; j < last; ++j) {
      __m512 vv[DV];
#pragma GCC unroll 16
      for (int g = 0; g < DV; ++g) vv[g] = _mm512_loadu_ps(v + j * D + 16 * g);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512 x = _mm512_set1_ps(sb[static_cast<size_t>(r * kp + j)]);
#pragma GCC unroll 16
        for (int g = 0; g < DV; ++g) acc[r][g] = _mm512_fmadd_ps(vv[g], x, acc[r][g]);
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      T* dst = out + (t0 + tt + r) * ostride;
      alignas(64) float o[D];
      for (int g = 0; g < DV; ++g) _mm512_store_ps(o + 16 * g, acc[r][g]);
      for (int64_t c = 0; c < D; ++c) store(dst, c, o[c]);
    }
  }
}

// attend_block_head for `heads` query heads of one kv head (contiguous, D apart in q and out
// rows): kc, vc are the (slot, kv head) cache rows, transposed and widened once for all.
template <int DV, int R, class T>
void attend_block(const T* q_rows, int64_t stride, const T* kc, const T* vc, T* out,
                  int64_t ostride, int64_t pos, int64_t t0, int64_t t1, float scale,
                  int64_t heads) {
  constexpr int64_t D = 16 * DV;
  const int64_t keys = pos + t1, kp = round_up(keys, kKeyGroup);
  static thread_local std::vector<float> kt, vb;
  if (kt.size() < static_cast<size_t>(D * kp)) kt.resize(static_cast<size_t>(D * kp));
  // kt[c][j] = k_j[c] for j < keys, zeros up to kp.
  for (int64_t j0 = 0; j0 < kp; j0 += 16) {
    for (int64_t c0 = 0; c0 < D; c0 += 16) {
      __m512 r[16];
      for (int64_t i = 0; i < 16; ++i) {
        r[i] = j0 + i < keys ? load16(kc + (j0 + i) * D + c0, first_lanes(16)) : _mm512_setzero_ps();
      }
      transpose16(r);
      for (int64_t c = 0; c < 16; ++c) _mm512_storeu_ps(kt.data() + (c0 + c) * kp + j0, r[c]);
    }
  }
  const float* v = nullptr;
  if constexpr (std::is_same_v<T, float>) {
    v = vc;
  } else {
    if (vb.size() < static_cast<size_t>(keys * D)) vb.resize(static_cast<size_t>(keys * D));
    for (int64_t j = 0; j < keys * D; j += 16) {
      _mm512_storeu_ps(vb.data() + j, load16(vc + j, first_lanes(16)));
    }
    v = vb.data();
  }
  for (int64_t head = 0; head < heads; ++head) {
    attend_block_head<DV, R>(q_rows + head * D, stride, kt.data(), kp, v, out + head * D, ostride,
                             pos, t0, t1, scale);
  }
}

// The block kernel for head size d, or null where it has none (d not 16, 32, 64 or 128).
template <class T>
using BlockKernel = void (*)(const T*, int64_t, const T*, const T*, T*, int64_t, int64_t,
                             int64_t, int64_t, float, int64_t);
template <class T>
BlockKernel<T> block_kernel(int64_t d) {
  switch (d) {
    case 16: return attend_block<1, 6, T>;
    case 32: return attend_block<2, 6, T>;
    case 64: return attend_block<4, 6, T>;
    case 128: return attend_block<8, 2, T>;
    default: return nullptr;
  }
}

// Lane i of the result: the sum of x[i]'s lanes (16 dot products' partial sums at once, in
// half transpose16's shuffles).
[[gnu::always_inline]] inline __m512 reduce16(__m512 x[16]) {
  __m512 y[8], z[4];
  for (int k = 0; k < 8; ++k) {
    y[k] = _mm512_add_ps(_mm512_unpacklo_ps(x[2 * k], x[2 * k + 1]),
                         _mm512_unpackhi_ps(x[2 * k], x[2 * k + 1]));
  }
  // z[k], each 128-bit lane: the sums there of x[4k], x[4k+1], x[4k+2], x[4k+3].
  for (int k = 0; k < 4; ++k) {
    z[k] = _mm512_add_ps(_mm512_shuffle_ps(y[2 * k], y[2 * k + 1], 0x44),
                         _mm512_shuffle_ps(y[2 * k], y[2 * k + 1], 0xEE));
  }
  const __m512 v0 = _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], 0x44),
                                  _mm512_shuffle_f32x4(z[0], z[1], 0xEE));
  const __m512 v1 = _mm512_add_ps(_mm512_shuffle_f32x4(z[2], z[3], 0x44),
                                  _mm512_shuffle_f32x4(z[2], z[3], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, 0x88), _mm512_shuffle_f32x4(v0, v1, 0xDD));
}

// attend_row_group with AVX-512, D = 16 DV: one decode row, `heads` query heads of one kv
// head over `len` cache rows, the cache streamed once. Keys, then values, go by blocks of 16
// rows that stay in L1 for every head (widened to f32 once where bf16 or a partial block):
// a head's 16 scores from 16 dot products and one reduce16, then out = p v with the head's
// D accumulators in registers across the block. Measured on one thread of a loaded 2-core
// host, a decode row of 32 query heads of 128 at position 4095: 8 kv heads 1.5-1.6 ms in bf16
// (2.6-3.2 in f32), against 4.6-4.9 (6.0-6.9) for 32 (attend_row, at ~20 GB/s in f32).
constexpr int64_t kGroupKeys = 16;

template <int DV, class T>
void attend_group_row(const T* src, const T* kc, const T* vc, T* dst, int64_t len,
                      int64_t heads, float scale) {
  constexpr int64_t D = 16 * DV, KB = kGroupKeys;  // one reduce16 of scores per block
  const int64_t lp = round_up(len, KB);
  static thread_local std::vector<float> qs, sc, acc;
  if (qs.size() < static_cast<size_t>(heads * D)) qs.resize(static_cast<size_t>(heads * D));
  if (sc.size() < static_cast<size_t>(heads * lp)) sc.resize(static_cast<size_t>(heads * lp));
  acc.assign(static_cast<size_t>(heads * D), 0.0f);
  for (int64_t j = 0; j < heads * D; j += 16) {
    _mm512_storeu_ps(qs.data() + j, load16(src + j, first_lanes(16)));
  }
  alignas(64) float blk[KB * D];
  // Rows j0 .. j0 + KB of the (slot, kv head) cache `c` as f32, zeros past len.
  auto block = [&](const T* c, int64_t j0) -> const float* {
    if constexpr (std::is_same_v<T, float>) {
      if (j0 + KB <= len) return c + j0 * D;
    }
    for (int64_t i = 0; i < KB; ++i) {
      for (int g = 0; g < DV; ++g) {
        _mm512_store_ps(blk + i * D + 16 * g,
                        j0 + i < len ? load16(c + (j0 + i) * D + 16 * g, first_lanes(16))
                                     : _mm512_setzero_ps());
      }
    }
    return blk;
  };
  // The next block's cache lines are requested a few at a time between the heads' work on
  // this one (all at once they would queue on the core's few line-fill buffers).
  const char* pf_at = nullptr;
  const char* pf_stop = nullptr;
  int64_t pf_step = 0;
  auto prefetch_next = [&](const T* c, int64_t j0) {
    pf_at = reinterpret_cast<const char*>(c + std::min(len, j0 + KB) * D);
    pf_stop = reinterpret_cast<const char*>(c + std::min(len, j0 + 2 * KB) * D);
    pf_step = ((pf_stop - pf_at) / 64 + heads - 1) / heads;
  };
  auto prefetch_some = [&] {
    for (int64_t i = 0; i < pf_step && pf_at < pf_stop; ++i, pf_at += 64) {
      _mm_prefetch(pf_at, _MM_HINT_T0);
    }
  };
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t j0 = 0; j0 < len; j0 += KB) {
    const float* k = block(kc, j0);
    prefetch_next(kc, j0);
    for (int64_t r = 0; r < heads; ++r) {
      prefetch_some();
      const float* q = qs.data() + r * D;
      __m512 dot[KB];
      const __m512 q0 = _mm512_loadu_ps(q);
#pragma GCC unroll 16
      for (int i = 0; i < KB; ++i) dot[i] = _mm512_mul_ps(q0, _mm512_loadu_ps(k + i * D));
      for (int g = 1; g < DV; ++g) {
        const __m512 qg = _mm512_loadu_ps(q + 16 * g);
#pragma GCC unroll 16
        for (int i = 0; i < KB; ++i) {
          dot[i] = _mm512_fmadd_ps(qg, _mm512_loadu_ps(k + i * D + 16 * g), dot[i]);
        }
      }
      _mm512_storeu_ps(sc.data() + r * lp + j0, _mm512_mul_ps(reduce16(dot), vscale));
    }
  }
  prefetch_next(vc, -KB);  // the first block of values, during the softmax
  for (int64_t r = 0; r < heads; ++r) {
    prefetch_some();
    softmax_in_place(sc.data() + r * lp, len);
  }
  for (int64_t j0 = 0; j0 < len; j0 += KB) {
    const float* v = block(vc, j0);
    const int64_t n = std::min(KB, len - j0);
    prefetch_next(vc, j0);
    for (int64_t r = 0; r < heads; ++r) {
      prefetch_some();
      float* a = acc.data() + r * D;
      const float* p = sc.data() + r * lp + j0;
      __m512 o[DV];
#pragma GCC unroll 16
      for (int g = 0; g < DV; ++g) o[g] = _mm512_loadu_ps(a + 16 * g);
      for (int64_t j = 0; j < n; ++j) {
        const __m512 w = _mm512_set1_ps(p[j]);
#pragma GCC unroll 16
        for (int g = 0; g < DV; ++g) {
          o[g] = _mm512_fmadd_ps(_mm512_loadu_ps(v + j * D + 16 * g), w, o[g]);
        }
      }
#pragma GCC unroll 16
      for (int g = 0; g < DV; ++g) _mm512_storeu_ps(a + 16 * g, o[g]);
    }
  }
  for (int64_t j = 0; j < heads * D; ++j) store(dst, j, acc[static_cast<size_t>(j)]);
}

template <class T>
using GroupRowKernel = void (*)(const T*, const T*, const T*, T*, int64_t, int64_t, float);
template <class T>
GroupRowKernel<T> group_row_kernel(int64_t d) {
  switch (d) {
    case 16: return attend_group_row<1, T>;
    case 32: return attend_group_row<2, T>;
    case 64: return attend_group_row<4, T>;
    case 128: return attend_group_row<8, T>;
    default: return nullptr;
  }
}
#endif

}  // namespace

void attention_kv_cache(Tensor out, Tensor qkv, Tensor k_cache, Tensor v_cache, Tensor rows) {
  expect(qkv.ndim == 2 && k_cache.ndim == 4 && v_cache.ndim == 4 && rows.ndim == 2 &&
             rows.dim(1) == 2 && rows.dtype == DType::i32,
         "attention_kv_cache: qkv [N, G*(R+2)*D], caches [slots, G, P, D], rows i32 [N, 2]");
  expect(k_cache.dtype == qkv.dtype && v_cache.dtype == qkv.dtype && out.dtype == qkv.dtype,
         "attention_kv_cache: one compute dtype");
  const int64_t n = qkv.dim(0), slots = k_cache.dim(0), g = k_cache.dim(1), p = k_cache.dim(2),
                d = k_cache.dim(3);
  expect(rows.dim(0) == n && v_cache.numel() == k_cache.numel() && g > 0 && d > 0,
         "attention_kv_cache: sizes");
  if (n == 0) return;
  // H query heads from out's width; each kv head serves `rep` = R of them.
  const int64_t h = out.numel() / (n * d), rep = h / g, w = (h + 2 * g) * d;
  expect(out.numel() == n * h * d && rep * g == h && qkv.dim(1) == w,
         "attention_kv_cache: out [N, H*D], qkv width (H + 2G)*D, G divides H");
  const int32_t* r = rows.as<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    expect(r[2 * i] >= 0 && r[2 * i] < slots && r[2 * i + 1] >= 0 && r[2 * i + 1] < p,
           "attention_kv_cache: row slot or position outside the cache");
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const std::vector<Run> runs = runs_of(r, n);
  dispatch_float(qkv.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* pqkv = qkv.as<T>();
    T* kc = k_cache.as<T>();
    T* vc = v_cache.as<T>();
    T* po = out.as<T>();
    auto cache_row = [&](int64_t slot, int64_t kv, int64_t pos) {
      return ((slot * g + kv) * p + pos) * d;
    };
    // Row i's group kv: its first query head (then rep - 1 more, d apart), key, value.
    auto q_of = [&](int64_t i, int64_t kv) { return pqkv + i * w + kv * (rep + 2) * d; };
    // Tasks: (run, query block) of the long runs, most keys first, then single rows; each
    // for every kv head, with all its query heads.
    struct Task {
      int64_t run, t0, t1;  // t1 < 0: the single row `run` of the step
    };
    std::vector<Task> tasks;
#ifdef JUMBO_AVX512
    const BlockKernel<T> block = block_kernel<T>(d);
    const GroupRowKernel<T> group_row = group_row_kernel<T>(d);
#else
    const bool block = false, group_row = false;
#endif
    for (size_t k = 0; k < runs.size(); ++k) {
      const Run& run = runs[k];
      if (block && run.len >= kMinRun) {
        for (int64_t t0 = 0; t0 < run.len; t0 += kQueryBlock) {
          tasks.push_back({static_cast<int64_t>(k), t0, std::min(run.len, t0 + kQueryBlock)});
        }
      } else {
        for (int64_t i = run.row; i < run.row + run.len; ++i) tasks.push_back({i, 0, -1});
      }
    }
    auto keys_of = [&](const Task& t) {
      return t.t1 < 0 ? r[2 * t.run + 1] + 1 : runs[static_cast<size_t>(t.run)].pos + t.t1;
    };
    std::stable_sort(tasks.begin(), tasks.end(), [&](const Task& a, const Task& b) {
      return (a.t1 >= 0) > (b.t1 >= 0) || ((a.t1 >= 0) == (b.t1 >= 0) && keys_of(a) > keys_of(b));
    });
    const int64_t count = static_cast<int64_t>(tasks.size());
#pragma omp parallel
    {
      // Every row's keys and values first (the loop's barrier): a prefill's rows attend to each
      // other.
#pragma omp for collapse(2)
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t kv = 0; kv < g; ++kv) {
          const T* src = q_of(i, kv) + rep * d;
          const int64_t at = cache_row(r[2 * i], kv, r[2 * i + 1]);
          for (int64_t j = 0; j < d; ++j) {
            kc[at + j] = src[j];
            vc[at + j] = src[d + j];
          }
        }
      }
#pragma omp for collapse(2) schedule(dynamic, 1)
      for (int64_t k = 0; k < count; ++k) {
        for (int64_t kv = 0; kv < g; ++kv) {
          const Task& t = tasks[static_cast<size_t>(k)];
          if (t.t1 < 0) {
            const int64_t i = t.run, len = r[2 * i + 1] + 1;
            const T* kr = kc + cache_row(r[2 * i], kv, 0);
            const T* vr = vc + cache_row(r[2 * i], kv, 0);
            T* dst = po + (i * h + kv * rep) * d;
            if (rep == 1) {
              attend_row(q_of(i, kv), kr, vr, dst, len, d, scale);
            } else if (group_row) {
#ifdef JUMBO_AVX512
              group_row(q_of(i, kv), kr, vr, dst, len, rep, scale);
#endif
            } else {
              attend_row_group(q_of(i, kv), kr, vr, dst, len, d, rep, scale);
            }
            continue;
          }
#ifdef JUMBO_AVX512
          const Run& run = runs[static_cast<size_t>(t.run)];
          block(q_of(run.row, kv), w, kc + cache_row(run.slot, kv, 0),
                vc + cache_row(run.slot, kv, 0), po + (run.row * h + kv * rep) * d, h * d,
                run.pos, t.t0, t.t1, scale, rep);
#endif
        }
      }
    }
  });
}

}  // namespace jumbo::cpu
