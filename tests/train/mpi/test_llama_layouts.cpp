// The Llama block on every layout, as tests/train/mpi/test_layouts.cpp holds GPT's: (tp, pp,
// dp) with ZeRO-1, recomputation and sequence parallelism reproduce the one-rank run's losses
// within 1e-5 relative and its weights within 1e-4 absolute (fp32); interleaved pipelines too;
// bf16 tracks the one-rank bf16 run; a checkpoint resumes bit for bit on its layout and
// reshards onto others. tp splits whole key/value heads: 4 of them, so tp <= 4.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>

#include "layout_support.h"
#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"
#include "jumbo/train/trainer.h"

namespace jumbo {
namespace {

using test::Family;

const test::RefRun& llama_reference() {
  static const test::RefRun ref = test::reference("fp32", Family::llama);
  return ref;
}

void expect_matches_reference(const TrainSummary& s, Trainer& t, const std::string& what) {
  const test::RefRun& ref = llama_reference();
  ASSERT_EQ(s.losses.size(), ref.losses.size());
  for (size_t i = 0; i < s.losses.size(); ++i) {
    EXPECT_NEAR(s.losses[i], ref.losses[i], 1e-5 * ref.losses[i]) << "step " << i + 1 << " " << what;
  }
  test::expect_same_weights(t, ref.reference_weights, 1e-4, Family::llama);
}

void check_layout(int tp, int pp, bool zero1, const std::string& recompute, bool sp) {
  llama_reference();
  auto backend = make_cpu_backend();
  Trainer t(test::layout_config(tp, pp, zero1, "fp32", recompute, sp, Family::llama), *backend,
            mpi_world());
  expect_matches_reference(t.run(), t,
                           "tp " + std::to_string(tp) + " pp " + std::to_string(pp) + " zero1 " +
                               std::to_string(zero1) + " recompute " + recompute + " sp " +
                               std::to_string(sp));
}

class LlamaLayouts : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(LlamaLayouts, MatchOneRank) {
  const auto [tp, pp] = GetParam();
  const int n = mpi_world()->size();
  if (n % (tp * pp) != 0) GTEST_SKIP() << "layout does not fit " << n << " ranks";
  check_layout(tp, pp, false, pp > 1 ? "selective" : "none", false);
  check_layout(tp, pp, true, tp > 1 ? "full" : "none", tp > 1);
}

// On 8 ranks: (1,1,8) (2,1,4) (4,1,2) (2,2,2) (1,2,4) (4,2,1) (1,8,1); on 6: (1,3,2) (2,3,1)
// (1,1,6) (2,1,3) (1,2,3).
INSTANTIATE_TEST_SUITE_P(AllLayouts, LlamaLayouts,
                         ::testing::Values(std::make_tuple(1, 1), std::make_tuple(2, 1),
                                           std::make_tuple(4, 1), std::make_tuple(2, 2),
                                           std::make_tuple(1, 2), std::make_tuple(4, 2),
                                           std::make_tuple(1, 8), std::make_tuple(1, 3),
                                           std::make_tuple(2, 3)));

TEST(LlamaLayouts, InterleavedPipelineMatchesOneRank) {
  auto w = mpi_world();
  for (auto [tp, pp] : {std::pair{1, 2}, std::pair{2, 2}}) {
    if (w->size() % (tp * pp) != 0) continue;
    RunConfig cfg = test::layout_config(tp, pp, tp > 1, "fp32", "none", tp > 1, Family::llama);
    cfg.parallel.virtual_stages = 2;
    llama_reference();
    auto backend = make_cpu_backend();
    Trainer t(cfg, *backend, w);
    EXPECT_EQ(t.model().options().chunks, 2);
    expect_matches_reference(t.run(), t, "interleaved tp " + std::to_string(tp));
  }
}

TEST(LlamaLayouts, Bf16TracksTheOneRankRun) {
  static const test::RefRun ref = test::reference("bf16", Family::llama);
  auto w = mpi_world();
  const int tp = w->size() % 2 == 0 ? 2 : 1;
  const int pp = w->size() % (2 * tp) == 0 ? 2 : 1;
  auto backend = make_cpu_backend();
  Trainer t(test::layout_config(tp, pp, true, "bf16", "none", true, Family::llama), *backend, w);
  const TrainSummary s = t.run();
  for (size_t i = 0; i < s.losses.size(); ++i) {
    EXPECT_NEAR(s.losses[i], ref.losses[i], 1e-2 * ref.losses[i]) << "step " << i + 1;
  }
}

// Saved at step 5 on (2, 2, dp): the same layout repeats the uninterrupted run's steps 6-10
// bit for bit; (1, pp, dp) with ZeRO-1 off resumes from it within the layout tolerance.
TEST(LlamaLayouts, CheckpointsResumeBitForBitAndReshard) {
  auto w = mpi_world();
  if (w->size() % 4 != 0) GTEST_SKIP() << "needs a multiple of 4 ranks";
  auto backend = make_cpu_backend();
  auto config = [](int tp, int pp, bool zero1) {
    RunConfig cfg = test::layout_config(tp, pp, zero1, "fp32", "none", false, Family::llama);
    cfg.train.decay_tokens = cfg.train.steps * cfg.train.global_batch * cfg.model.context;
    return cfg;
  };
  std::vector<double> full;
  {
    Trainer t(config(2, 2, true), *backend, w);
    full = t.run().losses;
  }
  const std::string dir = test::fresh_checkpoint_dir("llama-resume-22");
  {
    RunConfig cfg = config(2, 2, true);
    cfg.train.steps = 5;
    cfg.checkpoint.dir = dir;
    cfg.checkpoint.every = 5;
    Trainer t(cfg, *backend, w);
    t.run();
  }
  w->barrier();
  for (auto [tp, pp, zero1] : {std::tuple{2, 2, true}, std::tuple{1, 4, false}}) {
    RunConfig cfg = config(tp, pp, zero1);
    cfg.checkpoint.dir = dir;
    cfg.checkpoint.resume = "auto";
    cfg.checkpoint.every = 0;
    Trainer t(cfg, *backend, w);
    const TrainSummary s = t.run();
    ASSERT_EQ(s.first_step, 6);
    ASSERT_EQ(s.losses.size(), 5u);
    for (size_t i = 0; i < 5; ++i) {
      if (tp == 2) {
        EXPECT_EQ(s.losses[i], full[5 + i]) << "step " << 6 + i << " differs after the resume";
      } else {
        EXPECT_NEAR(s.losses[i], full[5 + i], 1e-5 * full[5 + i]) << "step " << 6 + i << " resharded";
      }
    }
  }
}

// LoRA on every Llama map as PEFT names them (q, k, v: their rows of the grouped q/k/v map;
// o; SwiGLU's gate and up: halves of its packed output; down) from a trained base: tp 2 x
// pp 2 with ZeRO-1 and sequence parallelism equals one rank within the layout tolerance.
TEST(LlamaLayouts, LoraOnEveryMapMatchesOneRank) {
  auto w = mpi_world();
  if (w->size() % 4 != 0) GTEST_SKIP() << "needs a multiple of 4 ranks";
  const std::string base = test::fresh_checkpoint_dir("llama-lora-base");
  auto backend = make_cpu_backend();
  {
    RunConfig cfg = test::layout_config(2, 2, true, "fp32", "none", false, Family::llama);
    cfg.train.steps = 4;
    cfg.checkpoint.dir = base;
    cfg.checkpoint.every = 4;
    Trainer t(cfg, *backend, w);
    t.run();
  }
  w->barrier();
  auto lora_config = [&](int tp, int pp, bool sp) {
    RunConfig cfg = test::layout_config(tp, pp, tp > 1, "fp32", "none", sp, Family::llama);
    cfg.train.init_from = base;
    cfg.train.steps = 4;
    cfg.train.lr = 3e-3;  // the adapters move the loss within four steps
    cfg.finetune.method = FineTune::lora;
    cfg.finetune.lora_rank = 4;
    return cfg;
  };
  const test::RefRun ref = test::solo_run(lora_config(1, 1, false));
  Trainer t(lora_config(2, 2, true), *backend, w);
  std::set<std::string> maps;  // the first layer's adapted maps
  for (size_t i = 0; i < t.model().trained_params().size(); ++i) {
    const std::string& name = t.model().trained_params().info(static_cast<int>(i)).name;
    if (name.ends_with(".lora_a")) maps.insert(name.substr(name.find('.', 7) + 1));
  }
  if (t.model().options().has_embedding) {  // layers 0-3 on the first stage
    EXPECT_EQ(maps, (std::set<std::string>{"attn.q.lora_a", "attn.k.lora_a", "attn.v.lora_a",
                                           "attn.proj.lora_a", "mlp.gate.lora_a",
                                           "mlp.up.lora_a", "mlp.fc2.lora_a"}));
  }
  const TrainSummary s = t.run();
  ASSERT_EQ(s.losses.size(), 4u);
  for (size_t i = 0; i < s.losses.size(); ++i) {
    EXPECT_NEAR(s.losses[i], ref.losses[i], 1e-5 * ref.losses[i]) << "step " << i + 1;
  }
  EXPECT_GT(std::abs(s.losses[3] - s.losses[0]), 1e-3) << "the adapters did not train";
}

}  // namespace
}  // namespace jumbo
