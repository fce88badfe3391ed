#pragma once
// A run's data: the tokenizer checked against the model and every dataset, the training and
// validation sets with their samplers, and this data-parallel rank's microbatches of each.
// Built before the model, so a mismatch fails before gigabytes are allocated.
#include <cstdint>
#include <memory>
#include <string>

#include "jumbo/config/config.h"
#include "jumbo/data/indexed_dataset.h"
#include "jumbo/data/sampler.h"
#include "jumbo/train/batch.h"

namespace jumbo {

class RunData {
 public:
  // Throws UserError naming the file on a missing or mismatched dataset or tokenizer.
  RunData(const RunConfig& cfg, int64_t dp_rank);
  DatasetBatches& train() { return *train_batches_; }
  bool has_valid() const { return valid_batches_ != nullptr; }
  DatasetBatches& valid() { return *valid_batches_; }
  // "data: PREFIX (N tokens, M samples of S), tokenizer T"
  std::string describe() const;

 private:
  std::string train_prefix_, tokenizer_;
  int64_t seq_;
  std::unique_ptr<IndexedDataset> train_data_, valid_data_;
  std::unique_ptr<GptSampler> train_sampler_, valid_sampler_;
  std::unique_ptr<DatasetBatches> train_batches_, valid_batches_;
};

}  // namespace jumbo
