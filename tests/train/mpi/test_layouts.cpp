// Every layout computes the same training run: on N ranks, (tp, pp, dp) with ZeRO-1 off and
// on must reproduce the one-rank run's per-step losses within 1e-5 relative and its final
// weights within 1e-4 absolute (fp32). The one-rank reference runs on rank 0 alone, inside the job.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include "../../data/data_test_support.h"
#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"
#include "jumbo/data/prepare.h"
#include "jumbo/train/trainer.h"

namespace jumbo {
namespace {

namespace fs = std::filesystem;

// Rank 0 makes the tokenizer and datasets in the build tree; the others wait.
const std::string& data_dir() {
  static const std::string dir = [] {
    const fs::path d = fs::path(JUMBO_BINARY_DIR) / "test-data" / "layouts";
    auto w = mpi_world();
    if (w->rank() == 0) {
      fs::create_directories(d);
      const std::string docs = (d / "docs.jsonl").string();
      test::write_brown_subset(docs, 10);
      PrepareOptions p;
      p.inputs = {docs};
      p.tokenizer = test::small_tokenizer();
      p.output_prefix = (d / "train").string();
      prepare_dataset(p);
    }
    w->barrier();
    return d.string();
  }();
  return dir;
}

RunConfig layout_config(int tp, int pp, bool zero1, const std::string& precision,
                        const std::string& recompute = "none", bool sequence_parallel = false) {
  const std::string d = data_dir();
  std::vector<std::string> sets = {
      "model.layers=8", "model.d_model=64", "model.heads=8", "model.ffn=128",
      "model.vocab=1024",  // padded alike for tp = 1..8
      "model.context=16", "parallel.micro_batch=1", "parallel.tp=" + std::to_string(tp),
      "parallel.pp=" + std::to_string(pp), std::string("parallel.zero1=") + (zero1 ? "true" : "false"),
      "parallel.bucket_size=5000", "parallel.recompute=" + recompute,
      std::string("parallel.sequence_parallel=") + (sequence_parallel ? "true" : "false"),  // several buckets, so reductions overlap the backward
      "train.steps=10", "train.global_batch=24", "train.lr=1e-3", "train.min_lr=1e-4",
      "train.warmup_tokens=200", "train.eval_every=0", "train.precision=" + precision,
      "data.train=" + d + "/train", "data.valid=", "data.tokenizer=" + test::small_tokenizer(),
      "log.metrics_file=", "log.peak_tflops=1"};
  return parse_run_config("[model]\npreset = \"" JUMBO_SOURCE_DIR "/inputs/models/tiny.toml\"\n",
                          "layout-test", sets);
}

struct RefRun {
  std::vector<double> losses;
  std::vector<float> reference_weights;  // the one-rank run's flat master (rank 0 only)
};

// The one-rank run, on rank 0 of the job; losses broadcast to every rank.
// The run of `cfg` (a one-rank layout) on rank 0 alone; its results broadcast to every rank.
RefRun solo_run(const RunConfig& cfg) {
  data_dir();  // collective: every rank, before rank 0 goes off alone
  auto w = mpi_world();
  auto solo = w->split(w->rank() == 0 ? 0 : -1, 0, "solo");
  RefRun r;
  std::vector<float> losses(10);
  if (solo) {
    auto backend = make_cpu_backend();
    Trainer t(cfg, *backend, solo);
    const TrainSummary s = t.run();
    for (size_t i = 0; i < losses.size(); ++i) losses[i] = static_cast<float>(s.losses[i]);
    Tensor m = t.model().params().all_master();
    r.reference_weights.assign(m.as<float>(), m.as<float>() + m.numel());
  }
  w->broadcast(Tensor(losses.data(), DType::f32, {10}), 0);
  r.losses.assign(losses.begin(), losses.end());
  int64_t n = static_cast<int64_t>(r.reference_weights.size());
  std::vector<int32_t> size = {static_cast<int32_t>(n)};
  w->broadcast(Tensor(size.data(), DType::i32, {1}), 0);
  r.reference_weights.resize(size[0]);
  w->broadcast(Tensor(r.reference_weights.data(), DType::f32, {size[0]}), 0);
  return r;
}

RefRun reference(const std::string& precision) {
  return solo_run(layout_config(1, 1, false, precision));
}

// Compares every element this rank holds with the same global element of the reference.
void expect_same_weights(Trainer& t, const std::vector<float>& ref_flat, double tol) {
  // The one-rank layout of the same model gives each tensor's offset in ref_flat.
  auto backend = make_cpu_backend();
  auto self = mpi_world()->split(mpi_world()->rank(), 0, "self");
  const RunConfig cfg = layout_config(1, 1, false, "fp32");
  GptOptions o;
  o.micro_batch = 1;
  o.seq = cfg.model.context;
  GptModel one(cfg.model, o, *backend, *self);
  std::map<std::string, int> by_name;
  for (size_t i = 0; i < one.params().size(); ++i) by_name[one.params().info(int(i)).name] = int(i);
  const ParamStore& mine = t.model().params();
  double worst = 0;
  for (size_t i = 0; i < mine.size(); ++i) {
    const ParamInfo& p = mine.info(static_cast<int>(i));
    ASSERT_EQ(by_name.count(p.name), 1u) << p.name;
    const ParamInfo& q = one.params().info(by_name[p.name]);
    const float* got = mine.master(static_cast<int>(i)).as<float>();
    const int64_t cols = p.slice.shape.size() == 2 ? p.slice.shape[1] : 1;
    const int64_t gcols = p.slice.global_shape.size() == 2 ? p.slice.global_shape[1] : 1;
    const int64_t col0 = p.slice.offset.size() == 2 ? p.slice.offset[1] : 0;
    for (int64_t e = 0; e < p.numel(); ++e) {
      const int64_t row = p.slice.offset[0] + e / cols, col = col0 + e % cols;
      const float want = ref_flat[q.flat_offset + row * gcols + col];
      worst = std::max(worst, std::abs(double(got[e]) - want));
    }
  }
  // Absolute: Adam normalises each gradient by its own running RMS, so a weight whose gradient
  // is at rounding-noise level (padded vocabulary rows) can move by a noise-driven fraction of
  // lr per step in any layout; absolute differences stay below 1e-4 (weights are ~0.02 to 1).
  EXPECT_LT(worst, tol) << "largest absolute weight difference";
}

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
// (docs/metrics.md): per microbatch, tensor parallel all-reduces N h e four times per layer
// (two forward, two backward), once for the embedding, and on the last stage 3 N f32 for the
// cross-entropy parts plus N h e for the head's input gradient; pipeline sends N h e forward
// (not on the last stage) and backward (not on the first); data parallel reduces the flat f32
// grads once (plus, with ZeRO-1, all-gathers this rank's 1/dp of the compute weights); the
// embedding group sums the tied embedding's f32 gradient.
TEST(CommBytes, EveryGroupSendsWhatTheLayoutImplies) {
  auto w = mpi_world();
  const int n = w->size();
  const int tp = n % 2 == 0 ? 2 : 1;
  const int pp = n % (2 * tp) == 0 ? 2 : 1;
  for (bool zero1 : {false, true}) {
    RunConfig cfg = layout_config(tp, pp, zero1, "fp32");
    cfg.log.comm = true;
    cfg.train.steps = 2;
    auto backend = make_cpu_backend();
    Trainer t(cfg, *backend, w);
    t.run();
    Grid& g = t.grid();
    const uint64_t e = 4, tokens = cfg.parallel.micro_batch * cfg.model.context;
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
    EXPECT_EQ(g.tp().bytes_sent(), tp_bytes) << "tp, zero1 " << zero1;
    EXPECT_EQ(g.pp().bytes_sent(), pp_bytes) << "pp";
    EXPECT_EQ(g.dp().bytes_sent(), dp_bytes) << "dp, zero1 " << zero1;
    if (g.embedding() && pp > 1) {
      const uint64_t wte = t.model().embedding_grad().numel() * 4;
      EXPECT_EQ(g.embedding()->bytes_sent(), wte) << "embedding";
    }
  }
}

}  // namespace
}  // namespace jumbo
