#include <gtest/gtest.h>

#include "jumbo/config/config.h"
#include "jumbo/model/flops.h"

namespace jumbo {
namespace {

TEST(Flops, J1JumboHas178BParameters) {
  const ModelConfig m = load_model_config(JUMBO_SOURCE_DIR "/inputs/models/j1-jumbo.toml");
  const double n = static_cast<double>(parameter_count(m));
  EXPECT_NEAR(n, 178e9, 0.01 * 178e9);
  EXPECT_NEAR(parameter_count_formula(m), n, 1e-6 * n);
}

TEST(Flops, Gpt2SmallMatchesTheKnownCount) {
  const ModelConfig m = load_model_config(JUMBO_SOURCE_DIR "/inputs/models/gpt2-124m.toml");
  // GPT-2 small: 124,439,808 parameters with vocab 50257; padding to 50304 adds 47 x 768.
  EXPECT_EQ(parameter_count(m), 124439808 + 47 * 768);
}

TEST(Flops, ModelFlopsAreAboutSixPerParameterPerToken) {
  const ModelConfig m = load_model_config(JUMBO_SOURCE_DIR "/inputs/models/j1-jumbo.toml");
  const double per_token = model_flops_per_token(m, m.context);
  const double ratio = per_token / static_cast<double>(parameter_count(m));
  EXPECT_GT(ratio, 6.0);
  EXPECT_LT(ratio, 6.2);
  // 72 B s l h^2 (1 + s/(12h) + V/(12lh)) by hand for B = 1.
  const double s = 2048, l = 76, h = 13824, v = 256000;
  EXPECT_NEAR(model_flops_per_iteration(m, 1, 2048),
              72 * s * l * h * h * (1 + s / (12 * h) + v / (12 * l * h)), 1e3);
}

// The published parameter counts of the Llama-family presets (each model's safetensors
// total), from the spec's shapes, and the closed form equal to them (no vocabulary padding).
TEST(Flops, LlamaFamilyPresetsHaveTheirPublishedCounts) {
  const std::pair<const char*, int64_t> published[] = {
      {"llama3-8b", 8030261248}, {"llama3-70b", 70553706496}, {"llama3.2-1b", 1235814400},
      {"mistral-7b", 7248023552}, {"qwen2.5-0.5b", 494032768}};
  for (const auto& [name, count] : published) {
    SCOPED_TRACE(name);
    const ModelConfig m =
        load_model_config(std::string(JUMBO_SOURCE_DIR "/inputs/models/") + name + ".toml");
    EXPECT_EQ(parameter_count(m), count);
    EXPECT_EQ(static_cast<int64_t>(parameter_count_formula(m)), count);
  }
}

// LoRA r = 16 on every Llama 3 8B map (PEFT's all-linear): PEFT reports 41,943,040 trainable
// parameters; the same count with tp 8 (B split by output on q, k, v, gate, up).
TEST(Flops, LoraOnEveryLlamaMapIsPeftsCount) {
  const ModelConfig m = load_model_config(JUMBO_SOURCE_DIR "/inputs/models/llama3-8b.toml");
  EXPECT_EQ(lora_adapter_params(m, 16, every_lora_target(m)), 41943040);
  const LoraLayerShard shard = lora_layer_adapters(m, 16, every_lora_target(m), 8);
  EXPECT_EQ(m.layers * (8 * shard.split + shard.replicated), 41943040);
}

// With tp the exact count is of the padded vocabulary; qk-norm adds two [D] vectors a layer.
TEST(Flops, QkNormAddsTwoHeadVectorsPerLayer) {
  ModelConfig m = load_model_config(JUMBO_SOURCE_DIR "/inputs/models/tiny-llama.toml");
  const int64_t without = parameter_count(m);
  m.qk_norm = true;
  EXPECT_EQ(parameter_count(m), without + m.layers * 2 * m.head_dim());
}

// Grouped-query attention's FLOPs: 6 per token and matrix element, plus attention's.
TEST(Flops, LlamaFlopsCountTheGroupedMapsAndSwiglu) {
  const ModelConfig m = load_model_config(JUMBO_SOURCE_DIR "/inputs/models/llama3-8b.toml");
  const double s = 8192, l = 32, h = 4096, kv = 8 * 128, f = 14336, v = 128256;
  const double matrices = l * (h * (h + 2 * kv) + h * h + 3 * h * f) + v * h;
  EXPECT_NEAR(model_flops_per_iteration(m, 1, 8192), 6 * s * matrices + 6 * s * s * l * h,
              1e-12 * 6 * s * matrices);
}

}  // namespace
}  // namespace jumbo
