#include "gpu_test_support.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string_view>

#include "jumbo/backend/bf16.h"

namespace jumbo::gputest {
namespace {

// Host bytes of `values` in `dtype` (f32, bf16 rounded to nearest even, i32).
std::vector<char> encode(DType dtype, const Values& values) {
  std::vector<char> bytes(values.size() * dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    const float f = static_cast<float>(values[i]);
    if (dtype == DType::f32) {
      std::memcpy(bytes.data() + 4 * i, &f, 4);
    } else if (dtype == DType::bf16) {
      const bf16 b = f32_to_bf16(f);
      std::memcpy(bytes.data() + 2 * i, &b, 2);
    } else {
      const int32_t n = static_cast<int32_t>(values[i]);
      std::memcpy(bytes.data() + 4 * i, &n, 4);
    }
  }
  return bytes;
}

// Backend's operations (include/jumbo/backend/backend.h): the kernel names of the GPUCMP lines,
// as bench_gpu_kernels names its rows.
constexpr std::string_view kOps[] = {
    "fill", "copy", "token_embedding_fwd", "token_embedding_bwd", "position_embedding_fwd",
    "position_embedding_bwd", "layernorm_fwd", "layernorm_bwd", "linear_fwd", "linear_bwd",
    "linear_gelu_fwd", "rmsnorm_fwd", "rmsnorm_bwd", "qk_norm_fwd", "qk_norm_bwd",
    "attention_fwd", "attention_bwd", "attention_kv_cache", "rope", "swiglu_fwd", "swiglu_bwd",
    "gelu_fwd", "gelu_bwd", "scale", "add", "add_to_column_blocks", "copy_from_column_blocks",
    "dropout", "ce_local_max", "ce_local_sumexp",
    "ce_target_logit", "ce_loss", "ce_bwd", "fill_columns", "adamw", "sum_squares"};

std::vector<std::string> words(const std::string& s) {
  std::vector<std::string> out;
  std::string w;
  for (char ch : s + " ") {
    if (ch == ' ') {
      if (!w.empty()) out.push_back(w);
      w.clear();
    } else {
      w += ch;
    }
  }
  return out;
}

}  // namespace

void report_error_as(const std::string& kernel, const std::string& dtype, double rel_err,
                     double tol, const std::string& what) {
  fmt::print("GPUCMP {} {} {} {:.3g} {}\n", kernel, dtype,
             std::isfinite(rel_err) ? fmt::format("{:.3g}", rel_err) : "nan", tol, what);
  std::fflush(stdout);
}

void report_error(const std::string& what, DType stored, double rel_err, double tol) {
  std::string kernel = "other", dtype = to_string(stored);
  bool have_dtype = false;
  for (const std::string& w : words(what)) {
    if (kernel == "other" && std::find(std::begin(kOps), std::end(kOps), w) != std::end(kOps))
      kernel = w;
    if (!have_dtype && (w == "f32" || w == "bf16" || w == "i32")) dtype = w, have_dtype = true;
  }
  report_error_as(kernel, dtype, rel_err, tol, what);
}

std::string gpu_unavailable_reason() {
  if (!cuda_backend_built()) return "this build has no CUDA backend (-DJUMBO_CUDA=ON)";
  if (cuda_device_count() == 0) return "the CUDA driver shows no GPU on this machine";
  return "";
}

DualBench::DualBench(size_t arena_bytes)
    : cpu_(make_cpu_backend()),
      gpu_(make_cuda_backend(0)),
      cpu_arena_(cpu_->device().make_arena(arena_bytes, "gpu-test cpu")),
      gpu_arena_(gpu_->device().make_arena(arena_bytes, "gpu-test gpu")),
      cpu_stage_(cpu_arena_.alloc(DType::f32, {kStageFloats})),
      gpu_stage_(gpu_arena_.alloc(DType::f32, {kStageFloats})) {}

Pair DualBench::upload(DType dtype, std::initializer_list<int64_t> dims, const Values& values) {
  Pair p{cpu_arena_.alloc(dtype, dims), gpu_arena_.alloc(dtype, dims)};
  EXPECT_EQ(static_cast<int64_t>(values.size()), p.cpu.numel()) << "test bug: size mismatch";
  const std::vector<char> bytes = encode(dtype, values);
  cpu_->from_host(p.cpu, bytes.data());
  gpu_->from_host(p.gpu, bytes.data());
  return p;
}

Pair DualBench::upload_ids(std::initializer_list<int64_t> dims, const std::vector<int32_t>& ids) {
  Pair p{cpu_arena_.alloc(DType::i32, dims), gpu_arena_.alloc(DType::i32, dims)};
  cpu_->from_host(p.cpu, ids.data());
  gpu_->from_host(p.gpu, ids.data());
  return p;
}

Pair DualBench::poisoned(DType dtype, std::initializer_list<int64_t> dims) {
  Pair p{cpu_arena_.alloc(dtype, dims), gpu_arena_.alloc(dtype, dims)};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  cpu_->fill(p.cpu, nan);
  gpu_->fill(p.gpu, nan);
  return p;
}

Pair DualBench::scratch(DType dtype, std::initializer_list<int64_t> cpu_dims,
                        std::initializer_list<int64_t> gpu_dims) {
  return {cpu_arena_.alloc(dtype, cpu_dims), gpu_arena_.alloc(dtype, gpu_dims)};
}

Values DualBench::download(Backend& side, Tensor t) {
  // Through an f32 copy on the same side, so bf16 and i32 come back as values.
  Values out(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::i32) {
    std::vector<int32_t> host(out.size());
    Tensor h(host.data(), DType::i32, {t.numel()});
    side.copy(h, t);
    side.stream().synchronize();
    for (size_t i = 0; i < out.size(); ++i) out[i] = host[i];
    return out;
  }
  const Tensor stage = &side == cpu_.get() ? cpu_stage_ : gpu_stage_;
  const Tensor flat = t.view({t.numel()});
  std::vector<float> host(static_cast<size_t>(kStageFloats));
  for (int64_t off = 0; off < t.numel(); off += kStageFloats) {
    const int64_t n = std::min(kStageFloats, t.numel() - off);
    const Tensor part = stage.rows(0, n);
    side.copy(part, flat.rows(off, n));
    side.to_host(host.data(), part);
    for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(off + i)] = host[static_cast<size_t>(i)];
  }
  return out;
}

::testing::AssertionResult DualBench::same(const Pair& p, double tol, const std::string& what) {
  const Values want = download(*cpu_, p.cpu), got = download(*gpu_, p.gpu);
  double scale = 0;
  for (double w : want)
    if (std::isfinite(w)) scale = std::max(scale, std::abs(w));
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(want[i])) continue;
    if (!std::isfinite(got[i])) {
      report_error(what, p.gpu.dtype, std::numeric_limits<double>::quiet_NaN(), tol);
      return ::testing::AssertionFailure()
             << what << ": element " << i << " is " << got[i] << " on the GPU, " << want[i]
             << " on the CPU";
    }
    const double d = std::abs(got[i] - want[i]);
    if (d > worst) worst = d, at = i;
  }
  report_error(what, p.gpu.dtype, scale > 0 ? worst / scale : worst, tol);
  if (worst <= tol * std::max(scale, 1e-30)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << fmt::format("{}: max |gpu - cpu| = {:.3g} at element {} (gpu {:.6g}, cpu {:.6g}) "
                        "exceeds {} x max |cpu| = {:.3g}",
                        what, worst, at, got[at], want[at], tol, tol * scale);
}

Values random_normal(int64_t n, double stddev, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(0.0, stddev);
  Values v(static_cast<size_t>(n));
  for (double& x : v) x = dist(gen);
  if (n > 0 && v[0] == 0.0) v[0] = stddev;  // never all zeros
  return v;
}

std::vector<int32_t> random_ids(int64_t n, int32_t lo, int32_t hi, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int32_t> dist(lo, hi);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& x : v) x = dist(gen);
  return v;
}

}  // namespace jumbo::gputest
