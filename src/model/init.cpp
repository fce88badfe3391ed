#include "jumbo/model/init.h"

#include <cmath>

namespace jumbo {
namespace {

// Philox4x32-10 (Salmon et al., SC'11): a counter-based generator, 10 rounds.
struct Philox {
  static constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  static constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  static void round(uint32_t c[4], const uint32_t k[2]) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c[0] = hi1 ^ c[1] ^ k[0];
    c[1] = lo1;
    c[2] = hi0 ^ c[3] ^ k[1];
    c[3] = lo0;
  }
  static void generate(uint32_t c[4], uint32_t k[2]) {
    for (int r = 0; r < 10; ++r) {
      round(c, k);
      k[0] += kW0;
      k[1] += kW1;
    }
  }
};

uint64_t mix(uint64_t x) {  // splitmix64 finaliser: spreads seed and name into the key
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t name_hash(std::string_view name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

float counter_normal(uint64_t seed, uint64_t name_key, uint64_t index) {
  const uint64_t key = mix(seed ^ mix(name_key));
  uint32_t k[2] = {static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32)};
  uint32_t c[4] = {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0, 0};
  Philox::generate(c, k);
  // Box-Muller on two 32-bit uniforms in (0, 1].
  const double u1 = (static_cast<double>(c[0]) + 1.0) / 4294967296.0;
  const double u2 = static_cast<double>(c[1]) / 4294967296.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

int64_t Slice::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

void init_normal_slice(float* out, uint64_t seed, std::string_view name, const Slice& slice,
                       float std) {
  init_normal_range(out, seed, name, slice, std, 0, slice.numel());
}

void init_normal_range(float* out, uint64_t seed, std::string_view name, const Slice& slice,
                       float std, int64_t begin, int64_t count) {
  const uint64_t key = name_hash(name);
  if (slice.shape.size() == 1) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; ++i) {
      out[i] = std * counter_normal(seed, key, static_cast<uint64_t>(slice.offset[0] + begin + i));
    }
    return;
  }
  const int64_t cols = slice.global_shape[1], local_cols = slice.shape[1];
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const int64_t e = begin + i, r = e / local_cols, c = e % local_cols;
    const uint64_t index = static_cast<uint64_t>((slice.offset[0] + r) * cols + slice.offset[1] + c);
    out[i] = std * counter_normal(seed, key, index);
  }
}

}  // namespace jumbo
