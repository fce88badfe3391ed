#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "jumbo/infer/evaluate.h"
#include "jumbo/infer/sampling.h"

namespace jumbo {
namespace {

const std::vector<float> kLogits = {1.0f, 3.0f, 2.5f, -1.0f, 0.0f, 2.9f};

TEST(PickToken, GreedyIsTheArgmaxAndReportsTheModelsLogprob) {
  const TokenPick p = pick_token(kLogits, {.temperature = 0}, 0, 0);
  EXPECT_EQ(p.token, 1);
  double z = 0;
  for (float l : kLogits) z += std::exp(l);
  EXPECT_NEAR(p.logprob, 3.0 - std::log(z), 1e-6);
}

TEST(PickToken, TiesGoToTheLowerId) {
  EXPECT_EQ(pick_token(std::vector<float>{0.5f, 2.0f, 2.0f}, {}, 0, 0).token, 1);
}

TEST(PickToken, TopKOneAndATinyTopPAreGreedy) {
  for (int64_t i = 0; i < 50; ++i) {
    EXPECT_EQ(pick_token(kLogits, {.temperature = 1, .top_k = 1}, 3, i).token, 1);
    EXPECT_EQ(pick_token(kLogits, {.temperature = 1, .top_p = 1e-6}, 3, i).token, 1);
  }
}

// Frequencies over many indices follow softmax(logits / T), restricted as asked.
std::map<int32_t, double> frequencies(const SamplingParams& p, int n) {
  std::map<int32_t, double> f;
  for (int i = 0; i < n; ++i) f[pick_token(kLogits, p, 11, i).token] += 1.0 / n;
  return f;
}

TEST(PickToken, SamplesTheTemperedDistribution) {
  const int n = 40000;
  for (double t : {0.7, 1.0, 1.5}) {
    const auto f = frequencies({.temperature = t, .seed = 9}, n);
    double z = 0;
    for (float l : kLogits) z += std::exp(l / t);
    for (size_t id = 0; id < kLogits.size(); ++id) {
      const double want = std::exp(kLogits[id] / t) / z;
      const double got = f.count(static_cast<int32_t>(id)) ? f.at(static_cast<int32_t>(id)) : 0;
      EXPECT_NEAR(got, want, 4 * std::sqrt(want * (1 - want) / n) + 1e-4) << "T " << t << " id " << id;
    }
  }
}

TEST(PickToken, TopKAndTopPKeepOnlyTheirSets) {
  const auto k2 = frequencies({.temperature = 1, .top_k = 2, .seed = 1}, 5000);
  EXPECT_EQ(k2.size(), 2u);  // ids 1 (3.0) and 5 (2.9)
  EXPECT_TRUE(k2.count(1) && k2.count(5));
  // p(1), p(5), p(2) = 0.368, 0.333, 0.223: top_p 0.65 needs the first two, 0.75 three.
  const auto p65 = frequencies({.temperature = 1, .top_p = 0.65, .seed = 1}, 5000);
  EXPECT_EQ(p65.size(), 2u);
  const auto p75 = frequencies({.temperature = 1, .top_p = 0.75, .seed = 1}, 5000);
  EXPECT_EQ(p75.size(), 3u);
}

TEST(PickToken, TheSameKeyGivesTheSamePickAndTheTopList) {
  const SamplingParams p{.temperature = 1.2, .seed = 77, .logprobs = 3};
  const TokenPick a = pick_token(kLogits, p, 5, 17), b = pick_token(kLogits, p, 5, 17);
  EXPECT_EQ(a.token, b.token);
  ASSERT_EQ(a.top.size(), 3u);
  EXPECT_EQ(a.top[0].first, 1);
  EXPECT_EQ(a.top[1].first, 5);
  EXPECT_EQ(a.top[2].first, 2);
  EXPECT_GT(a.top[0].second, a.top[1].second);
  EXPECT_NE(sampling_stream({1, 2, 3}, 0), sampling_stream({1, 2, 3}, 1));
  EXPECT_NE(sampling_stream({1, 2, 3}, 0), sampling_stream({1, 2, 4}, 0));
  EXPECT_NE(uniform_of(1, 2, 3), uniform_of(1, 2, 4));
}

TEST(LogitAdjustments, PenalisePerCountAndPresenceAndAddTheBias) {
  std::vector<float> logits = {1.0f, 2.0f, 3.0f, 4.0f};
  std::vector<int32_t> counts(4, 0);
  SamplingParams p;
  p.frequency_penalty = 0.5;
  p.presence_penalty = 0.25;
  p.logit_bias = {{0, 10.0f}};
  const std::vector<int32_t> generated = {3, 3, 1, 3};
  apply_logit_adjustments(logits, p, generated, counts);
  EXPECT_FLOAT_EQ(logits[0], 11.0f);              // biased, never generated
  EXPECT_FLOAT_EQ(logits[1], 2.0f - 0.5f - 0.25f);  // once
  EXPECT_FLOAT_EQ(logits[2], 3.0f);
  EXPECT_FLOAT_EQ(logits[3], 4.0f - 1.5f - 0.25f);  // three times
  EXPECT_EQ(counts, std::vector<int32_t>(4, 0)) << "the scratch must be left all zero";
}

TEST(LogitAdjustments, PickFromTheAdjustedRowReportTheModelsLogprob) {
  std::vector<float> adjusted = kLogits;
  adjusted[1] -= 5;  // the argmax, penalised away
  const TokenPick p = pick_token(kLogits, {.temperature = 0, .logprobs = 1}, 0, 0, adjusted);
  EXPECT_EQ(p.token, 5);  // 2.9, next best
  double z = 0;
  for (float l : kLogits) z += std::exp(l);
  EXPECT_NEAR(p.logprob, 2.9 - std::log(z), 1e-6);
  ASSERT_EQ(p.top.size(), 1u);
  EXPECT_EQ(p.top[0].first, 1);  // the model's most likely, not the adjusted
}

TEST(ScoreToken, IsTheTargetsLogprobWithAlternatives) {
  const TokenPick p = score_token(kLogits, 3, 2);
  double z = 0;
  for (float l : kLogits) z += std::exp(l);
  EXPECT_EQ(p.token, 3);
  EXPECT_NEAR(p.logprob, -1.0 - std::log(z), 1e-6);
  ASSERT_EQ(p.top.size(), 2u);
  EXPECT_EQ(p.top[0].first, 1);
  EXPECT_EQ(p.top[1].first, 5);
}

TEST(EvalWindows, EveryTargetIsScoredOnce) {
  for (int64_t tokens : {33, 34, 40, 64, 65, 100, 257}) {
    for (int64_t stride : {1, 5, 16, 31, 32}) {
      const int64_t seq = 32, windows = eval_window_count(tokens, seq, stride);
      std::vector<int> scored(static_cast<size_t>(tokens), 0);
      for (int64_t k = 0; k < windows; ++k) {
        const EvalWindow w = eval_window(k, tokens, seq, stride);
        ASSERT_GE(w.start, 0);
        ASSERT_LE(w.start + seq + 1, tokens);
        ASSERT_GE(w.first_scored, 0);
        ASSERT_LT(w.first_scored, seq);
        if (k > 0) {
          EXPECT_GE(w.first_scored, seq - stride);  // at least seq - stride of context
        }
        for (int64_t j = w.first_scored; j < seq; ++j) ++scored[static_cast<size_t>(w.start + 1 + j)];
      }
      EXPECT_EQ(scored[0], 0);
      for (int64_t t = 1; t < tokens; ++t) {
        ASSERT_EQ(scored[static_cast<size_t>(t)], 1) << tokens << " tokens, stride " << stride << ", target " << t;
      }
    }
  }
  EXPECT_EQ(eval_window_count(32, 32, 32), 0);
  // Stride = seq: the windows are the sampler's stored samples (start k x seq).
  EXPECT_EQ(eval_window(3, 1000, 32, 32).start, 96);
  EXPECT_EQ(eval_window(3, 1000, 32, 32).first_scored, 0);
}

}  // namespace
}  // namespace jumbo
