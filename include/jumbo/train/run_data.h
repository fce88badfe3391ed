#pragma once
// A run's data: the tokenizer checked against the model and every dataset, the training blend
// of data.train with its sampler, the named validation sets of data.valid, and this
// data-parallel rank's microbatches of each. Built before the model, so a mismatch fails
// before gigabytes are allocated.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "jumbo/config/config.h"
#include "jumbo/data/blend.h"
#include "jumbo/data/indexed_dataset.h"
#include "jumbo/data/sampler.h"
#include "jumbo/train/batch.h"

namespace jumbo {

// One validation set of data.valid: its name in the metrics (val_loss.NAME), its weight in the
// mean, and this rank's microbatches of it in stored order.
struct ValidSet {
  std::string name;
  double weight = 1;  // normalised over data.valid
  std::unique_ptr<IndexedDataset> data;
  std::unique_ptr<SampleSource> sampler;
  std::unique_ptr<DatasetBatches> batches;
};

// A dataset's sampler: text windows (GptSampler) or prompt-completion examples
// (ExampleSampler), packed or padded (data.packing).
std::unique_ptr<SampleSource> make_sampler(const IndexedDataset& data, int64_t seq, uint64_t seed,
                                           SampleOrder order, bool packing);

class RunData {
 public:
  // Throws UserError naming the file on a missing or mismatched dataset or tokenizer, and
  // both files when two datasets were made with different tokenizers.
  RunData(const RunConfig& cfg, int64_t dp_rank);
  DatasetBatches& train() { return *train_batches_; }
  std::vector<ValidSet>& valid() { return valid_; }
  // "data: PREFIX (N tokens, M samples of S), tokenizer T", one part per blended dataset.
  std::string describe() const;

  // data.chat_template's stored text (TOML, or a Jinja template's JSON; checked when the run
  // starts), or "".
  const std::string& chat_template_text() const { return chat_template_text_; }

 private:
  DataMixture train_mixture_;
  std::string tokenizer_;
  std::string chat_template_text_;
  int64_t seq_;
  bool packing_;
  std::vector<std::unique_ptr<IndexedDataset>> train_data_;
  std::unique_ptr<BlendedSampler> train_sampler_;
  std::unique_ptr<DatasetBatches> train_batches_;
  std::vector<ValidSet> valid_;
};

}  // namespace jumbo
