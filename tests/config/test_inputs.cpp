// The shipped configs: inputs/runs/demo.toml (also compiled into the binary) and every model
// preset in inputs/models/ load and validate. Paths in configs are relative to the working
// directory, so these tests run from the repository root.
#include <filesystem>
#include <set>

#include <gtest/gtest.h>

#include "jumbo/config/config.h"
#include "jumbo/embedded_demo.h"

namespace jumbo {
namespace {

class ShippedInputs : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = std::filesystem::current_path();
    std::filesystem::current_path(JUMBO_SOURCE_DIR);
  }
  void TearDown() override { std::filesystem::current_path(saved_); }

 private:
  std::filesystem::path saved_;
};

TEST_F(ShippedInputs, DemoRunLoadsWithItsPresetAndValidates) {
  const RunConfig cfg = load_run_config("inputs/runs/demo.toml", {});
  EXPECT_EQ(cfg.source, "inputs/runs/demo.toml");
  EXPECT_EQ(cfg.model.preset, "inputs/models/demo-small.toml");
  EXPECT_EQ(cfg.model.name, "demo-small");
  EXPECT_EQ(cfg.model.layers, 4);
  EXPECT_EQ(cfg.model.d_model, 256);
  EXPECT_EQ(cfg.model.heads, 4);
  EXPECT_EQ(cfg.model.ffn_dim(), 1024);
  EXPECT_EQ(cfg.model.vocab, 4096);
  EXPECT_EQ(cfg.model.context, 128);
  EXPECT_EQ(cfg.parallel.micro_batch, 16);
  EXPECT_EQ(cfg.train.steps, 300);
  EXPECT_EQ(cfg.train.global_batch, 32);
  EXPECT_DOUBLE_EQ(cfg.train.lr, 2e-3);
  EXPECT_DOUBLE_EQ(cfg.train.min_lr, 2e-4);
  EXPECT_EQ(cfg.train.warmup_tokens, 200000);
  EXPECT_EQ(cfg.train.seed, 1234u);
  EXPECT_EQ(cfg.train.precision, Precision::fp32);
  EXPECT_EQ(cfg.train.eval_every, 50);
  EXPECT_EQ(cfg.data.train.describe(), "build/demo/brown-train");
  EXPECT_EQ(cfg.data.valid.describe(), "build/demo/brown-valid");
  EXPECT_EQ(cfg.data.tokenizer, "build/demo/brown-4k.model");
  EXPECT_EQ(cfg.log.metrics_file, "build/demo/metrics.jsonl");
  EXPECT_EQ(cfg.log.every, 10);
  // Untouched keys keep GPT-3's values.
  EXPECT_DOUBLE_EQ(cfg.train.beta2, 0.95);
  EXPECT_DOUBLE_EQ(cfg.train.weight_decay, 0.1);
  EXPECT_NO_THROW(validate(cfg, 1));
  EXPECT_NO_THROW(validate(cfg, 2));  // dp 2: 32 = 16 x 2
  EXPECT_THROW(validate(cfg, 4), UserError);  // dp 4: 32 is not a multiple of 16 x 4
}

TEST_F(ShippedInputs, EmbeddedDemoIsTheDemoFile) {
  const RunConfig embedded = parse_run_config(kEmbeddedDemoToml, "<embedded demo>", {});
  const RunConfig file = load_run_config("inputs/runs/demo.toml", {});
  EXPECT_EQ(embedded.source, "<embedded demo>");
  RunConfig renamed = embedded;
  renamed.source = file.source;
  EXPECT_EQ(describe(renamed), describe(file));
}

struct PresetShape {
  const char* file;
  int64_t layers, d_model, heads, ffn, vocab, context;
};

TEST_F(ShippedInputs, EveryPresetLoadsWithItsPublishedShape) {
  const PresetShape shapes[] = {
      {"inputs/models/j1-jumbo.toml", 76, 13824, 96, 55296, 256000, 2048},
      {"inputs/models/j1-large.toml", 32, 4096, 32, 16384, 256000, 2048},
      {"inputs/models/gpt2-124m.toml", 12, 768, 12, 3072, 50257, 1024},
      {"inputs/models/tiny.toml", 2, 64, 4, 256, 512, 32},
      {"inputs/models/demo-small.toml", 4, 256, 4, 1024, 4096, 128},
      {"inputs/models/gpt-1.3b.toml", 24, 2048, 16, 8192, 50257, 2048},
      {"inputs/models/llama3-8b.toml", 32, 4096, 32, 14336, 128256, 8192},
      {"inputs/models/llama3-70b.toml", 80, 8192, 64, 28672, 128256, 8192},
      {"inputs/models/llama3.2-1b.toml", 16, 2048, 32, 8192, 128256, 8192},
      {"inputs/models/mistral-7b.toml", 32, 4096, 32, 14336, 32768, 32768},
      {"inputs/models/qwen2.5-0.5b.toml", 24, 896, 14, 4864, 151936, 32768},
      {"inputs/models/tiny-llama.toml", 4, 64, 4, 192, 512, 32},
  };
  std::set<std::string> checked;
  for (const PresetShape& s : shapes) {
    SCOPED_TRACE(s.file);
    const ModelConfig m = load_model_config(s.file);
    EXPECT_EQ(m.preset, s.file);
    EXPECT_EQ(std::filesystem::path(s.file).stem().string(), m.name);
    EXPECT_EQ(m.layers, s.layers);
    EXPECT_EQ(m.d_model, s.d_model);
    EXPECT_EQ(m.heads, s.heads);
    EXPECT_EQ(m.ffn_dim(), s.ffn);
    EXPECT_EQ(m.vocab, s.vocab);
    EXPECT_EQ(m.context, s.context);
    checked.insert(std::filesystem::path(s.file).filename().string());
    // Each preset also drives a run (the demo's schedule) on one rank.
    RunConfig run = load_run_config("inputs/runs/demo.toml", {std::string("model.preset=") + s.file});
    EXPECT_EQ(run.model.d_model, s.d_model);
    EXPECT_NO_THROW(validate(run, 1));
  }
  // No preset in inputs/models/ goes untested.
  for (const auto& entry : std::filesystem::directory_iterator("inputs/models")) {
    if (entry.path().extension() == ".toml") {
      EXPECT_TRUE(checked.count(entry.path().filename().string())) << entry.path();
    }
  }
}

TEST_F(ShippedInputs, JumboLayoutOfThePublishedRunValidates) {
  // Megatron-Core's 177B layout (REFERENCES.md): TP8 PP6 DP48 on 2304 GPUs.
  // 76 layers do not split evenly into 6 stages, which validate allows (pp <= layers).
  const RunConfig cfg = load_run_config(
      "inputs/runs/demo.toml", {"model.preset=inputs/models/j1-jumbo.toml", "parallel.tp=8",
                                "parallel.pp=6", "parallel.micro_batch=1", "train.global_batch=1536",
                                // evaluation microbatches are shared by the 48 dp ranks
                                "train.eval_batches=48"});
  EXPECT_NO_THROW(validate(cfg, 2304));
  EXPECT_EQ(cfg.model.padded_vocab(8), 256000);  // already a multiple of 128 x 8
  EXPECT_THROW(validate(cfg, 2300), UserError);
}

TEST_F(ShippedInputs, ClusterRunConfigsValidateOnTheirNodeCounts) {
  // slurm/train_jumbo.sh's default: 64 p4d nodes; train_large.sh's: 4 (8 GPUs each).
  const RunConfig jumbo = load_run_config("inputs/runs/j1-jumbo.toml", {});
  EXPECT_EQ(jumbo.model.name, "j1-jumbo");
  EXPECT_EQ(jumbo.train.gpu, "a100-40gb");
  EXPECT_EQ(jumbo.checkpoint.resume, "auto");
  EXPECT_NO_THROW(validate(jumbo, 64 * 8));
  EXPECT_NO_THROW(validate(jumbo, 128 * 8));
  const RunConfig large = load_run_config("inputs/runs/j1-large.toml", {});
  EXPECT_EQ(large.model.name, "j1-large");
  EXPECT_NO_THROW(validate(large, 4 * 8));
}

}  // namespace
}  // namespace jumbo
