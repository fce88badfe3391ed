// GPT sampler. Sample p covers tokens [p * seq_len, p * seq_len + seq_len + 1). Within each
// epoch, position -> sample is a keyed Feistel permutation of [0, n): a balanced Feistel network
// on 2h bits (2^2h >= n) is a bijection of [0, 2^2h); applying it again while the result is
// >= n ("cycle walking") restricts it to a bijection of [0, n). Since 2^2h < 4n, a lookup takes
// under four network evaluations on average. Definition: docs/data-format.md.
#include "jumbo/data/sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <stdexcept>

#include "jumbo/config/config.h"
#include "jumbo/config/hashing.h"

namespace jumbo {
namespace {

constexpr int kRounds = 6;

// Permutation of [0, 2^(2 * half_bits)) keyed by `key`.
uint64_t feistel(uint64_t x, uint64_t key, int half_bits) {
  const uint64_t mask = (uint64_t{1} << half_bits) - 1;
  uint64_t left = x >> half_bits, right = x & mask;
  for (int round = 0; round < kRounds; ++round) {
    const uint64_t f = splitmix64(key ^ splitmix64(right + (uint64_t(round) << 56))) & mask;
    const uint64_t next_right = left ^ f;
    left = right;
    right = next_right;
  }
  return (left << half_bits) | right;
}

}  // namespace

GptSampler::GptSampler(const IndexedDataset& data, int64_t seq_len, uint64_t seed,
                       SampleOrder order)
    : data_(data), seq_len_(seq_len), seed_(seed), shuffle_(order == SampleOrder::shuffled) {
  if (seq_len <= 0) {
    throw UserError(fmt::format("{}: context {} for sampling, expected a positive length",
                                data.prefix(), seq_len));
  }
  const uint64_t tokens = data.num_tokens();
  if (tokens < static_cast<uint64_t>(seq_len) + 1) {
    throw UserError(fmt::format("{}.bin: {} tokens, too few for one sample of {} (context {} + 1)",
                                data.prefix(), tokens, seq_len + 1, seq_len));
  }
  samples_per_epoch_ = static_cast<int64_t>((tokens - 1) / static_cast<uint64_t>(seq_len));
}

int64_t shuffled_position(int64_t position, int64_t items, uint64_t seed, uint64_t epoch) {
  const uint64_t n = static_cast<uint64_t>(items);
  if (n <= 1) return position;
  // Smallest h with 2^(2h) >= n, at least 1 so both halves have a bit.
  const int bits = std::bit_width(n - 1);
  const int half_bits = std::max(1, (bits + 1) / 2);
  const uint64_t key = splitmix64(seed ^ splitmix64(epoch ^ 0x6a756d626f5f6570ull));
  uint64_t x = static_cast<uint64_t>(position);
  do {
    x = feistel(x, key, half_bits);
  } while (x >= n);
  return static_cast<int64_t>(x);
}

int64_t GptSampler::permuted(int64_t index) const {
  if (index < 0) throw std::out_of_range(fmt::format("sample index {} is negative", index));
  const int64_t n = samples_per_epoch_;
  const int64_t epoch = index / n, position = index % n;
  if (!shuffle_) return position;
  return shuffled_position(position, n, seed_, static_cast<uint64_t>(epoch));
}

void GptSampler::window(int64_t index, int32_t* out) const {
  const uint64_t start = static_cast<uint64_t>(permuted(index)) * static_cast<uint64_t>(seq_len_);
  data_.read(start, static_cast<uint64_t>(seq_len_) + 1, out);
}

void GptSampler::sample(int64_t index, const SampleView& out) const {
  const uint64_t start = static_cast<uint64_t>(permuted(index)) * static_cast<uint64_t>(seq_len_);
  const auto seq = static_cast<uint64_t>(seq_len_);
  data_.read(start, seq, out.tokens);
  data_.read(start + 1, seq, out.targets);
  if (out.positions) {
    for (int64_t t = 0; t < seq_len_; ++t) out.positions[t] = static_cast<int32_t>(t);
  }
}

}  // namespace jumbo
