#pragma once
// splitmix64's finaliser: consecutive inputs give unrelated outputs. The one counter hash of
// every keyed random choice (the sampler's shuffle, the tokenizer's sample, generation's
// picks). On the ground floor so that every room may use it.
#include <cstdint>

namespace jumbo {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace jumbo
