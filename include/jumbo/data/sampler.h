#pragma once
// GPT sampler: the token stream is cut into samples of seq_len + 1 tokens (inputs and shifted
// targets; consecutive samples share one token). Each epoch visits every sample once in an
// order that is a pseudorandom permutation keyed by (seed, epoch), computed per index by a
// Feistel network: no index array, so its memory does not grow with the dataset.
#include <cstdint>

#include "jumbo/data/indexed_dataset.h"

namespace jumbo {

// Training shuffles each epoch; evaluation reads the samples in stored order.
enum class SampleOrder { shuffled, stored };

// One sample's model inputs, seq_len each: the tokens, their targets (the next token, or
// kIgnoredTarget where the loss does not count it: a prompt, padding) and the tokens'
// positions (0, 1, ... in each sequence; packed examples restart at 0, and a token attends
// only to the tokens of its own sequence: t - position .. t).
constexpr int32_t kIgnoredTarget = -1;
struct SampleView {
  int32_t* tokens = nullptr;
  int32_t* targets = nullptr;
  int32_t* positions = nullptr;
};

// An endless sequence of samples, addressed by index: one dataset's sampler or a blend.
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual void sample(int64_t index, const SampleView& out) const = 0;
  // How many of sample `index`'s targets the loss counts (seq_len for text), without
  // reading its tokens: every rank sums a step's count from this alone.
  virtual int64_t loss_tokens(int64_t index) const = 0;
  // Whether samples hold prompt-completion examples (targets masked, positions restarting).
  virtual bool holds_examples() const = 0;
  // Samples in one epoch (the first, for sources whose epochs differ).
  virtual int64_t samples_per_epoch() const = 0;
};

// The pseudorandom position -> item map of one epoch of n items keyed by (seed, epoch).
int64_t shuffled_position(int64_t position, int64_t n, uint64_t seed, uint64_t epoch);

class GptSampler final : public SampleSource {
 public:
  // Throws UserError naming the dataset if it holds fewer than seq_len + 1 tokens.
  GptSampler(const IndexedDataset& data, int64_t seq_len, uint64_t seed,
             SampleOrder order = SampleOrder::shuffled);
  int64_t samples_per_epoch() const override { return samples_per_epoch_; }
  // The sample at position `index` of the endless sequence of epochs: its seq_len + 1 tokens.
  void window(int64_t index, int32_t* out) const;
  // Tokens = the window's first seq_len, targets its last seq_len, positions 0 .. seq_len - 1.
  void sample(int64_t index, const SampleView& out) const override;
  int64_t loss_tokens(int64_t) const override { return seq_len_; }
  bool holds_examples() const override { return false; }
  // Which stored sample position `index` maps to (exposed for tests).
  int64_t permuted(int64_t index) const;

 private:
  const IndexedDataset& data_;
  int64_t seq_len_;
  uint64_t seed_;
  bool shuffle_;
  int64_t samples_per_epoch_;
};

}  // namespace jumbo
