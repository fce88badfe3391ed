// AdamW over flat f32 ranges, and the sum of squares behind the global gradient norm.
#include <cmath>

#include "kernels.h"

namespace jumbo::cpu {

void adamw(Tensor master, Tensor grad, Tensor m, Tensor v, Tensor compute_copy,
           const AdamWStep& s) {
  const int64_t n = master.numel();
  expect(master.dtype == DType::f32 && grad.dtype == DType::f32 && m.dtype == DType::f32 &&
             v.dtype == DType::f32 && grad.numel() == n && m.numel() == n && v.numel() == n,
         "adamw: f32 ranges of one size");
  float* p = master.as<float>();
  const float* g = grad.as<float>();
  float* pm = m.as<float>();
  float* pv = v.as<float>();
  const float bc1 = 1.0f - static_cast<float>(std::pow(s.beta1, static_cast<double>(s.step)));
  const float bc2 = 1.0f - static_cast<float>(std::pow(s.beta2, static_cast<double>(s.step)));
  const float step_size = s.lr / bc1;
  const float inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
  const float decay = s.lr * s.weight_decay;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * s.grad_scale;
    const float mi = s.beta1 * pm[i] + (1.0f - s.beta1) * gi;
    const float vi = s.beta2 * pv[i] + (1.0f - s.beta2) * gi * gi;
    pm[i] = mi;
    pv[i] = vi;
    // Decoupled weight decay (Loshchilov & Hutter), applied to the weight before the step.
    p[i] -= decay * p[i] + step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + s.eps);
  }
  if (!compute_copy.empty()) {
    expect(compute_copy.numel() == n, "adamw: compute copy size");
    copy(compute_copy, master);
  }
}

double sum_squares(Tensor t) {
  expect(t.dtype == DType::f32, "sum_squares: f32");
  const int64_t n = t.numel();
  const float* p = t.as<float>();
  double total = 0;
  // Blocks of f32 partial sums, added in double: fast and accurate to ~1e-7 relative.
#pragma omp parallel for reduction(+ : total) schedule(static)
  for (int64_t b0 = 0; b0 < n; b0 += 4096) {
    const int64_t b1 = b0 + 4096 < n ? b0 + 4096 : n;
    float part = 0;
#pragma omp simd reduction(+ : part)
    for (int64_t i = b0; i < b1; ++i) part += p[i] * p[i];
    total += part;
  }
  return total;
}

}  // namespace jumbo::cpu
