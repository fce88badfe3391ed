#pragma once
// ModelSpec: the architecture as every floor reads it, built once from the model keys
// (config.h's ModelConfig) and the tensor-parallel size. A shape or a count is a formula
// here and nowhere else: the stage's parameters (stage_params), its activations, the
// decoder's KV cache, LoRA's maps, FLOPs, `jumbo info` and the planner read these.
//
// The block is pre-norm: x += o(attn(rope?(qkv(norm1(x))))), x += down(mlp(up(norm2(x)))),
// with the norm (LayerNorm or RMSNorm), position encoding (learned table or RoPE), MLP (GELU
// or SwiGLU), key/value heads, biases and the head's tying as the keys pick them (Megatron-
// Core's layer spec). GPT-3 and Llama are two settings of these keys.
#include <cstdint>

#include "jumbo/config/config.h"

namespace jumbo {

struct ModelSpec {
  Norm norm = Norm::layernorm;
  PositionEncoding position = PositionEncoding::learned;
  Mlp mlp = Mlp::gelu;
  int64_t layers = 0, d_model = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0;
  int64_t vocab = 0, context = 0;
  int64_t tp = 1;
  bool tied_embeddings = true;
  bool linear_bias = true;  // o, up and down (and q, k, v) maps have biases
  bool qkv_bias = true;     // the q, k, v map has a bias
  bool qk_norm = false;     // RMSNorm over each query and key head (its own [D] weights)
  float norm_eps = 1e-5f;

  bool norm_has_bias() const { return norm == Norm::layernorm; }
  bool learned_positions() const { return position == PositionEncoding::learned; }
  bool rope() const { return position == PositionEncoding::rope; }
  bool swiglu() const { return mlp == Mlp::swiglu; }

  // Widths on one tp rank. qkv's rows: kv groups, each (heads / kv_heads) query heads, its key
  // head and its value head (backend.h's grouped layout); tp splits whole groups.
  int64_t heads_local() const { return heads / tp; }
  int64_t kv_heads_local() const { return kv_heads / tp; }
  int64_t qkv_width() const { return (heads + 2 * kv_heads) * head_dim; }
  int64_t qkv_local() const { return qkv_width() / tp; }
  int64_t attn_width() const { return heads * head_dim; }  // the attention's output, o's input
  int64_t attn_local() const { return attn_width() / tp; }
  int64_t ffn_local() const { return ffn / tp; }
  // The up projection's outputs: the hidden layer, or SwiGLU's gate and up side by side.
  int64_t up_width() const { return swiglu() ? 2 * ffn : ffn; }
  int64_t up_local() const { return up_width() / tp; }
  // Weight-matrix elements of one layer (q, k, v, o, up (+ gate), down), whole.
  int64_t layer_matrix_params() const {
    return d_model * qkv_width() + attn_width() * d_model + d_model * up_width() + ffn * d_model;
  }
  // Every parameter of one layer, whole: matrices, biases, norms.
  int64_t layer_params() const;
  // qk-norm's weights of one layer: a [D] vector for queries and one for keys.
  int64_t qk_norm_params() const { return qk_norm ? 2 * head_dim : 0; }
  // A norm's parameters: weight, and LayerNorm's bias.
  int64_t norm_params() const { return norm_has_bias() ? 2 * d_model : d_model; }
  // RoPE's table of cos and sin, f32 [context, head_dim] (model/rope.h).
  int64_t rope_table_elements() const { return rope() ? context * head_dim : 0; }
};

ModelSpec model_spec(const ModelConfig& cfg, int64_t tp = 1);

}  // namespace jumbo
