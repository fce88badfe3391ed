// A whole training step on the GPU against the same step on the CPU: the same model (head
// size 64, so flash attention runs), the same counter-based init and the same tokens; losses,
// grad norms and the updated weights must agree within the dtype's tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gpu_test_support.h"
#include "jumbo/comm/comm.h"
#include "jumbo/model/transformer.h"
#include "jumbo/train/step.h"
#include "jumbo/train/train_stage.h"

namespace jumbo::gputest {
namespace {

// Deterministic tokens and next-token targets, the same on every call sequence.
class FixedBatches final : public MicrobatchSource {
 public:
  FixedBatches(int64_t n, int32_t vocab) : ids_(random_ids(64 * n, 0, vocab - 1, 42)), n_(n) {}
  void next(const MicrobatchView& mb) override {
    for (int64_t i = 0; i < n_; ++i) {
      mb.tokens[i] = ids_[(calls_ * n_ + i) % ids_.size()];
      mb.targets[i] = ids_[(calls_ * n_ + i + 1) % ids_.size()];
    }
    ++calls_;
  }

 private:
  std::vector<int32_t> ids_;
  int64_t n_, calls_ = 0;
};

struct StepsRun {
  std::vector<double> losses, norms;
  Values weights;  // the first layer's qkv weight after the last step
};

StepsRun train_three_steps(Backend& backend, Precision precision) {
  const ModelConfig m = small_gpu_model("gpu-step");
  // One rank, two microbatches of 2 x 128 per step: the trainer's own parts.
  Layout layout;
  layout.micro_batch = 2;
  layout.device = backend.device().kind();
  TrainConfig tc;
  tc.precision = precision;
  tc.seed = 1234;
  TrainStage solo = solo_train_stage(
      m, layout, {.global_batch = 4, .seq = 128, .precision = precision}, tc, backend);
  FixedBatches source(2 * 128, static_cast<int32_t>(m.vocab));
  StepsRun run;
  for (int s = 0; s < 3; ++s) {
    const StepResult r = train_step(
        solo, source, {.microbatches = 2, .loss_tokens = 4 * 128, .lr = 1e-3, .grad_clip = 1.0});
    run.losses.push_back(r.loss);
    run.norms.push_back(r.grad_norm);
  }
  const ParamStore& ps = solo.model().params();
  for (int i = 0; i < static_cast<int>(ps.size()); ++i) {
    if (ps.info(i).name != "layers.0.attn.qkv.weight") continue;
    // One rank: the optimizer's master is whole and in flat order, in either precision.
    const Tensor w = solo.optimizer().master().rows(ps.info(i).flat_offset, ps.info(i).numel());
    std::vector<float> host(static_cast<size_t>(w.numel()));
    backend.to_host(host.data(), w);
    run.weights.assign(host.begin(), host.end());
  }
  return run;
}

void expect_close(const std::vector<double>& gpu, const std::vector<double>& cpu, double tol,
                  const char* what) {
  ASSERT_EQ(gpu.size(), cpu.size());
  for (size_t i = 0; i < gpu.size(); ++i)
    EXPECT_NEAR(gpu[i], cpu[i], tol * std::abs(cpu[i])) << what << " at step " << i + 1;
}

TEST(GpuTrainingStep, ThreeStepsMatchTheCpu) {
  JUMBO_REQUIRE_GPU();
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    SCOPED_TRACE(to_string(p));
    auto cpu = make_cpu_backend();
    auto gpu = make_cuda_backend(0);
    const StepsRun want = train_three_steps(*cpu, p);
    const StepsRun got = train_three_steps(*gpu, p);
    // f32: the same arithmetic in another order; bf16: roundings of stored activations.
    const double tol = p == Precision::fp32 ? 1e-4 : 2e-2;
    expect_close(got.losses, want.losses, tol, "loss");
    expect_close(got.norms, want.norms, p == Precision::fp32 ? 1e-3 : 5e-2, "grad norm");
    ASSERT_FALSE(want.weights.empty());
    ASSERT_EQ(got.weights.size(), want.weights.size());
    double worst = 0, scale = 0;
    for (size_t i = 0; i < want.weights.size(); ++i) {
      worst = std::max(worst, std::abs(got.weights[i] - want.weights[i]));
      scale = std::max(scale, std::abs(want.weights[i]));
    }
    EXPECT_LE(worst, tol * scale) << "updated qkv weight";
    // check.sh's table: the whole step as one row (losses and the updated weight).
    const std::string dt = p == Precision::fp32 ? "f32" : "bf16";
    double loss_err = 0;
    for (size_t i = 0; i < want.losses.size() && i < got.losses.size(); ++i) {
      const double d = std::abs(got.losses[i] - want.losses[i]);
      loss_err = std::max(loss_err, d / std::abs(want.losses[i]));
    }
    report_error_as("train_step", dt, loss_err, tol, "loss, three steps");
    report_error_as("train_step", dt, scale > 0 ? worst / scale : worst, tol, "updated qkv weight");
    EXPECT_LT(got.losses.back(), got.losses.front()) << "the GPU model learns";
  }
}

}  // namespace
}  // namespace jumbo::gputest
