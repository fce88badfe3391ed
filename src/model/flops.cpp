#include "jumbo/model/flops.h"

namespace jumbo {

int64_t parameter_count(const ModelConfig& m, int64_t tp) {
  const int64_t h = m.d_model, f = m.ffn_dim(), l = m.layers;
  const int64_t per_layer = 2 * h          // ln1
                            + 3 * h * h + 3 * h  // qkv
                            + h * h + h          // proj
                            + 2 * h              // ln2
                            + f * h + f          // fc1
                            + h * f + h;         // fc2
  return m.padded_vocab(tp) * h + m.context * h + l * per_layer + 2 * h;
}

double parameter_count_formula(const ModelConfig& m) {
  const double l = static_cast<double>(m.layers), h = static_cast<double>(m.d_model);
  const double v = static_cast<double>(m.vocab), s = static_cast<double>(m.context);
  return 12.0 * l * h * h * (1.0 + 13.0 / (12.0 * h) + (v + s) / (12.0 * l * h));
}

double model_flops_per_iteration(const ModelConfig& m, int64_t sequences, int64_t seq) {
  const double b = static_cast<double>(sequences), s = static_cast<double>(seq);
  const double l = static_cast<double>(m.layers), h = static_cast<double>(m.d_model);
  const double v = static_cast<double>(m.padded_vocab());
  // The formula assumes ffn = 4h; scale the MLP's share (16 of the 24 h^2 terms) otherwise.
  const double mlp_ratio = static_cast<double>(m.ffn_dim()) / (4.0 * h);
  const double dense = (8.0 + 16.0 * mlp_ratio) / 24.0;
  return 72.0 * b * s * l * h * h * (dense + s / (12.0 * h) + v / (12.0 * l * h));
}

double model_flops_per_token(const ModelConfig& m, int64_t seq) {
  return model_flops_per_iteration(m, 1, seq) / static_cast<double>(seq);
}

LoraLayerShard lora_layer_adapters(const ModelConfig& m, int64_t rank, LoraTargetSet targets,
                                   int64_t tp) {
  const int64_t h = m.d_model, f = m.ffn_dim();
  LoraLayerShard s;
  // Column-parallel: A [r x in] whole, B [out x r] split by output.
  const auto column = [&](int64_t in, int64_t out) {
    s.replicated += rank * in;
    s.split += out / tp * rank;
  };
  // Row-parallel: A [r x in] split by input, B [out x r] whole.
  const auto row = [&](int64_t in, int64_t out) {
    s.split += rank * (in / tp);
    s.replicated += out * rank;
  };
  if (targets.has(LoraTarget::qkv)) column(h, 3 * h);
  if (targets.has(LoraTarget::proj)) row(h, h);
  if (targets.has(LoraTarget::fc1)) column(h, f);
  if (targets.has(LoraTarget::fc2)) row(f, h);
  return s;
}

int64_t lora_adapter_params(const ModelConfig& m, int64_t rank, LoraTargetSet targets) {
  return m.layers * lora_layer_adapters(m, rank, targets).held();
}

}  // namespace jumbo
