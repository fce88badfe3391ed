#pragma once
// CPU kernels behind CpuBackend. Each takes Tensors whose dtypes it checks; activations and
// compute weights are f32 or bf16 (one compute dtype per call), grads and statistics f32.
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "jumbo/backend/backend.h"
#include "jumbo/backend/bf16.h"

namespace jumbo::cpu {

// Calls f with a value of the storage type of `t` (float or bf16).
template <class F>
void dispatch_float(DType t, F&& f) {
  if (t == DType::f32) {
    f(float{});
  } else if (t == DType::bf16) {
    f(bf16{});
  } else {
    throw std::logic_error(std::string("kernel: expected f32 or bf16, got ") + to_string(t));
  }
}

inline void expect(bool ok, const char* what) {
  if (!ok) throw std::logic_error(std::string("kernel contract violated: ") + what);
}

// Grow-once scratch for f32 copies of bf16 operands (sized by the first step; reused after).
class Scratch {
 public:
  float* get(int slot, size_t count);

 private:
  std::vector<std::vector<float>> slots_;
};

void fill(Tensor t, float value);
void fill_columns(Tensor t, int64_t first_col, float value);
void copy(Tensor dst, Tensor src);
void gelu_fwd(Tensor out, Tensor in);
void scale(Tensor t, float factor);
void add_to_column_blocks(Tensor wide, Tensor narrow, const ColumnBlocks& at);
void copy_from_column_blocks(Tensor narrow, Tensor wide, const ColumnBlocks& at);
void dropout(Tensor out, Tensor in, const DropoutMask& mask);
void gelu_bwd(Tensor din, Tensor dout, Tensor in);
void add(Tensor out, Tensor a, Tensor b);

void token_embedding_fwd(Tensor out, Tensor tokens, Tensor wte, int64_t vocab_start);
void token_embedding_bwd(Tensor dwte, Tensor dout, Tensor tokens, int64_t vocab_start);
void position_embedding_fwd(Tensor out, Tensor wpe, Tensor positions);
void position_embedding_bwd(Tensor dwpe, Tensor dout, Tensor positions);
void layernorm_fwd(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w, Tensor b, float eps);
void layernorm_bwd(Tensor dx, Tensor dw, Tensor db, Tensor dout, Tensor x, Tensor w, Tensor mean,
                   Tensor rstd);

void linear_fwd(Scratch& s, Tensor out, Tensor in, Tensor w, Tensor bias);
// linear_fwd for tens to a few hundred rows (generation steps), from the f32 input and bias
// (may be null): kernels_matmul_rows.cpp. False, doing nothing, where it is not built (a
// host without AVX-512).
bool linear_fwd_rows(Scratch& s, Tensor out, const float* in, Tensor w, const float* bias);
// The f32 panels linear_fwd_rows keeps in scratch for `rows` x `k` inputs (0 where not built).
int64_t linear_rows_panel_floats(int64_t rows, int64_t k);
// Up to this many rows linear_fwd runs linear_fwd_rows.
inline constexpr int64_t kRowsKernelRows = 256;
void linear_bwd(Scratch& s, Tensor din, Tensor dw, Tensor dbias, Tensor dout, Tensor in, Tensor w);

void rmsnorm_fwd(Tensor out, Tensor rstd, Tensor x, Tensor w, float eps);
void rmsnorm_bwd(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd);
void swiglu_fwd(Tensor out, Tensor gate_up);
void swiglu_bwd(Tensor dgate_up, Tensor dout, Tensor gate_up);

void qk_norm_fwd(Tensor out, Tensor rstd, Tensor qkv, Tensor q_weight, Tensor k_weight,
                 int64_t kv_heads, float eps);
void qk_norm_bwd(Tensor dqkv, Tensor dq_weight, Tensor dk_weight, Tensor dout, Tensor qkv,
                 Tensor q_weight, Tensor k_weight, Tensor rstd, int64_t kv_heads);
void attention_fwd(Tensor out, Tensor probs, Tensor qkv, int64_t kv_heads, Tensor positions);
void attention_bwd(Tensor dqkv, Tensor dprobs, Tensor dout, Tensor qkv, Tensor probs,
                   int64_t kv_heads, Tensor positions);
void attention_kv_cache(Tensor out, Tensor qkv, Tensor k_cache, Tensor v_cache, Tensor rows);
void rope(Tensor qkv, Tensor table, Tensor positions, int64_t kv_heads, RopeDirection direction);

void ce_local_max(Tensor max, Tensor logits);
void ce_local_sumexp(Tensor sumexp, Tensor logits, Tensor max);
void ce_target_logit(Tensor target_logit, Tensor logits, Tensor targets, int64_t vocab_start);
void ce_loss(Tensor losses, Tensor max, Tensor sumexp, Tensor target_logit, Tensor targets);
void ce_bwd(Tensor dlogits, Tensor logits, Tensor max, Tensor sumexp, Tensor targets,
            int64_t vocab_start, float scale);

void adamw(Tensor master, Tensor grad, Tensor m, Tensor v, Tensor compute_copy,
           std::span<const AdamWRange> ranges, const AdamWStep& s);
// `partials` and `first_block` are grow-once scratch.
double sum_squares(Tensor flat, std::span<const FlatSpan> spans, std::vector<double>& partials,
                   std::vector<int64_t>& first_block);

}  // namespace jumbo::cpu
