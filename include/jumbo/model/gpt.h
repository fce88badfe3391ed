#pragma once
// GPT (GPT-3 architecture): learned absolute positions, pre-LayerNorm blocks with causal
// multi-head attention and a 4x tanh-GELU MLP, final LayerNorm, output head tied to the token
// embedding. Forward and backward are written out kernel by kernel (llm.c style).
// The model sees only Backend& and Comm&: tensor parallelism adds all-reduces over `tp`
// between kernels (Megatron's column/row-parallel layers and vocab-parallel embedding and
// cross-entropy); with one rank those are no-ops.
#include <cstdint>
#include <functional>
#include <vector>

#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"
#include "jumbo/model/params.h"

namespace jumbo {

struct GptOptions {
  int64_t micro_batch = 1;
  int64_t seq = 0;  // <= context
  DType compute_dtype = DType::f32;
  float layernorm_eps = 1e-5f;
  int64_t flat_multiple = 1;  // pad the flat parameter buffers (data-parallel shards)
};

class GptModel {
 public:
  GptModel(const ModelConfig& cfg, const GptOptions& opts, Backend& backend, Comm& tp);

  ParamStore& params() { return params_; }
  const ParamStore& params() const { return params_; }
  void initialize(uint64_t seed) { params_.initialize(backend_, seed); }

  // One microbatch: tokens and targets are host arrays of micro_batch * seq ids.
  // Returns the sum of the per-token losses (nats).
  double forward(const int32_t* tokens, const int32_t* targets);
  // Backward of the last forward; every token's loss is weighted by loss_scale (1 / tokens of
  // the global batch). Weight gradients accumulate into params().all_grads().
  void backward(float loss_scale);
  void zero_grads() { backend_.fill(params_.all_grads(), 0.0f); }
  // Called during backward each time the gradients of every parameter at flat offset >= the
  // argument are complete for this microbatch (parameters are laid out so that backward
  // finishes them from the end of the flat buffer towards its start). Data parallelism uses
  // it to start bucket reductions while the backward still runs.
  void set_grads_ready_hook(std::function<void(int64_t)> hook) { grads_ready_ = std::move(hook); }

  size_t activation_bytes() const { return acts_arena_.used(); }
  Backend& backend() { return backend_; }
  int64_t padded_vocab() const { return vocab_padded_; }
  const GptOptions& options() const { return opts_; }

 private:
  struct LayerParams {
    int ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
  };
  struct LayerActs {
    Tensor ln1, ln1_mean, ln1_rstd, qkv, atty, probs, residual2, ln2, ln2_mean, ln2_rstd, fch,
        fch_gelu, residual3;
  };
  struct Activations {
    Tensor tokens, targets, encoded;
    std::vector<LayerActs> layers;
    Tensor lnf, lnf_mean, lnf_rstd, logits, ce_max, ce_sumexp, ce_target, losses;
    Tensor proj_out;  // row-parallel outputs before the residual add
    // backward
    Tensor dresidual, dln, datty, dqkv, dfch, dfch_gelu, dprobs;
  };

  void register_params();
  void layout_activations(Arena& arena);
  void block_forward(int64_t l, Tensor input);
  void block_backward(int64_t l, Tensor input);

  ModelConfig cfg_;
  GptOptions opts_;
  Backend& backend_;
  Comm& tp_;
  int64_t tp_rank_, tp_size_;
  int64_t vocab_padded_, vocab_local_, vocab_start_;
  int64_t heads_local_, ffn_local_;
  ParamStore params_;
  int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1;
  std::vector<LayerParams> layer_params_;
  Arena acts_arena_;
  Activations a_;
  std::vector<float> host_losses_;
  std::function<void(int64_t)> grads_ready_;
};

}  // namespace jumbo
