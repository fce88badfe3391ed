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

#include "decode_support.h"
#include "jumbo/comm/comm.h"
#include "jumbo/infer/engine.h"
#include "jumbo/infer/scheduler.h"

namespace jumbo {
namespace {

using namespace decode_test;

void expect_equals_full_forward(const ModelConfig& m) {
  std::shared_ptr<Comm> world = mpi_world();
  const auto [tp, pp] = layout_for(world->size());
  auto backend = make_cpu_backend();
  auto made = make_engine(*backend, {.max_rows = 4, .max_sampled = 2, .cache_slots = 2}, m);
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
    const std::vector<int32_t> seq = final_sequence(*world, prompts[i], picks[i]);
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

TEST(CachedDecode, EqualsFullForwardAtEveryGeneratedPosition) { expect_equals_full_forward(tiny()); }

// The Llama block: the cache holds the 2 kv heads (1 per tp rank), each read by its group's
// query heads, and RoPE rotates each row at its own position.
TEST(CachedDecode, LlamaEqualsFullForwardAtEveryGeneratedPosition) {
  expect_equals_full_forward(tiny_llama());
}

// qk-norm (Qwen 3's): each query and key head normed before RoPE, in prefill and decode.
TEST(CachedDecode, QkNormEqualsFullForwardAtEveryGeneratedPosition) {
  ModelConfig m = tiny_llama();
  m.qk_norm = true;
  expect_equals_full_forward(m);
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
