// What the CUDA backend cannot run is refused when a run is validated, before any device is
// opened: one line naming train.device and the model's keys (exit 2 from `jumbo train`), not
// an exception from a kernel in the first step. Needs no GPU, so it runs everywhere the CUDA
// build does.
#include <gtest/gtest.h>

#include <string>

#include "jumbo/config/config.h"
#include "jumbo/parallel/stage_plan.h"
#include "jumbo/runtime/device.h"

namespace jumbo {
namespace {

RunConfig run_with_heads(int64_t heads) {
  return parse_run_config(
      "[model]\nlayers = 2\nd_model = 256\nheads = " + std::to_string(heads) +
          "\nvocab = 512\ncontext = 64\n[train]\nsteps = 1\nglobal_batch = 1\ndevice = \"cuda\"\n"
          "[data]\ntrain = \"x\"\ntokenizer = \"x.model\"\n",
      "validation-test", {});
}

StageOptions stage_of(const RunConfig& cfg) { return plan_stage(cfg, GridCoords{}).model; }

TEST(GpuValidation, UnsupportedHeadSizeIsAUserErrorBeforeAnyDevice) {
  const RunConfig cfg = run_with_heads(8);  // head size 32
  try {
    check_device_supports(cfg, stage_of(cfg), cfg.parallel.device);
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("validation-test: train.device = \"cuda\": attention head size 32", 0), 0u)
        << what;
    EXPECT_NE(what.find("64, 128 and 144"), std::string::npos) << what;
    EXPECT_NE(what.find("model.d_model = 256, model.heads = 8"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  // Head sizes the kernels have, and the CPU, which runs every one.
  EXPECT_NO_THROW(check_device_supports(run_with_heads(4), stage_of(run_with_heads(4)), Device::cuda));  // 64
  EXPECT_NO_THROW(check_device_supports(run_with_heads(2), stage_of(run_with_heads(2)), Device::cuda));  // 128
  EXPECT_NO_THROW(check_device_supports(cfg, stage_of(cfg), Device::cpu));
}

}  // namespace
}  // namespace jumbo
