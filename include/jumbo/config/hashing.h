#pragma once
// splitmix64's finaliser: consecutive inputs give unrelated outputs. The one counter hash of
// every keyed random choice (the sampler's shuffle, the tokenizer's sample, generation's
// picks). On the ground floor so that every room may use it.
#include <cstdint>
#include <string_view>

namespace jumbo {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// FNV-1a 64 (offset basis 0xcbf29ce484222325, prime 0x100000001b3), continuing from `h`: the
// fingerprint of a tokenizer's file and of a checkpoint's shard records.
inline uint64_t fnv1a64(std::string_view bytes, uint64_t h = 0xcbf29ce484222325ull) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace jumbo
