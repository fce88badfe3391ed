// Every CUDA kernel at training shapes, against this GPU's ceilings measured in the same run:
// memory bandwidth (a large device copy) and bf16 GEMM throughput (an 8192^3 linear). One
// line per kernel: time, achieved GB/s or TFLOP/s, and the ratio to its ceiling; then the
// same as machine-readable lines (CEILING, KERNEL) for benchmarks/gpu/check.sh's table, each
// KERNEL line named by its Backend operation as the gpu tests' GPUCMP lines are. Through the
// Backend interface only (no CUDA headers here).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "jumbo/backend/backend.h"

namespace {

using jumbo::Arena;
using jumbo::Backend;
using jumbo::DType;
using jumbo::Tensor;

// Median seconds of `repeats` runs of `f`, after two warm-ups.
double time_it(Backend& be, const std::function<void()>& f, int repeats = 10) {
  for (int i = 0; i < 2; ++i) f();
  be.stream().synchronize();
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    be.stream().synchronize();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Uniform values in [-1, 1) (splitmix64), a pool tiled over each tensor. Matrix products run
// faster on constant data than on real data (tensor cores draw less power, clocks stay up),
// so the ceiling and the products measured against it take random data.
class Randomizer {
 public:
  explicit Randomizer(Backend& b) : b_(b), pool_(static_cast<size_t>(kPool)) {
    uint64_t state = 0x9e3779b97f4a7c15ull;
    for (float& x : pool_) {
      uint64_t z = (state += 0x9e3779b97f4a7c15ull);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      z ^= z >> 31;
      x = static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-52 - 1.0);
    }
  }
  void operator()(Tensor t) {
    const Tensor flat = t.view({t.numel()});
    for (int64_t off = 0; off < t.numel(); off += kPool)
      jumbo::write_from_f32(b_, flat.rows(off, std::min(kPool, t.numel() - off)), pool_.data());
  }

 private:
  static constexpr int64_t kPool = int64_t(1) << 24;
  Backend& b_;
  std::vector<float> pool_;
};

struct Row {
  std::string op;  // the Backend operation (the gpu tests' GPUCMP kernel name)
  std::string kernel, shape;
  double seconds, amount;  // bytes moved or FLOPs done
  bool flops;
};

void print(const Row& r, double bw_ceiling, double flop_ceiling) {
  const double rate = r.amount / r.seconds;
  const double ceiling = r.flops ? flop_ceiling : bw_ceiling;
  fmt::print("{:<22} {:<34} {:>9.3f} ms {:>9.1f} {:<7} {:>6.1f}% of {}\n", r.kernel, r.shape,
             r.seconds * 1e3, r.flops ? rate / 1e12 : rate / 1e9, r.flops ? "TFLOP/s" : "GB/s",
             100 * rate / ceiling, r.flops ? "GEMM ceiling" : "copy ceiling");
}

// KERNEL <op> <fraction of the ceiling> <rate> <unit> <row> | <shape>
void print_machine(const Row& r, double bw_ceiling, double flop_ceiling) {
  const double rate = r.amount / r.seconds;
  fmt::print("KERNEL {} {:.4f} {:.3f} {} {} | {}\n", r.op,
             rate / (r.flops ? flop_ceiling : bw_ceiling), r.flops ? rate / 1e12 : rate / 1e9,
             r.flops ? "TFLOP/s" : "GB/s", r.kernel, r.shape);
}

}  // namespace

int main() {
  if (jumbo::cuda_device_count() == 0) {
    std::fprintf(stderr, "bench_gpu_kernels: no GPU (%s)\n",
                 jumbo::cuda_backend_built() ? "the driver shows none" : "CPU-only build");
    return 2;
  }
  auto be = jumbo::make_cuda_backend(0);
  Backend& b = *be;
  Arena arena = b.device().make_arena(size_t(12) << 30, "bench");
  auto alloc = [&](DType t, std::initializer_list<int64_t> d) {
    Tensor x = arena.alloc(t, d);
    b.fill(x, 0.01f);
    return x;
  };
  Randomizer randomize(b);
  auto random = [&](DType t, std::initializer_list<int64_t> d) {
    Tensor x = arena.alloc(t, d);
    randomize(x);
    return x;
  };
  const DType bf = DType::bf16, f32 = DType::f32;
  fmt::print("bench_gpu_kernels on {}\n", b.device().name());

  // Ceilings. Bandwidth: a 1 GiB f32 copy reads and writes every byte.
  const int64_t big = int64_t(1) << 28;
  Tensor a = alloc(f32, {big}), c = alloc(f32, {big});
  const double copy_s = time_it(b, [&] { b.copy(c, a); });
  const double bw = 2.0 * 4 * big / copy_s;
  Tensor gx = random(bf, {8192, 8192}), gw = random(bf, {8192, 8192}), gy = alloc(bf, {8192, 8192});
  const double gemm_s = time_it(b, [&] { b.linear_fwd(gy, gx, gw, Tensor{}); });
  const double peak = 2.0 * 8192.0 * 8192 * 8192 / gemm_s;
  fmt::print("ceilings: device copy {:.0f} GB/s; bf16 GEMM 8192^3 {:.0f} TFLOP/s\n", bw / 1e9,
             peak / 1e12);

  std::vector<Row> rows;
  // GPT-1.3B shapes: 4 x 2048 tokens, d_model 2048, ffn 8192, vocab 50304, head size 128.
  const int64_t N = 8192, C = 2048, F = 8192, V = 50304;
  Tensor x = random(bf, {N, C}), y = alloc(bf, {N, C}), h = alloc(bf, {N, F}), h2 = alloc(bf, {N, F});
  Tensor w1 = random(bf, {F, C}), b1 = random(bf, {F}), dw1 = alloc(f32, {F, C}), db1 = alloc(f32, {F});
  rows.push_back({"linear_fwd", "linear_fwd+bias", "N 8192 x 2048 -> 8192", time_it(b, [&] { b.linear_fwd(h, x, w1, b1); }),
                  2.0 * N * C * F, true});
  rows.push_back({"linear_gelu_fwd", "linear_gelu_fwd", "N 8192 x 2048 -> 8192",
                  time_it(b, [&] { b.linear_gelu_fwd(h2, h, x, w1, b1); }), 2.0 * N * C * F, true});
  rows.push_back({"linear_bwd", "linear_bwd", "N 8192 x 2048 -> 8192 (din, dW, db)",
                  time_it(b, [&] { b.linear_bwd(y, dw1, db1, h, x, w1); }), 4.0 * N * C * F, true});
  Tensor g = alloc(bf, {C}), be_ = alloc(bf, {C}), mean = alloc(f32, {N}), rstd = alloc(f32, {N});
  Tensor dg = alloc(f32, {C}), dbe = alloc(f32, {C});
  rows.push_back({"layernorm_fwd", "layernorm_fwd", "8192 x 2048", time_it(b, [&] { b.layernorm_fwd(y, mean, rstd, x, g, be_, 1e-5f); }),
                  2.0 * 2 * N * C, false});
  rows.push_back({"layernorm_bwd", "layernorm_bwd", "8192 x 2048", time_it(b, [&] { b.layernorm_bwd(y, dg, dbe, x, x, g, mean, rstd); }),
                  4.0 * 2 * N * C, false});
  rows.push_back({"gelu_bwd", "gelu_bwd", "8192 x 8192", time_it(b, [&] { b.gelu_bwd(h2, h2, h); }), 3.0 * 2 * N * F, false});
  rows.push_back({"add", "add (residual)", "8192 x 2048", time_it(b, [&] { b.add(y, x, x); }), 3.0 * 2 * N * C, false});
  for (int64_t d : {64, 128, 144}) {
    const int64_t heads = d == 144 ? 12 : C / d, B = 4, T = 2048;
    Tensor qkv = random(bf, {B, T, heads * 3 * d}), out = alloc(bf, {B, T, heads * d});
    Tensor lse = alloc(f32, {B, heads, T, b.attention_stats_cols(T)});
    Tensor dqkv = alloc(bf, {B, T, heads * 3 * d}), delta = alloc(f32, {B, heads, T, 1});
    const double flops = 2.0 * B * heads * T * T * d;  // causal: half of 4 B H T^2 D
    const std::string shape = fmt::format("B 4 H {} T 2048 D {} causal", heads, d);
    rows.push_back({"attention_fwd", fmt::format("flash_attn_fwd D{}", d), shape,
                    time_it(b, [&] { b.attention_fwd(out, lse, qkv, heads); }), flops, true});
    rows.push_back({"attention_bwd", fmt::format("flash_attn_bwd D{}", d), shape,
                    time_it(b, [&] { b.attention_bwd(dqkv, delta, out, qkv, out, lse, heads); }),
                    2.5 * flops, true});
  }
  // Llama-family kernels at the same N x C: RMSNorm, SwiGLU over F, and for grouped-query
  // attention H = 16 query heads in G = 4 groups of D = 128 (qkv rows of G*(R+2)*D = 3072).
  {
    Tensor rstd2 = alloc(f32, {N}), dg2 = alloc(f32, {C});
    rows.push_back({"rmsnorm_fwd", "rmsnorm_fwd", "8192 x 2048",
                    time_it(b, [&] { b.rmsnorm_fwd(y, rstd2, x, g, 1e-5f); }), 2.0 * 2 * N * C, false});
    rows.push_back({"rmsnorm_bwd", "rmsnorm_bwd", "8192 x 2048",
                    time_it(b, [&] { b.rmsnorm_bwd(y, dg2, x, x, g, rstd2); }), 4.0 * 2 * N * C, false});
    Tensor gate_up = random(bf, {N, 2 * F}), dgate_up = alloc(bf, {N, 2 * F});
    rows.push_back({"swiglu_fwd", "swiglu_fwd", "8192 x 2 x 8192",
                    time_it(b, [&] { b.swiglu_fwd(h, gate_up); }), 3.0 * 2 * N * F, false});
    rows.push_back({"swiglu_bwd", "swiglu_bwd", "8192 x 2 x 8192",
                    time_it(b, [&] { b.swiglu_bwd(dgate_up, h, gate_up); }), 5.0 * 2 * N * F, false});
    const int64_t H = 16, G = 4, D = 128, B = 4, T = 2048, W = G * (H / G + 2) * D;
    Tensor qkv = random(bf, {B, T, W}), out = alloc(bf, {B, T, H * D});
    Tensor lse = alloc(f32, {B, H, T, b.attention_stats_cols(T)});
    Tensor dqkv = alloc(bf, {B, T, W}), delta = alloc(f32, {B, H, T, 1});
    // Positions 0 .. T-1 in each row; a table of P = T rows (values do not change the work).
    std::vector<int32_t> ramp(static_cast<size_t>(B * T));
    for (int64_t i = 0; i < B * T; ++i) ramp[static_cast<size_t>(i)] = static_cast<int32_t>(i % T);
    Tensor positions = arena.alloc(DType::i32, {B * T});
    b.from_host(positions, ramp.data());
    Tensor table = random(f32, {T, D});
    rows.push_back({"rope", "rope (q and k heads)", "N 8192, H 16 G 4 D 128",
                    time_it(b, [&] { b.rope(qkv, table, positions, G, jumbo::RopeDirection::forward); }),
                    2.0 * 2 * N * (H + G) * D + 4.0 * N * D, false});
    Tensor qk_rstd = alloc(f32, {B * T, H + G}), qn_w = random(bf, {D});
    rows.push_back({"qk_norm_fwd", "qk_norm_fwd", "N 8192, H 16 G 4 D 128",
                    time_it(b, [&] { b.qk_norm_fwd(dqkv, qk_rstd, qkv, qn_w, qn_w, G, 1e-6f); }),
                    2.0 * 2 * N * W, false});
    const double flops = 2.0 * B * H * T * T * D;
    const std::string shape = "B 4 H 16 G 4 T 2048 D 128 causal";
    rows.push_back({"attention_fwd", "flash_attn_fwd GQA", shape,
                    time_it(b, [&] { b.attention_fwd(out, lse, qkv, G); }), flops, true});
    rows.push_back({"attention_bwd", "flash_attn_bwd GQA", shape,
                    time_it(b, [&] { b.attention_bwd(dqkv, delta, out, qkv, out, lse, G); }),
                    2.5 * flops, true});
    // A decode step over a KV cache: 64 sequences at position 2047, H 32 in G 8 groups (Llama 3
    // 8B's heads): each row reads its slot's cached keys and values once per group.
    const int64_t S = 64, P = 2048, Hd = 32, Gd = 8, Wd = Gd * (Hd / Gd + 2) * D;
    Tensor kc = random(bf, {S, Gd, P, D}), vc = random(bf, {S, Gd, P, D});
    Tensor dq = random(bf, {S, Wd}), dout_ = alloc(bf, {S, Hd * D});
    std::vector<int32_t> slots(static_cast<size_t>(2 * S));
    for (int64_t i = 0; i < S; ++i) {
      slots[static_cast<size_t>(2 * i)] = static_cast<int32_t>(i);
      slots[static_cast<size_t>(2 * i + 1)] = static_cast<int32_t>(P - 1);
    }
    Tensor cache_rows = arena.alloc(DType::i32, {S, 2});
    b.from_host(cache_rows, slots.data());
    rows.push_back({"attention_kv_cache", "kv_cache decode GQA",
                    "64 rows at 2047, H 32 G 8 D 128",
                    time_it(b, [&] { b.attention_kv_cache(dout_, dq, kc, vc, cache_rows); }),
                    2.0 * 2 * S * Gd * P * D, false});
  }
  Tensor logits = random(bf, {N, V}), mx = alloc(f32, {N}), se = alloc(f32, {N});
  Tensor targets = arena.alloc(DType::i32, {N});
  b.fill(targets, 0.0f);
  rows.push_back({"ce_local_max", "ce_local_max", "8192 x 50304", time_it(b, [&] { b.ce_local_max(mx, logits); }),
                  2.0 * N * V, false});
  rows.push_back({"ce_local_sumexp", "ce_local_sumexp", "8192 x 50304", time_it(b, [&] { b.ce_local_sumexp(se, logits, mx); }),
                  2.0 * N * V, false});
  rows.push_back({"ce_bwd", "ce_bwd (in place)", "8192 x 50304",
                  time_it(b, [&] { b.ce_bwd(logits, logits, mx, se, targets, 0, 1e-4f); }), 2.0 * 2 * N * V, false});
  const int64_t P = 100'000'000;
  Tensor master = alloc(f32, {P}), grad = alloc(f32, {P}), m = alloc(f32, {P}), v = alloc(f32, {P}),
         copy = alloc(bf, {P});
  jumbo::AdamWStep step;
  step.lr = 1e-4f;
  step.weight_decay = 0.1f;
  // As a stage holds them: 4 matrices of 4M and 8 vectors of 4K per layer, 24 layers. One
  // rank: each range's master is its own (master = flat), so no two blocks update one weight.
  std::vector<jumbo::AdamWRange> ranges;
  std::vector<jumbo::FlatSpan> spans;
  for (int64_t at = 0; at < P;) {
    const int64_t n = std::min<int64_t>(P - at, ranges.size() % 3 == 0 ? 4096 : 4 << 20);
    ranges.push_back({.flat = at, .local = at, .count = n, .master = at, .weight_decay = n > 4096});
    spans.push_back({at, n});
    at += n;
  }
  rows.push_back({"adamw", "adamw (+bf16 copy)", fmt::format("100M parameters, {} ranges", ranges.size()),
                  time_it(b, [&] { b.adamw(master, grad, m, v, copy, ranges, step); }),
                  (4.0 * 7 + 2) * P, false});
  rows.push_back({"sum_squares", "sum_squares", fmt::format("100M f32, {} spans", spans.size()),
                  time_it(b, [&] { b.sum_squares(grad, spans); }), 4.0 * P, false});

  fmt::print("{:<22} {:<34} {:>12} {:>17} {}\n", "kernel", "shape", "time", "achieved", "ratio");
  for (const Row& r : rows) print(r, bw, peak);
  fmt::print("CEILING copy {:.1f} GB/s\nCEILING gemm {:.1f} TFLOP/s\n", bw / 1e9, peak / 1e12);
  for (const Row& r : rows) print_machine(r, bw, peak);
  return 0;
}
