#pragma once
// GPT (GPT-3 architecture): learned absolute positions, pre-LayerNorm blocks with causal
// multi-head attention and a 4x tanh-GELU MLP, final LayerNorm, output head tied to the token
// embedding. Forward and backward are written out kernel by kernel (llm.c style).
//
// A TransformerStage is one pipeline stage: a contiguous range of layers, plus the embedding on the
// first stage and the final norm and head on the last (which keeps its own copy of the tied
// embedding; the trainer sums the two copies' gradients). It holds `slots` sets of forward
// activations, one per microbatch in flight in the pipeline schedule.
// The model sees only Backend& and Comm&: tensor parallelism adds all-reduces over `tp`
// between kernels (Megatron's column/row-parallel layers and vocab-parallel embedding and
// cross-entropy); with one rank those are no-ops.
#include <cstdint>
#include <functional>
#include <optional>
#include <initializer_list>
#include <memory>
#include <vector>

#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"
#include "jumbo/model/activations.h"
#include "jumbo/model/layer.h"
#include "jumbo/model/params.h"
#include "jumbo/model/spec.h"
#include "jumbo/model/stage.h"

namespace jumbo {



// Where each parameter of a stage sits in stage_params' order (the ParamStore index),
// for the training model and the decoder alike.
struct StageParamIndex {
  // -1: not on this stage (or not in the spec). head is wte when the embeddings are tied.
  int wte = -1, wpe = -1, lnf_w = -1, lnf_b = -1, head = -1;
  std::vector<LayerParams> layers;  // this stage's layers, chunk after chunk
};
StageParamIndex stage_param_index(const ModelConfig& cfg, const StageOptions& opts);

class TransformerStage final : public ModelStage {
 public:
  TransformerStage(const ModelConfig& cfg, const StageOptions& opts, Backend& backend, Comm& tp);

  // The stage's model weights (with LoRA frozen: weights only, no gradients).
  ParamStore& params() override { return params_; }
  const ParamStore& params() const override { return params_; }
  // What trains: every weight, or with LoRA the adapters. The optimizer, the gradient sync
  // and checkpoints work on this store; the grads-ready and weights-needed hooks report its
  // flat offsets.
  ParamStore& trained_params() override { return lora_ ? adapters_ : params_; }
  const ParamStore& trained_params() const override { return lora_ ? adapters_ : params_; }
  bool lora() const override { return lora_; }
  // Before a run of microbatches: training's seed of the LoRA dropout masks (a step's), or
  // none (evaluation: nothing dropped). Each microbatch's masks derive from it, the chunk and
  // the microbatch's place in the run, so a recomputation and the backward draw the same.
  void begin_run(std::optional<uint64_t> dropout_seed) override;
  void initialize(uint64_t seed) override {
    params_.initialize(backend_, seed);
    if (lora_) adapters_.initialize(backend_, seed);
  }

  // One microbatch through this stage, into activation set `slot`. tokens (first stage) and
  // targets (last stage) are host arrays of micro_batch * seq ids; other stages read their
  // input from input(slot). On the last stage the per-token losses are recorded on the device
  // (no host wait); take_loss_sum() reads them back.
  // A negative target is not in the loss (its loss and gradient are 0).
  void forward(int slot, const int32_t* tokens, const int32_t* targets) {
    forward(slot, 0, tokens, targets, nullptr);
  }
  // The same through model chunk `chunk` (interleaved pipelines): the embedding runs in chunk
  // 0 of the first stage, the head in the last chunk of the last stage. `positions` (host,
  // micro_batch * seq, every stage; null for plain sequences) holds packed sequences: each
  // token's position in its own sequence, which the position embedding looks up and the
  // attention keeps inside (the slot keeps them for its backward).
  void forward(int slot, int chunk, const int32_t* tokens, const int32_t* targets,
               const int32_t* positions) override;
  // The sum of the per-token losses recorded since the last call, added in microbatch and
  // token order (one host read); 0 on stages without the head.
  double take_loss_sum() override;
  // The same losses one by one, appended to `out` in microbatch and token order (evaluation
  // scores some tokens of a window, not all).
  void take_token_losses(std::vector<float>& out) override;
  // Backward of slot's microbatch. The last stage weights each token's loss by loss_scale;
  // other stages read d(output) from grad_output(). Leaves d(input) in grad_input(slot) on
  // stages without the embedding. Weight gradients accumulate into params().all_grads().
  void backward(int slot, float loss_scale) { backward(slot, 0, loss_scale); }
  void backward(int slot, int chunk, float loss_scale) override;
  // One-stage convenience: slot 0; returns the microbatch's loss sum (a host read).
  double forward(const int32_t* tokens, const int32_t* targets) {
    forward(0, 0, tokens, targets, nullptr);
    return take_loss_sum();
  }
  void backward(float loss_scale) { backward(0, 0, loss_scale); }

  // Stage boundary tensors, [B, S, C] ([B, S/tp, C] with sequence parallelism).
  Tensor input(int slot) override { return slots_[slot].encoded; }
  Tensor output(int slot) override;
  Tensor grad_output() override { return acts_.dresidual; }
  Tensor grad_input(int slot) override { return slots_[slot].dinput; }

  void zero_grads() override { backend_.fill(trained_params().all_grads(), 0.0f); }
  // Called during backward each time the gradients of every parameter at flat offset >= the
  // argument are complete for this microbatch (backward finishes them from the end of the
  // flat buffer towards its start). Data parallelism starts bucket reductions from it. The
  // tied embedding (offset 0) is never reported: it still needs the embedding-group sum.
  void set_grads_ready_hook(std::function<void(int64_t)> hook) override {
    grads_ready_ = std::move(hook);
  }
  // Called during forward before the weights at flat offsets below the argument are first
  // read (the embedding, each layer, the head): ZeRO's weight all-gather is waited for
  // bucket by bucket there, so it overlaps the forward.
  void set_weights_needed_hook(std::function<void(int64_t)> hook) override {
    weights_needed_ = std::move(hook);
  }
  // The token embedding's gradient (the first stage, and the last when tied), or an empty
  // tensor.
  Tensor embedding_grad() override { return wte_ >= 0 && !lora_ ? params_.grad(wte_) : Tensor{}; }

  size_t activation_bytes() const override { return acts_arena_.used(); }
  // The last stage's logits of its last forward, [micro_batch x seq, vocab slice] in the
  // compute dtype, padded columns -inf (kept until the next backward overwrites them).
  Tensor logits() override { return acts_.logits; }
  Backend& backend() { return backend_; }
  int64_t padded_vocab() const override { return vocab_padded_; }
  const StageOptions& options() const override { return opts_; }

 private:
  using LayerActs = LayerTensors;  // input: the previous layer's residual3 (or encoded)
  // Forward state of one microbatch in flight: its tensors (model/activations.h), whether its
  // sequences are packed, and the model chunk whose microbatch it holds.
  struct Slot : SlotActivations {
    bool packed = false;
    int chunk = 0;
  };
  std::optional<uint64_t> dropout_seed_;  // this run's (begin_run)
  std::vector<int64_t> forwards_in_run_;   // per chunk

  void register_params();
  void layout_activations(Arena& arena);
  // The layers' context for a microbatch whose rows sit at rope_positions (RoPE).
  LayerContext layer_context(Tensor rope_positions = {}) {
    return {backend_, region_, params_, spec_, acts_.rope_table, rope_positions};
  }
  // A norm's backward by the spec: dx += ..., the weight's (and bias's) gradient +=.
  void norm_backward(Tensor dx, int weight, int bias, Tensor dout, Tensor x, Tensor mean,
                     Tensor rstd);
  // The positions RoPE rotates a slot's rows by: its packed positions, or 0 .. seq-1.
  Tensor rope_positions(const Slot& s) const { return s.packed ? s.positions : acts_.sequence_positions; }
  void block_backward(LayerActs& a, const LayerParams& p, Tensor rope_positions);
  // Backward of out += scale B(A(x)) (layer.h's lora_forward) after its base map's: dB, then
  // dh = scale dout B, dA, and dx += dh A.
  void lora_backward(LoraTarget target, const LayerParams& p, Tensor dout, Tensor x, Tensor dx,
                     const LayerActs& a);
  // A parameter's gradient, or for a frozen base norm scratch its backward may write.
  Tensor norm_grad(int param, Tensor frozen_scratch) const {
    return lora_ ? frozen_scratch : params_.grad(param);
  }
  // The trained weights a layer's forward reads end at this flat offset (ZeRO's gather).
  int64_t layer_weights_end(const LayerParams& p) const;
  void head_forward(Slot& s, Tensor x);
  void head_backward(Slot& s, Tensor x, float loss_scale);

  ModelConfig cfg_;
  StageOptions opts_;
  ModelSpec spec_;  // this rank's: spec_.tp is the tp size
  Backend& backend_;
  Comm& tp_;
  // Gathers and reductions along the sequence with SP, plain all-reduces without.
  TensorParallelRegion region_;
  CausalAttention causal_;
  int64_t tp_rank_, tp_size_;
  int64_t vocab_padded_, vocab_local_, vocab_start_;
  int64_t vocab_valid_;  // columns of this rank's slice below model.vocab (the rest is padding)
  bool sp_ = false;
  int64_t seq_part_;  // sequence positions of this rank's part (S, or S/tp with SP)
  ParamStore params_;
  bool lora_ = false;
  ParamStore adapters_;  // LoRA's trained parameters
  LoraAdapter adapter_;   // the adapters as the layers run them
  LoraRows every_row_;    // a microbatch's rows, all on adapter_
  int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1, head_ = -1;
  std::vector<LayerParams> layer_params_;  // this stage's layers, chunk after chunk
  Arena acts_arena_;
  std::vector<Slot> slots_;
  // Everything but the slots' tensors, as model/activations.h lays it out and describes it:
  // the head's (not per slot: the last stage runs a microbatch's forward and backward back to
  // back), the scratch all slots share, LoRA's, RoPE's, and the layer tensors recomputation
  // does not keep per slot (written by every forward, rebuilt before each backward).
  StageActivations acts_;
  int64_t losses_recorded_ = 0;     // microbatches in acts_.loss_record
  std::vector<float> host_losses_;  // its host copy
  std::vector<int32_t> host_positions_part_;  // sequence parallel: this rank's positions
  std::function<void(int64_t)> grads_ready_;
  std::function<void(int64_t)> weights_needed_;
  // Flat offsets just past the weights a part of the forward reads.
  int64_t flat_end(std::initializer_list<int> params) const;
};

}  // namespace jumbo
