#include "jumbo/train/run_data.h"

#include <fmt/format.h>

#include "jumbo/data/chat_template.h"
#include "jumbo/data/example_sampler.h"
#include "jumbo/data/tokenizer.h"

namespace jumbo {
namespace {

// Datasets that record their tokenizer must all record the same one: names both files.
void check_same_tokenizer(const IndexedDataset& first, const IndexedDataset& other) {
  const DatasetHeader &a = first.header(), &b = other.header();
  if (a.tokenizer_fingerprint == 0 || b.tokenizer_fingerprint == 0) return;  // Megatron's
  if (a.vocab_size == b.vocab_size && a.tokenizer_fingerprint == b.tokenizer_fingerprint) return;
  throw UserError(fmt::format("{} and {} were made with different tokenizers: vocab {} "
                              "(fingerprint {}) and vocab {} (fingerprint {}); every dataset of "
                              "a run needs data.tokenizer's", first.prefix(), other.prefix(),
                              a.vocab_size, fingerprint_text(a.tokenizer_fingerprint), b.vocab_size,
                              fingerprint_text(b.tokenizer_fingerprint)));
}

}  // namespace

std::unique_ptr<SampleSource> make_sampler(const IndexedDataset& data, int64_t seq, uint64_t seed,
                                           SampleOrder order, bool packing) {
  if (data.kind() == DocumentKind::text) return std::make_unique<GptSampler>(data, seq, seed, order);
  return std::make_unique<ExampleSampler>(
      data, seq, seed, order, packing ? ExamplePacking::packed : ExamplePacking::padded);
}

RunData::RunData(const RunConfig& cfg, int64_t dp_rank)
    : train_mixture_(cfg.data.train),
      tokenizer_(cfg.data.tokenizer),
      seq_(cfg.model.context),
      packing_(cfg.data.packing) {
  if (!cfg.data.chat_template.empty()) {
    chat_template_text_ = load_chat_template(cfg.data.chat_template).text;
  }
  const Tokenizer tokenizer(cfg.data.tokenizer);
  if (tokenizer.vocab_size() > cfg.model.vocab) {
    throw UserError(fmt::format("{}: model.vocab = {} is smaller than the vocabulary of "
                                "data.tokenizer = {} ({} pieces)",
                                cfg.source, cfg.model.vocab, cfg.data.tokenizer,
                                tokenizer.vocab_size()));
  }
  const IndexedDataset* first = nullptr;
  auto open = [&](const std::string& prefix) {
    auto data = std::make_unique<IndexedDataset>(prefix);
    if (first) check_same_tokenizer(*first, *data);
    else first = data.get();
    data->check_tokenizer(tokenizer.vocab_size(), tokenizer.fingerprint(), tokenizer.path());
    return data;
  };
  const int64_t mb = cfg.parallel.micro_batch, dp = cfg.parallel.dp;
  // Dataset i of the blend shuffles with seed + i: one dataset samples as it always has.
  std::vector<std::unique_ptr<SampleSource>> samplers;
  std::vector<double> weights;
  for (size_t i = 0; i < train_mixture_.datasets.size(); ++i) {
    const DatasetWeight& d = train_mixture_.datasets[i];
    train_data_.push_back(open(d.prefix));
    samplers.push_back(make_sampler(*train_data_.back(), seq_, cfg.train.seed + i,
                                    SampleOrder::shuffled, cfg.data.packing));
    weights.push_back(d.weight);
  }
  train_sampler_ = std::make_unique<BlendedSampler>(std::move(samplers), weights);
  train_batches_ = std::make_unique<DatasetBatches>(*train_sampler_, mb, seq_, dp_rank, dp);

  double total = 0;
  for (const DatasetWeight& d : cfg.data.valid.datasets) total += d.weight;
  for (size_t i = 0; i < cfg.data.valid.datasets.size(); ++i) {
    ValidSet v;
    v.name = cfg.data.valid.name(i);
    v.weight = cfg.data.valid.datasets[i].weight / total;
    v.data = open(cfg.data.valid.datasets[i].prefix);
    v.sampler = make_sampler(*v.data, seq_, cfg.train.seed, SampleOrder::stored, cfg.data.packing);
    v.batches = std::make_unique<DatasetBatches>(*v.sampler, mb, seq_, dp_rank, dp);
    valid_.push_back(std::move(v));
  }
}

std::string RunData::describe() const {
  double total = 0;
  for (const DatasetWeight& d : train_mixture_.datasets) total += d.weight;
  std::string sets;
  for (size_t i = 0; i < train_data_.size(); ++i) {
    const IndexedDataset& d = *train_data_[i];
    const std::string share =
        train_data_.size() > 1 ? fmt::format("{:.1f}% ", 100 * train_mixture_.datasets[i].weight / total) : "";
    const std::string format =
        d.format() == DatasetFormat::jumbo ? "" : fmt::format("{}, ", to_string(d.format()));
    const std::string samples =
        d.kind() == DocumentKind::text
            ? fmt::format("{} samples of {}", train_sampler_->sampler(i).samples_per_epoch(), seq_ + 1)
            : fmt::format("{} examples in {} samples of {}{}", d.num_docs(),
                          train_sampler_->sampler(i).samples_per_epoch(), seq_,
                          packing_ ? ", packed" : ", padded");
    sets += fmt::format("{}{}{} ({}{} tokens, {})", i ? ", " : "", share, d.prefix(), format,
                        d.num_tokens(), samples);
  }
  return fmt::format("data: {}, tokenizer {}", sets, tokenizer_);
}

}  // namespace jumbo
