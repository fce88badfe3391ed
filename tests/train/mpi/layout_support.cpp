// Shared helpers of the tests under mpirun (see layout_support.h).
#include "layout_support.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "../../data/data_test_support.h"
#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/data/prepare.h"

namespace jumbo::test {

namespace fs = std::filesystem;

// Rank 0 makes the tokenizer and the two blended datasets in the build tree; the others wait.
const std::string& data_dir() {
  static const std::string dir = [] {
    const fs::path d = fs::path(JUMBO_BINARY_DIR) / "test-data" / "layouts";
    auto w = mpi_world();
    if (w->rank() == 0) {
      fs::create_directories(d);
      const std::string docs = (d / "docs.jsonl").string();
      write_brown_subset(docs, 10);
      PrepareOptions p;
      p.inputs = {docs};
      p.tokenizer = small_tokenizer();
      p.output_prefix = (d / "train").string();
      prepare_dataset(p);
      // A second, smaller dataset: every layout and resume test trains on a blend of both.
      const std::string docs2 = (d / "docs2.jsonl").string();
      write_brown_subset(docs2, 4);
      p.inputs = {docs2};
      p.output_prefix = (d / "train2").string();
      prepare_dataset(p);
    }
    w->barrier();
    return d.string();
  }();
  return dir;
}

RunConfig layout_config(int tp, int pp, bool zero1, const std::string& precision,
                        const std::string& recompute, bool sequence_parallel, Family family) {
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
      "data.train=0.7 " + d + "/train 0.3 " + d + "/train2", "data.valid=", "data.tokenizer=" + small_tokenizer(),
      "log.metrics_file=", "log.peak_tflops=1"};
  if (family == Family::llama) {
    for (const char* key : {"model.norm=rmsnorm", "model.position=rope", "model.mlp=swiglu",
                            "model.kv_heads=4", "model.tied_embeddings=false",
                            "model.linear_bias=false", "model.ffn=96"}) {
      sets.push_back(key);
    }
  }
  return parse_run_config("[model]\npreset = \"" JUMBO_SOURCE_DIR "/inputs/models/tiny.toml\"\n",
                          "layout-test", sets);
}

// The run of `cfg` (a one-rank layout) on rank 0 alone; its results broadcast to every rank.
RefRun solo_run(const RunConfig& cfg) {
  data_dir();  // collective: every rank, before rank 0 goes off alone
  auto w = mpi_world();
  auto solo = w->split(w->rank() == 0 ? 0 : -1, 0, "solo");
  RefRun r;
  std::vector<float> losses(static_cast<size_t>(cfg.train.steps));
  if (solo) {
    auto backend = make_cpu_backend();
    Trainer t(cfg, *backend, solo);
    const TrainSummary s = t.run();
    for (size_t i = 0; i < losses.size(); ++i) losses[i] = static_cast<float>(s.losses[i]);
    Tensor m = t.optimizer().master();  // one rank: the whole fp32 master, flat order
    r.reference_weights.assign(m.as<float>(), m.as<float>() + m.numel());
  }
  w->broadcast(Tensor(losses.data(), DType::f32, {cfg.train.steps}), 0);
  r.losses.assign(losses.begin(), losses.end());
  int64_t n = static_cast<int64_t>(r.reference_weights.size());
  std::vector<int32_t> size = {static_cast<int32_t>(n)};
  w->broadcast(Tensor(size.data(), DType::i32, {1}), 0);
  r.reference_weights.resize(size[0]);
  w->broadcast(Tensor(r.reference_weights.data(), DType::f32, {size[0]}), 0);
  return r;
}

std::string fresh_checkpoint_dir(const std::string& name) {
  const fs::path d = fs::path(JUMBO_BINARY_DIR) / "test-data" / "checkpoints" / name;
  auto w = mpi_world();
  if (w->rank() == 0) {
    fs::remove_all(d);
    fs::create_directories(d);
  }
  w->barrier();
  return d.string();
}

RefRun reference(const std::string& precision, Family family) {
  return solo_run(layout_config(1, 1, false, precision, "none", false, family));
}

// Compares every element this rank holds with the same global element of the reference.
void expect_same_weights(Trainer& t, const std::vector<float>& ref_flat, double tol,
                         Family family) {
  // The one-rank layout of the same model gives each tensor's offset in ref_flat.
  auto backend = make_cpu_backend();
  auto self = mpi_world()->split(mpi_world()->rank(), 0, "self");
  const RunConfig cfg = layout_config(1, 1, false, "fp32", "none", false, family);
  StageOptions o;
  o.micro_batch = 1;
  o.seq = cfg.model.context;
  const std::unique_ptr<ModelStage> stage = make_model_stage(cfg.model, o, *backend, *self);
  const ModelStage& one = *stage;
  std::map<std::string, int> by_name;
  for (size_t i = 0; i < one.params().size(); ++i) by_name[one.params().info(int(i)).name] = int(i);
  const ParamStore& mine = t.model().params();
  double worst = 0;
  for (size_t i = 0; i < mine.size(); ++i) {
    const ParamInfo& p = mine.info(static_cast<int>(i));
    ASSERT_EQ(by_name.count(p.name), 1u) << p.name;
    const ParamInfo& q = one.params().info(by_name[p.name]);
    const float* got = mine.weight(static_cast<int>(i)).as<float>();  // fp32: the master
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

}  // namespace jumbo::test
