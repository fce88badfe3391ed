#pragma once
// GPT (GPT-3 architecture): learned absolute positions, pre-LayerNorm blocks with causal
// multi-head attention and a 4x tanh-GELU MLP, final LayerNorm, output head tied to the token
// embedding. Forward and backward are written out kernel by kernel (llm.c style).
//
// A GptModel is one pipeline stage: a contiguous range of layers, plus the embedding on the
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
#include "jumbo/model/layer.h"
#include "jumbo/model/params.h"

namespace jumbo {

// The storage type of weights and activations for a precision mode (master weights, main
// grads and optimizer state are f32 in both).
inline DType compute_dtype_of(Precision p) { return p == Precision::bf16 ? DType::bf16 : DType::f32; }

struct GptOptions {
  int64_t micro_batch = 1;
  int64_t seq = 0;  // <= context
  DType compute_dtype = DType::f32;
  float layernorm_eps = 1e-5f;
  int64_t flat_multiple = 1;  // pad the flat parameter buffers (data-parallel shards)
  // Pipeline stage: layers [first_layer, first_layer + num_layers); -1 = all. With
  // interleaving the stage holds `chunks` such ranges, chunk_stride layers apart.
  int64_t first_layer = 0;
  int64_t num_layers = -1;
  int64_t chunks = 1;
  int64_t chunk_stride = 0;
  bool has_embedding = true;  // first stage
  bool has_head = true;       // last stage
  int64_t slots = 1;          // microbatches in flight (activation sets)
  int64_t losses_per_read = 1;  // microbatches whose losses take_loss_sum() reads at once
  Recompute recompute = Recompute::none;
  // Sequence parallelism (Korthikanti et al. 2022): with tp > 1, the layernorm and residual
  // regions hold S/tp of the sequence; all-gather and reduce-scatter along the sequence
  // replace the tensor-parallel all-reduces. Layernorm and position-embedding gradients are
  // then partial sums over the tp ranks (ParamInfo::tp_partial_grad).
  bool sequence_parallel = false;
  // LoRA (model/lora.h): adapters on a frozen base. The base then holds weights only (no
  // gradients); trained_params() is the adapters' store. rank 0: no adapters.
  LoraShape lora{};
  // The probability to drop an element of an adapter's input in training's forward (Hu et al.
  // 2021's lora_dropout); evaluation and generation never drop.
  float lora_dropout = 0;
};

// What a stage with these options asks of a backend's kernels (backend/device.h): checked
// against the device when a run is validated.
KernelRequirements kernel_requirements(const ModelConfig& cfg, const GptOptions& opts);

// The parameters of one pipeline stage on tp rank `tp_rank` of `tp_size`, in the order the
// flat buffers hold them (no memory: checkpoint conversion lays out stages it never builds).
std::vector<ParamInfo> gpt_stage_params(const ModelConfig& cfg, const GptOptions& opts,
                                        int64_t tp_rank, int64_t tp_size);

// Where each parameter of a stage sits in gpt_stage_params' order (the ParamStore index),
// for the training model and the decoder alike.
struct GptParamIndex {
  int wte = -1, wpe = -1, lnf_w = -1, lnf_b = -1;  // -1: not on this stage
  std::vector<GptLayerParams> layers;                // this stage's layers, chunk after chunk
};
GptParamIndex gpt_param_index(const GptOptions& opts);

class GptModel {
 public:
  GptModel(const ModelConfig& cfg, const GptOptions& opts, Backend& backend, Comm& tp);

  // The stage's model weights (with LoRA frozen: weights only, no gradients).
  ParamStore& params() { return params_; }
  const ParamStore& params() const { return params_; }
  // What trains: every weight, or with LoRA the adapters. The optimizer, the gradient sync
  // and checkpoints work on this store; the grads-ready and weights-needed hooks report its
  // flat offsets.
  ParamStore& trained_params() { return lora_ ? adapters_ : params_; }
  const ParamStore& trained_params() const { return lora_ ? adapters_ : params_; }
  bool lora() const { return lora_; }
  // Before a run of microbatches: training's seed of the LoRA dropout masks (a step's), or
  // none (evaluation: nothing dropped). Each microbatch's masks derive from it, the chunk and
  // the microbatch's place in the run, so a recomputation and the backward draw the same.
  void begin_run(std::optional<uint64_t> dropout_seed);
  void initialize(uint64_t seed) {
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
               const int32_t* positions);
  // The sum of the per-token losses recorded since the last call, added in microbatch and
  // token order (one host read); 0 on stages without the head.
  double take_loss_sum();
  // The same losses one by one, appended to `out` in microbatch and token order (evaluation
  // scores some tokens of a window, not all).
  void take_token_losses(std::vector<float>& out);
  // Backward of slot's microbatch. The last stage weights each token's loss by loss_scale;
  // other stages read d(output) from grad_output(). Leaves d(input) in grad_input(slot) on
  // stages without the embedding. Weight gradients accumulate into params().all_grads().
  void backward(int slot, float loss_scale) { backward(slot, 0, loss_scale); }
  void backward(int slot, int chunk, float loss_scale);
  // One-stage convenience: slot 0; returns the microbatch's loss sum (a host read).
  double forward(const int32_t* tokens, const int32_t* targets) {
    forward(0, 0, tokens, targets, nullptr);
    return take_loss_sum();
  }
  void backward(float loss_scale) { backward(0, 0, loss_scale); }

  // Stage boundary tensors, [B, S, C] ([B, S/tp, C] with sequence parallelism).
  Tensor input(int slot) { return slots_[slot].encoded; }
  Tensor output(int slot);
  Tensor grad_output() { return dresidual_; }
  Tensor grad_input(int slot) { return slots_[slot].dinput; }

  void zero_grads() { backend_.fill(trained_params().all_grads(), 0.0f); }
  // Called during backward each time the gradients of every parameter at flat offset >= the
  // argument are complete for this microbatch (backward finishes them from the end of the
  // flat buffer towards its start). Data parallelism starts bucket reductions from it. The
  // tied embedding (offset 0) is never reported: it still needs the embedding-group sum.
  void set_grads_ready_hook(std::function<void(int64_t)> hook) { grads_ready_ = std::move(hook); }
  // Called during forward before the weights at flat offsets below the argument are first
  // read (the embedding, each layer, the head): ZeRO's weight all-gather is waited for
  // bucket by bucket there, so it overlaps the forward.
  void set_weights_needed_hook(std::function<void(int64_t)> hook) {
    weights_needed_ = std::move(hook);
  }
  // The tied embedding's gradient (first and last stage), or an empty tensor.
  Tensor embedding_grad() { return wte_ >= 0 && !lora_ ? params_.grad(wte_) : Tensor{}; }

  size_t activation_bytes() const { return acts_arena_.used(); }
  // The last stage's logits of its last forward, [micro_batch x seq, vocab slice] in the
  // compute dtype, padded columns -inf (kept until the next backward overwrites them).
  Tensor logits() { return logits_; }
  Backend& backend() { return backend_; }
  int64_t padded_vocab() const { return vocab_padded_; }
  const GptOptions& options() const { return opts_; }

 private:
  using LayerParams = GptLayerParams;
  using LayerActs = LayerTensors;  // input: the previous layer's residual3 (or encoded)
  // Forward state of one microbatch in flight.
  struct Slot {
    Tensor tokens, targets, encoded, dinput;
    // Packed sequences: positions of the whole sequence (attention) and of this rank's part
    // of it (the position embedding; the same tensor without sequence parallelism).
    Tensor positions, positions_part;
    bool packed = false;
    std::vector<LayerActs> layers;
    int chunk = 0;  // the model chunk whose microbatch the slot holds
  };
  std::optional<uint64_t> dropout_seed_;  // this run's (begin_run)
  std::vector<int64_t> forwards_in_run_;   // per chunk

  void register_params();
  void layout_activations(Arena& arena);
  LayerContext layer_context() {
    return {backend_, region_, params_, opts_.layernorm_eps};
  }
  void block_backward(LayerActs& a, const LayerParams& p);
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
  GptOptions opts_;
  Backend& backend_;
  Comm& tp_;
  // Gathers and reductions along the sequence with SP, plain all-reduces without.
  TensorParallelRegion region_;
  CausalAttention causal_;
  int64_t tp_rank_, tp_size_;
  int64_t vocab_padded_, vocab_local_, vocab_start_;
  int64_t vocab_valid_;  // columns of this rank's slice below model.vocab (the rest is padding)
  int64_t heads_local_, ffn_local_;
  bool sp_ = false;
  int64_t seq_part_;  // sequence positions of this rank's part (S, or S/tp with SP)
  ParamStore params_;
  bool lora_ = false;
  ParamStore adapters_;  // LoRA's trained parameters
  LoraAdapter adapter_;   // the adapters as the layers run them
  LoraRows every_row_;    // a microbatch's rows, all on adapter_
  Tensor lora_scratch_, lora_dh_;        // B's output (and dx's share); scale dout B
  Tensor lora_dropped_;                   // LoRA dropout: the dropped-out input
  Tensor frozen_norm_w_, frozen_norm_b_;  // what a frozen norm's backward writes, unread
  int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1;
  std::vector<LayerParams> layer_params_;  // this stage's layers, chunk after chunk
  Arena acts_arena_;
  std::vector<Slot> slots_;
  // The head runs forward and backward of one microbatch back to back (the last stage has
  // one microbatch in flight), so its buffers are not per slot.
  Tensor lnf_, lnf_full_, lnf_mean_, lnf_rstd_, logits_, ce_max_, ce_sumexp_, ce_target_, losses_;
  // Scratch shared by all slots: "full" tensors span the sequence, "part" ones this rank's
  // part (aliases without SP); sp_stage_ reorders [B, S, C] as [tp, B, S/tp, C].
  Tensor emb_full_, proj_out_, proj_part_, dresidual_, dres_full_, dln_, dln_part_, datty_, dqkv_,
      dfch_, dfch_gelu_, dprobs_, sp_stage_;
  // Layer tensors that recomputation does not keep per slot: written by every forward,
  // rebuilt before each backward.
  LayerActs recomputed_;
  Tensor loss_record_;              // f32 [losses_per_read x micro_batch x seq], last stage
  int64_t losses_recorded_ = 0;     // microbatches in loss_record_
  std::vector<float> host_losses_;  // its host copy
  std::vector<int32_t> host_positions_part_;  // sequence parallel: this rank's positions
  std::function<void(int64_t)> grads_ready_;
  std::function<void(int64_t)> weights_needed_;
  // Flat offsets just past the weights a part of the forward reads.
  int64_t flat_end(std::initializer_list<int> params) const;
};

}  // namespace jumbo
