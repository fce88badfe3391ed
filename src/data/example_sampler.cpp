// Prompt-completion samples: a per-epoch packing of the shuffled examples (greedy, in order),
// kept as two small arrays per epoch reached. Layout of a sample: docs/data-format.md.
#include "jumbo/data/example_sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "jumbo/config/config.h"

namespace jumbo {

ExampleSampler::ExampleSampler(const IndexedDataset& data, int64_t seq_len, uint64_t seed,
                               SampleOrder order, ExamplePacking packing)
    : data_(data),
      seq_len_(seq_len),
      seed_(seed),
      shuffle_(order == SampleOrder::shuffled),
      packing_(packing) {
  if (data.kind() != DocumentKind::prompt_completion) {
    throw std::logic_error("ExampleSampler: a dataset of prompt-completion examples");
  }
  if (data.num_docs() == 0) {
    throw UserError(fmt::format("{}: no examples, expected at least one", data.prefix()));
  }
  for (uint64_t d = 0; d < data.num_docs(); ++d) {
    if (static_cast<int64_t>(data.doc_offset(d + 1) - data.doc_offset(d)) > seq_len) ++cut_examples_;
  }
  epochs_.push_back(pack_epoch(0, 0));
}

int64_t ExampleSampler::length(int64_t doc) const {
  const auto d = static_cast<uint64_t>(doc);
  return std::min<int64_t>(seq_len_, static_cast<int64_t>(data_.doc_offset(d + 1) - data_.doc_offset(d)));
}

int64_t ExampleSampler::example_at(uint64_t epoch, int64_t position) const {
  const auto n = static_cast<int64_t>(data_.num_docs());
  return shuffle_ ? shuffled_position(position, n, seed_, epoch) : position;
}

ExampleSampler::Epoch ExampleSampler::pack_epoch(uint64_t epoch, int64_t start) const {
  Epoch e;
  e.start = start;
  e.number = epoch;
  const auto n = static_cast<int64_t>(data_.num_docs());
  int64_t used = 0, loss = 0;
  e.first.push_back(0);
  for (int64_t p = 0; p < n; ++p) {
    const int64_t doc = example_at(epoch, p), len = length(doc);
    const bool full = packing_ == ExamplePacking::padded ? p > 0 : used + len > seq_len_;
    if (full) {
      e.first.push_back(p);
      e.loss_tokens.push_back(static_cast<int32_t>(loss));
      used = loss = 0;
    }
    used += len;
    loss += std::max<int64_t>(0, len - static_cast<int64_t>(data_.doc_loss_start(static_cast<uint64_t>(doc))));
  }
  e.first.push_back(n);
  e.loss_tokens.push_back(static_cast<int32_t>(loss));
  return e;
}

const ExampleSampler::Epoch& ExampleSampler::epoch_of(int64_t index, int64_t& local) const {
  if (index < 0) throw std::out_of_range(fmt::format("sample index {} is negative", index));
  std::lock_guard<std::mutex> lock(mutex_);
  // Epochs differ in length (the packing of each shuffle): reach index's epoch in order.
  for (;;) {
    const Epoch& last = epochs_.back();
    const int64_t end = last.start + static_cast<int64_t>(last.loss_tokens.size());
    if (index < end) break;
    epochs_.push_back(pack_epoch(epochs_.size(), end));
  }
  const auto it = std::upper_bound(epochs_.begin(), epochs_.end(), index,
                                   [](int64_t i, const Epoch& e) { return i < e.start; });
  const Epoch& e = *(it - 1);
  local = index - e.start;
  return e;
}

int64_t ExampleSampler::samples_per_epoch() const {
  return static_cast<int64_t>(epochs_.front().loss_tokens.size());
}

int64_t ExampleSampler::loss_tokens(int64_t index) const {
  int64_t local = 0;
  return epoch_of(index, local).loss_tokens[static_cast<size_t>(local)];
}

void ExampleSampler::sample(int64_t index, const SampleView& out) const {
  int64_t local = 0;
  const Epoch& e = epoch_of(index, local);
  const uint64_t epoch = e.number;
  int64_t at = 0;
  int32_t eos = 0;
  for (int64_t p = e.first[static_cast<size_t>(local)]; p < e.first[static_cast<size_t>(local) + 1]; ++p) {
    const int64_t doc = example_at(epoch, p), len = length(doc);
    const auto d = static_cast<uint64_t>(doc);
    const uint64_t begin = data_.doc_offset(d), tokens = data_.doc_offset(d + 1) - begin;
    // Targets are the example's tokens; inputs the same shifted right behind its EOS.
    data_.read(begin, static_cast<uint64_t>(len), out.targets + at);
    data_.read(begin + tokens - 1, 1, &eos);
    out.tokens[at] = eos;
    std::copy(out.targets + at, out.targets + at + len - 1, out.tokens + at + 1);
    const auto loss_start = static_cast<int64_t>(data_.doc_loss_start(d));
    for (int64_t j = 0; j < len; ++j) {
      out.positions[at + j] = static_cast<int32_t>(j);
      if (j < loss_start) out.targets[at + j] = kIgnoredTarget;
    }
    at += len;
  }
  for (int64_t j = 0; at + j < seq_len_; ++j) {  // padding: a sequence of its own
    out.tokens[at + j] = eos;
    out.targets[at + j] = kIgnoredTarget;
    out.positions[at + j] = static_cast<int32_t>(j);
  }
}

}  // namespace jumbo
