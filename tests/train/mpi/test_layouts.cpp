// Every layout computes the same training run: on N ranks, (tp, pp, dp) with ZeRO-1 off and
// on must reproduce the one-rank run's per-step losses within 1e-5 relative and its final
// weights within 1e-4 absolute (fp32). The one-rank reference runs on rank 0 alone, inside the job.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include "layout_support.h"
#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"
#include "jumbo/data/prepare.h"
#include "jumbo/train/trainer.h"

namespace jumbo {
namespace {

using test::expect_same_weights;
using test::layout_config;
using test::reference;
using test::RefRun;
using test::solo_run;


void check_layout(int tp, int pp, bool zero1, const std::string& recompute, bool sp) {
  static const RefRun ref = reference("fp32");
  auto w = mpi_world();
  auto backend = make_cpu_backend();
  Trainer t(layout_config(tp, pp, zero1, "fp32", recompute, sp), *backend, w);
  const TrainSummary s = t.run();
  ASSERT_EQ(s.losses.size(), ref.losses.size());
  for (size_t i = 0; i < s.losses.size(); ++i) {
    // The reference went through a float broadcast: compare at float precision and 1e-5.
    EXPECT_NEAR(s.losses[i], ref.losses[i], 1e-5 * ref.losses[i])
        << "step " << i + 1 << " tp " << tp << " pp " << pp << " zero1 " << zero1
        << " recompute " << recompute << " sequence parallel " << sp;
  }
  expect_same_weights(t, ref.reference_weights, 1e-4);
}

class Layouts : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(Layouts, MatchOneRank) {
  const auto [tp, pp] = GetParam();
  const int n = mpi_world()->size();
  if (n % (tp * pp) != 0) GTEST_SKIP() << "layout does not fit " << n << " ranks";
  // Recomputation and sequence parallelism in some runs: they change no number either.
  check_layout(tp, pp, false, pp > 1 ? "selective" : "none", false);
  check_layout(tp, pp, true, tp > 1 ? "full" : "none", tp > 1);
  if (tp > 1) check_layout(tp, pp, false, "selective", true);
}

// (tp, pp); dp is what the world leaves. On 8 ranks: (1,1,8) (2,1,4) (4,1,2) (8,1,1) (1,8,1)
// (2,2,2) (2,4,1) (1,2,4) (4,2,1); on 6 ranks: (1,3,2) (2,3,1) (1,1,6) (2,1,3) (1,2,3), with
// 8 layers over 3 stages an uneven split.
INSTANTIATE_TEST_SUITE_P(AllLayouts, Layouts,
                         ::testing::Values(std::make_tuple(1, 1), std::make_tuple(2, 1),
                                           std::make_tuple(4, 1), std::make_tuple(8, 1),
                                           std::make_tuple(1, 8), std::make_tuple(2, 2),
                                           std::make_tuple(2, 4), std::make_tuple(1, 2),
                                           std::make_tuple(4, 2), std::make_tuple(1, 3),
                                           std::make_tuple(2, 3)));

TEST(LayoutsBf16, AllThreeKindsTrackTheOneRankRun) {
  static const RefRun ref = reference("bf16");
  auto w = mpi_world();
  const int tp = w->size() % 2 == 0 ? 2 : 1;
  const int pp = w->size() % (2 * tp) == 0 ? 2 : 1;
  auto backend = make_cpu_backend();
  Trainer t(layout_config(tp, pp, true, "bf16", "none", true), *backend, w);
  const TrainSummary s = t.run();
  // bf16 activations: summation order changes rounding; the losses stay within 1%.
  for (size_t i = 0; i < s.losses.size(); ++i) {
    EXPECT_NEAR(s.losses[i], ref.losses[i], 1e-2 * ref.losses[i]) << "step " << i + 1;
  }
}

// Interleaved 1F1B: 8 layers as pp x 2 chunks; rank r holds chunks r and r + pp.
TEST(Layouts, InterleavedPipelineMatchesOneRank) {
  static const RefRun ref = reference("fp32");
  auto w = mpi_world();
  for (auto [tp, pp] : {std::pair{1, 2}, std::pair{2, 2}, std::pair{1, 4}}) {
    if (w->size() % (tp * pp) != 0) continue;
    RunConfig cfg = layout_config(tp, pp, tp > 1, "fp32", "none", tp > 1);
    cfg.parallel.virtual_stages = 2;
    auto backend = make_cpu_backend();
    Trainer t(cfg, *backend, w);
    EXPECT_EQ(t.model().options().chunks, 2);
    const TrainSummary s = t.run();
    for (size_t i = 0; i < s.losses.size(); ++i) {
      EXPECT_NEAR(s.losses[i], ref.losses[i], 1e-5 * ref.losses[i])
          << "step " << i + 1 << " tp " << tp << " pp " << pp;
    }
    expect_same_weights(t, ref.reference_weights, 1e-4);
  }
}

// model.vocab = 500 pads to 512 on one rank but to 128 x tp multiples elsewhere (1024 with
// tp = 8): the padded columns are masked, so the losses still agree.
TEST(Layouts, VocabularyPaddingDoesNotChangeTheModel) {
  auto w = mpi_world();
  const int tp = w->size() % 8 == 0 ? 8 : (w->size() % 2 == 0 ? 2 : 1);
  if (tp == 1) GTEST_SKIP() << "needs tensor parallelism";
  RunConfig one = layout_config(1, 1, false, "fp32");
  one.model.vocab = 500;
  const std::vector<double> ref = solo_run(one).losses;
  RunConfig cfg = layout_config(tp, 1, false, "fp32");
  cfg.model.vocab = 500;
  auto backend = make_cpu_backend();
  Trainer t(cfg, *backend, w);
  EXPECT_EQ(t.model().padded_vocab(), 128 * tp * ((500 + 128 * tp - 1) / (128 * tp)));
  const TrainSummary s = t.run();
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_NEAR(s.losses[i], ref[i], 1e-5 * ref[i]) << "step " << i + 1 << " tp " << tp;
  }
}

TEST(Layouts, ExplicitUnevenStageSplitMatchesOneRank) {
  static const RefRun ref = reference("fp32");
  auto w = mpi_world();
  if (w->size() % 3 != 0) GTEST_SKIP() << "needs a multiple of 3 ranks";
  RunConfig cfg = layout_config(1, 3, false, "fp32");
  cfg.parallel.stage_layers = {2, 5, 1};
  auto backend = make_cpu_backend();
  Trainer t(cfg, *backend, w);
  EXPECT_EQ(t.model().options().num_layers, (std::vector<int64_t>{2, 5, 1})[t.grid().pp_rank()]);
  const TrainSummary s = t.run();
  for (size_t i = 0; i < s.losses.size(); ++i) {
    EXPECT_NEAR(s.losses[i], ref.losses[i], 1e-5 * ref.losses[i]) << "step " << i + 1;
  }
  expect_same_weights(t, ref.reference_weights, 1e-4);
}

// log.comm: the bytes each rank hands to each group in one step, against the analytic count
// (docs/metrics.md), e bytes per activation element (4 in fp32, 2 in bf16): per microbatch,
// tensor parallel all-reduces N h e four times per layer (two forward, two backward), once
// for the embedding, and on the last stage 3 N f32 for the cross-entropy parts plus N h e for
// the head's input gradient; pipeline sends N h e forward (not on the last stage) and
// backward (not on the first); data parallel reduces the flat f32 grads once (plus, with
// ZeRO-1, all-gathers this rank's 1/dp of the weights, e bytes each); the embedding group
// sums the tied embedding's f32 gradient.
TEST(CommBytes, EveryGroupSendsWhatTheLayoutImplies) {
  auto w = mpi_world();
  const int n = w->size();
  const int tp = n % 2 == 0 ? 2 : 1;
  const int pp = n % (2 * tp) == 0 ? 2 : 1;
  for (const std::string precision : {"fp32", "bf16"}) {
    for (bool zero1 : {false, true}) {
      RunConfig cfg = layout_config(tp, pp, zero1, precision);
      cfg.log.comm = true;
      cfg.train.steps = 2;
      auto backend = make_cpu_backend();
      Trainer t(cfg, *backend, w);
      t.run();
      Grid& g = t.grid();
      const uint64_t e = precision == "bf16" ? 2 : 4;
      const uint64_t tokens = cfg.parallel.micro_batch * cfg.model.context;
      const uint64_t nh = tokens * cfg.model.d_model * e;
      const uint64_t micro = cfg.train.global_batch / (cfg.parallel.micro_batch * g.dp_size());
      const uint64_t layers = t.model().options().num_layers;
      const bool first = g.first_stage(), last = g.last_stage();
      const uint64_t tp_bytes =
          tp > 1 ? micro * (layers * 4 * nh + (first ? nh : 0) + (last ? 3 * tokens * 4 + nh : 0)) : 0;
      const uint64_t pp_bytes = pp > 1 ? micro * ((last ? 0 : nh) + (first ? 0 : nh)) : 0;
      const uint64_t total = t.model().params().total_numel();
      const uint64_t dp_bytes =
          g.dp_size() > 1 ? total * 4 + (zero1 ? total / g.dp_size() * e : 0) : 0;
      const std::string what = precision + (zero1 ? ", ZeRO-1" : "");
      EXPECT_EQ(g.tp().bytes_sent(), tp_bytes) << "tp, " << what;
      EXPECT_EQ(g.pp().bytes_sent(), pp_bytes) << "pp, " << what;
      EXPECT_EQ(g.dp().bytes_sent(), dp_bytes) << "dp, " << what;
      const uint64_t wte = first || last ? t.model().embedding_grad().numel() * 4 : 0;
      EXPECT_EQ(g.embedding().bytes_sent(), pp > 1 ? wte : 0) << "embedding, " << what;
    }
  }
}

}  // namespace
}  // namespace jumbo
