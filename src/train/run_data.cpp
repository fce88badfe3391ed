#include "jumbo/train/run_data.h"

#include <fmt/format.h>

#include "jumbo/data/tokenizer.h"

namespace jumbo {

RunData::RunData(const RunConfig& cfg, int64_t dp_rank)
    : train_prefix_(cfg.data.train), tokenizer_(cfg.data.tokenizer), seq_(cfg.model.context) {
  const Tokenizer tokenizer(cfg.data.tokenizer);
  if (tokenizer.vocab_size() > cfg.model.vocab) {
    throw UserError(fmt::format("{}: model.vocab = {} is smaller than the vocabulary of "
                                "data.tokenizer = {} ({} pieces)",
                                cfg.source, cfg.model.vocab, cfg.data.tokenizer,
                                tokenizer.vocab_size()));
  }
  const int64_t mb = cfg.parallel.micro_batch, dp = cfg.parallel.dp;
  train_data_ = std::make_unique<IndexedDataset>(cfg.data.train);
  train_data_->check_tokenizer(tokenizer.vocab_size(), tokenizer.fingerprint(), tokenizer.path());
  train_sampler_ = std::make_unique<GptSampler>(*train_data_, seq_, cfg.train.seed);
  train_batches_ = std::make_unique<DatasetBatches>(*train_sampler_, mb, seq_, dp_rank, dp);
  if (cfg.data.valid.empty()) return;
  valid_data_ = std::make_unique<IndexedDataset>(cfg.data.valid);
  valid_data_->check_tokenizer(tokenizer.vocab_size(), tokenizer.fingerprint(), tokenizer.path());
  valid_sampler_ =
      std::make_unique<GptSampler>(*valid_data_, seq_, cfg.train.seed, SampleOrder::stored);
  valid_batches_ = std::make_unique<DatasetBatches>(*valid_sampler_, mb, seq_, dp_rank, dp);
}

std::string RunData::describe() const {
  return fmt::format("data: {} ({} tokens, {} samples of {}), tokenizer {}", train_prefix_,
                     train_data_->num_tokens(), train_sampler_->samples_per_epoch(), seq_ + 1,
                     tokenizer_);
}

}  // namespace jumbo
