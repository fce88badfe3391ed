// Throughput of every CPU backend kernel at GPT-2 124M shapes: micro batch 8 x sequence 128
// (N = 1024 tokens), C = 768, 12 heads of 64, ffn 3072, vocab padded to 50304; AdamW and the
// reductions over all 124M parameters. Counters: GFLOP/s for the matmul-bound kernels (linear,
// attention), GB/s of bytes each kernel must move for the memory-bound ones. The Llama-family
// kernels (RMSNorm, RoPE, SwiGLU, grouped-query attention with G = H/4 kv heads) run at the
// same sizes, the SwiGLU over the same ffn width.
//   build-kerneltests/benchmarks/bench_kernels --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "jumbo/backend/backend.h"
#include "jumbo/backend/bf16.h"

namespace {

using namespace jumbo;

constexpr int64_t kB = 8, kT = 128, kN = kB * kT, kC = 768, kH = 12, kD = 64;
constexpr int64_t kFfn = 3072, kVocab = 50304, kMaxT = 1024;
constexpr int64_t kKvHeads = kH / 4;  // grouped-query attention: 3 kv heads of 4 query heads
// 12 layers x (12 C^2 + 13 C) + (V + 1024) C + 2 C, with the padded vocabulary.
constexpr int64_t kParams = 12 * (12 * kC * kC + 13 * kC) + (kVocab + kMaxT) * kC + 2 * kC;

Backend& backend() {
  static std::unique_ptr<Backend> be = make_cpu_backend();
  return *be;
}

// An arena exactly big enough for the listed tensors (plus alignment padding).
Arena arena_for(std::initializer_list<std::pair<DType, int64_t>> tensors) {
  size_t bytes = 0;
  for (const auto& [dtype, numel] : tensors) bytes += dtype_size(dtype) * numel + Arena::kAlign;
  return backend().device().make_arena(bytes, "bench");
}

// Cheap deterministic values in [-scale, scale): a random generator over 50M elements would
// dominate setup time.
void randomize(Tensor t, float scale, uint64_t seed = 1) {
  const int64_t n = t.numel();
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&] {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return static_cast<float>(static_cast<int64_t>(x >> 40) - (1 << 23)) * (scale / (1 << 23));
  };
  if (t.dtype == DType::f32) {
    std::vector<float> host(n);
    for (auto& v : host) v = next();
    backend().from_host(t, host.data());
  } else {
    std::vector<bf16> host(n);
    for (auto& v : host) v = f32_to_bf16(next());
    backend().from_host(t, host.data());
  }
}

// One untimed call first: it faults in fresh arena pages and grows the kernels' grow-once
// scratch, so the loop measures the steady state a training step sees.
template <class Kernel>
void run_timed(benchmark::State& state, Kernel&& kernel) {
  kernel();
  backend().stream().synchronize();
  for (auto _ : state) {
    kernel();
    backend().stream().synchronize();
  }
}

void report_flops(benchmark::State& state, double flops_per_iteration) {
  state.counters["GFLOP/s"] = benchmark::Counter(
      flops_per_iteration * static_cast<double>(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
}

void report_bytes(benchmark::State& state, double bytes_per_iteration) {
  state.counters["GB/s"] = benchmark::Counter(
      bytes_per_iteration * static_cast<double>(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
}

// ---- linear: 2 N I O flops forward; backward din and dweight, 4 N I O (dbias is noise) ----
void BM_linear_fwd(benchmark::State& state, int64_t in_f, int64_t out_f, DType dt) {
  Arena arena = arena_for({{dt, kN * in_f}, {dt, out_f * in_f}, {dt, out_f}, {dt, kN * out_f}});
  Tensor in = arena.alloc(dt, {kN, in_f}), w = arena.alloc(dt, {out_f, in_f});
  Tensor bias = arena.alloc(dt, {out_f}), out = arena.alloc(dt, {kN, out_f});
  randomize(in, 1.f, 1), randomize(w, 0.02f, 2), randomize(bias, 0.02f, 3);
  run_timed(state, [&] { backend().linear_fwd(out, in, w, bias); });
  report_flops(state, 2.0 * kN * in_f * out_f);
}

void BM_linear_bwd(benchmark::State& state, int64_t in_f, int64_t out_f, DType dt) {
  Arena arena = arena_for({{dt, kN * in_f}, {dt, out_f * in_f}, {dt, kN * out_f},
                           {dt, kN * in_f}, {DType::f32, out_f * in_f}, {DType::f32, out_f}});
  Tensor in = arena.alloc(dt, {kN, in_f}), w = arena.alloc(dt, {out_f, in_f});
  Tensor dout = arena.alloc(dt, {kN, out_f}), din = arena.alloc(dt, {kN, in_f});
  Tensor dw = arena.alloc(DType::f32, {out_f, in_f}), db = arena.alloc(DType::f32, {out_f});
  randomize(in, 1.f, 1), randomize(w, 0.02f, 2), randomize(dout, 1e-3f, 3);
  backend().fill(dw, 0.f), backend().fill(db, 0.f);
  run_timed(state, [&] { backend().linear_bwd(din, dw, db, dout, in, w); });
  report_flops(state, 4.0 * kN * in_f * out_f);
}

// ---- attention: Q K^T and P V, counted over the full T x T square (no causal halving):
// forward 4 B H T^2 D flops, backward twice that, whatever the kv heads (qkv rows are
// (H + 2 kv) D wide) ----
constexpr double kAttentionFwdFlops = 4.0 * kB * kH * kT * kT * kD;

void BM_attention_fwd(benchmark::State& state, int64_t kv, DType dt) {
  const int64_t w = (kH + 2 * kv) * kD;
  Arena arena = arena_for({{dt, kN * w}, {dt, kN * kC}, {DType::f32, kB * kH * kT * kT}});
  Tensor qkv = arena.alloc(dt, {kB, kT, w}), out = arena.alloc(dt, {kB, kT, kH, kD});
  Tensor probs = arena.alloc(DType::f32, {kB, kH, kT, kT});
  randomize(qkv, 1.f);
  run_timed(state, [&] { backend().attention_fwd(out, probs, qkv, kv); });
  report_flops(state, kAttentionFwdFlops);
}

void BM_attention_bwd(benchmark::State& state, int64_t kv, DType dt) {
  const int64_t w = (kH + 2 * kv) * kD;
  Arena arena = arena_for({{dt, kN * w}, {dt, kN * w}, {dt, kN * kC}, {dt, kN * kC},
                           {DType::f32, kB * kH * kT * kT}, {DType::f32, kB * kH * kT * kT}});
  Tensor qkv = arena.alloc(dt, {kB, kT, w}), dqkv = arena.alloc(dt, {kB, kT, w});
  Tensor out = arena.alloc(dt, {kB, kT, kH, kD}), dout = arena.alloc(dt, {kB, kT, kH, kD});
  Tensor probs = arena.alloc(DType::f32, {kB, kH, kT, kT});
  Tensor dprobs = arena.alloc(DType::f32, {kB, kH, kT, kT});
  randomize(qkv, 1.f, 1), randomize(dout, 1e-3f, 2);
  backend().attention_fwd(out, probs, qkv, kv);
  run_timed(state, [&] { backend().attention_bwd(dqkv, dprobs, dout, qkv, out, probs, kv); });
  report_flops(state, 2.0 * kAttentionFwdFlops);
}

// ---- rope, in place on the q and k heads of grouped qkv rows: those read and written ----
void BM_rope(benchmark::State& state, DType dt) {
  const int64_t w = (kH + 2 * kKvHeads) * kD;
  Arena arena = arena_for({{dt, kN * w}, {DType::f32, kMaxT * kD}, {DType::i32, kN}});
  Tensor qkv = arena.alloc(dt, {kB, kT, w}), table = arena.alloc(DType::f32, {kMaxT, kD});
  Tensor positions = arena.alloc(DType::i32, {kN});
  randomize(qkv, 1.f, 1), randomize(table, 1.f, 2);
  std::vector<int32_t> pos(kN);
  for (int64_t i = 0; i < kN; ++i) pos[i] = static_cast<int32_t>(i % kT);
  backend().from_host(positions, pos.data());
  run_timed(state, [&] {
    backend().rope(qkv, table, positions, kKvHeads, RopeDirection::forward);
  });
  report_bytes(state, 2.0 * kN * (kH + kKvHeads) * kD * dtype_size(dt) + kT * kD * 4.0);
}

// ---- layernorm: bytes = what must be read and written once ----
void BM_layernorm_fwd(benchmark::State& state, DType dt) {
  const double s = dtype_size(dt);
  Arena arena = arena_for({{dt, kN * kC}, {dt, kN * kC}, {dt, kC}, {dt, kC},
                           {DType::f32, kN}, {DType::f32, kN}});
  Tensor x = arena.alloc(dt, {kN, kC}), out = arena.alloc(dt, {kN, kC});
  Tensor w = arena.alloc(dt, {kC}), b = arena.alloc(dt, {kC});
  Tensor mean = arena.alloc(DType::f32, {kN}), rstd = arena.alloc(DType::f32, {kN});
  randomize(x, 1.f, 1), randomize(w, 1.f, 2), randomize(b, 1.f, 3);
  run_timed(state, [&] { backend().layernorm_fwd(out, mean, rstd, x, w, b, 1e-5f); });
  report_bytes(state, 2.0 * kN * kC * s + 2.0 * kC * s + 2.0 * kN * 4);
}

void BM_layernorm_bwd(benchmark::State& state, DType dt) {
  const double s = dtype_size(dt);
  Arena arena = arena_for({{dt, kN * kC}, {dt, kN * kC}, {dt, kN * kC}, {dt, kN * kC}, {dt, kC},
                           {dt, kC}, {DType::f32, kC}, {DType::f32, kC}, {DType::f32, kN},
                           {DType::f32, kN}});
  Tensor x = arena.alloc(dt, {kN, kC}), out = arena.alloc(dt, {kN, kC});
  Tensor dout = arena.alloc(dt, {kN, kC}), dx = arena.alloc(dt, {kN, kC});
  Tensor w = arena.alloc(dt, {kC}), b = arena.alloc(dt, {kC});
  Tensor dw = arena.alloc(DType::f32, {kC}), db = arena.alloc(DType::f32, {kC});
  Tensor mean = arena.alloc(DType::f32, {kN}), rstd = arena.alloc(DType::f32, {kN});
  randomize(x, 1.f, 1), randomize(w, 1.f, 2), randomize(b, 1.f, 3), randomize(dout, 1e-3f, 4);
  backend().fill(dx, 0.f), backend().fill(dw, 0.f), backend().fill(db, 0.f);
  backend().layernorm_fwd(out, mean, rstd, x, w, b, 1e-5f);
  run_timed(state, [&] { backend().layernorm_bwd(dx, dw, db, dout, x, w, mean, rstd); });
  // dout, x read; dx read and written; w, mean, rstd read; dweight, dbias read and written.
  report_bytes(state, 4.0 * kN * kC * s + kC * s + 2.0 * kN * 4 + 4.0 * kC * 4);
}

// ---- rmsnorm: bytes = what must be read and written once ----
void BM_rmsnorm_fwd(benchmark::State& state, DType dt) {
  const double s = dtype_size(dt);
  Arena arena = arena_for({{dt, kN * kC}, {dt, kN * kC}, {dt, kC}, {DType::f32, kN}});
  Tensor x = arena.alloc(dt, {kN, kC}), out = arena.alloc(dt, {kN, kC});
  Tensor w = arena.alloc(dt, {kC}), rstd = arena.alloc(DType::f32, {kN});
  randomize(x, 1.f, 1), randomize(w, 1.f, 2);
  run_timed(state, [&] { backend().rmsnorm_fwd(out, rstd, x, w, 1e-5f); });
  report_bytes(state, 2.0 * kN * kC * s + kC * s + kN * 4.0);
}

void BM_rmsnorm_bwd(benchmark::State& state, DType dt) {
  const double s = dtype_size(dt);
  Arena arena = arena_for({{dt, kN * kC}, {dt, kN * kC}, {dt, kN * kC}, {dt, kN * kC}, {dt, kC},
                           {DType::f32, kC}, {DType::f32, kN}});
  Tensor x = arena.alloc(dt, {kN, kC}), out = arena.alloc(dt, {kN, kC});
  Tensor dout = arena.alloc(dt, {kN, kC}), dx = arena.alloc(dt, {kN, kC});
  Tensor w = arena.alloc(dt, {kC}), dw = arena.alloc(DType::f32, {kC});
  Tensor rstd = arena.alloc(DType::f32, {kN});
  randomize(x, 1.f, 1), randomize(w, 1.f, 2), randomize(dout, 1e-3f, 3);
  backend().fill(dx, 0.f), backend().fill(dw, 0.f);
  backend().rmsnorm_fwd(out, rstd, x, w, 1e-5f);
  run_timed(state, [&] { backend().rmsnorm_bwd(dx, dw, dout, x, w, rstd); });
  // dout, x read; dx read and written; w, rstd read; dweight read and written.
  report_bytes(state, 4.0 * kN * kC * s + kC * s + kN * 4.0 + 2.0 * kC * 4);
}

// ---- elementwise ----
void BM_swiglu_fwd(benchmark::State& state, DType dt) {
  const int64_t n = kN * kFfn;
  Arena arena = arena_for({{dt, 2 * n}, {dt, n}});
  Tensor gate_up = arena.alloc(dt, {kN, 2 * kFfn}), out = arena.alloc(dt, {kN, kFfn});
  randomize(gate_up, 3.f);
  run_timed(state, [&] { backend().swiglu_fwd(out, gate_up); });
  report_bytes(state, 3.0 * n * dtype_size(dt));
}

void BM_swiglu_bwd(benchmark::State& state, DType dt) {
  const int64_t n = kN * kFfn;
  Arena arena = arena_for({{dt, 2 * n}, {dt, n}, {dt, 2 * n}});
  Tensor gate_up = arena.alloc(dt, {kN, 2 * kFfn}), dout = arena.alloc(dt, {kN, kFfn});
  Tensor dgate_up = arena.alloc(dt, {kN, 2 * kFfn});
  randomize(gate_up, 3.f, 1), randomize(dout, 1e-3f, 2);
  run_timed(state, [&] { backend().swiglu_bwd(dgate_up, dout, gate_up); });
  report_bytes(state, 5.0 * n * dtype_size(dt));
}

void BM_gelu_bwd(benchmark::State& state, DType dt) {
  const int64_t n = kN * kFfn;
  Arena arena = arena_for({{dt, n}, {dt, n}, {dt, n}});
  Tensor in = arena.alloc(dt, {kN, kFfn}), dout = arena.alloc(dt, {kN, kFfn});
  Tensor din = arena.alloc(dt, {kN, kFfn});
  randomize(in, 3.f, 1), randomize(dout, 1e-3f, 2);
  run_timed(state, [&] { backend().gelu_bwd(din, dout, in); });
  report_bytes(state, 3.0 * n * dtype_size(dt));
}

void BM_add(benchmark::State& state, DType dt) {
  const int64_t n = kN * kC;
  Arena arena = arena_for({{dt, n}, {dt, n}, {dt, n}});
  Tensor a = arena.alloc(dt, {kN, kC}), b = arena.alloc(dt, {kN, kC}), out = arena.alloc(dt, {kN, kC});
  randomize(a, 1.f, 1), randomize(b, 1.f, 2);
  run_timed(state, [&] { backend().add(out, a, b); });
  report_bytes(state, 3.0 * n * dtype_size(dt));
}

// ---- embeddings (one rank holding the whole padded vocabulary) ----
void BM_token_embedding_fwd(benchmark::State& state, DType dt) {
  Arena arena = arena_for({{dt, kVocab * kC}, {dt, kN * kC}, {DType::i32, kN}});
  Tensor wte = arena.alloc(dt, {kVocab, kC}), out = arena.alloc(dt, {kN, kC});
  Tensor tokens = arena.alloc(DType::i32, {kN});
  randomize(wte, 0.02f);
  std::vector<int32_t> ids(kN);
  for (int64_t i = 0; i < kN; ++i) ids[i] = static_cast<int32_t>((i * 7919) % 50257);
  backend().from_host(tokens, ids.data());
  run_timed(state, [&] { backend().token_embedding_fwd(out, tokens, wte, 0); });
  report_bytes(state, 2.0 * kN * kC * dtype_size(dt) + 4.0 * kN);
}

void BM_token_embedding_bwd(benchmark::State& state, DType dt) {
  Arena arena = arena_for({{DType::f32, kVocab * kC}, {dt, kN * kC}, {DType::i32, kN}});
  Tensor dwte = arena.alloc(DType::f32, {kVocab, kC}), dout = arena.alloc(dt, {kN, kC});
  Tensor tokens = arena.alloc(DType::i32, {kN});
  backend().fill(dwte, 0.f);
  randomize(dout, 1e-3f);
  std::vector<int32_t> ids(kN);
  for (int64_t i = 0; i < kN; ++i) ids[i] = static_cast<int32_t>((i * 7919) % 50257);
  backend().from_host(tokens, ids.data());
  run_timed(state, [&] { backend().token_embedding_bwd(dwte, dout, tokens, 0); });
  report_bytes(state, kN * kC * (dtype_size(dt) + 8.0) + 4.0 * kN);  // dout; dwte rows r+w
}

void BM_position_embedding_fwd(benchmark::State& state, DType dt) {
  Arena arena = arena_for({{dt, kMaxT * kC}, {dt, kN * kC}});
  Tensor wpe = arena.alloc(dt, {kMaxT, kC}), out = arena.alloc(dt, {kB, kT, kC});
  randomize(wpe, 0.02f, 1), randomize(out, 0.02f, 2);
  run_timed(state, [&] { backend().position_embedding_fwd(out, wpe); });
  report_bytes(state, (2.0 * kN * kC + kT * kC) * dtype_size(dt));
}

void BM_position_embedding_bwd(benchmark::State& state, DType dt) {
  Arena arena = arena_for({{DType::f32, kMaxT * kC}, {dt, kN * kC}});
  Tensor dwpe = arena.alloc(DType::f32, {kMaxT, kC}), dout = arena.alloc(dt, {kB, kT, kC});
  backend().fill(dwpe, 0.f);
  randomize(dout, 1e-3f);
  run_timed(state, [&] { backend().position_embedding_bwd(dwpe, dout); });
  report_bytes(state, kN * kC * dtype_size(dt) + 8.0 * kT * kC);
}

// ---- vocab-parallel cross-entropy parts on logits [N, 50304] (one rank, whole vocabulary) ----
struct CrossEntropyBuffers {
  Arena arena;
  Tensor logits, max, sumexp, target_logit, losses, targets;
  explicit CrossEntropyBuffers(DType dt)
      : arena(arena_for({{dt, kN * kVocab}, {DType::f32, 4 * kN}, {DType::i32, kN}})) {
    logits = arena.alloc(dt, {kN, kVocab});
    max = arena.alloc(DType::f32, {kN}), sumexp = arena.alloc(DType::f32, {kN});
    target_logit = arena.alloc(DType::f32, {kN}), losses = arena.alloc(DType::f32, {kN});
    targets = arena.alloc(DType::i32, {kN});
    randomize(logits, 4.f);
    std::vector<int32_t> ids(kN);
    for (int64_t i = 0; i < kN; ++i) ids[i] = static_cast<int32_t>((i * 104729) % 50257);
    backend().from_host(targets, ids.data());
    backend().ce_local_max(max, logits);
    backend().ce_local_sumexp(sumexp, logits, max);
    backend().ce_target_logit(target_logit, logits, targets, 0);
  }
};

enum class CePart { max, sumexp, target_logit, loss, bwd };

void BM_cross_entropy(benchmark::State& state, CePart part, DType dt) {
  CrossEntropyBuffers ce(dt);
  const double logits_bytes = static_cast<double>(kN) * kVocab * dtype_size(dt);
  double bytes = 0;
  run_timed(state, [&] {
    switch (part) {
      case CePart::max: backend().ce_local_max(ce.max, ce.logits); break;
      case CePart::sumexp: backend().ce_local_sumexp(ce.sumexp, ce.logits, ce.max); break;
      case CePart::target_logit:
        backend().ce_target_logit(ce.target_logit, ce.logits, ce.targets, 0);
        break;
      case CePart::loss:
        backend().ce_loss(ce.losses, ce.max, ce.sumexp, ce.target_logit);
        break;
      case CePart::bwd:  // in place, as the model runs it
        backend().ce_bwd(ce.logits, ce.logits, ce.max, ce.sumexp, ce.targets, 0, 1.f / kN);
        break;
    }
  });
  switch (part) {
    case CePart::max: bytes = logits_bytes + 4.0 * kN; break;
    case CePart::sumexp: bytes = logits_bytes + 8.0 * kN; break;
    case CePart::target_logit: bytes = kN * (dtype_size(dt) + 8.0); break;  // gathers only
    case CePart::loss: bytes = 16.0 * kN; break;
    case CePart::bwd: bytes = 2 * logits_bytes + 12.0 * kN; break;
  }
  report_bytes(state, bytes);
}

// ---- optimizer and reductions over all 124M parameters (f32 master, grads, state) ----
// The parameter tensors of GPT-2 124M as ranges of one flat buffer, in the trainer's order:
// the optimizer and the grad norm walk them all in one call.
std::vector<AdamWRange> gpt2_ranges() {
  std::vector<int64_t> sizes = {kVocab * kC, kMaxT * kC};
  for (int l = 0; l < 12; ++l) {
    for (int64_t n : {kC, kC, 3 * kC * kC, 3 * kC, kC * kC, kC, kC, kC, 4 * kC * kC, 4 * kC,
                      4 * kC * kC, kC}) {
      sizes.push_back(n);
    }
  }
  sizes.push_back(kC);
  sizes.push_back(kC);
  std::vector<AdamWRange> ranges;
  int64_t at = 0;
  for (int64_t n : sizes) {
    ranges.push_back({.flat = at, .local = at, .count = n, .weight_decay = n > 4 * kC});
    at += n;
  }
  return ranges;
}

void BM_adamw(benchmark::State& state, bool bf16_copy) {
  Arena arena = arena_for({{DType::f32, kParams}, {DType::f32, kParams}, {DType::f32, kParams},
                           {DType::f32, kParams}, {DType::bf16, bf16_copy ? kParams : 0}});
  Tensor master = arena.alloc(DType::f32, {kParams}), grad = arena.alloc(DType::f32, {kParams});
  Tensor m = arena.alloc(DType::f32, {kParams}), v = arena.alloc(DType::f32, {kParams});
  Tensor copy = bf16_copy ? arena.alloc(DType::bf16, {kParams}) : Tensor{};
  randomize(master, 0.02f, 1), randomize(grad, 1e-3f, 2);
  backend().fill(m, 0.f), backend().fill(v, 0.f);
  AdamWStep s;
  s.lr = 6e-4f;
  s.weight_decay = 0.1f;
  const std::vector<AdamWRange> ranges = gpt2_ranges();
  run_timed(state, [&] {
    backend().adamw(master, grad, m, v, copy, ranges, s);
    ++s.step;
  });
  // master, m, v read and written; grad read; the compute copy written.
  report_bytes(state, kParams * (28.0 + (bf16_copy ? 2.0 : 0.0)));
}

void BM_sum_squares(benchmark::State& state) {
  Arena arena = arena_for({{DType::f32, kParams}});
  Tensor grad = arena.alloc(DType::f32, {kParams});
  randomize(grad, 1e-3f);
  std::vector<FlatSpan> spans;
  for (const AdamWRange& r : gpt2_ranges()) spans.push_back({r.flat, r.count});
  run_timed(state, [&] { benchmark::DoNotOptimize(backend().sum_squares(grad, spans)); });
  report_bytes(state, 4.0 * kParams);
}

void BM_copy(benchmark::State& state, DType to, DType from) {
  Arena arena = arena_for({{to, kParams}, {from, kParams}});
  Tensor dst = arena.alloc(to, {kParams}), src = arena.alloc(from, {kParams});
  randomize(src, 0.02f);
  run_timed(state, [&] { backend().copy(dst, src); });
  report_bytes(state, static_cast<double>(kParams) * (dtype_size(to) + dtype_size(from)));
}

void BM_fill(benchmark::State& state, DType dt) {
  Arena arena = arena_for({{dt, kParams}});
  Tensor t = arena.alloc(dt, {kParams});
  run_timed(state, [&] { backend().fill(t, 0.f); });
  report_bytes(state, static_cast<double>(kParams) * dtype_size(dt));
}

}  // namespace

// Registration: every benchmark in milliseconds of wall time (the kernels are multi-threaded).
#define JUMBO_BENCH(func, name, ...) \
  BENCHMARK_CAPTURE(func, name, __VA_ARGS__)->Unit(benchmark::kMillisecond)->UseRealTime()

JUMBO_BENCH(BM_linear_fwd, qkv_768x2304_f32, kC, 3 * kC, DType::f32);
JUMBO_BENCH(BM_linear_fwd, attn_proj_768x768_f32, kC, kC, DType::f32);
JUMBO_BENCH(BM_linear_fwd, fc_768x3072_f32, kC, kFfn, DType::f32);
JUMBO_BENCH(BM_linear_fwd, fc_proj_3072x768_f32, kFfn, kC, DType::f32);
JUMBO_BENCH(BM_linear_fwd, lm_head_768x50304_f32, kC, kVocab, DType::f32);
JUMBO_BENCH(BM_linear_fwd, qkv_768x2304_bf16, kC, 3 * kC, DType::bf16);
JUMBO_BENCH(BM_linear_fwd, fc_768x3072_bf16, kC, kFfn, DType::bf16);
JUMBO_BENCH(BM_linear_fwd, fc_proj_3072x768_bf16, kFfn, kC, DType::bf16);
JUMBO_BENCH(BM_linear_bwd, qkv_768x2304_f32, kC, 3 * kC, DType::f32);
JUMBO_BENCH(BM_linear_bwd, attn_proj_768x768_f32, kC, kC, DType::f32);
JUMBO_BENCH(BM_linear_bwd, fc_768x3072_f32, kC, kFfn, DType::f32);
JUMBO_BENCH(BM_linear_bwd, fc_proj_3072x768_f32, kFfn, kC, DType::f32);
JUMBO_BENCH(BM_linear_bwd, lm_head_768x50304_f32, kC, kVocab, DType::f32);
JUMBO_BENCH(BM_linear_bwd, fc_768x3072_bf16, kC, kFfn, DType::bf16);
JUMBO_BENCH(BM_attention_fwd, f32, kH, DType::f32);
JUMBO_BENCH(BM_attention_bwd, f32, kH, DType::f32);
JUMBO_BENCH(BM_attention_fwd, gqa_kv3_f32, kKvHeads, DType::f32);
JUMBO_BENCH(BM_attention_bwd, gqa_kv3_f32, kKvHeads, DType::f32);
JUMBO_BENCH(BM_rope, gqa_kv3_f32, DType::f32);
JUMBO_BENCH(BM_rope, gqa_kv3_bf16, DType::bf16);
JUMBO_BENCH(BM_layernorm_fwd, f32, DType::f32);
JUMBO_BENCH(BM_layernorm_bwd, f32, DType::f32);
JUMBO_BENCH(BM_rmsnorm_fwd, f32, DType::f32);
JUMBO_BENCH(BM_rmsnorm_bwd, f32, DType::f32);
JUMBO_BENCH(BM_swiglu_fwd, f32, DType::f32);
JUMBO_BENCH(BM_swiglu_bwd, f32, DType::f32);
JUMBO_BENCH(BM_gelu_bwd, f32, DType::f32);
JUMBO_BENCH(BM_add, f32, DType::f32);
JUMBO_BENCH(BM_token_embedding_fwd, f32, DType::f32);
JUMBO_BENCH(BM_token_embedding_bwd, f32, DType::f32);
JUMBO_BENCH(BM_position_embedding_fwd, f32, DType::f32);
JUMBO_BENCH(BM_position_embedding_bwd, f32, DType::f32);

JUMBO_BENCH(BM_cross_entropy, local_max_f32, CePart::max, DType::f32);
JUMBO_BENCH(BM_cross_entropy, local_sumexp_f32, CePart::sumexp, DType::f32);
JUMBO_BENCH(BM_cross_entropy, target_logit_f32, CePart::target_logit, DType::f32);
JUMBO_BENCH(BM_cross_entropy, loss_f32, CePart::loss, DType::f32);
JUMBO_BENCH(BM_cross_entropy, bwd_in_place_f32, CePart::bwd, DType::f32);
JUMBO_BENCH(BM_adamw, params_124M_f32, false);
JUMBO_BENCH(BM_adamw, params_124M_with_bf16_copy, true);
BENCHMARK(BM_sum_squares)->Unit(benchmark::kMillisecond)->UseRealTime();  // 124M f32
JUMBO_BENCH(BM_copy, params_124M_f32_to_bf16, DType::bf16, DType::f32);
JUMBO_BENCH(BM_copy, params_124M_bf16_to_f32, DType::f32, DType::bf16);
JUMBO_BENCH(BM_fill, params_124M_f32, DType::f32);

BENCHMARK_MAIN();
