#pragma once
// Evaluation of a checkpoint, in any tp x pp x dp layout: the forward-only pipeline run of
// training (PipelineRunner) over windows of the model's context, keeping each token's loss.
// Two kinds of windows: a prepared dataset cut so that every token is scored once (windows
// of `seq` tokens `stride` apart, each scoring only what the previous did not), and the
// (context, continuation) pairs of a multiple-choice task.
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"
#include "jumbo/infer/checkpoint_weights.h"
#include "jumbo/model/stage.h"
#include "jumbo/parallel/pipeline_runner.h"
#include "jumbo/parallel/rank_stage.h"

namespace jumbo {

// Window k of a token stream of `tokens` tokens: inputs [start, start + seq), targets one
// later; targets j >= first_scored are scored. Windows start `stride` apart; the last one is
// moved back to end at the stream's end. Together they score tokens 1 .. tokens - 1 once.
struct EvalWindow {
  int64_t start = 0;
  int64_t first_scored = 0;
};
int64_t eval_window_count(int64_t tokens, int64_t seq, int64_t stride);
EvalWindow eval_window(int64_t k, int64_t tokens, int64_t seq, int64_t stride);

// What one window holds, written by a WindowSource: seq input tokens, seq targets, and the
// targets [first, end) that are scored.
struct WindowTokens {
  int32_t* tokens;
  int32_t* targets;
  int64_t first_scored = 0, end_scored = 0;
};
// Fills window k (k < count()); called on the ranks that read tokens or targets.
class WindowSource {
 public:
  virtual ~WindowSource() = default;
  virtual int64_t count() const = 0;
  virtual void window(int64_t k, WindowTokens& out) const = 0;
};

struct EvalLayout {
  int64_t tp = 1, pp = 1, micro_batch = 1;  // dp = world / (tp x pp)
  Precision precision = Precision::fp32;
  LoraShape lora{};  // the adapters' (an adapter checkpoint's manifest), or none
};

class Evaluator {
 public:
  // Throws UserError (naming --tp, --pp, --micro-batch) when the layout does not fit the
  // model or the world. seq <= model.context.
  Evaluator(const ModelConfig& model, const EvalLayout& layout, int64_t seq, Backend& backend,
            std::shared_ptr<Comm> world);
  void load(const ResolvedCheckpoint& ckpt);
  // Collective, after load() of its base (with layout.lora its shape): the adapters of a LoRA
  // checkpoint, checked against the base (check_adapter_base), in any layout they were saved in.
  void load_adapter(const ResolvedCheckpoint& adapter);
  // Collective: scores every window of `source`. `scored` is called on the ranks that hold
  // the results (the last stage's tp rank 0 of each replica) with a window's index and the
  // losses of its scored targets, in order.
  void score(const WindowSource& source,
             const std::function<void(int64_t, std::span<const float>)>& scored);
  Grid& grid() { return stage_.grid(); }
  Comm& world() { return *world_; }
  // Whether this rank receives `scored` calls.
  bool holds_results() const { return stage_.grid().last_stage() && stage_.grid().tp_rank() == 0; }
  int64_t seq() const { return seq_; }

 private:
  ModelConfig model_;
  EvalLayout layout_;
  Layout parallel_;  // layout_ checked against the model and the world (dp set)
  int64_t seq_;
  Backend& backend_;
  std::shared_ptr<Comm> world_;
  int64_t microbatches_per_run_;
  RankStage stage_;  // the grid, groups and stage plan: the forward half of training's
  std::unique_ptr<ModelStage> model_stage_;
  std::unique_ptr<PipelineRunner> runner_;
  Manifest base_;           // what load() read: an adapter's base
  std::string base_where_;
};

// A prepared dataset's token stream as windows (read from the memory-mapped dataset).
struct DatasetEvalResult {
  int64_t dataset_tokens = 0;  // the stream's length: tokens_scored = dataset_tokens - 1
  int64_t windows = 0, tokens_scored = 0, bytes_scored = 0;
  double loss_sum = 0;
  double mean_loss() const { return loss_sum / static_cast<double>(tokens_scored); }
  double perplexity() const;
  double bits_per_byte() const;  // loss_sum / ln 2 / bytes_scored
};
// Collective. `piece_bytes[id]`: the UTF-8 bytes token id stands for (on every rank);
// `max_windows` >= 0 keeps only the first windows.
DatasetEvalResult evaluate_dataset(Evaluator& ev, const std::string& prefix, int64_t stride,
                                   int64_t max_windows, const std::vector<int32_t>& piece_bytes);

}  // namespace jumbo
