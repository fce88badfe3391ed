#pragma once
// One GPT transformer layer's forward and the head's logits, written once for training
// (TransformerStage, every position of a microbatch) and decoding (TransformerDecoder, a step's rows over a KV
// cache). What differs between the two is a small object, not a copy of the op sequence
// (Megatron-Core's TransformerLayer with `Attention.forward(..., inference_context)`):
// - CoreAttention: causal attention over the sequence, or attention over a KV cache that may
//   narrow the rest of the layer to the rows that reach the head;
// - TensorParallelRegion: where a column-parallel layer's input is gathered and a row-parallel
//   layer's partial sums are reduced (sequence parallelism, or plain all-reduces);
// - LayerTensors: the layer's tensors, which the decoder passes as aliases (its residual
//   stream is added in place).
#include <array>
#include <cstdint>
#include <span>

#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"
#include "jumbo/model/params.h"
#include "jumbo/model/spec.h"

namespace jumbo {

// A layer's LoRA adapters (Hu et al. 2021), per LoraTarget: A [r x in] and B [out x r] in the
// stage's adapter ParamStore, -1 where a map has none.
struct LoraLayerParams {
  static constexpr std::array<int, kLoraTargetCount> unset() {
    std::array<int, kLoraTargetCount> none{};
    none.fill(-1);
    return none;
  }
  std::array<int, kLoraTargetCount> a = unset(), b = unset();
  bool has(LoraTarget t) const { return a[static_cast<size_t>(t)] >= 0; }
};

// Where each of a layer's parameters sits in its stage's ParamStore (stage_param_index); -1
// where the spec has none (RMSNorm's bias, Llama's linear biases). ln1 and ln2 are the norms
// before attention and MLP, LayerNorm or RMSNorm. fc1 is the up projection: with SwiGLU the
// gate (fc1_w, fc1_b) and the up map (up_w, up_b) packed after it, read as one.
struct LayerParams {
  int ln1_w = -1, ln1_b = -1, qkv_w = -1, qkv_b = -1, proj_w = -1, proj_b = -1, ln2_w = -1,
      ln2_b = -1, fc1_w = -1, fc1_b = -1, up_w = -1, up_b = -1, fc2_w = -1, fc2_b = -1;
  int q_norm_w = -1, k_norm_w = -1;  // qk-norm's weights
  LoraLayerParams lora;
};

// The entry and exit of a tensor-parallel region. Column-parallel layers read the full
// sequence [B, S, C]; row-parallel layers leave partial sums that go back to this rank's part.
class TensorParallelRegion {
 public:
  // Plain tensor parallelism: the part is the full sequence; gather does nothing and reduce is
  // an all-reduce in place.
  TensorParallelRegion(Backend& backend, Comm& tp) : backend_(&backend), tp_(&tp) {}
  // Sequence parallelism (Korthikanti et al. 2022): this rank holds seq / tp positions of each
  // of `batch` sequences of `width` columns; all-gather and reduce-scatter along the sequence.
  // `stage` is scratch of batch x seq x width elements in the compute dtype.
  struct SequenceSplit {
    int64_t batch = 0, seq = 0, width = 0;
    Tensor stage;
  };
  TensorParallelRegion(Backend& backend, Comm& tp, const SequenceSplit& split);

  // This rank's part into the full sequence from every rank's part (nothing without SP).
  void gather(Tensor part, Tensor full);
  // A partial sum over the full sequence into this rank's part: all-reduce in place (part is
  // full) or, with sequence parallelism, reduce-scatter along the sequence.
  void reduce(Tensor full, Tensor part);
  // A row-parallel layer adds its bias on tp rank 0 only, so the reduction counts it once.
  Tensor row_parallel_bias(Tensor bias) const { return tp_->rank() == 0 ? bias : Tensor{}; }
  // Whether this rank adds the terms a row-parallel reduction must count once (bias, LoRA).
  bool counts_row_parallel_terms() const { return tp_->rank() == 0; }
  int rank() const { return tp_->rank(); }
  int size() const { return tp_->size(); }
  // The sum over the tp ranks in place, whatever the split (LoRA's r-wide partial products).
  void all_reduce(Tensor t) { tp_->all_reduce(t, ReduceOp::sum); }

 private:
  Backend* backend_;
  Comm* tp_;
  bool split_ = false;
  SequenceSplit seq_;
  int64_t seq_part_ = 0;
};

// One LoRA adapter as a layer forward runs it: A and B in `store` (lora_stage_params' layout;
// a slot of the decoder's adapter pool is laid out for a larger rank and this adapter uses the
// leading rank x in of A and out x rank of B), its maps, and alpha / r.
struct LoraAdapter {
  const ParamStore* store = nullptr;
  int64_t rank = 0;
  LoraTargetSet targets = LoraTargetSet::none();
  float scale = 1;
  float dropout = 0;  // training's dropout of the adapter's input (0 off)
  // A map's A [rank, in] and B [out, rank] (LoraLayerParams' indices into `store`): the leading
  // elements of the stored tensors, which are those when the store has this rank.
  Tensor a(int param) const;
  Tensor b(int param) const;
};

// Rows [begin, begin + count) of a layer's rows run `adapter`: training has one range over
// every row; a decode step one per run of rows of the same adapter (S-LoRA's batch of many
// adapters over one base: each row applies its own; rows of the base alone are in none).
struct LoraRows {
  int64_t begin = 0, count = 0;
  const LoraAdapter* adapter = nullptr;
};

// The tensors one layer reads and writes. `input`, the norms and the residuals are this rank's
// part of the sequence; ln1_full and ln2_full the gathered inputs of the column-parallel layers
// (the same tensors without SP); proj_full and proj_part scratch for the row-parallel outputs
// before and after their reduction. Training keeps a set per layer and microbatch; the decoder
// passes aliases (input = residual2 = residual3: x += proj).
struct LayerTensors {
  Tensor input, ln1, ln1_full, ln1_mean, ln1_rstd, qkv, atty, probs, residual2, ln2, ln2_full,
      ln2_mean, ln2_rstd, fch, fch_act, residual3, proj_full, proj_part;
  // qk-norm: the q, k, v map's output before the norm (qkv is after it) and the heads' rstd.
  Tensor qkv_raw{}, qk_rstd{};
  // LoRA: which rows run which adapter (none: the base alone); per target, [N, stored rank]
  // for scale x (x A^T), what B's gradient reads; and scratch for B's output before it is
  // added (at least N x the widest map's output, flat, in the compute dtype).
  std::span<const LoraRows> lora_rows{};
  std::array<Tensor, kLoraTargetCount> lora_h{};
  Tensor lora_scratch{};
  // LoRA dropout (training): the microbatch's and layer's seed of the masks, and scratch for
  // the dropped-out input (at least N x the widest map's input, flat).
  uint64_t dropout_seed = 0;
  Tensor lora_dropped{};
};

// The layer's core attention: atty from qkv.
class CoreAttention {
 public:
  virtual ~CoreAttention() = default;
  // May narrow the rest of the layer (the tensors after the attention) to fewer rows; false
  // when no row goes on.
  virtual bool forward(Backend& backend, LayerTensors& t) = 0;
};

// Training: causal attention over each sequence; probs keeps the softmax statistics.
class CausalAttention final : public CoreAttention {
 public:
  bool forward(Backend& backend, LayerTensors& t) override;
  // Packed sequences (backend.h's attention positions) of the microbatch at hand; empty for
  // plain causal attention.
  Tensor positions;
  int64_t kv_heads = 0;  // this rank's key/value heads
};

// Decoding: each row attends to its cache slot's earlier positions, after writing its own key
// and value there. With `keep` (count >= 0) only keep.count rows, listed by index in
// keep.rows (i32), go on after the attention: the last layer of the last stage, whose other
// rows' outputs reach nothing once their keys and values are cached. They are gathered into
// keep.input and keep.atty ([>= count, C] and [>= count, C / tp]).
class KvCacheAttention final : public CoreAttention {
 public:
  struct Keep {
    Tensor rows, input, atty;
    int64_t count = -1;  // -1: every row goes on
    std::span<const LoraRows> lora_rows{};  // the kept rows' adapters, by kept index
  };
  // rows: i32 [n, 2], each query row's (cache slot, position).
  KvCacheAttention(Tensor k_cache, Tensor v_cache, Tensor rows, const Keep& keep)
      : k_cache_(k_cache), v_cache_(v_cache), rows_(rows), keep_(keep) {}
  bool forward(Backend& backend, LayerTensors& t) override;

 private:
  Tensor k_cache_, v_cache_, rows_;
  Keep keep_;
};

// What a layer forward runs on: the kernels, the tensor-parallel region, the weights and the
// architecture (this rank's part of it: spec.tp is the tp size).
struct LayerContext {
  Backend& backend;
  TensorParallelRegion& tp;
  const ParamStore& params;
  const ModelSpec& spec;
  // RoPE: the table (model/rope.h) and each row's position (i32 [N], or a KV cache's rows
  // [N, 2]); empty with learned positions.
  Tensor rope_table{}, rope_positions{};
  // A parameter's weight, or an empty tensor for an index of -1 (a bias the spec has not).
  Tensor weight(int i) const { return i >= 0 ? params.weight(i) : Tensor{}; }
};

// The spec's norm of x into out: LayerNorm (keeping mean and rstd) or RMSNorm (rstd; mean
// unused). bias is -1 without one.
void norm_forward(const LayerContext& ctx, int weight, int bias, Tensor out, Tensor mean,
                  Tensor rstd, Tensor x);

// The one rule of a LoRA map's forward, out += scale B(A(x)), for each of t.lora_rows' ranges
// with its adapter: for a column-parallel map (x whole, B this rank's output rows) every rank
// adds its slice; for a row-parallel one (A this rank's input columns) the r-wide partial
// products are summed over tp and rank 0 adds B's output, so the reduction after the map
// counts it once. Keeps scale x (x A^T) in h's rows.
void lora_forward(const LayerContext& ctx, const LayerTensors& t, LoraTarget target,
                  const LoraLayerParams& p, Tensor x, Tensor out, Tensor h);
// Where a map's adapter writes in its base map's output on this rank: q, k or v in the grouped
// q/k/v rows (a block per kv group), SwiGLU's gate or up half of the packed up output; a block
// of 0 for a map that is its output whole (qkv, proj, fc1, fc2).
ColumnBlocks lora_output_blocks(const ModelSpec& spec, LoraTarget target);
// The dropout mask of a LoRA map's input x ([rows, in_local] on this rank) for the layer's
// seed: one logical mask over the whole input, of which a row-parallel map's rank holds the
// columns tp_rank x in_local onwards (column-parallel maps read the whole input on every
// rank, so every rank draws the same). The forward and the backward share it.
DropoutMask lora_dropout_mask(const LoraAdapter& adapter, uint64_t layer_seed, LoraTarget target,
                              const TensorParallelRegion& tp, int64_t in_local);

// One pre-norm layer: residual2 = input + proj(attn(rope?(qkv(ln1(input))))),
// residual3 = residual2 + fc2(act(fc1(ln2(residual2)))), act GELU or SwiGLU (model/spec.h).
void transformer_layer_forward(const LayerContext& ctx, const LayerParams& p,
                               CoreAttention& attention, LayerTensors t);

// The head's tensors: the final norm (this rank's part, then gathered) and the logits of this
// rank's vocabulary slice, [rows, vocab slice].
struct HeadTensors {
  Tensor lnf, lnf_full, lnf_mean, lnf_rstd, logits;
};
struct HeadParams {
  int head = -1, lnf_w = -1, lnf_b = -1;  // head: the tied embedding or the untied head
};
// Final norm of x, gathered, then the head's logits over this rank's vocabulary
// slice; its columns from `vocab_valid` on are padding (their number depends on tp) and are set
// to -inf, so they take no part in a softmax or in sampling.
void head_logits_forward(const LayerContext& ctx, const HeadParams& p, const HeadTensors& t,
                         Tensor x, int64_t vocab_valid);

}  // namespace jumbo
