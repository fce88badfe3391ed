#pragma once
// Inverted dropout's mask, counter-based (as the initialisation is, model/init.h): element
// (r, c) of a [rows, cols] tensor that holds columns [col_offset, col_offset + cols) of a
// logical [rows, cols_total] one is kept with probability 1 - p, decided by a hash of (seed,
// r x cols_total + col_offset + c) alone. So a tensor-parallel rank's column slice gets the
// slice of one logical mask, the backward recomputes the forward's mask instead of storing
// it, and the CPU and CUDA backends draw the same bits. Header-only for both compilers.
#include <cstdint>

#if defined(__CUDACC__)
#define JUMBO_HOST_DEVICE __host__ __device__
#else
#define JUMBO_HOST_DEVICE
#endif

namespace jumbo {

struct DropoutMask {
  uint64_t seed = 0;
  float p = 0;             // the probability to drop, in [0, 1)
  int64_t col_offset = 0;  // this tensor's first column in the logical tensor
  int64_t cols_total = 0;  // the logical tensor's columns; 0: this tensor's own
};

// SplitMix64's finaliser: a bijection of 64 bits that mixes every bit into every other.
JUMBO_HOST_DEVICE inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// A seed for a part of a computation (a step, a microbatch, a layer, a map) from its parent's.
JUMBO_HOST_DEVICE inline uint64_t derive_seed(uint64_t parent, uint64_t part) {
  return mix64(parent ^ mix64(part));
}
// Whether the element at `index` of the logical tensor is kept: 24 hashed bits as a uniform
// u in [0, 1), kept when u >= p.
JUMBO_HOST_DEVICE inline bool dropout_keeps(uint64_t seed, uint64_t index, float p) {
  const uint64_t h = derive_seed(seed, index);
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f) >= p;
}

}  // namespace jumbo
