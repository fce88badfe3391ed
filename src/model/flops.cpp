#include "jumbo/model/flops.h"

#include "jumbo/model/spec.h"

namespace jumbo {

int64_t parameter_count(const ModelConfig& m, int64_t tp) {
  const ModelSpec spec = model_spec(m, tp);
  const int64_t h = spec.d_model, embedding = m.padded_vocab(tp) * h;
  return embedding                                         // token embedding
         + (spec.learned_positions() ? m.context * h : 0)  // position table
         + m.layers * spec.layer_params()                  // layers
         + spec.norm_params()                              // final norm
         + (spec.tied_embeddings ? 0 : embedding);         // untied head
}

namespace {

// The GPT-3 block the paper's closed form describes.
bool paper_block(const ModelSpec& s) {
  return s.norm == Norm::layernorm && s.learned_positions() && s.mlp == Mlp::gelu &&
         s.kv_heads == s.heads && s.tied_embeddings && s.linear_bias && !s.qk_norm &&
         s.ffn == 4 * s.d_model;
}

}  // namespace

double parameter_count_formula(const ModelConfig& m) {
  const ModelSpec spec = model_spec(m);
  const double l = static_cast<double>(m.layers), h = static_cast<double>(m.d_model);
  const double v = static_cast<double>(m.vocab), s = static_cast<double>(m.context);
  if (paper_block(spec)) return 12.0 * l * h * h * (1.0 + 13.0 / (12.0 * h) + (v + s) / (12.0 * l * h));
  const double heads = static_cast<double>(spec.heads), groups = static_cast<double>(spec.kv_heads);
  const double d = static_cast<double>(spec.head_dim), f = static_cast<double>(spec.ffn);
  const double norm = spec.norm_has_bias() ? 2 * h : h;
  const double mlp_maps = spec.swiglu() ? 3 : 2;
  double layer = h * (heads + 2 * groups) * d + heads * d * h + mlp_maps * h * f + 2 * norm;
  if (spec.qkv_bias) layer += (heads + 2 * groups) * d;
  if (spec.qk_norm) layer += 2 * d;
  if (spec.linear_bias) layer += h + (mlp_maps - 1) * f + h;
  return l * layer + (spec.tied_embeddings ? 1 : 2) * v * h +
         (spec.learned_positions() ? s * h : 0) + norm;
}

std::string parameter_count_formula_text(const ModelConfig& m) {
  const ModelSpec spec = model_spec(m);
  if (paper_block(spec)) return "12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h))";
  std::string layer = "h (H + 2G) D + H D h";
  layer += spec.swiglu() ? " + 3 h f" : " + 2 h f";
  layer += spec.norm_has_bias() ? " + 4h" : " + 2h";
  if (spec.qkv_bias) layer += " + (H + 2G) D";
  if (spec.qk_norm) layer += " + 2D";
  if (spec.linear_bias) layer += spec.swiglu() ? " + 2h + 2f" : " + 2h + f";
  std::string out = "l (" + layer + ")";
  out += spec.tied_embeddings ? " + V h" : " + 2 V h";
  if (spec.learned_positions()) out += " + s h";
  out += spec.norm_has_bias() ? " + 2h" : " + h";
  return out;
}

double model_flops_per_iteration(const ModelConfig& m, int64_t sequences, int64_t seq) {
  // 6 FLOPs per token and weight-matrix element (2 forward, 4 backward), the head's V h
  // included, plus attention's q k^T and p v: 2 x 2 s (H D) per token and layer forward,
  // causal at half, x 3. For GPT (ffn 4h, kv heads = heads) this is the paper's
  // 72 B s l h^2 (1 + s/(12h) + V/(12 l h)).
  const ModelSpec spec = model_spec(m);
  const double b = static_cast<double>(sequences), s = static_cast<double>(seq);
  const double l = static_cast<double>(m.layers), h = static_cast<double>(m.d_model);
  const double v = static_cast<double>(m.padded_vocab());
  const double matrices = l * static_cast<double>(spec.layer_matrix_params()) + v * h;
  const double attention = 6.0 * b * s * s * l * static_cast<double>(spec.attn_width());
  return 6.0 * b * s * matrices + attention;
}

double model_flops_per_token(const ModelConfig& m, int64_t seq) {
  return model_flops_per_iteration(m, 1, seq) / static_cast<double>(seq);
}

LoraLayerShard lora_layer_adapters(const ModelConfig& m, int64_t rank, LoraTargetSet targets,
                                   int64_t tp) {
  const ModelSpec spec = model_spec(m);
  const int64_t h = m.d_model, f = spec.ffn;
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
  if (targets.has(LoraTarget::qkv)) column(h, spec.qkv_width());
  if (targets.has(LoraTarget::q)) column(h, spec.heads * spec.head_dim);
  if (targets.has(LoraTarget::k)) column(h, spec.kv_heads * spec.head_dim);
  if (targets.has(LoraTarget::v)) column(h, spec.kv_heads * spec.head_dim);
  if (targets.has(LoraTarget::gate)) column(h, f);
  if (targets.has(LoraTarget::up)) column(h, f);
  if (targets.has(LoraTarget::proj)) row(spec.attn_width(), h);
  if (targets.has(LoraTarget::fc1)) column(h, spec.up_width());
  if (targets.has(LoraTarget::fc2)) row(f, h);
  return s;
}

int64_t lora_adapter_params(const ModelConfig& m, int64_t rank, LoraTargetSet targets) {
  return m.layers * lora_layer_adapters(m, rank, targets).held();
}

}  // namespace jumbo
