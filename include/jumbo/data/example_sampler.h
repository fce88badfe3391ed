#pragma once
// Samples of prompt-completion examples (a dataset prepared with --format prompt-completion).
// Each example is one sequence: EOS (the start every document of pre-training had: the end of
// the one before), then its tokens but the last; its targets are its tokens, those before its
// loss start ignored, so the loss counts the completion and the EOS only. Positions restart
// at 0 per example and attention stays inside it.
//
// Packing (data.packing = true) puts consecutive examples of the epoch's shuffled order into
// one sample while they fit, the rest of a sample padding; without packing each sample holds
// one example and padding. Padding tokens are EOS with ignored targets, a sequence of their
// own. An example longer than the context is cut to it (its loss tokens past the cut lost).
// Either way a step trains on whole examples, and the same examples in the same order.
#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

#include "jumbo/data/indexed_dataset.h"
#include "jumbo/data/sampler.h"

namespace jumbo {

enum class ExamplePacking { packed, padded };

class ExampleSampler final : public SampleSource {
 public:
  // Throws UserError naming the dataset unless it holds prompt-completion examples.
  ExampleSampler(const IndexedDataset& data, int64_t seq_len, uint64_t seed, SampleOrder order,
                 ExamplePacking packing);
  void sample(int64_t index, const SampleView& out) const override;
  int64_t loss_tokens(int64_t index) const override;
  bool holds_examples() const override { return true; }
  int64_t samples_per_epoch() const override;
  // Examples longer than the context (cut), of the dataset's.
  int64_t cut_examples() const { return cut_examples_; }
  int64_t examples() const { return static_cast<int64_t>(data_.num_docs()); }

 private:
  // One epoch's samples: the first example (a position of the epoch's order) of each, and
  // each one's loss tokens; computed when first reached, each epoch from its own key.
  struct Epoch {
    std::vector<int64_t> first;  // size samples + 1: sample s holds order [first[s], first[s+1])
    std::vector<int32_t> loss_tokens;
    int64_t start = 0;           // global index of its first sample
    uint64_t number = 0;
  };
  const Epoch& epoch_of(int64_t index, int64_t& local) const;
  Epoch pack_epoch(uint64_t epoch, int64_t start) const;
  int64_t example_at(uint64_t epoch, int64_t position) const;
  int64_t length(int64_t doc) const;  // tokens the example takes in a sample (cut to seq)

  const IndexedDataset& data_;
  int64_t seq_len_;
  uint64_t seed_;
  bool shuffle_;
  ExamplePacking packing_;
  int64_t cut_examples_ = 0;
  mutable std::mutex mutex_;
  mutable std::deque<Epoch> epochs_;  // a deque: references stay valid as epochs are added
};

}  // namespace jumbo
