// Linear layers for the row counts of generation steps: a prefill chunk, or a step mixing a
// chunk with decode rows, tens to a few hundred rows. There OpenBLAS's sgemm packs the whole
// weight matrix on every call for little work per weight: measured on 2 cores (AVX-512, peak
// ~315 GFLOP/s), K 768 x N 2304, its SkylakeX kernels reach 215-265 GFLOP/s at 512 rows but
// 180 at 128, 160 at 64 and 60-90 at 29; and where OpenBLAS does not recognise the CPU (a
// virtual "Intel Xeon Processor") it runs its SSE3 kernels, ~63 GFLOP/s whatever the rows.
//
// This kernel reads the weights in place, [O, K] rows as they are: a micro-tile is 32 input
// rows x 12 weight rows, the input rows transposed once per call into [K, 32] panels (two
// vectors per k), each weight element broadcast to both: 24 accumulators, 24 FMAs per 2 vector
// loads and 12 broadcasts. The 12 x 256 weight slice of a pass stays in L1 for every panel of
// the chunk's rows (128 at a time, their panels in L2) while the first panel prefetches the
// next slice from memory; a tile's 12 columns leave through an in-register transpose to the
// output rows with the bias. Measured as above: ~200-240 GFLOP/s at 128 rows, 220-260 at 64,
// 180-240 at 29, and 190-200 over a step's cold weights (12 layers of GPT-2 small at 128
// rows, where sgemm gets 165). Every output element is one chain of FMAs over k in order, so
// a row's result does not depend on the other rows of the call.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "simd_avx512.h"

namespace jumbo::cpu {

#ifdef JUMBO_AVX512
namespace {

using namespace avx512;

constexpr int64_t kMR = 32;   // input rows per micro-tile (two vectors)
constexpr int64_t kNR = 12;   // weight rows (output columns) per micro-tile
constexpr int64_t kKC = 256;  // depth of a pass: 12 x 256 weights stay in L1 over the panels
constexpr int64_t kMC = 128;  // input rows per chunk: their panels stay in L2 over the weights

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// at[p][kk][r] = in[p * 32 + r][kk] for the m rows (zero rows past m): 32-row panels of k.
// Called inside a parallel region: its threads share the work.
void pack_panels(const float* in, int64_t m, int64_t k, float* at) {
  const int64_t panels = (m + kMR - 1) / kMR, kblocks = (k + 15) / 16;
#pragma omp for collapse(3) schedule(static)
  for (int64_t p = 0; p < panels; ++p) {
    for (int64_t kb = 0; kb < kblocks; ++kb) {
      for (int64_t half = 0; half < 2; ++half) {
        const int64_t k0 = kb * 16, kn = std::min<int64_t>(16, k - k0);
        const __mmask16 lanes = first_lanes(kn);
        __m512 r[16];
        for (int64_t i = 0; i < 16; ++i) {
          const int64_t row = p * kMR + half * 16 + i;
          r[i] = row < m ? load16(in + row * k + k0, lanes) : _mm512_setzero_ps();
        }
        transpose16(r);
        float* dst = at + p * k * kMR + k0 * kMR + half * 16;
        for (int64_t c = 0; c < kn; ++c) _mm512_storeu_ps(dst + c * kMR, r[c]);
      }
    }
  }
}

#define JUMBO_FOR12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

// tile[j][0..32) (+)= sum over kk < kc of panel[kk][0..32) * w[j * ldw + kk], j < 12. With
// prefetch != 0 it also prefetches the weights the next pass reads, at w[j * ldw + prefetch
// + kk]: one line of each row per 16 k, so they arrive from memory while this pass computes.
[[gnu::always_inline]] inline void micro_tile(const float* panel, const float* w, int64_t ldw,
                                              int64_t kc, float* tile, int64_t ldt, bool first,
                                              int64_t prefetch) {
#define JUMBO_DECL(j) __m512 a##j, b##j;
  JUMBO_FOR12(JUMBO_DECL)
#undef JUMBO_DECL
  if (first) {
#define JUMBO_ZERO(j) a##j = _mm512_setzero_ps(), b##j = _mm512_setzero_ps();
    JUMBO_FOR12(JUMBO_ZERO)
#undef JUMBO_ZERO
  } else {
#define JUMBO_LOAD(j) \
  a##j = _mm512_loadu_ps(tile + j * ldt), b##j = _mm512_loadu_ps(tile + j * ldt + 16);
    JUMBO_FOR12(JUMBO_LOAD)
#undef JUMBO_LOAD
  }
#define JUMBO_ROW(j) const float* w##j = w + j * ldw;
  JUMBO_FOR12(JUMBO_ROW)
#undef JUMBO_ROW
  for (int64_t k0 = 0; k0 < kc; k0 += 16) {
    if (prefetch != 0) {
#define JUMBO_PREFETCH(j) _mm_prefetch(reinterpret_cast<const char*>(w##j + prefetch + k0), _MM_HINT_T0);
      JUMBO_FOR12(JUMBO_PREFETCH)
#undef JUMBO_PREFETCH
    }
    const int64_t k1 = std::min(kc, k0 + 16);
    for (int64_t kk = k0; kk < k1; ++kk) {
      const __m512 lo = _mm512_loadu_ps(panel + kk * kMR);
      const __m512 hi = _mm512_loadu_ps(panel + kk * kMR + 16);
#define JUMBO_FMA(j)                           \
  {                                            \
    const __m512 x = _mm512_set1_ps(w##j[kk]); \
    a##j = _mm512_fmadd_ps(lo, x, a##j);       \
    b##j = _mm512_fmadd_ps(hi, x, b##j);       \
  }
      JUMBO_FOR12(JUMBO_FMA)
#undef JUMBO_FMA
    }
  }
#define JUMBO_STORE(j) \
  _mm512_storeu_ps(tile + j * ldt, a##j), _mm512_storeu_ps(tile + j * ldt + 16, b##j);
  JUMBO_FOR12(JUMBO_STORE)
#undef JUMBO_STORE
}

#undef JUMBO_FOR12

[[gnu::always_inline]] inline void store_row(float* dst, __mmask16 lanes, __m512 v, int64_t) {
  _mm512_mask_storeu_ps(dst, lanes, v);
}
[[gnu::always_inline]] inline void store_row(bf16* dst, __mmask16, __m512 v, int64_t count) {
  alignas(64) float tmp[16];
  _mm512_store_ps(tmp, v);
  for (int64_t j = 0; j < count; ++j) store(dst, j, tmp[j]);
}

// out[m, o] = in[m, k] @ w[o, k]^T + bias, m <= kMC rows; at holds the panels.
template <class W, class O>
void chunk_linear(O* out, const float* in, const W* w, const float* bias, int64_t m, int64_t o,
                  int64_t k, float* at) {
  const int64_t panels = (m + kMR - 1) / kMR, mp = panels * kMR;
  const int64_t blocks = (o + kNR - 1) / kNR;
#pragma omp parallel
  {
    pack_panels(in, m, k, at);  // ends with the loop's barrier
    static thread_local std::vector<float> tile, wbuf;
    tile.resize(static_cast<size_t>(kNR * mp));
    wbuf.resize(static_cast<size_t>(kNR * kKC));
#pragma omp for schedule(static)
    for (int64_t nb = 0; nb < blocks; ++nb) {
      const int64_t n0 = nb * kNR, nv = std::min(kNR, o - n0);
      for (int64_t k0 = 0; k0 < k; k0 += kKC) {
        const int64_t kc = std::min(kKC, k - k0);
        const float* wp;
        int64_t ldw, prefetch = 0;
        if (std::is_same_v<W, float> && nv == kNR) {
          wp = reinterpret_cast<const float*>(w) + n0 * k + k0;
          ldw = k;
          // The next pass: this block's next kKC, or the next block's first (when it is whole).
          if (k0 + kKC < k) {
            prefetch = kKC;
          } else if (nb + 1 < blocks && o - n0 >= 2 * kNR) {
            prefetch = kNR * k - k0;
          }
        } else {  // bf16 weights, or the last block's rows past o: a widened, padded copy
          for (int64_t j = 0; j < kNR; ++j) {
            float* dst = wbuf.data() + j * kKC;
            if (j < nv) {
              const W* src = w + (n0 + j) * k + k0;
              for (int64_t kk = 0; kk < kc; kk += 16) {
                const __mmask16 lanes = first_lanes(kc - kk);
                _mm512_mask_storeu_ps(dst + kk, lanes, load16(src + kk, lanes));
              }
            } else {
              std::fill(dst, dst + kc, 0.0f);
            }
          }
          wp = wbuf.data();
          ldw = kKC;
        }
        for (int64_t p = 0; p < panels; ++p) {
          micro_tile(at + p * k * kMR + k0 * kMR, wp, ldw, kc, tile.data() + p * kMR, mp, k0 == 0,
                     p == 0 ? prefetch : 0);
        }
      }
      const __mmask16 lanes = first_lanes(nv);
      const __m512 b = bias ? _mm512_maskz_loadu_ps(lanes, bias + n0) : _mm512_setzero_ps();
      for (int64_t m0 = 0; m0 < m; m0 += 16) {
        __m512 r[16];
        for (int64_t j = 0; j < kNR; ++j) r[j] = _mm512_loadu_ps(tile.data() + j * mp + m0);
        for (int64_t j = kNR; j < 16; ++j) r[j] = _mm512_setzero_ps();
        transpose16(r);
        const int64_t rows = std::min<int64_t>(16, m - m0);
        for (int64_t i = 0; i < rows; ++i) {
          store_row(out + (m0 + i) * o + n0, lanes, _mm512_add_ps(r[i], b), nv);
        }
      }
    }
  }
}

}  // namespace
#endif

int64_t linear_rows_panel_floats(int64_t rows, int64_t k) {
#ifdef JUMBO_AVX512
  return round_up(std::min(rows, kMC), kMR) * k;
#else
  (void)rows;
  (void)k;
  return 0;
#endif
}

bool linear_fwd_rows(Scratch& s, Tensor out, const float* in, Tensor w, const float* bias) {
#ifdef JUMBO_AVX512
  const int64_t o = w.dim(0), k = w.dim(1), n = out.numel() / o;
  float* at = s.get(5, static_cast<size_t>(linear_rows_panel_floats(n, k)));
  dispatch_float(w.dtype, [&](auto wt) {
    dispatch_float(out.dtype, [&](auto ot) {
      using O = decltype(ot);
      for (int64_t m0 = 0; m0 < n; m0 += kMC) {
        chunk_linear(out.as<O>() + m0 * o, in + m0 * k, w.as<decltype(wt)>(), bias,
                     std::min(kMC, n - m0), o, k, at);
      }
    });
  });
  return true;
#else
  return false;
#endif
}

}  // namespace jumbo::cpu
