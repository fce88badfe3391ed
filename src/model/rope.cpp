#include "jumbo/model/rope.h"

#include <cmath>

namespace jumbo {

std::vector<float> rope_inverse_frequencies(const ModelConfig& cfg) {
  const int64_t d = cfg.head_dim();
  std::vector<float> inv(static_cast<size_t>(d / 2));
  for (int64_t i = 0; i < d / 2; ++i) {
    // HF: 1 / (base ** (arange(0, dim, 2).float() / dim)) in fp32.
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(d);
    inv[static_cast<size_t>(i)] = 1.0f / std::pow(static_cast<float>(cfg.rope_theta), exponent);
  }
  if (cfg.rope_scaling != RopeScaling::llama3) return inv;
  // Llama 3.1 (HF's _compute_llama3_parameters): wavelengths longer than
  // original_context / low_freq_factor are divided by factor, shorter than
  // original_context / high_freq_factor kept, and those between interpolated.
  const double factor = cfg.rope_factor, low = cfg.rope_low_freq_factor,
               high = cfg.rope_high_freq_factor;
  const double old_context = static_cast<double>(cfg.rope_original_context);
  const double low_wavelen = old_context / low, high_wavelen = old_context / high;
  for (float& f : inv) {
    const double wavelen = 2 * M_PI / f;
    if (wavelen < high_wavelen) continue;
    if (wavelen > low_wavelen) {
      f = static_cast<float>(f / factor);
      continue;
    }
    const double smooth = (old_context / wavelen - low) / (high - low);
    f = static_cast<float>((1 - smooth) * f / factor + smooth * f);
  }
  return inv;
}

std::vector<float> rope_table(const ModelConfig& cfg, int64_t positions) {
  const std::vector<float> inv = rope_inverse_frequencies(cfg);
  const int64_t half = static_cast<int64_t>(inv.size()), d = 2 * half;
  std::vector<float> table(static_cast<size_t>(positions * d));
  for (int64_t p = 0; p < positions; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      // fp32 angle, as HF's (position.float() @ inv_freq.float()), then cos and sin of it.
      const float angle = static_cast<float>(p) * inv[static_cast<size_t>(i)];
      table[static_cast<size_t>(p * d + i)] = std::cos(angle);
      table[static_cast<size_t>(p * d + half + i)] = std::sin(angle);
    }
  }
  return table;
}

}  // namespace jumbo
