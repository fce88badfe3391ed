#pragma once
// The gpu tests: every CUDA launcher against the CPU backend on the same random inputs.
// Outputs are poisoned (NaN) on both sides before each call, inputs are never all zeros, and
// the tolerance is stated per dtype. Without a usable GPU each test skips with one line.
#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "jumbo/backend/arena.h"
#include "jumbo/backend/backend.h"
#include "jumbo/config/config.h"

namespace jumbo::gputest {

using Values = std::vector<double>;

// Tolerances relative to the largest |CPU value| of the output compared:
// - f32 storage: both compute in fp32 but sum in another order (and cuBLASLt may use
//   TF32-free fp32 kernels): 1e-4.
// - bf16 storage: one rounding of the stored result each side (2^-8 relative) plus order:
//   2e-2.
inline constexpr double kTolF32 = 1e-4;
inline constexpr double kTolBf16 = 2e-2;
inline double tolerance_for(DType stored) { return stored == DType::bf16 ? kTolBf16 : kTolF32; }

// "" when a GPU is usable, else why not (the skip line).
std::string gpu_unavailable_reason();

// In a TEST body: skips with one clear line when there is no GPU (or no CUDA build).
#define JUMBO_REQUIRE_GPU()                                                   \
  do {                                                                        \
    const std::string why = ::jumbo::gputest::gpu_unavailable_reason();       \
    if (!why.empty()) GTEST_SKIP() << "no GPU: " << why;                      \
  } while (0)

struct Pair {
  Tensor cpu, gpu;
};

// A CPU backend and the CUDA backend on device 0, each with an arena to carve tensors from.
class DualBench {
 public:
  explicit DualBench(size_t arena_bytes = 256u << 20);
  Backend& cpu() { return *cpu_; }
  Backend& gpu() { return *gpu_; }
  // The same values (rounded to dtype) on both sides.
  Pair upload(DType dtype, std::initializer_list<int64_t> dims, const Values& values);
  Pair upload_ids(std::initializer_list<int64_t> dims, const std::vector<int32_t>& ids);
  // NaN-filled tensors on both sides (a kernel that forgets an element is caught).
  Pair poisoned(DType dtype, std::initializer_list<int64_t> dims);
  // Tensors of the given shapes, not poisoned (for scratch whose shape differs per side).
  Pair scratch(DType dtype, std::initializer_list<int64_t> cpu_dims,
               std::initializer_list<int64_t> gpu_dims);
  Values download(Backend& side, Tensor t);
  // max |gpu - cpu| <= tol * max |cpu|, no NaN where the CPU is finite; names the worst index.
  ::testing::AssertionResult same(const Pair& p, double tol, const std::string& what);

 private:
  static constexpr int64_t kStageFloats = 4 << 20;  // downloads convert through this
  std::unique_ptr<Backend> cpu_, gpu_;
  Arena cpu_arena_, gpu_arena_;
  Tensor cpu_stage_, gpu_stage_;
};

// One line per comparison for benchmarks/gpu/check.sh's table, on stdout:
//   GPUCMP <kernel> <dtype> <max |gpu - cpu| / max |cpu|> <tolerance> <what>
// kernel: the first word of `what` that names a Backend operation ("other" if none), so each
// `what` should name the launcher it checks; dtype: the first of f32, bf16, i32 in `what`,
// else the compared tensor's. The error is "nan" where the GPU is not finite.
void report_error(const std::string& what, DType stored, double rel_err, double tol);
// The same line with the kernel and dtype given (whole-model checks: kernel "train_step").
void report_error_as(const std::string& kernel, const std::string& dtype, double rel_err,
                     double tol, const std::string& what);

// Deterministic normal values, scaled; never all zeros.
Values random_normal(int64_t n, double stddev, uint64_t seed);
std::vector<int32_t> random_ids(int64_t n, int32_t lo, int32_t hi, uint64_t seed);

// The whole-model gpu tests' model: 2 layers, d_model 256, 4 heads (head size 64, so flash
// attention runs), ffn 1024, vocab 512, context 128.
inline ModelConfig small_gpu_model(const std::string& name) {
  ModelConfig m;
  m.name = name;
  m.layers = 2;
  m.d_model = 256;
  m.heads = 4;
  m.ffn = 1024;
  m.vocab = 512;
  m.context = 128;
  return m;
}

}  // namespace jumbo::gputest
