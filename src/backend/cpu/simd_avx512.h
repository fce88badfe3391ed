#pragma once
// AVX-512 helpers shared by the hand-blocked CPU kernels (kernels_matmul_rows.cpp,
// kernels_attention_cache.cpp), defined with JUMBO_AVX512 when the compiler targets
// AVX-512 F, BW and VL (the build's -march=native on such a host); the kernels keep a
// portable path for other hosts.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define JUMBO_AVX512 1
#include <immintrin.h>

#include <cstdint>

#include "jumbo/backend/bf16.h"

// GCC 12's permute intrinsics pass _mm512_undefined_ps() (`__m512 __Y = __Y;`) as their
// unused merge source, and -Wmaybe-uninitialized reports it wherever they are inlined: in
// the including file, so this cannot be a push/pop around the header.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace jumbo::cpu::avx512 {

// r[i] = column i of the 16 x 16 matrix whose rows are r[0..15].
[[gnu::always_inline]] inline void transpose16(__m512 r[16]) {
  __m512 t[16], u[16], v[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 4; ++j) {
      v[8 * i + j] = _mm512_shuffle_f32x4(u[8 * i + j], u[8 * i + 4 + j], 0x88);
      v[8 * i + 4 + j] = _mm512_shuffle_f32x4(u[8 * i + j], u[8 * i + 4 + j], 0xDD);
    }
  }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(v[j], v[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_f32x4(v[j], v[8 + j], 0xDD);
  }
}

inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u);
}

// The lanes of `mask` of p[0..16) as floats, zeros elsewhere.
[[gnu::always_inline]] inline __m512 load16(const float* p, __mmask16 mask) {
  return _mm512_maskz_loadu_ps(mask, p);
}
[[gnu::always_inline]] inline __m512 load16(const bf16* p, __mmask16 mask) {
  const __m256i h = _mm256_maskz_loadu_epi16(mask, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

}  // namespace jumbo::cpu::avx512
#endif
