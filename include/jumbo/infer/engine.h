#pragma once
// GenerationEngine: one model replica loaded for generation over its tp x pp ranks. Every
// step is collective over the world: world rank 0 decides the step (the rows and how each
// sampled row is sampled) and broadcasts it; each stage runs its decoder and passes the rows'
// hidden states to the next; the last stage gathers the sampled rows' logits over tp, its tp
// rank 0 picks the tokens and broadcasts them to every rank. So tp splits heads, the MLP and
// the vocabulary as in training, and pp passes each decode step through the stages.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"
#include "jumbo/infer/checkpoint_weights.h"
#include "jumbo/infer/sampling.h"
#include "jumbo/model/stage.h"
#include "jumbo/parallel/rank_stage.h"

namespace jumbo {

struct EngineOptions {
  int64_t tp = 1, pp = 1;  // the world must be exactly tp x pp ranks (one replica)
  Precision precision = Precision::fp32;
  DecodeShape shape;
  // Tokens a pick may choose: the tokenizer's vocabulary (model.vocab may be larger; its
  // extra rows never occur in the data). 0 = model.vocab.
  int64_t sampled_vocab = 0;
};

// One sampled row of a step: which row, and how to pick its token.
// A row whose `target` is set is scored, not sampled: its pick is that token with the model's
// log-probability (a prompt token, for OpenAI's echo with logprobs).
struct SampledRow {
  int32_t row = 0;
  SamplingParams sampling;
  uint64_t stream = 0;  // which completion (sampling.h)
  int64_t index = 0;    // the token's index in its completion (0 starts the slot's history)
  int32_t target = -1;  // >= 0: score this token instead of picking one
};

struct EngineStep {
  std::vector<DecodeRow> rows;
  std::vector<SampledRow> sampled;
};

class GenerationEngine {
 public:
  // Throws UserError when the world is not tp x pp ranks or the layout does not divide the
  // model (named as --tp / --pp).
  GenerationEngine(const ModelConfig& model, const EngineOptions& opts, Backend& backend,
                   std::shared_ptr<Comm> world);
  // Collective: this rank's stage weights from the checkpoint (any layout it was saved in).
  void load(const ResolvedCheckpoint& ckpt);
  // LoRA adapters over the base (opts.shape.adapter_slots of them; model/decoder.h). Collective:
  // every rank calls it, or world rank 0 does while the others are in follow(). The adapter
  // checkpoint at `path` into `slot` (rank 0's arguments), checked against the loaded base
  // (check_adapter_base) and read by every stage in any layout it was saved in. Throws
  // UserError on world rank 0, naming the path, when it cannot be loaded (on every rank
  // alike; the slot is then empty and nothing else changed). Returns the adapter's shape.
  LoraShape load_adapter(int32_t slot, const std::string& path);
  // Collective as load_adapter: the slot is empty from the next step.
  void remove_adapter(int32_t slot);
  bool has_adapter(int32_t slot) const { return decoder_->has_adapter(slot); }
  // Collective. On world rank 0 `step` is the step to run (ignored elsewhere); returns the
  // picks of step.sampled, in order, on every rank.
  std::vector<TokenPick> step(const EngineStep& step);
  // Collective: world rank 0 tells the followers to return from follow().
  void stop_followers();
  // Ranks other than world rank 0: run the steps rank 0 sends until stop_followers().
  void follow();

  bool leader() const { return world_->rank() == 0; }
  const ModelConfig& model() const { return model_; }
  const DecodeShape& shape() const { return decoder_->shape(); }
  int64_t sampled_vocab() const { return opts_.sampled_vocab; }
  DecodeStage& decoder() { return *decoder_; }
  Grid& grid() { return stage_.grid(); }

 private:
  // Runs a step every rank has; returns the picks on every rank.
  std::vector<TokenPick> run(const EngineStep& step);
  // Every rank: reads and installs the adapter (load_adapter after the broadcast).
  LoraShape install_adapter(int32_t slot, const std::string& path);

  ModelConfig model_;
  EngineOptions opts_;
  Layout layout_;  // tp x pp, checked against the model and the world
  Backend& backend_;
  std::shared_ptr<Comm> world_;
  Manifest base_;           // the loaded checkpoint's: what an adapter must have been trained on
  std::string base_where_;  // its URL
  RankStage stage_;  // the grid, groups and stage plan, as training builds them
  std::unique_ptr<DecodeStage> decoder_;
  Tensor gathered_;                  // [tp, sampled, vocab slice] on the last stage
  std::vector<float> host_logits_;   // its host copy
  std::vector<float> row_logits_;    // one row, the real vocabulary, in id order
  std::vector<int32_t> sampled_rows_;
  Arena gather_arena_;
  // On the rank that picks: each slot's completion so far (penalties), and scratch for them.
  std::vector<std::vector<int32_t>> generated_;
  std::vector<float> adjusted_logits_;
  std::vector<int32_t> token_counts_;
};

}  // namespace jumbo
