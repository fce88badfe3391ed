#pragma once
// Shared plumbing for the kernel tests: random inputs, moving values between the reference's
// doubles and backend tensors (f32, bf16, i32), poisoning outputs, and comparing with a stated
// tolerance.
#include <gtest/gtest.h>

#include <initializer_list>
#include <memory>
#include <random>
#include <string>

#include "jumbo/backend/arena.h"
#include "jumbo/backend/backend.h"
#include "reference.h"

namespace jumbo::test {

using ref::Ids;
using ref::Vec;

// Tolerances, relative to the largest |reference| value of the output being checked:
// - f32 storage: fp32 compute on short sums (< 200 terms here) is good to ~1e-6; allow 1e-5.
// - bf16 storage: storing a result rounds it by up to 2^-9 (half of a bf16 ulp of 2^-8
//   relative); fp32 compute adds little. Allow 1e-2.
inline constexpr double kTolF32 = 1e-5;
inline constexpr double kTolBf16 = 1e-2;
inline double tolerance_for(DType stored) { return stored == DType::bf16 ? kTolBf16 : kTolF32; }

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  Vec uniform(int64_t n, double lo = -1.0, double hi = 1.0);
  Vec normal(int64_t n, double stddev = 1.0);
  Ids ints(int64_t n, int32_t lo, int32_t hi);  // uniform in [lo, hi]
 private:
  std::mt19937_64 gen_;
};

// Values as the given storage dtype holds them (f32: rounded to float; bf16: to bf16).
Vec round_to(DType dtype, const Vec& values);
double round_to(DType dtype, double value);

// A CPU backend and an arena to carve tensors from.
class KernelBench {
 public:
  explicit KernelBench(size_t arena_bytes = 64u << 20);
  Backend& be() { return *backend_; }

  // A tensor holding `values` converted to `dtype` (callers pass values already rounded with
  // round_to when they need the reference to see exactly what the kernel sees).
  Tensor upload(DType dtype, std::initializer_list<int64_t> dims, const Vec& values);
  Tensor upload_ids(std::initializer_list<int64_t> dims, const Ids& ids);
  // A tensor filled with NaN, so elements a kernel forgets to write show up.
  Tensor poisoned(DType dtype, std::initializer_list<int64_t> dims);
  void poison(Tensor t);
  void write(Tensor t, const Vec& values);
  Vec download(Tensor t);

 private:
  std::unique_ptr<Backend> backend_;
  Arena arena_;
};

// max_i |got_i - want_i| <= tol * max_i |want_i|, and no NaN/inf where want is finite.
::testing::AssertionResult close(const Vec& got, const Vec& want, double tol,
                                 const std::string& what);

std::string dtype_name(DType dtype);

// gtest parameter naming for TEST_P over storage dtypes.
struct DTypeName {
  std::string operator()(const ::testing::TestParamInfo<DType>& info) const {
    return dtype_name(info.param);
  }
};

// The fixture of the kernel tests over storage dtypes: the dtype, a tag naming it, its
// tolerance, a bench and a generator seeded per test file.
class DTypeKernelTest : public ::testing::TestWithParam<DType> {
 protected:
  explicit DTypeKernelTest(uint64_t seed) : rng(seed) {}
  DType dt() const { return GetParam(); }
  std::string tag(const std::string& what) const { return what + " [" + dtype_name(dt()) + "]"; }
  double tol() const { return tolerance_for(dt()); }
  KernelBench kb;
  Rng rng;
};

}  // namespace jumbo::test
