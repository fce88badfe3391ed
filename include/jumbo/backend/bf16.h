#pragma once
// bfloat16 storage for the CPU backend: fp32 with the low 16 bits dropped after
// round-to-nearest-even. No hardware arithmetic: kernels load to fp32 and compute there.
#include <cstdint>
#include <cstring>

namespace jumbo {

struct bf16 {
  uint16_t bits;
};

inline float bf16_to_f32(bf16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16 f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) {
    return bf16{static_cast<uint16_t>((u >> 16) | 0x40u)};  // NaN stays a quiet NaN
  }
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);  // ties to even
  return bf16{static_cast<uint16_t>((u + rounding) >> 16)};
}

// Uniform load/store so kernels can be templated on the storage type.
inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const bf16* p, int64_t i) { return bf16_to_f32(p[i]); }
inline void store(float* p, int64_t i, float v) { p[i] = v; }
inline void store(bf16* p, int64_t i, float v) { p[i] = f32_to_bf16(v); }

}  // namespace jumbo
