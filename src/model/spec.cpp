#include "jumbo/model/spec.h"

namespace jumbo {

ModelSpec model_spec(const ModelConfig& cfg, int64_t tp) {
  ModelSpec s;
  s.norm = cfg.norm;
  s.position = cfg.position;
  s.mlp = cfg.mlp;
  s.layers = cfg.layers;
  s.d_model = cfg.d_model;
  s.heads = cfg.heads;
  s.kv_heads = cfg.kv_head_count();
  s.head_dim = cfg.head_dim();
  s.ffn = cfg.ffn_dim();
  s.vocab = cfg.vocab;
  s.context = cfg.context;
  s.tp = tp;
  s.tied_embeddings = cfg.tied_embeddings;
  s.linear_bias = cfg.linear_bias;
  s.qkv_bias = cfg.linear_bias || cfg.qkv_bias;
  s.qk_norm = cfg.qk_norm;
  s.norm_eps = static_cast<float>(cfg.norm_eps);
  return s;
}

int64_t ModelSpec::layer_params() const {
  int64_t n = layer_matrix_params() + 2 * norm_params() + qk_norm_params();
  if (qkv_bias) n += qkv_width();
  if (linear_bias) n += d_model + up_width() + d_model;  // o, up (+ gate), down
  return n;
}

}  // namespace jumbo
