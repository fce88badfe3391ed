#include "backend_test_support.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <vector>

#include "jumbo/backend/bf16.h"

namespace jumbo::test {

Vec Rng::uniform(int64_t n, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(n);
  for (auto& x : v) x = dist(gen_);
  return v;
}

Vec Rng::normal(int64_t n, double stddev) {
  std::normal_distribution<double> dist(0.0, stddev);
  Vec v(n);
  for (auto& x : v) x = dist(gen_);
  return v;
}

Ids Rng::ints(int64_t n, int32_t lo, int32_t hi) {
  std::uniform_int_distribution<int32_t> dist(lo, hi);
  Ids v(n);
  for (auto& x : v) x = dist(gen_);
  return v;
}

double round_to(DType dtype, double value) {
  switch (dtype) {
    case DType::f32: return ref::round_to_f32(value);
    case DType::bf16: return ref::round_to_bf16(value);
    case DType::i32: return std::nearbyint(value);
  }
  return value;
}

Vec round_to(DType dtype, const Vec& values) {
  Vec out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = round_to(dtype, values[i]);
  return out;
}

std::string dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
  }
  return "?";
}

KernelBench::KernelBench(size_t arena_bytes)
    : backend_(make_cpu_backend()), arena_(arena_bytes, "kernel-test") {}

void KernelBench::write(Tensor t, const Vec& values) {
  EXPECT_EQ(static_cast<int64_t>(values.size()), t.numel()) << "test bug: size mismatch";
  const int64_t n = t.numel();
  switch (t.dtype) {
    case DType::f32: {
      std::vector<float> host(n);
      for (int64_t i = 0; i < n; ++i) host[i] = static_cast<float>(values[i]);
      backend_->from_host(t, host.data());
      break;
    }
    case DType::bf16: {
      std::vector<bf16> host(n);
      for (int64_t i = 0; i < n; ++i) host[i] = f32_to_bf16(static_cast<float>(values[i]));
      backend_->from_host(t, host.data());
      break;
    }
    case DType::i32: {
      std::vector<int32_t> host(n);
      for (int64_t i = 0; i < n; ++i) host[i] = static_cast<int32_t>(values[i]);
      backend_->from_host(t, host.data());
      break;
    }
  }
}

Tensor KernelBench::upload(DType dtype, std::initializer_list<int64_t> dims, const Vec& values) {
  Tensor t = arena_.alloc(dtype, dims);
  write(t, values);
  return t;
}

Tensor KernelBench::upload_ids(std::initializer_list<int64_t> dims, const Ids& ids) {
  Tensor t = arena_.alloc(DType::i32, dims);
  EXPECT_EQ(static_cast<int64_t>(ids.size()), t.numel()) << "test bug: size mismatch";
  backend_->from_host(t, ids.data());
  return t;
}

void KernelBench::poison(Tensor t) {
  // Written straight into host memory (the CPU backend's memory), not through fill(), so a
  // broken fill cannot hide a kernel that skips elements.
  const int64_t n = t.numel();
  if (t.dtype == DType::f32) {
    float* p = t.as<float>();
    for (int64_t i = 0; i < n; ++i) p[i] = std::numeric_limits<float>::quiet_NaN();
  } else if (t.dtype == DType::bf16) {
    bf16* p = t.as<bf16>();
    for (int64_t i = 0; i < n; ++i) p[i] = bf16{0x7fc0};
  } else {
    std::memset(t.data, 0x7f, t.bytes());
  }
}

Tensor KernelBench::poisoned(DType dtype, std::initializer_list<int64_t> dims) {
  Tensor t = arena_.alloc(dtype, dims);
  poison(t);
  return t;
}

Vec KernelBench::download(Tensor t) {
  backend_->stream().synchronize();
  const int64_t n = t.numel();
  Vec out(n);
  switch (t.dtype) {
    case DType::f32: {
      std::vector<float> host(n);
      backend_->to_host(host.data(), t);
      for (int64_t i = 0; i < n; ++i) out[i] = host[i];
      break;
    }
    case DType::bf16: {  // the CPU backend's memory is host memory
      const bf16* p = t.as<bf16>();
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(p[i]);
      break;
    }
    case DType::i32: {
      const int32_t* p = t.as<int32_t>();
      for (int64_t i = 0; i < n; ++i) out[i] = p[i];
      break;
    }
  }
  return out;
}

::testing::AssertionResult close(const Vec& got, const Vec& want, double tol,
                                 const std::string& what) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << what << ": size " << got.size() << ", expected " << want.size();
  }
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  if (scale == 0) scale = 1;  // all-zero reference: absolute tolerance
  double worst = -1;
  size_t worst_at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::isfinite(got[i]) ? std::fabs(got[i] - want[i])
                                             : std::numeric_limits<double>::infinity();
    if (err > worst) {
      worst = err;
      worst_at = i;
    }
  }
  std::ostringstream msg;
  msg.precision(9);
  msg << what << ": max |error| " << worst << " at [" << worst_at << "] (got " << got[worst_at]
      << ", want " << want[worst_at] << "), " << worst / scale
      << " of the output's scale max|want| = " << scale << "; tolerance " << tol
      << " relative to that scale";
  // JUMBO_KERNEL_TEST_VERBOSE=1 prints every comparison, to see the margin to the tolerance.
  static const bool verbose = std::getenv("JUMBO_KERNEL_TEST_VERBOSE") != nullptr;
  if (verbose) std::printf("  %s\n", msg.str().c_str());
  if (got.empty() || worst <= tol * scale) return ::testing::AssertionSuccess() << msg.str();
  return ::testing::AssertionFailure() << msg.str();
}

}  // namespace jumbo::test
