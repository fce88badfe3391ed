#include "jumbo/infer/evaluate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "jumbo/data/indexed_dataset.h"

namespace jumbo {

int64_t eval_window_count(int64_t tokens, int64_t seq, int64_t stride) {
  if (tokens < seq + 1) return 0;
  // Window 0 covers targets 1 .. seq; each further one `stride` more, the last clamped.
  return 1 + (tokens - 1 - seq + stride - 1) / stride;
}

EvalWindow eval_window(int64_t k, int64_t tokens, int64_t seq, int64_t stride) {
  if (k == 0) return {0, 0};
  const int64_t last_start = tokens - 1 - seq;
  const int64_t start = std::min(k * stride, last_start);
  // The previous window scored targets up to position (k - 1) stride + seq of the stream.
  const int64_t covered = (k - 1) * stride + seq;
  return {start, covered - start};
}

namespace {

Layout eval_layout(const ModelConfig& model, const EvalLayout& e, int world_size) {
  Layout layout;
  layout.tp = e.tp;
  layout.pp = e.pp;
  layout.micro_batch = e.micro_batch;
  if (e.tp < 1 || e.pp < 1 || world_size % (e.tp * e.pp) != 0) {
    throw UserError(fmt::format("jumbo eval: {} ranks are not a multiple of --tp {} x --pp {}",
                                world_size, e.tp, e.pp));
  }
  layout.dp = world_size / (e.tp * e.pp);
  validate_layout(layout, model, "jumbo eval", LayoutKeys::flags);
  return layout;
}

// This replica's microbatches of one run, fed to the pipeline.
class RunWindows final : public MicrobatchSource {
 public:
  RunWindows(const WindowSource& source, int64_t micro_batch, int64_t seq)
      : source_(source), micro_batch_(micro_batch), seq_(seq) {}
  void start(std::vector<int64_t> windows) {
    windows_ = std::move(windows);
    next_ = 0;
    scored_.assign(windows_.size(), {0, 0});
  }
  void next(const MicrobatchView& mb) override {
    for (int64_t b = 0; b < micro_batch_; ++b, ++next_) {
      WindowTokens w{mb.tokens + b * seq_, mb.targets + b * seq_, 0, 0};
      const int64_t k = windows_[static_cast<size_t>(next_)];
      if (k < 0) {  // padding of the last microbatch: scores nothing
        std::fill(w.tokens, w.tokens + seq_, 0);
        std::fill(w.targets, w.targets + seq_, 0);
      } else {
        source_.window(k, w);
      }
      scored_[static_cast<size_t>(next_)] = {w.first_scored, w.end_scored};
    }
  }
  const std::vector<int64_t>& windows() const { return windows_; }
  std::pair<int64_t, int64_t> scored(size_t i) const { return scored_[i]; }

 private:
  const WindowSource& source_;
  int64_t micro_batch_, seq_;
  std::vector<int64_t> windows_;
  std::vector<std::pair<int64_t, int64_t>> scored_;
  int64_t next_ = 0;
};

}  // namespace

namespace {
// The step shape of one forward-only run: enough microbatches to fill the pipeline several
// times over.
StepShape eval_shape(const EvalLayout& layout, int64_t dp, int64_t seq, int64_t microbatches) {
  StepShape shape;
  shape.global_batch = microbatches * layout.micro_batch * dp;
  shape.seq = seq;
  shape.precision = layout.precision;
  shape.eval_microbatches = microbatches;
  shape.lora = layout.lora;
  return shape;
}
}  // namespace

Evaluator::Evaluator(const ModelConfig& model, const EvalLayout& layout, int64_t seq,
                     Backend& backend, std::shared_ptr<Comm> world)
    : model_(model),
      layout_(layout),
      parallel_(eval_layout(model, layout, world->size())),
      seq_(seq),
      backend_(backend),
      world_(world),
      microbatches_per_run_(4 * layout.pp),
      stage_(world, model_, parallel_,
             eval_shape(layout, parallel_.dp, seq, microbatches_per_run_)) {
  model_stage_ = make_model_stage(model_, stage_.options(), backend_, stage_.groups().tp);
  runner_ = std::make_unique<PipelineRunner>(*model_stage_, stage_.groups().pp, stage_.plan());
}

void Evaluator::load(const ResolvedCheckpoint& ckpt) {
  load_weights(ckpt, model_stage_->params(), backend_, stage_.grid().dp());
  base_ = ckpt.manifest;
  base_where_ = ckpt.storage->url(ckpt.dir);
}

void Evaluator::load_adapter(const ResolvedCheckpoint& adapter) {
  const std::string where = "--adapter " + adapter.storage->url(adapter.dir);
  check_adapter_base(adapter.manifest, where, base_, "the base " + base_where_);
  if (!(adapter.manifest.lora == layout_.lora)) {
    throw std::logic_error("Evaluator: built for another LoRA shape than the adapter's");
  }
  load_weights(adapter, model_stage_->trained_params(), backend_, stage_.grid().dp());
}

void Evaluator::score(const WindowSource& source,
                      const std::function<void(int64_t, std::span<const float>)>& scored) {
  const int64_t mb = layout_.micro_batch, dp = stage_.grid().dp_size(), d = stage_.grid().dp_rank();
  const int64_t windows = source.count();
  const int64_t microbatches = (windows + mb - 1) / mb;
  // Microbatch g holds windows [g mb, (g + 1) mb); replica d takes g = d, d + dp, ...
  std::vector<int64_t> mine;
  for (int64_t g = d; g < microbatches; g += dp) mine.push_back(g);
  RunWindows feed(source, mb, seq_);
  std::vector<float> losses;
  for (size_t first = 0; first < mine.size(); first += static_cast<size_t>(microbatches_per_run_)) {
    const size_t count = std::min(mine.size() - first, static_cast<size_t>(microbatches_per_run_));
    std::vector<int64_t> run_windows;
    for (size_t i = 0; i < count; ++i) {
      for (int64_t b = 0; b < mb; ++b) {
        const int64_t k = mine[first + i] * mb + b;
        run_windows.push_back(k < windows ? k : -1);
      }
    }
    feed.start(std::move(run_windows));
    losses.clear();
    PipelineRun run;
    run.mode = PipelineMode::forward_only;
    run.microbatches = static_cast<int64_t>(count);
    run.token_losses = &losses;
    runner_->run(feed, run);
    if (!holds_results()) continue;
    for (size_t i = 0; i < feed.windows().size(); ++i) {
      const int64_t k = feed.windows()[i];
      if (k < 0) continue;
      const auto [begin, end] = feed.scored(i);
      scored(k, std::span<const float>(losses).subspan(i * static_cast<size_t>(seq_) + begin,
                                                      static_cast<size_t>(end - begin)));
    }
  }
}

double DatasetEvalResult::perplexity() const { return std::exp(mean_loss()); }
double DatasetEvalResult::bits_per_byte() const {
  return loss_sum / std::log(2.0) / static_cast<double>(bytes_scored);
}

namespace {

class DatasetWindows final : public WindowSource {
 public:
  DatasetWindows(const IndexedDataset& data, int64_t seq, int64_t stride, int64_t max_windows)
      : data_(data), seq_(seq), stride_(stride) {
    tokens_ = static_cast<int64_t>(data.num_tokens());
    count_ = eval_window_count(tokens_, seq, stride);
    if (max_windows >= 0) count_ = std::min(count_, max_windows);
    buffer_.resize(static_cast<size_t>(seq + 1));
  }
  int64_t count() const override { return count_; }
  void window(int64_t k, WindowTokens& out) const override {
    const EvalWindow w = eval_window(k, tokens_, seq_, stride_);
    data_.read(static_cast<uint64_t>(w.start), static_cast<uint64_t>(seq_ + 1), buffer_.data());
    std::copy(buffer_.begin(), buffer_.begin() + seq_, out.tokens);
    std::copy(buffer_.begin() + 1, buffer_.end(), out.targets);
    out.first_scored = w.first_scored;
    out.end_scored = seq_;
  }
  int64_t tokens() const { return tokens_; }

 private:
  const IndexedDataset& data_;
  int64_t seq_, stride_, tokens_ = 0, count_ = 0;
  mutable std::vector<int32_t> buffer_;
};

}  // namespace

DatasetEvalResult evaluate_dataset(Evaluator& ev, const std::string& prefix, int64_t stride,
                                   int64_t max_windows, const std::vector<int32_t>& piece_bytes) {
  const int64_t seq = ev.seq();
  if (stride < 1 || stride > seq) {
    throw UserError(fmt::format("jumbo eval: --stride {}: expected 1 .. {} (the window)", stride, seq));
  }
  IndexedDataset data(prefix);
  DatasetWindows source(data, seq, stride, max_windows);
  if (source.count() == 0) {
    throw UserError(fmt::format("{}: {} tokens, fewer than one window of {} + 1", prefix,
                                source.tokens(), seq));
  }
  std::vector<int32_t> targets(static_cast<size_t>(seq + 1));
  double loss = 0, tokens = 0, bytes = 0;
  ev.score(source, [&](int64_t k, std::span<const float> losses) {
    const EvalWindow w = eval_window(k, source.tokens(), seq, stride);
    data.read(static_cast<uint64_t>(w.start + 1 + w.first_scored), losses.size(), targets.data());
    for (size_t i = 0; i < losses.size(); ++i) {
      loss += losses[i];
      const int32_t t = targets[i];
      bytes += t >= 0 && t < static_cast<int32_t>(piece_bytes.size()) ? piece_bytes[static_cast<size_t>(t)] : 0;
    }
    tokens += static_cast<double>(losses.size());
  });
  Comm& world = ev.world();
  DatasetEvalResult r;
  r.dataset_tokens = source.tokens();
  r.windows = source.count();
  r.loss_sum = world.all_reduce_scalar(loss, ReduceOp::sum);
  r.tokens_scored = static_cast<int64_t>(world.all_reduce_scalar(tokens, ReduceOp::sum));
  r.bytes_scored = static_cast<int64_t>(world.all_reduce_scalar(bytes, ReduceOp::sum));
  return r;
}

}  // namespace jumbo
