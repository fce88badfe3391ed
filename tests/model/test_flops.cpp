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

}  // namespace
}  // namespace jumbo
