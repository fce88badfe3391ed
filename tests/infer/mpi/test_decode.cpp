// Cached decoding equals the full forward: every generated position's log-probabilities over
// the whole vocabulary, from the KV-cache engine (chunked prefill, continuous batching:
// three prompts through two cache slots), against the training model's forward of the final
// sequence, on one rank (np1) and tp 2 x pp 2 (np4).
#include <gtest/gtest.h>

#include <map>

#include <cmath>
#include <cstring>
#include <memory>
#include <tuple>

#include "jumbo/comm/comm.h"
#include "jumbo/infer/engine.h"
#include "jumbo/infer/scheduler.h"
#include "jumbo/model/gpt.h"
#include "jumbo/parallel/pipeline_runner.h"
#include "jumbo/parallel/stage_plan.h"

namespace jumbo {
namespace {

constexpr uint64_t kSeed = 7;

// Initialised weights with the query/key/value projections scaled up: at the usual std 0.02
// attention is nearly uniform and would hide a wrong score; these make it peaked.
void init_weights(ParamStore& params, Backend& backend) {
  params.initialize(backend, kSeed);
  for (size_t i = 0; i < params.size(); ++i) {
    if (params.info(static_cast<int>(i)).name.find("attn.qkv.weight") == std::string::npos) continue;
    Tensor w = params.weight(static_cast<int>(i));  // fp32 on the CPU
    for (int64_t k = 0; k < w.numel(); ++k) w.as<float>()[k] *= 12.0f;
  }
}

ModelConfig tiny() { return load_model_config(JUMBO_SOURCE_DIR "/inputs/models/tiny.toml"); }

std::pair<int64_t, int64_t> layout_for(int world) { return world == 4 ? std::pair{2, 2} : std::pair{1, 1}; }

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
std::vector<std::vector<double>> full_forward_logprobs(const ModelConfig& m, int64_t tp, int64_t pp,
                                                       const std::vector<int32_t>& seq) {
  std::shared_ptr<Comm> world = mpi_world();
  auto backend = make_cpu_backend();
  Grid grid(world, static_cast<int>(tp), static_cast<int>(pp));
  Layout layout;
  layout.tp = tp;
  layout.pp = pp;
  StepShape shape;
  shape.seq = static_cast<int64_t>(seq.size());
  shape.eval_microbatches = 1;
  const StagePlan plan = plan_stage(m, layout, shape, grid.coords());
  GptModel model(m, plan.model, *backend, grid.tp());
  init_weights(model.params(), *backend);
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

// The tiny model's engine on this world's layout, with init_weights.
std::unique_ptr<GenerationEngine> make_engine(Backend& backend, const DecodeShape& shape) {
  std::shared_ptr<Comm> world = mpi_world();
  EngineOptions opts;
  std::tie(opts.tp, opts.pp) = layout_for(world->size());
  opts.shape = shape;
  auto engine = std::make_unique<GenerationEngine>(tiny(), opts, backend, world);
  init_weights(engine->decoder().params(), backend);
  return engine;
}

// The final tokens of a leader's run, on every rank (rank 0 knows them).
std::vector<int32_t> shared_tokens(Comm& world, const std::vector<int32_t>& mine) {
  std::vector<char> bytes(reinterpret_cast<const char*>(mine.data()),
                          reinterpret_cast<const char*>(mine.data() + mine.size()));
  world.broadcast_bytes(bytes, 0);
  std::vector<int32_t> out(bytes.size() / sizeof(int32_t));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

TEST(CachedDecode, EqualsFullForwardAtEveryGeneratedPosition) {
  std::shared_ptr<Comm> world = mpi_world();
  const auto [tp, pp] = layout_for(world->size());
  const ModelConfig m = tiny();
  auto backend = make_cpu_backend();
  auto made = make_engine(*backend, {.max_rows = 4, .max_sampled = 2, .cache_slots = 2});
  GenerationEngine& engine = *made;

  // Prompts longer than a step's 4 rows (chunked prefill); three through two slots (the third
  // joins when one leaves).
  const std::vector<std::vector<int32_t>> prompts = {
      {11, 200, 3, 57, 400, 9, 81, 4, 33, 150, 2}, {5, 6, 7}, {300, 301, 12, 90, 91, 92, 93}};
  const std::vector<int64_t> new_tokens = {9, 14, 6};
  std::vector<std::vector<TokenPick>> picks(prompts.size());
  if (engine.leader()) {
    Scheduler scheduler(engine, /*eos_id=*/-1);
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerationRequest r;
      r.prompt = prompts[i];
      r.max_new_tokens = new_tokens[i];
      r.sampling.logprobs = m.vocab;  // every token's log-probability
      r.stop_at_eos = false;
      scheduler.submit(r, [&picks, i](const TokenEvent& e) {
        picks[i].push_back(e.pick);
        return true;
      });
    }
    while (!scheduler.idle()) scheduler.step();
    engine.stop_followers();
  } else {
    engine.follow();
  }
  // Every rank runs the full forward of the final sequences (rank 0 knows them).
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> generated;
    for (const TokenPick& p : picks[i]) generated.push_back(p.token);
    std::vector<int32_t> seq = prompts[i];
    const std::vector<int32_t> tail = shared_tokens(*world, generated);
    seq.insert(seq.end(), tail.begin(), tail.end());
    ASSERT_EQ(seq.size(), prompts[i].size() + static_cast<size_t>(new_tokens[i]));
    const auto full = full_forward_logprobs(m, tp, pp, seq);
    if (!engine.leader()) continue;
    double worst = 0;
    for (size_t k = 0; k < picks[i].size(); ++k) {
      const std::vector<double>& row = full[prompts[i].size() - 1 + k];
      const TokenPick& p = picks[i][k];
      ASSERT_EQ(p.top.size(), static_cast<size_t>(m.vocab));
      // Greedy: the pick is the full forward's most likely token.
      EXPECT_EQ(p.token, std::max_element(row.begin(), row.end()) - row.begin())
          << "prompt " << i << " token " << k;
      for (const auto& [id, lp] : p.top) worst = std::max(worst, std::abs(lp - row[static_cast<size_t>(id)]));
    }
    EXPECT_LT(worst, 1e-5) << "prompt " << i << ": largest log-probability difference";
  }
}

TEST(CachedDecode, ScoredPromptTokensAreTheFullForwardsLogprobs) {
  // Echo with logprobs: prompt rows scored in chunks (4 rows a step, 2 sampled rows beyond
  // the 2 slots), next to a sequence that is decoding.
  std::shared_ptr<Comm> world = mpi_world();
  const auto [tp, pp] = layout_for(world->size());
  const ModelConfig m = tiny();
  auto backend = make_cpu_backend();
  auto made = make_engine(*backend, {.max_rows = 4, .max_sampled = 4, .cache_slots = 2});
  GenerationEngine& engine = *made;
  const std::vector<int32_t> prompt = {11, 200, 3, 57, 400, 9, 81, 4, 33, 150, 2};
  std::vector<TokenEvent> scores;
  std::vector<int32_t> generated;
  if (engine.leader()) {
    Scheduler scheduler(engine, /*eos_id=*/-1);
    GenerationRequest other;
    other.prompt = {5, 6, 7};
    other.max_new_tokens = 12;
    other.stop_at_eos = false;
    scheduler.submit(other, [](const TokenEvent&) { return true; });
    GenerationRequest r;
    r.prompt = prompt;
    r.max_new_tokens = 3;
    r.sampling.logprobs = 2;
    r.score_prompt_from = 2;  // the first shown token (1) has none
    r.stop_at_eos = false;
    ASSERT_EQ(request_problem(r, engine.shape(), m.vocab), "");
    scheduler.submit(r, [&](const TokenEvent& e) {
      if (e.prompt) {
        EXPECT_TRUE(generated.empty()) << "a prompt score after a generated token";
        scores.push_back(e);
      } else {
        generated.push_back(e.pick.token);
      }
      return true;
    });
    while (!scheduler.idle()) scheduler.step();
    engine.stop_followers();
  } else {
    engine.follow();
  }
  std::vector<int32_t> seq = prompt;
  const std::vector<int32_t> tail = shared_tokens(*world, generated);
  seq.insert(seq.end(), tail.begin(), tail.end());
  const auto full = full_forward_logprobs(m, tp, pp, seq);
  if (!engine.leader()) return;
  ASSERT_EQ(scores.size(), prompt.size() - 2);
  for (size_t k = 0; k < scores.size(); ++k) {
    const int64_t at = scores[k].index;
    ASSERT_EQ(at, static_cast<int64_t>(k) + 2);
    const std::vector<double>& row = full[static_cast<size_t>(at - 1)];
    EXPECT_EQ(scores[k].pick.token, prompt[static_cast<size_t>(at)]);
    EXPECT_NEAR(scores[k].pick.logprob, row[static_cast<size_t>(prompt[static_cast<size_t>(at)])], 1e-5);
    ASSERT_EQ(scores[k].pick.top.size(), 2u);
    EXPECT_EQ(scores[k].pick.top[0].first, std::max_element(row.begin(), row.end()) - row.begin());
  }
}

TEST(CachedDecode, PenaltiesAndLogitBiasPickFromTheAdjustedRow) {
  // Greedy with OpenAI's penalties and a bias, on this layout: each pick is the argmax of the
  // full forward's row less count x frequency + presence for the tokens generated so far,
  // plus the bias; the same rule on every layout gives the same text.
  std::shared_ptr<Comm> world = mpi_world();
  const auto [tp, pp] = layout_for(world->size());
  const ModelConfig m = tiny();
  auto backend = make_cpu_backend();
  auto made = make_engine(*backend, {.max_rows = 8, .max_sampled = 2, .cache_slots = 2});
  GenerationEngine& engine = *made;
  const std::vector<int32_t> prompt = {1, 2, 3, 4};
  SamplingParams sampling;
  sampling.frequency_penalty = 0.4;
  sampling.presence_penalty = 0.3;
  sampling.logit_bias = {{7, 2.5f}, {8, -100.0f}};
  std::vector<int32_t> generated;
  if (engine.leader()) {
    GenerationRequest r;
    r.prompt = prompt;
    r.max_new_tokens = 16;
    r.sampling = sampling;
    r.stop_at_eos = false;
    GenerationRequest plain = r;
    plain.sampling = {};
    const std::vector<Generated> out = generate_all(engine, -1, {plain, r});
    engine.stop_followers();
    generated = out[1].tokens;
    EXPECT_NE(out[0].tokens, out[1].tokens);  // the adjustments changed something
  } else {
    engine.follow();
  }
  std::vector<int32_t> seq = prompt;
  const std::vector<int32_t> tail = shared_tokens(*world, generated);
  seq.insert(seq.end(), tail.begin(), tail.end());
  const auto full = full_forward_logprobs(m, tp, pp, seq);
  if (!engine.leader()) return;
  ASSERT_EQ(generated.size(), 16u);
  std::map<int32_t, int> counts;
  for (size_t k = 0; k < generated.size(); ++k) {
    std::vector<double> row = full[prompt.size() - 1 + k];
    for (const auto& [id, c] : counts) row[static_cast<size_t>(id)] -= c * 0.4 + 0.3;
    row[7] += 2.5;
    row[8] -= 100;
    EXPECT_EQ(generated[k], std::max_element(row.begin(), row.end()) - row.begin()) << "token " << k;
    ++counts[generated[k]];
  }
}

TEST(CachedDecode, SameSeedSameTextWhateverTheBatch) {
  // Sampling with a seed: one prompt alone, and the same prompt among others in one batch,
  // give the same tokens.
  auto backend = make_cpu_backend();
  auto made = make_engine(*backend, {.max_rows = 16, .max_sampled = 4, .cache_slots = 4});
  GenerationEngine& engine = *made;
  GenerationRequest r;
  r.prompt = {1, 2, 3, 4};
  r.max_new_tokens = 12;
  r.sampling = {.temperature = 0.9, .top_k = 50, .top_p = 0.95, .seed = 42, .logprobs = 0};
  r.stop_at_eos = false;
  GenerationRequest other = r;
  other.prompt = {9, 8, 7, 6, 5, 4, 3};
  if (engine.leader()) {
    const std::vector<Generated> alone = generate_all(engine, -1, {r});
    const std::vector<Generated> batch = generate_all(engine, -1, {other, r, other});
    engine.stop_followers();
    EXPECT_EQ(alone[0].tokens, batch[1].tokens);
    EXPECT_NE(batch[0].tokens, batch[1].tokens);  // other prompts draw other numbers
  } else {
    engine.follow();
  }
}

}  // namespace
}  // namespace jumbo
