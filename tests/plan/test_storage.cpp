// Storage of a run (plan/storage.h): the checkpoint size formula against real shard images of
// every writer of several layouts, and the retention count against the Checkpointer's rule.
// (tests/ckpt/no_room.sh compares it with a real save on disk.)
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <chrono>

#include "jumbo/ckpt/manifest.h"
#include "jumbo/model/flops.h"
#include "jumbo/parallel/stage_plan.h"
#include "jumbo/plan/storage.h"

namespace jumbo {
namespace {

ModelConfig load(const char* name) {
  return load_model_config(std::string(JUMBO_SOURCE_DIR) + "/inputs/models/" + name + ".toml");
}

Layout layout_of(int64_t tp, int64_t pp, int64_t dp, bool zero1, int64_t bucket = 40'000'000) {
  Layout l;
  l.tp = tp;
  l.pp = pp;
  l.dp = dp;
  l.zero1 = zero1;
  l.bucket_size = bucket;
  l.sequence_parallel = tp > 1;
  return l;
}

// Every writer's shard built for real (zeros: the size does not depend on the values) against
// shard_file_bytes: never below, at most 2% + 8 KiB above.
void expect_formula_bounds_images(const ModelConfig& m, const Layout& l) {
  SCOPED_TRACE(fmt::format("{} {}", m.name, l.describe()));
  const CheckpointSize size = checkpoint_size(m, l);
  int64_t measured = 0, files = 0;
  Manifest header;
  header.model = m;
  header.layout = l;
  header.layout.stage_layers = stage_layer_range(m, l, 0).per_stage;
  for (int64_t pp = 0; pp < l.pp; ++pp) {
    for (int64_t tp = 0; tp < l.tp; ++tp) {
      for (int64_t dp = 0; dp < (l.zero1_active() ? l.dp : 1); ++dp) {
        const GridCoords at{static_cast<int>(tp), static_cast<int>(dp), static_cast<int>(pp)};
        const StagePlan plan = plan_stage(m, l, StepShape{}, at);
        std::vector<std::vector<float>> buffers;
        std::vector<PieceData> pieces;
        std::vector<TensorPiece> described;
        for (StatePiece& sp : state_pieces(plan.params, plan.optimizer_ranges, StateUse::save)) {
          float* base = buffers.emplace_back(3 * static_cast<size_t>(sp.piece.count())).data();
          const int64_t n = sp.piece.count();
          described.push_back(sp.piece);
          pieces.push_back({std::move(sp.piece), {base, base + n, base + 2 * n}});
        }
        const std::vector<char> image = build_shard_image(
            pieces, {{"step", 12345678}, {"format_version", kCheckpointFormatVersion}});
        const auto real = static_cast<int64_t>(image.size());
        const int64_t formula = shard_file_bytes(described);
        EXPECT_GE(formula, real) << shard_file_name(at);
        EXPECT_LE(formula, real + real / 50 + 8192) << shard_file_name(at) << ": "
                                                      << described.size() << " pieces";
        measured += real;
        ++files;
        add_shard_record(header, shard_record_to_json({shard_file_name(at), real, file_crc32(image)},
                                                      described));
      }
    }
  }
  EXPECT_EQ(size.files, files);
  EXPECT_GE(size.shard_bytes, measured);
  EXPECT_LE(size.shard_bytes, measured + measured / 50 + 8192 * files);
  const auto manifest = static_cast<int64_t>(manifest_to_json(header).size());
  EXPECT_GE(size.manifest_bytes, manifest);
  EXPECT_LE(size.manifest_bytes, manifest + 8192);
}

TEST(PlanStorage, CheckpointBytesBoundEveryWritersRealShardWithin2PercentPlus8KiB) {
  const ModelConfig tiny = load("tiny");
  for (const Layout& l : {layout_of(1, 1, 1, false), layout_of(2, 1, 1, false),
                          layout_of(1, 2, 1, false), layout_of(1, 1, 2, true, 5000),
                          layout_of(2, 2, 2, true, 3000), layout_of(4, 2, 1, false),
                          layout_of(1, 1, 4, false)}) {
    expect_formula_bounds_images(tiny, l);
  }
  // Larger pieces and more of them: 8 layers, a vocabulary of 5000.
  ModelConfig wider = tiny;
  wider.name = "wider";
  wider.layers = 8;
  wider.d_model = 256;
  wider.ffn = 1024;
  wider.vocab = 5000;
  for (const Layout& l : {layout_of(1, 1, 1, false), layout_of(2, 2, 4, true, 100000)}) {
    expect_formula_bounds_images(wider, l);
  }
}

TEST(PlanStorage, J1JumboCheckpointIsAbout12BytesPerParameter) {
  // The arithmetic: ~12 bytes per parameter, ~1.94 TiB (tp 8 x pp 16 x dp 8, ZeRO-1
  // as 128 p4d nodes run it). Replicas over tp (norms, biases) add a little.
  const ModelConfig m = load("j1-jumbo");
  const auto t0 = std::chrono::steady_clock::now();
  const CheckpointSize size = checkpoint_size(m, layout_of(8, 16, 8, true));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double params = static_cast<double>(parameter_count(m));
  EXPECT_EQ(size.files, 8 * 16 * 8);
  EXPECT_GT(static_cast<double>(size.total()), 12 * params);
  EXPECT_LT(static_cast<double>(size.total()), 12 * params * 1.01);
  const double tib = static_cast<double>(size.total()) / 1099511627776.0;
  EXPECT_NEAR(tib, 1.94, 0.03);
  EXPECT_LT(seconds, 10.0);  // jumbo plan and every run's start compute it
}

TEST(PlanStorage, CheckpointsAtThePeakOfTheLastSave) {
  CheckpointConfig c;
  c.every = 10;
  c.keep_last = 3;
  RetentionPeak r = checkpoints_at_peak(c, 100);
  EXPECT_EQ(r.saves, 10);
  EXPECT_EQ(r.at_peak, 4);  // 3 kept + the one being written
  c.keep_last = 0;          // every one kept
  EXPECT_EQ(checkpoints_at_peak(c, 100).at_peak, 10);
  c.keep_last = 2;
  c.keep_every = 30;  // 30, 60, 90: 90 is among the newest two before the last save (100)
  r = checkpoints_at_peak(c, 105);  // saves 10..100 and the last step 105
  EXPECT_EQ(r.saves, 11);
  EXPECT_EQ(r.keep_every_kept, 3);
  EXPECT_EQ(r.at_peak, 2 + 2 + 1);  // 90, 100; 30, 60; 105
  // inputs/runs/j1-jumbo.toml: every 250, keep_last 3, keep_every 5000, 95367 steps: the
  // issue's "4 coexist" plus the 18 keep_every copies older than the newest three.
  c.every = 250;
  c.keep_last = 3;
  c.keep_every = 5000;
  r = checkpoints_at_peak(c, 95367);
  EXPECT_EQ(r.saves, 382);
  EXPECT_EQ(r.keep_every_kept, 19);
  EXPECT_EQ(r.at_peak, 22);
  // No schedule (checkpoint.every = 0): the newest kept and the one written.
  EXPECT_EQ(checkpoints_at_peak(CheckpointConfig{}, 1000).at_peak, 2);
}

}  // namespace
}  // namespace jumbo
