#pragma once
// The CUDA backend's launchers: one per Backend operation, each queued on `stream` with no
// host synchronisation. Tensors are device memory with the dtypes backend.h's contract gives
// (activations f32 or bf16, main grads / statistics / optimizer state f32, token ids i32);
// kernels compute in fp32. Shapes and semantics are exactly backend.h's; CpuBackend is the
// reference the gpu tests compare every launcher with.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "jumbo/backend/backend.h"
#include "jumbo/backend/tensor.h"

namespace jumbo::cuda {

// ---- elementwise.cu ----
void fill(cudaStream_t stream, Tensor t, float value);
// Same numel, device to device; f32 <-> bf16 conversions; i32 copied as is.
void convert_copy(cudaStream_t stream, Tensor dst, Tensor src);
void gelu_fwd(cudaStream_t stream, Tensor out, Tensor in);
void gelu_bwd(cudaStream_t stream, Tensor din, Tensor dout, Tensor in);
void add(cudaStream_t stream, Tensor out, Tensor a, Tensor b);
void scale(cudaStream_t stream, Tensor t, float factor);  // in place
// columns.cu: backend.h's ColumnBlocks (a LoRA adapter's part of a packed output).
void add_to_column_blocks(cudaStream_t stream, Tensor wide, Tensor narrow, const ColumnBlocks& at);
void copy_from_column_blocks(cudaStream_t stream, Tensor narrow, Tensor wide, const ColumnBlocks& at);
void dropout(cudaStream_t stream, Tensor out, Tensor in, const DropoutMask& mask);
void fill_columns(cudaStream_t stream, Tensor t, int64_t first_col, float value);
// out[N, F] = silu(gate) * up of gate_up [N, 2F] = (gate, up); the backward writes dgate_up.
void swiglu_fwd(cudaStream_t stream, Tensor out, Tensor gate_up);
void swiglu_bwd(cudaStream_t stream, Tensor dgate_up, Tensor dout, Tensor gate_up);

// ---- rope.cu: rotary embedding in place on qkv's query and key heads (backend.h's rope) ----
// positions (i32 [N], or [N, 2] with the position in column 1) is device memory: a position
// outside the table makes that row's rotated heads NaN.
void rope(cudaStream_t stream, Tensor qkv, Tensor table, Tensor positions, int64_t kv_heads,
          RopeDirection direction);

// ---- embedding.cu ----
void token_embedding_fwd(cudaStream_t stream, Tensor out, Tensor tokens, Tensor wte,
                         int64_t vocab_start);
// Deterministic: rows are accumulated per vocabulary row, not with float atomics. The tokens
// are stably sorted by row (CUB radix sort) into `scratch`, device memory of at least
// token_embedding_bwd_scratch_ints(tokens.numel(), dwte rows) ints, 16-byte aligned; then
// each row adds its tokens' dout rows in token order (the CPU's order: bit-identical in f32).
void token_embedding_bwd(cudaStream_t stream, Tensor dwte, Tensor dout, Tensor tokens,
                         int64_t vocab_start, int* scratch);
// Host-only size query (needs the current CUDA device: CUB's sizes depend on it).
size_t token_embedding_bwd_scratch_ints(int64_t n_tokens, int64_t rows);
// positions (i32 [B*T]) may be empty: position t of each row.
void position_embedding_fwd(cudaStream_t stream, Tensor out, Tensor wpe, Tensor positions);
void position_embedding_bwd(cudaStream_t stream, Tensor dwpe, Tensor dout);

// ---- layernorm.cu (one warp or block per row, fp32 statistics) ----
void layernorm_fwd(cudaStream_t stream, Tensor out, Tensor mean, Tensor rstd, Tensor x,
                   Tensor weight, Tensor bias, float eps);
// dx +=; dweight, dbias (f32) += over rows, through per-block partial sums (no atomics, so
// the result is deterministic); `scratch` holds the partials: layernorm_bwd_scratch_floats.
void layernorm_bwd(cudaStream_t stream, Tensor dx, Tensor dweight, Tensor dbias, Tensor dout,
                   Tensor x, Tensor weight, Tensor mean, Tensor rstd, float* scratch);
size_t layernorm_bwd_scratch_floats(int64_t rows, int64_t cols);
// RMSNorm on the same kernels (no mean, no bias): rstd f32 [N]; the backward's dweight (f32,
// may be empty) += through the same deterministic partials, rmsnorm_bwd_scratch_floats of
// scratch (unused, may be null, when dweight is empty).
void rmsnorm_fwd(cudaStream_t stream, Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps);
void rmsnorm_bwd(cudaStream_t stream, Tensor dx, Tensor dweight, Tensor dout, Tensor x,
                 Tensor weight, Tensor rstd, float* scratch);
size_t rmsnorm_bwd_scratch_floats(int64_t rows, int64_t cols);

// ---- qk_norm.cu: RMSNorm of each query and key head of grouped qkv rows (backend.h) ----
// One warp per head; out may be qkv and dqkv may be dout. The weights' gradients (f32, each
// may be empty) += through per-chunk partials in `scratch` (qk_norm_bwd_scratch_floats for
// N rows, H query and G kv heads of size D; unused, may be null, when both are empty).
void qk_norm_fwd(cudaStream_t stream, Tensor out, Tensor rstd, Tensor qkv, Tensor q_weight,
                 Tensor k_weight, int64_t kv_heads, float eps);
void qk_norm_bwd(cudaStream_t stream, Tensor dqkv, Tensor dq_weight, Tensor dk_weight,
                 Tensor dout, Tensor qkv, Tensor q_weight, Tensor k_weight, Tensor rstd,
                 int64_t kv_heads, float* scratch);
size_t qk_norm_bwd_scratch_floats(int64_t rows, int64_t heads, int64_t kv_heads,
                                  int64_t head_dim);

// ---- loss.cu: vocab-parallel cross-entropy parts ----
void ce_local_max(cudaStream_t stream, Tensor max, Tensor logits);
void ce_local_sumexp(cudaStream_t stream, Tensor sumexp, Tensor logits, Tensor max);
void ce_target_logit(cudaStream_t stream, Tensor target_logit, Tensor logits, Tensor targets,
                     int64_t vocab_start);
// targets may be empty (every row counts); a negative target's loss is 0.
void ce_loss(cudaStream_t stream, Tensor losses, Tensor max, Tensor sumexp, Tensor target_logit,
             Tensor targets);
void ce_bwd(cudaStream_t stream, Tensor dlogits, Tensor logits, Tensor max, Tensor sumexp,
            Tensor targets, int64_t vocab_start, float scale);

// ---- optim.cu: one launch over many ranges of the flat buffers ----
// A piece of one range that one block handles.
struct RangeChunk {
  int64_t flat, local, count;
  int64_t master;  // AdamW: where the chunk's fp32 master starts
  int32_t item;  // the range's index
  int32_t flag;  // AdamW: the range decays
};
// The device copy of a list of ranges cut into chunks, with scratch for per-chunk partial
// sums. The ranges are the same every step (the stage plan's), so the table is uploaded once
// and again only when they change.
class RangeTable {
 public:
  RangeTable() = default;
  ~RangeTable();
  RangeTable(const RangeTable&) = delete;
  RangeTable& operator=(const RangeTable&) = delete;
  template <class Range, class Split>
  void upload(cudaStream_t stream, std::span<const Range> ranges, uint64_t kind, Split&& split);
  int64_t chunks() const { return static_cast<int64_t>(host_chunks_.size()); }
  const RangeChunk* device_chunks() const { return chunks_; }
  const int32_t* device_first_chunk() const { return first_chunk_; }
  double* device_partials() const { return partials_; }

 private:
  uint64_t key_ = 0, kind_ = 0;
  std::vector<RangeChunk> host_chunks_;
  std::vector<int32_t> host_first_;  // where each range's chunks start, and the end
  RangeChunk* chunks_ = nullptr;
  int32_t* first_chunk_ = nullptr;
  double* partials_ = nullptr;
  unsigned char* stage_ = nullptr;  // pinned: the source of the upload's async copies
  size_t chunk_capacity_ = 0, first_capacity_ = 0, partial_capacity_ = 0, stage_capacity_ = 0;
};

// AdamW over every range in one launch, writing the compute copy (bf16 or f32; may be empty)
// in the same pass; master and copy indexed by AdamWRange::flat, grad, m, v by ::local.
void adamw(cudaStream_t stream, Tensor master, Tensor grad, Tensor m, Tensor v,
           Tensor compute_copy, std::span<const AdamWRange> ranges, const AdamWStep& s,
           RangeTable& table);
// The sum of squares of each span of `flat` (f32) into sums[k] (device doubles, one per
// span): per-chunk partials, then each span's partials in order. Deterministic.
void sum_squares(cudaStream_t stream, Tensor flat, std::span<const FlatSpan> spans, double* sums,
                 RangeTable& table);

// ---- attention.cu: causal flash attention (Dao et al. 2022, FlashAttention-2 work split) ----
// qkv [B, T, G*(R+2)*D] in backend.h's grouped layout (G = kv_heads groups of R query heads,
// a key head and a value head); out [B, T, H*D]; lse f32 [B, H, T, 1]: the row log-sum-exp of
// the scaled scores (H = R * G from lse). Tiled with online softmax: no T x T matrix in memory.
// Head sizes 64, 128 and 144 (J1-Jumbo) are instantiated; others throw std::invalid_argument.
// positions (packed sequences, backend.h) is empty (plain causal) or i32 [B*T] CUDA memory:
// query t then sees only keys t - positions[t] .. t, masked elementwise; positions must count
// 0, 1, ... in each sequence (each 0 or the previous + 1), as the samplers write them, since
// the dK/dV kernel stops at the first query tile whose sequences start past its keys.
void flash_attention_fwd(cudaStream_t stream, Tensor out, Tensor lse, Tensor qkv, int64_t kv_heads,
                         Tensor positions);
// dqkv = gradient of qkv (a kv head's summed over its group's query heads, in order: no
// atomics); delta f32 [B, H, T, 1] is scratch for rowsum(dout * out).
void flash_attention_bwd(cudaStream_t stream, Tensor dqkv, Tensor delta, Tensor dout, Tensor qkv,
                         Tensor out, Tensor lse, int64_t kv_heads, Tensor positions);
bool flash_attention_supports(int64_t head_dim);

// ---- attention_cache.cu: attention over a KV cache (generation) ----
// backend.h's attention_kv_cache: k, v heads of each row stored at (slot, position) of the
// caches [slots, G, P, D], then out[N, H*D] over positions 0..position of the row's slot, each
// query head over its group's kv head; one block per (row, kv head, up to 4 of the group's
// query heads, sharing the cache loads), online softmax, deterministic. Any head size 1..256.
// rows (i32 [N, 2]) is device memory, so it is not checked on the host: a row outside the
// cache stores nothing and gets NaN output.
void attention_kv_cache(cudaStream_t stream, Tensor out, Tensor qkv, Tensor k_cache,
                        Tensor v_cache, Tensor rows);

}  // namespace jumbo::cuda
