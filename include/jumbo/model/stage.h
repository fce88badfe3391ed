#pragma once
// The seam between a model and the floors above it (Megatron-Core's and torchtitan's model
// interface): the pipeline runner, the train stage, the evaluator and the trainer hold a
// ModelStage; the generation engine holds a DecodeStage. Neither names an architecture: a
// stage is built by make_model_stage / make_decode_stage from the model keys (model/spec.h),
// and a family whose block the spec's components describe (GPT, Llama, Mistral, Qwen) is the
// one transformer implementation (model/transformer.h, model/decoder.h) with other settings.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"
#include "jumbo/model/params.h"

namespace jumbo {

// The storage type of weights and activations for a precision mode (master weights, main
// grads and optimizer state are f32 in both).
inline DType compute_dtype_of(Precision p) { return p == Precision::bf16 ? DType::bf16 : DType::f32; }

struct StageOptions {
  int64_t micro_batch = 1;
  int64_t seq = 0;  // <= context
  DType compute_dtype = DType::f32;
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
KernelRequirements kernel_requirements(const ModelConfig& cfg, const StageOptions& opts);

// One pipeline stage of a model in training or evaluation: a contiguous range of layers (or
// `chunks` of them), the embedding on the first stage, the final norm, head and loss on the
// last; `slots` microbatches in flight. Every call is the runner's part of a schedule; the
// model adds its tensor-parallel communication between kernels itself.
class ModelStage {
 public:
  virtual ~ModelStage() = default;
  // The stage's model weights (with LoRA frozen: weights only, no gradients).
  virtual ParamStore& params() = 0;
  virtual const ParamStore& params() const = 0;
  // What trains: every weight, or with LoRA the adapters. The optimizer, the gradient sync
  // and checkpoints work on this store; the hooks report its flat offsets.
  virtual ParamStore& trained_params() = 0;
  virtual const ParamStore& trained_params() const = 0;
  virtual bool lora() const = 0;
  virtual void initialize(uint64_t seed) = 0;
  // Before a run of microbatches: training's seed of the LoRA dropout masks, or none.
  virtual void begin_run(std::optional<uint64_t> dropout_seed) = 0;
  // One microbatch through model chunk `chunk` into activation set `slot`: tokens (first
  // stage) and targets (last stage) are host arrays of micro_batch x seq ids, `positions`
  // each token's position in its packed sequence (null: plain sequences). Other stages read
  // input(slot). The last stage records the per-token losses on the device.
  virtual void forward(int slot, int chunk, const int32_t* tokens, const int32_t* targets,
                       const int32_t* positions) = 0;
  // The recorded losses' sum (one host read) or, appended to `out`, the losses one by one.
  virtual double take_loss_sum() = 0;
  virtual void take_token_losses(std::vector<float>& out) = 0;
  // Backward of slot's microbatch through chunk `chunk`; weight gradients accumulate.
  virtual void backward(int slot, int chunk, float loss_scale) = 0;
  // Stage boundary tensors, [B, S, C] ([B, S/tp, C] with sequence parallelism).
  virtual Tensor input(int slot) = 0;
  virtual Tensor output(int slot) = 0;
  virtual Tensor grad_output() = 0;
  virtual Tensor grad_input(int slot) = 0;
  virtual void zero_grads() = 0;
  // Data parallelism's bucket reductions start from the first (gradients final from this flat
  // offset on); ZeRO's weight gathers are waited for from the second (weights below it read).
  virtual void set_grads_ready_hook(std::function<void(int64_t)> hook) = 0;
  virtual void set_weights_needed_hook(std::function<void(int64_t)> hook) = 0;
  // The token embedding's gradient (first stage; last too when tied), or empty.
  virtual Tensor embedding_grad() = 0;
  virtual size_t activation_bytes() const = 0;
  // The last stage's logits of its last forward, [micro_batch x seq, vocab slice].
  virtual Tensor logits() = 0;
  virtual int64_t padded_vocab() const = 0;
  virtual const StageOptions& options() const = 0;
};

struct DecodeShape {
  int64_t max_rows = 1;         // query rows one step may carry (prefill chunks + decode rows)
  int64_t max_sampled = 1;      // rows a step computes logits for (sequences sampled per step)
  int64_t cache_slots = 1;      // sequences the KV cache holds at once
  int64_t cache_positions = 0;  // positions per sequence; 0 = model.context
  int64_t adapter_slots = 0;    // LoRA adapters held at once (0: the base alone)
  int64_t max_lora_rank = 0;    // the largest rank a slot takes (with adapter_slots)
};

struct DecodeRow {
  int32_t token = 0;     // read on the first stage
  int32_t slot = 0;      // the sequence's KV-cache slot
  int32_t position = 0;  // 0-based position in its sequence
  int32_t adapter = -1;  // the LoRA adapter's slot, or -1: the base alone
};

// One pipeline stage of a model for generation, with a KV cache (model/decoder.h says how).
class DecodeStage {
 public:
  virtual ~DecodeStage() = default;
  virtual ParamStore& params() = 0;
  // A LoRA adapter into pool slot `slot` (its store laid out by lora_stage_params), or out.
  virtual void set_adapter(int32_t slot, const ParamStore& adapter, const LoraShape& lora) = 0;
  virtual void clear_adapter(int32_t slot) = 0;
  virtual bool has_adapter(int32_t slot) const = 0;
  virtual const DecodeShape& shape() const = 0;
  // One step of `rows`; the last stage computes the logits of the rows `sampled` lists.
  virtual void forward(std::span<const DecodeRow> rows, std::span<const int32_t> sampled) = 0;
  virtual Tensor input(int64_t n) = 0;
  virtual Tensor output(int64_t n) = 0;
  // f32 [count, vocab slice] of the last step's sampled rows; padded columns are -inf.
  virtual Tensor logits(int64_t count) = 0;
  virtual int64_t vocab_local() const = 0;
  virtual int64_t vocab_start() const = 0;
};

// The parameters of one pipeline stage on tp rank `tp_rank` of `tp_size`, in the order the
// flat buffers hold them (no memory: the stage plan and checkpoint conversion lay out stages
// they never build).
std::vector<ParamInfo> stage_params(const ModelConfig& cfg, const StageOptions& opts,
                                    int64_t tp_rank, int64_t tp_size);

// The model registry: the stage a model's keys describe, on tp rank tp.rank().
std::unique_ptr<ModelStage> make_model_stage(const ModelConfig& cfg, const StageOptions& opts,
                                             Backend& backend, Comm& tp);
std::unique_ptr<DecodeStage> make_decode_stage(const ModelConfig& cfg, const StageOptions& stage,
                                               const DecodeShape& shape, Backend& backend,
                                               Comm& tp);

}  // namespace jumbo
