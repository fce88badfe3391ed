// CpuBackend: the reference backend, host memory, OpenBLAS + OpenMP kernels (kernels_*.cpp).
#include <omp.h>
#include <xmmintrin.h>

#include <cstring>

#include "jumbo/backend/backend.h"
#include "kernels.h"

namespace jumbo {
namespace {

// FTZ | DAZ on every OpenMP thread (MXCSR is per thread).
void set_denormal_flushing_on_all_threads(bool on) {
  constexpr unsigned kFtzDaz = 0x8040;
#pragma omp parallel
  _mm_setcsr(on ? (_mm_getcsr() | kFtzDaz) : (_mm_getcsr() & ~kFtzDaz));
}

class CpuDevice final : public BackendDevice {
 public:
  Device kind() const override { return Device::cpu; }
  std::string name() const override { return "cpu"; }
  Arena make_arena(size_t bytes, const std::string& name) override { return Arena(bytes, name); }
};

// Every call completes before it returns: nothing is ever queued.
class CpuStream final : public Stream {
 public:
  Device device() const override { return Device::cpu; }
  void synchronize() override {}
};

class CpuBackend final : public Backend {
 public:
  BackendDevice& device() override { return device_; }
  Stream& stream() override { return stream_; }
  void set_flush_denormals(bool on) override { set_denormal_flushing_on_all_threads(on); }

  void fill(Tensor t, float value) override { cpu::fill(t, value); }
  void copy(Tensor dst, Tensor src) override { cpu::copy(dst, src); }
  void fill_columns(Tensor t, int64_t first_col, float value) override {
    cpu::fill_columns(t, first_col, value);
  }

  void token_embedding_fwd(Tensor out, Tensor tokens, Tensor wte, int64_t vocab_start) override {
    cpu::token_embedding_fwd(out, tokens, wte, vocab_start);
  }
  void token_embedding_bwd(Tensor dwte, Tensor dout, Tensor tokens, int64_t vocab_start) override {
    cpu::token_embedding_bwd(dwte, dout, tokens, vocab_start);
  }
  void position_embedding_fwd(Tensor out, Tensor wpe, Tensor positions = {}) override {
    cpu::position_embedding_fwd(out, wpe, positions);
  }
  void position_embedding_bwd(Tensor dwpe, Tensor dout, Tensor positions = {}) override {
    cpu::position_embedding_bwd(dwpe, dout, positions);
  }
  void layernorm_fwd(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w, Tensor b,
                     float eps) override {
    cpu::layernorm_fwd(out, mean, rstd, x, w, b, eps);
  }
  void layernorm_bwd(Tensor dx, Tensor dw, Tensor db, Tensor dout, Tensor x, Tensor w,
                     Tensor mean, Tensor rstd) override {
    cpu::layernorm_bwd(dx, dw, db, dout, x, w, mean, rstd);
  }
  void linear_fwd(Tensor out, Tensor in, Tensor w, Tensor bias) override {
    cpu::linear_fwd(scratch_, out, in, w, bias);
  }
  // No fused epilogue on the CPU: the GEMM, then the GELU.
  void linear_gelu_fwd(Tensor out, Tensor pre, Tensor in, Tensor w, Tensor bias) override {
    cpu::linear_fwd(scratch_, pre, in, w, bias);
    cpu::gelu_fwd(out, pre);
  }
  void linear_bwd(Tensor din, Tensor dw, Tensor dbias, Tensor dout, Tensor in, Tensor w) override {
    cpu::linear_bwd(scratch_, din, dw, dbias, dout, in, w);
  }
  void rmsnorm_fwd(Tensor out, Tensor rstd, Tensor x, Tensor w, float eps) override {
    cpu::rmsnorm_fwd(out, rstd, x, w, eps);
  }
  void rmsnorm_bwd(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd) override {
    cpu::rmsnorm_bwd(dx, dw, dout, x, w, rstd);
  }
  void attention_fwd(Tensor out, Tensor probs, Tensor qkv, int64_t kv_heads,
                     Tensor positions = {}) override {
    cpu::attention_fwd(out, probs, qkv, kv_heads, positions);
  }
  void attention_kv_cache(Tensor out, Tensor qkv, Tensor k_cache, Tensor v_cache,
                          Tensor rows) override {
    cpu::attention_kv_cache(out, qkv, k_cache, v_cache, rows);
  }
  // The kept probabilities are all the backward needs: `out` goes unused.
  void attention_bwd(Tensor dqkv, Tensor dprobs, Tensor dout, Tensor qkv, Tensor /*out*/,
                     Tensor probs, int64_t kv_heads, Tensor positions = {}) override {
    cpu::attention_bwd(dqkv, dprobs, dout, qkv, probs, kv_heads, positions);
  }
  void add_to_column_blocks(Tensor wide, Tensor narrow, const ColumnBlocks& at) override {
    cpu::add_to_column_blocks(wide, narrow, at);
  }
  void copy_from_column_blocks(Tensor narrow, Tensor wide, const ColumnBlocks& at) override {
    cpu::copy_from_column_blocks(narrow, wide, at);
  }
  void qk_norm_fwd(Tensor out, Tensor rstd, Tensor qkv, Tensor q_weight, Tensor k_weight,
                   int64_t kv_heads, float eps) override {
    cpu::qk_norm_fwd(out, rstd, qkv, q_weight, k_weight, kv_heads, eps);
  }
  void qk_norm_bwd(Tensor dqkv, Tensor dq_weight, Tensor dk_weight, Tensor dout, Tensor qkv,
                   Tensor q_weight, Tensor k_weight, Tensor rstd, int64_t kv_heads) override {
    cpu::qk_norm_bwd(dqkv, dq_weight, dk_weight, dout, qkv, q_weight, k_weight, rstd, kv_heads);
  }
  void rope(Tensor qkv, Tensor table, Tensor positions, int64_t kv_heads,
            RopeDirection direction) override {
    cpu::rope(qkv, table, positions, kv_heads, direction);
  }
  void swiglu_fwd(Tensor out, Tensor gate_up) override { cpu::swiglu_fwd(out, gate_up); }
  void swiglu_bwd(Tensor dgate_up, Tensor dout, Tensor gate_up) override {
    cpu::swiglu_bwd(dgate_up, dout, gate_up);
  }
  void gelu_fwd(Tensor out, Tensor in) override { cpu::gelu_fwd(out, in); }
  void gelu_bwd(Tensor din, Tensor dout, Tensor in) override { cpu::gelu_bwd(din, dout, in); }
  void scale(Tensor t, float factor) override { cpu::scale(t, factor); }
  void dropout(Tensor out, Tensor in, const DropoutMask& mask) override { cpu::dropout(out, in, mask); }
  void add(Tensor out, Tensor a, Tensor b) override { cpu::add(out, a, b); }

  void ce_local_max(Tensor max, Tensor logits) override { cpu::ce_local_max(max, logits); }
  void ce_local_sumexp(Tensor sumexp, Tensor logits, Tensor max) override {
    cpu::ce_local_sumexp(sumexp, logits, max);
  }
  void ce_target_logit(Tensor tl, Tensor logits, Tensor targets, int64_t vocab_start) override {
    cpu::ce_target_logit(tl, logits, targets, vocab_start);
  }
  void ce_loss(Tensor losses, Tensor max, Tensor sumexp, Tensor tl, Tensor targets = {}) override {
    cpu::ce_loss(losses, max, sumexp, tl, targets);
  }
  void ce_bwd(Tensor dlogits, Tensor logits, Tensor max, Tensor sumexp, Tensor targets,
              int64_t vocab_start, float scale) override {
    cpu::ce_bwd(dlogits, logits, max, sumexp, targets, vocab_start, scale);
  }

  void adamw(Tensor master, Tensor grad, Tensor m, Tensor v, Tensor compute_copy,
             std::span<const AdamWRange> ranges, const AdamWStep& s) override {
    cpu::adamw(master, grad, m, v, compute_copy, ranges, s);
  }
  double sum_squares(Tensor flat, std::span<const FlatSpan> spans) override {
    return cpu::sum_squares(flat, spans, sum_partials_, sum_blocks_);
  }
  void to_host(float* dst, Tensor t) override {
    cpu::expect(t.dtype == DType::f32, "to_host: f32 tensor");
    std::memcpy(dst, t.data, t.bytes());
  }
  void from_host(Tensor dst, const void* src) override { std::memcpy(dst.data, src, dst.bytes()); }

 private:
  CpuDevice device_;
  CpuStream stream_;
  cpu::Scratch scratch_;
  std::vector<double> sum_partials_;
  std::vector<int64_t> sum_blocks_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace jumbo
