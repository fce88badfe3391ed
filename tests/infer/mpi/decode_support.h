#pragma once
// What the cached-decoding tests share: the tiny model with peaked attention, its engine on
// the world's layout, and the training model's full forward of a sequence as the reference.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <tuple>
#include <vector>

#include "jumbo/comm/comm.h"
#include "jumbo/infer/engine.h"
#include "jumbo/model/transformer.h"
#include "jumbo/parallel/pipeline_runner.h"
#include "jumbo/parallel/stage_plan.h"

namespace jumbo::decode_test {

inline constexpr uint64_t kSeed = 7;

// Initialised weights with the query/key/value projections scaled up: at the usual std 0.02
// attention is nearly uniform and would hide a wrong score; these make it peaked.
inline void init_weights(ParamStore& params, Backend& backend) {
  params.initialize(backend, kSeed);
  for (size_t i = 0; i < params.size(); ++i) {
    if (params.info(static_cast<int>(i)).name.find("attn.qkv.weight") == std::string::npos) continue;
    Tensor w = params.weight(static_cast<int>(i));  // fp32 on the CPU
    for (int64_t k = 0; k < w.numel(); ++k) w.as<float>()[k] *= 12.0f;
  }
}

inline ModelConfig tiny() { return load_model_config(JUMBO_SOURCE_DIR "/inputs/models/tiny.toml"); }
// The Llama block at the same scale: RoPE, RMSNorm, SwiGLU, 4 query heads on 2 kv heads.
inline ModelConfig tiny_llama() {
  return load_model_config(JUMBO_SOURCE_DIR "/inputs/models/tiny-llama.toml");
}

inline std::pair<int64_t, int64_t> layout_for(int world) { return world == 4 ? std::pair{2, 2} : std::pair{1, 1}; }

class OneSequence final : public MicrobatchSource {
 public:
  explicit OneSequence(const std::vector<int32_t>& t) : tokens_(t) {}
  void next(const MicrobatchView& mb) override {
    std::copy(tokens_.begin(), tokens_.end(), mb.tokens);
    std::fill(mb.targets, mb.targets + tokens_.size(), 0);
  }

 private:
  const std::vector<int32_t>& tokens_;
};

// Log-softmax rows of the full forward of `seq` on the last stage's tp rank 0 ([L][vocab]),
// broadcast to every rank.
// With `lora`, the model runs adapters whose values `set_adapters` writes into its store.
inline std::vector<std::vector<double>> full_forward_logprobs(
    const ModelConfig& m, int64_t tp, int64_t pp, const std::vector<int32_t>& seq,
    const LoraShape& lora = {}, const std::function<void(ParamStore&, Backend&)>& set_adapters = {}) {
  std::shared_ptr<Comm> world = mpi_world();
  auto backend = make_cpu_backend();
  Grid grid(world, static_cast<int>(tp), static_cast<int>(pp));
  Layout layout;
  layout.tp = tp;
  layout.pp = pp;
  StepShape shape;
  shape.seq = static_cast<int64_t>(seq.size());
  shape.eval_microbatches = 1;
  shape.lora = lora;
  const StagePlan plan = plan_stage(m, layout, shape, grid.coords());
  TransformerStage model(m, plan.model, *backend, grid.tp());
  init_weights(model.params(), *backend);
  if (lora.rank > 0) set_adapters(model.trained_params(), *backend);
  PipelineRunner runner(model, grid.pp(), plan);
  OneSequence source(seq);
  PipelineRun run;
  run.mode = PipelineMode::forward_only;
  run.microbatches = 1;
  runner.run(source, run);
  const int64_t len = static_cast<int64_t>(seq.size());
  std::vector<char> bytes;
  const int root = grid.world_rank_of(0, 0, static_cast<int>(pp) - 1);
  if (grid.last_stage()) {
    const int64_t vl = model.logits().dim(1);
    std::vector<float> mine(static_cast<size_t>(len * vl)), all(static_cast<size_t>(tp * len * vl));
    backend->to_host(mine.data(), model.logits());
    Tensor in(mine.data(), DType::f32, {len * vl}), out(all.data(), DType::f32, {tp * len * vl});
    grid.tp().all_gather(in, out);
    if (grid.tp_rank() == 0) {
      for (int64_t p = 0; p < len; ++p) {
        std::vector<double> row(static_cast<size_t>(m.vocab));
        for (int64_t id = 0; id < m.vocab; ++id) {
          row[static_cast<size_t>(id)] = all[static_cast<size_t>(((id / vl) * len + p) * vl + id % vl)];
        }
        double mx = -INFINITY, sum = 0;
        for (double x : row) mx = std::max(mx, x);
        for (double x : row) sum += std::exp(x - mx);
        for (double& x : row) x -= mx + std::log(sum);
        const size_t at = bytes.size();
        bytes.resize(at + row.size() * sizeof(double));
        std::memcpy(bytes.data() + at, row.data(), row.size() * sizeof(double));
      }
    }
  }
  world->broadcast_bytes(bytes, root);
  std::vector<std::vector<double>> rows(static_cast<size_t>(len), std::vector<double>(static_cast<size_t>(m.vocab)));
  for (int64_t p = 0; p < len; ++p) {
    std::memcpy(rows[static_cast<size_t>(p)].data(), bytes.data() + p * m.vocab * sizeof(double),
                static_cast<size_t>(m.vocab) * sizeof(double));
  }
  return rows;
}

// The model's engine on this world's layout, with init_weights.
inline std::unique_ptr<GenerationEngine> make_engine(Backend& backend, const DecodeShape& shape,
                                                     const ModelConfig& model = tiny()) {
  std::shared_ptr<Comm> world = mpi_world();
  EngineOptions opts;
  std::tie(opts.tp, opts.pp) = layout_for(world->size());
  opts.shape = shape;
  auto engine = std::make_unique<GenerationEngine>(model, opts, backend, world);
  init_weights(engine->decoder().params(), backend);
  return engine;
}

// The final tokens of a leader's run, on every rank (rank 0 knows them).
inline std::vector<int32_t> shared_tokens(Comm& world, const std::vector<int32_t>& mine) {
  std::vector<char> bytes(reinterpret_cast<const char*>(mine.data()),
                          reinterpret_cast<const char*>(mine.data() + mine.size()));
  world.broadcast_bytes(bytes, 0);
  std::vector<int32_t> out(bytes.size() / sizeof(int32_t));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// A prompt followed by the tokens rank 0 picked for it, on every rank.
inline std::vector<int32_t> final_sequence(Comm& world, const std::vector<int32_t>& prompt,
                                           const std::vector<TokenPick>& picks) {
  std::vector<int32_t> generated;
  for (const TokenPick& p : picks) generated.push_back(p.token);
  std::vector<int32_t> seq = prompt;
  const std::vector<int32_t> tail = shared_tokens(world, generated);
  seq.insert(seq.end(), tail.begin(), tail.end());
  return seq;
}

}  // namespace jumbo::decode_test
