#pragma once
// Double-precision reference of every Backend kernel (include/jumbo/backend/backend.h), written
// as plainly as possible: loops over flat row-major std::vector<double>, no tricks. The tests
// check the reference's backward passes against finite differences, then the backend against
// the reference. "+=" kernels take their output by reference and accumulate into it.
#include <cstdint>
#include <vector>

#include "jumbo/backend/backend.h"

namespace jumbo::ref {

using Vec = std::vector<double>;
using Ids = std::vector<int32_t>;

// ---- embeddings (slice rule: tokens outside [vocab_start, vocab_start + rows) are skipped) ----
Vec token_embedding_fwd(const Ids& tokens, const Vec& wte, int64_t rows, int64_t C,
                        int64_t vocab_start);
void token_embedding_bwd(Vec& dwte, const Vec& dout, const Ids& tokens, int64_t rows, int64_t C,
                         int64_t vocab_start);                                 // dwte +=
void position_embedding_fwd(Vec& out, const Vec& wpe, int64_t B, int64_t T, int64_t C);  // out +=
void position_embedding_bwd(Vec& dwpe, const Vec& dout, int64_t B, int64_t T, int64_t C);  // +=

// ---- layernorm over the last dim of x[N,C]; biased variance, rstd = 1/sqrt(var + eps) ----
struct LayerNormOut {
  Vec out, mean, rstd;
};
LayerNormOut layernorm_fwd(const Vec& x, const Vec& weight, const Vec& bias, int64_t N, int64_t C,
                           double eps);
// dx, dweight, dbias all +=.
void layernorm_bwd(Vec& dx, Vec& dweight, Vec& dbias, const Vec& dout, const Vec& x,
                   const Vec& weight, const Vec& mean, const Vec& rstd, int64_t N, int64_t C);

// ---- linear: out[N,O] = in[N,I] @ weight[O,I]^T + bias[O] (bias may be empty) ----
Vec linear_fwd(const Vec& in, const Vec& weight, const Vec& bias, int64_t N, int64_t I, int64_t O);
// din = dout @ weight, skipped when din is null; dweight += dout^T @ in; dbias += column
// sums of dout, skipped when dbias is null.
void linear_bwd(Vec* din, Vec& dweight, Vec* dbias, const Vec& dout, const Vec& in,
                const Vec& weight, int64_t N, int64_t I, int64_t O);

// ---- RMSNorm over the last dim of x[N,C]; rstd = 1/sqrt(mean(x^2) + eps) ----
struct RmsNormOut {
  Vec out, rstd;
};
RmsNormOut rmsnorm_fwd(const Vec& x, const Vec& weight, int64_t N, int64_t C, double eps);
// dx +=; dweight += unless null.
void rmsnorm_bwd(Vec& dx, Vec* dweight, const Vec& dout, const Vec& x, const Vec& weight,
                 const Vec& rstd, int64_t N, int64_t C);

// ---- causal grouped-query attention ----
// qkv[B,T,G,R+2,D]: per kv head g, its R = H/G query heads, then its key, then its value
// (G = H: [B,T,H,3,D]); out[B,T,H,D], probs[B,H,T,T]. Query head h = g*R + r.
struct AttentionShape {
  int64_t B, T, H, D;
  int64_t G = 0;  // kv heads; 0 means H (multi-head)
  int64_t kv() const { return G > 0 ? G : H; }
  int64_t width() const { return (H + 2 * kv()) * D; }  // of a qkv row
};
// positions (empty, or one per token: packed sequences) limit token t to keys
// t - positions[b*T + t] .. t.
void attention_fwd(Vec& out, Vec& probs, const Vec& qkv, const AttentionShape& s,
                   const Ids& positions = {});
Vec attention_bwd(const Vec& dout, const Vec& qkv, const Vec& probs, const AttentionShape& s,
                  const Ids& positions = {});

// ---- rotary embedding on qkv[N, G*(R+2)*D]: the query and key heads of each group turn
// by position[n]'s angles; table[P, D] holds cos in [0, D/2), sin in [D/2, D) ----
Vec rope(const Vec& qkv, const Vec& table, const Ids& positions, int64_t G, int64_t D,
         bool inverse);
// table[p, i] = cos(p theta^(-2i/D)), table[p, D/2 + i] = its sin, i < D/2.
Vec rope_table(int64_t P, int64_t D, double theta);

// ---- elementwise ----
double gelu(double x);
double gelu_grad(double x);
Vec gelu_fwd(const Vec& in);
Vec gelu_bwd(const Vec& dout, const Vec& in);
// out[N,F] = silu(gate_up[:, :F]) * gate_up[:, F:]; the backward returns dgate_up [N, 2F].
Vec swiglu_fwd(const Vec& gate_up, int64_t N, int64_t F);
Vec swiglu_bwd(const Vec& dout, const Vec& gate_up, int64_t N, int64_t F);

// ---- vocab-parallel cross-entropy parts; logits[N,V] is one vocab slice ----
Vec ce_local_max(const Vec& logits, int64_t N, int64_t V);
Vec ce_local_sumexp(const Vec& logits, const Vec& max, int64_t N, int64_t V);
Vec ce_target_logit(const Vec& logits, const Ids& targets, int64_t N, int64_t V,
                    int64_t vocab_start);
Vec ce_loss(const Vec& max, const Vec& sumexp, const Vec& target_logit);
Vec ce_bwd(const Vec& logits, const Vec& max, const Vec& sumexp, const Ids& targets, int64_t N,
           int64_t V, int64_t vocab_start, double scale);
// The full (unsliced) per-token loss by log-softmax, for checking the parts compose.
Vec cross_entropy_direct(const Vec& logits, const Ids& targets, int64_t N, int64_t V);

// ---- optimizer and reductions ----
// One AdamW step (decoupled decay), updating master, m and v in place.
void adamw(Vec& master, const Vec& grad, Vec& m, Vec& v, const AdamWStep& s);
double sum_squares(const Vec& x);

// Round a double to the nearest bf16 value (ties to even), computed independently of bf16.h
// by rounding the significand to 8 bits; NaN stays NaN, overflow gives infinity.
double round_to_bf16(double x);
double round_to_f32(double x);

}  // namespace jumbo::ref
