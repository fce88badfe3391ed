#pragma once
// Backend: the one seam between the model and a device, in three parts (ggml's device,
// stream and kernels): the device (name, memory, arenas, what its kernels support:
// device.h), the stream its work runs on (stream.h), and one function per kernel the model
// needs, forward and backward, in the style of llm.c: explicit, no autograd.
//
// Conventions:
// - Activations and compute weights have the compute dtype (f32 or bf16); every kernel reads
//   and writes its tensors' own dtypes and computes in fp32.
// - Weight gradients ("main grads"), layernorm statistics and loss parts are always f32, and
//   gradient outputs marked "+=" accumulate, so microbatches add into one buffer.
// - Shapes: N tokens (= micro batch x sequence), C model width, rows of a linear weight are
//   its outputs (PyTorch layout). Tensor parallelism passes local slices; the model adds the
//   communication between kernels, the backend knows nothing of it.
#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "jumbo/backend/arena.h"
#include "jumbo/backend/device.h"
#include "jumbo/backend/dropout_mask.h"
#include "jumbo/backend/stream.h"
#include "jumbo/backend/tensor.h"

namespace jumbo {

struct AdamWStep {
  float lr = 0;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0;  // for the ranges that decay
  int64_t step = 1;        // 1-based, for bias correction
  float grad_scale = 1.f;  // applied to the gradient first (global-norm clipping)
};

// One range an optimizer step updates: `count` elements at `flat` in the flat parameter
// buffers (gradient, compute copy), at `local` in the moments and at `master` in the fp32
// master weights (the optimizer's shard, indexed like the moments, in mixed precision; the
// flat weights themselves in fp32).
struct AdamWRange {
  int64_t flat = 0, local = 0, count = 0;
  int64_t master = 0;
  bool weight_decay = false;  // matrices and embeddings decay; biases and norms do not
};

// Where a narrow tensor's columns sit in a wide one: block b of `block` columns of narrow
// [N, blocks x block] is columns first + b x period .. + block of wide [N, W]. A LoRA adapter
// on one part of a packed output writes it so: q, k or v in the grouped q/k/v rows (a block
// per kv group), SwiGLU's gate or up half (one block).
struct ColumnBlocks {
  int64_t block = 0, first = 0, period = 0;
};

// Which way rope() turns: the forward's rotation, or its inverse (the backward's).
enum class RopeDirection { forward, inverse };

// `count` elements at `offset` of a flat tensor.
struct FlatSpan {
  int64_t offset = 0, count = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendDevice& device() = 0;
  virtual Stream& stream() = 0;

  // ---- memory ----
  virtual void fill(Tensor t, float value) = 0;
  // dst = src element by element; numel must match; converts between f32 and bf16.
  virtual void copy(Tensor dst, Tensor src) = 0;
  // Treat denormal floats as zero (like torch.set_flush_denormal). Denormal results — tiny
  // Adam second moments, vanishing gradients — cost ~100x per operation on x86 and made later
  // CPU training steps several times slower than the first. The trainer turns it on for its
  // step loop; kernels' exact semantics (tests) are without it.
  virtual void set_flush_denormals(bool /*on*/) {}

  // ---- embeddings ----
  // out[N,C] = wte[token - vocab_start] for tokens in this rank's slice [vocab_start,
  // vocab_start + wte.rows), zero rows otherwise (vocab-parallel: an all-reduce follows).
  virtual void token_embedding_fwd(Tensor out, Tensor tokens, Tensor wte, int64_t vocab_start) = 0;
  // dwte (f32) += scatter of dout rows to their tokens' rows, same slice rule.
  virtual void token_embedding_bwd(Tensor dwte, Tensor dout, Tensor tokens, int64_t vocab_start) = 0;
  // out[B,T,C] += wpe[t] for every b (T <= wpe rows). With `positions` (i32 [B*T], packed
  // sequences: each token's position in its own sequence) out[b,t] += wpe[positions[b*T+t]].
  virtual void position_embedding_fwd(Tensor out, Tensor wpe, Tensor positions = {}) = 0;
  // dwpe[t] (f32) += sum over b of dout[b,t]; with positions, dwpe[positions[i]] += dout[i]
  // (deterministic: each row's sum in token order).
  virtual void position_embedding_bwd(Tensor dwpe, Tensor dout, Tensor positions = {}) = 0;

  // ---- layernorm over the last dim of x[N,C] ----
  virtual void layernorm_fwd(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor weight,
                             Tensor bias, float eps) = 0;
  // dx += ..., dweight (f32) += ..., dbias (f32) += ...
  virtual void layernorm_bwd(Tensor dx, Tensor dweight, Tensor dbias, Tensor dout, Tensor x,
                             Tensor weight, Tensor mean, Tensor rstd) = 0;

  // ---- linear: out[N,O] = in[N,I] @ weight[O,I]^T + bias[O] (bias may be empty) ----
  virtual void linear_fwd(Tensor out, Tensor in, Tensor weight, Tensor bias) = 0;
  // din[N,I] = dout @ weight; dweight (f32) += dout^T @ in; dbias (f32, may be empty) +=
  // column sums of dout. din may be empty (not needed), dweight too (a frozen weight).
  virtual void linear_bwd(Tensor din, Tensor dweight, Tensor dbias, Tensor dout, Tensor in,
                          Tensor weight) = 0;
  // out = gelu(in @ weight^T + bias) (tanh approximation), keeping the pre-activation in
  // `pre` (its backward needs it). A GPU fuses the GELU into the GEMM's epilogue.
  virtual void linear_gelu_fwd(Tensor out, Tensor pre, Tensor in, Tensor weight, Tensor bias) = 0;

  // ---- RMSNorm over the last dim of x[N,C] (Zhang & Sennrich 2019) ----
  // out = x * rstd * weight, rstd (f32 [N]) = 1 / sqrt(mean(x^2) + eps).
  virtual void rmsnorm_fwd(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps) = 0;
  // dx += ..., dweight (f32, may be empty: a frozen weight) += ...
  virtual void rmsnorm_bwd(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight,
                           Tensor rstd) = 0;

  // ---- qk-norm (Qwen 3, OLMo 2): RMSNorm over each query head and each key head ----
  // qkv and out are [N, G*(R+2)*D] (the grouped layout of attention_fwd below): out is qkv
  // with every query head x replaced by x * rstd * q_weight and every key head by
  // x * rstd * k_weight (weights [D], the compute dtype), rstd = 1 / sqrt(mean(x^2) + eps)
  // over the head's D values; value heads copied. rstd: f32 [N, H + G], a row's query heads
  // in order, then its key heads.
  virtual void qk_norm_fwd(Tensor out, Tensor rstd, Tensor qkv, Tensor q_weight,
                           Tensor k_weight, int64_t kv_heads, float eps) = 0;
  // dqkv = the gradient at qkv from dout (out's): value heads' copied; dq_weight and
  // dk_weight (f32, may be empty: frozen) +=. dqkv may be dout (in place).
  virtual void qk_norm_bwd(Tensor dqkv, Tensor dq_weight, Tensor dk_weight, Tensor dout,
                           Tensor qkv, Tensor q_weight, Tensor k_weight, Tensor rstd,
                           int64_t kv_heads) = 0;

  // ---- causal self-attention ----
  // qkv is a 3-d tensor [B, T, G*(R+2)*D]: G = kv_heads key/value heads, each shared by
  // R = H/G query heads (grouped-query attention, Ainslie et al. 2023; G = H is multi-head,
  // G = 1 multi-query). A row holds group after group: the group's R query heads, then its
  // key head, then its value head, each D wide (Megatron's layout; with G = H it is per head
  // (q, k, v)). Query head h = g*R + r reads its group's key and value: no copy per query head.
  // The query head count H comes from stats, f32 [B, H, T, attention_stats_cols(T)], what the
  // forward saves for the backward: the CPU reference keeps the probabilities (T columns,
  // zero above the diagonal), flash attention one log-sum-exp per row (1 column).
  // out[B,T,H*D] = softmax(q k^T / sqrt(D), causal) v.
  // With `positions` (i32 [B*T]: packed sequences, each token's position in its own
  // sequence) token t of a row attends to keys t - positions[t] .. t only: the causal mask
  // of each packed sequence, nothing across them.
  virtual int64_t attention_stats_cols(int64_t seq) const { return seq; }
  virtual void attention_fwd(Tensor out, Tensor stats, Tensor qkv, int64_t kv_heads,
                             Tensor positions = {}) = 0;
  // dqkv (same layout as qkv) = ... (a key or value head's gradient sums over its group's
  // query heads); out is the forward's output (flash attention's backward needs
  // rowsum(dout * out)); dstats (the shape of stats) is scratch.
  virtual void attention_bwd(Tensor dqkv, Tensor dstats, Tensor dout, Tensor qkv, Tensor out,
                             Tensor stats, int64_t kv_heads, Tensor positions = {}) = 0;

  // ---- attention over a KV cache (generation) ----
  // The query rows of one decode or prefill step: qkv [N, G*(R+2)*D] (the grouped layout
  // above), rows i32 [N, 2] = (cache slot, position) of each row, caches [slots, G, P, D] in
  // the compute dtype (P >= every position + 1; G kv heads, H = out's width / D query heads).
  // First stores each row's k and v at (slot, position) of k_cache and v_cache, then
  // out[N, H*D] = softmax(q k^T / sqrt(D)) v over positions 0..position of the row's slot,
  // each query head over its group's kv head: a prefill passes consecutive positions of one
  // slot, a decode step one row per sequence, and one step may mix both (continuous
  // batching). Rows of one slot have distinct positions; positions below a row's own that no
  // row of this step writes must have been written by earlier steps.
  virtual void attention_kv_cache(Tensor out, Tensor qkv, Tensor k_cache, Tensor v_cache,
                                  Tensor rows) = 0;

  // ---- rotary position embedding (Su et al. 2021), Hugging Face's Llama form ----
  // In place on the query and key heads of qkv [N, G*(R+2)*D] (any leading shape of N rows;
  // the grouped layout above; value heads untouched): at row n's position p, each head's
  // halves x1 = [0, D/2) and x2 = [D/2, D) become x1 cos - x2 sin and x2 cos + x1 sin
  // (rotate_half), cos = table[p, i] and sin = table[p, D/2 + i] for i < D/2, table f32
  // [P, D] (model/rope.h builds it). positions: i32 [N], or i32 [N, 2] whose second column
  // is the position (a KV cache's rows). RopeDirection::inverse rotates by minus the angle:
  // the backward, d(before) from d(after), in place on dqkv.
  virtual void rope(Tensor qkv, Tensor table, Tensor positions, int64_t kv_heads,
                    RopeDirection direction) = 0;

  // ---- elementwise ----
  // out[N,F] = silu(gate_up[:, :F]) * gate_up[:, F:] (SwiGLU, Shazeer 2020), gate_up [N, 2F]
  // the gate's and the up projection's outputs side by side.
  virtual void swiglu_fwd(Tensor out, Tensor gate_up) = 0;
  // dgate_up [N, 2F] = the gradients of gate_up's two halves (written, not accumulated).
  virtual void swiglu_bwd(Tensor dgate_up, Tensor dout, Tensor gate_up) = 0;
  virtual void gelu_fwd(Tensor out, Tensor in) = 0;                 // out = gelu(in), tanh form
  virtual void gelu_bwd(Tensor din, Tensor dout, Tensor in) = 0;    // din = dout * gelu'(in)
  virtual void scale(Tensor t, float factor) = 0;                   // t *= factor
  // wide's blocks += narrow (ColumnBlocks above); and narrow = wide's blocks.
  virtual void add_to_column_blocks(Tensor wide, Tensor narrow, const ColumnBlocks& at) = 0;
  virtual void copy_from_column_blocks(Tensor narrow, Tensor wide, const ColumnBlocks& at) = 0;
  virtual void add(Tensor out, Tensor a, Tensor b) = 0;             // out = a + b
  // Inverted dropout over the last dimension's columns (dropout_mask.h): out = in x keep / (1 -
  // p), 0 where dropped; out may be in. The same mask on the same logical elements anywhere.
  virtual void dropout(Tensor out, Tensor in, const DropoutMask& mask) = 0;

  // ---- vocab-parallel cross-entropy, from parts (logits[N,Vl] = this rank's vocab slice) ----
  virtual void ce_local_max(Tensor max, Tensor logits) = 0;                       // f32 [N]
  virtual void ce_local_sumexp(Tensor sumexp, Tensor logits, Tensor max) = 0;     // f32 [N]
  // A negative target is not in the loss (a prompt token, padding: data's kIgnoredTarget):
  // its loss and its logits' gradient are 0.
  // target_logit[n] = logits[n, target - vocab_start] if the target is in this slice, else 0.
  virtual void ce_target_logit(Tensor target_logit, Tensor logits, Tensor targets,
                               int64_t vocab_start) = 0;
  // losses[n] = log(sumexp[n]) + max[n] - target_logit[n], after the tp all-reduces; 0 where
  // targets[n] < 0 (targets may be empty: every row counts).
  virtual void ce_loss(Tensor losses, Tensor max, Tensor sumexp, Tensor target_logit,
                       Tensor targets = {}) = 0;
  // dlogits = (softmax - onehot(target)) * scale, 0 in rows whose target < 0; dlogits may
  // alias logits.
  virtual void ce_bwd(Tensor dlogits, Tensor logits, Tensor max, Tensor sumexp, Tensor targets,
                      int64_t vocab_start, float scale) = 0;

  // t[:, first_col:] = value for a 2-d tensor [rows, cols]. Masks the padded vocabulary
  // columns of the logits (-inf before the loss, 0 in their gradient), so padding, which
  // depends on tp, never changes the model.
  virtual void fill_columns(Tensor t, int64_t first_col, float value) = 0;

  // ---- optimizer and reductions over the flat buffers (f32 master, grads and state) ----
  // AdamW on every range in one pass (llm.c's gpt2_update: one launch, not one per tensor):
  // grad and compute_copy are indexed by AdamWRange::flat, m and v by ::local, master by
  // ::master.
  // compute_copy (may be empty) receives the new weights in the compute dtype (the bf16
  // copy in mixed precision).
  virtual void adamw(Tensor master, Tensor grad, Tensor m, Tensor v, Tensor compute_copy,
                     std::span<const AdamWRange> ranges, const AdamWStep& s) = 0;
  // The sum of squares of the spans of `flat` (f32), in one pass: each span's sum in double,
  // the spans' sums added in order (so the result does not depend on the device's grouping).
  // The host waits for it: the grad norm's one read per step.
  virtual double sum_squares(Tensor flat, std::span<const FlatSpan> spans) = 0;
  // Copies n f32 values from device tensor t to the host (for losses and statistics).
  virtual void to_host(float* dst, Tensor t) = 0;
  // Copies host data into a device tensor of the same byte size.
  virtual void from_host(Tensor dst, const void* src) = 0;
};

// Writes dst.numel() host f32 values into `dst` in its dtype (f32, or bf16 rounded to nearest
// even) on its device; `src` may be reused when it returns. For start-up and loads: weights
// from initial values or a checkpoint's f32 master.
void write_from_f32(Backend& backend, Tensor dst, const float* src);

std::unique_ptr<Backend> make_cpu_backend();
// Bytes of scratch the CPU backend's linear layer keeps after a call on `rows` input rows of
// width `k` (f32), beyond its operands: what the memory plan adds for it. 0 where none is kept.
int64_t cpu_linear_scratch_bytes(int64_t rows, int64_t k);
// The CUDA backend on GPU `device` (the local rank). In a build without -DJUMBO_CUDA=ON it
// throws UserError saying so; without a usable GPU, UserError naming the CUDA error.
std::unique_ptr<Backend> make_cuda_backend(int device);
// Whether this binary has the CUDA backend, and how many GPUs the driver shows (0 if none).
bool cuda_backend_built();
int cuda_device_count();

}  // namespace jumbo
