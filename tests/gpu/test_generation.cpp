// Generation on the GPU against the CPU: the same model and weights through the engine
// (decoder, KV cache, sampled-row logits), three prompts of different lengths with chunked
// prefill and two cache slots, greedy. The picks' log-probabilities (every vocabulary entry)
// must agree within the dtype's tolerance; in fp32 the tokens must be the same.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "gpu_test_support.h"
#include "jumbo/comm/comm.h"
#include "jumbo/infer/scheduler.h"

namespace jumbo::gputest {
namespace {

std::vector<std::vector<TokenPick>> generate_on(Backend& backend, Precision precision) {
  const ModelConfig m = small_gpu_model("gpu-generate");
  EngineOptions opts;
  opts.precision = precision;
  opts.shape = {.max_rows = 16, .max_sampled = 2, .cache_slots = 2, .cache_positions = 0};
  GenerationEngine engine(m, opts, backend, make_solo_comm("world"));
  engine.decoder().params().initialize(backend, 99);
  const std::vector<std::vector<int32_t>> prompts = {
      random_ids(37, 0, 511, 1), random_ids(5, 0, 511, 2), random_ids(20, 0, 511, 3)};
  std::vector<std::vector<TokenPick>> picks(prompts.size());
  Scheduler scheduler(engine, -1);
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r;
    r.prompt = prompts[i];
    r.max_new_tokens = 12;
    r.sampling.logprobs = m.vocab;
    r.stop_at_eos = false;
    scheduler.submit(r, [&picks, i](const TokenEvent& e) {
      picks[i].push_back(e.pick);
      return true;
    });
  }
  while (!scheduler.idle()) scheduler.step();
  return picks;
}

TEST(GpuGeneration, GreedyDecodeMatchesTheCpu) {
  JUMBO_REQUIRE_GPU();
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    SCOPED_TRACE(to_string(p));
    auto cpu = make_cpu_backend();
    auto gpu = make_cuda_backend(0);
    const auto want = generate_on(*cpu, p);
    const auto got = generate_on(*gpu, p);
    ASSERT_EQ(got.size(), want.size());
    // Absolute, on log-probabilities near -ln 512: fp32 sums in another order; bf16 roundings
    // of every stored activation.
    const double tol = p == Precision::fp32 ? 1e-3 : 0.1;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i].size(), want[i].size());
      // The first pick follows the same prompt on both sides: compare it always; later ones
      // follow the same tokens only while the picks agree (bf16 may flip a near tie).
      for (size_t k = 0; k < want[i].size(); ++k) {
        std::vector<double> a(512), b(512);
        for (const auto& [id, lp] : want[i][k].top) a[static_cast<size_t>(id)] = lp;
        for (const auto& [id, lp] : got[i][k].top) b[static_cast<size_t>(id)] = lp;
        double worst = 0;
        for (size_t v = 0; v < a.size(); ++v) worst = std::max(worst, std::abs(a[v] - b[v]));
        EXPECT_LE(worst, tol) << "prompt " << i << " token " << k << ": log-probabilities";
        if (p == Precision::fp32) {
          EXPECT_EQ(got[i][k].token, want[i][k].token);
        }
        if (got[i][k].token != want[i][k].token) break;
      }
    }
  }
}

}  // namespace
}  // namespace jumbo::gputest
