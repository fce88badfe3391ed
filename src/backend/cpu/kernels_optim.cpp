// AdamW over ranges of the flat f32 buffers, and the sum of squares behind the global
// gradient norm: each one pass (one OpenMP region) over every range.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels.h"

namespace jumbo::cpu {
namespace {

constexpr int64_t kSumBlock = 4096;  // f32 partial sums over blocks, added in double

float sum_squares_block(const float* p, int64_t n) {
  float part = 0;
#pragma omp simd reduction(+ : part)
  for (int64_t i = 0; i < n; ++i) part += p[i] * p[i];
  return part;
}

}  // namespace

void adamw(Tensor master, Tensor grad, Tensor m, Tensor v, Tensor compute_copy,
           std::span<const AdamWRange> ranges, const AdamWStep& s) {
  expect(master.dtype == DType::f32 && grad.dtype == DType::f32 && m.dtype == DType::f32 &&
             v.dtype == DType::f32 && m.numel() == v.numel(),
         "adamw: f32 buffers, moments of one size");
  for (const AdamWRange& r : ranges) {
    expect(r.count >= 0 && r.master + r.count <= master.numel() && r.local + r.count <= m.numel() &&
               r.flat + r.count <= grad.numel() &&
               (compute_copy.empty() || r.flat + r.count <= compute_copy.numel()),
           "adamw: range inside the buffers");
  }
  expect(compute_copy.empty() || compute_copy.dtype != DType::i32, "adamw: a float compute copy");
  float* p = master.as<float>();
  const float* g = grad.as<float>();
  float* pm = m.as<float>();
  float* pv = v.as<float>();
  const float bc1 = 1.0f - static_cast<float>(std::pow(s.beta1, static_cast<double>(s.step)));
  const float bc2 = 1.0f - static_cast<float>(std::pow(s.beta2, static_cast<double>(s.step)));
  const float step_size = s.lr / bc1;
  const float inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
  // Every thread takes its share of every range: one parallel region for the whole step.
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), threads = omp_get_num_threads();
    for (const AdamWRange& r : ranges) {
      const int64_t lo = r.count * t / threads, hi = r.count * (t + 1) / threads;
      const float decay = s.lr * (r.weight_decay ? s.weight_decay : 0.0f);
      float* rp = p + r.master;
      const float* rg = g + r.flat;
      float* rm = pm + r.local;
      float* rv = pv + r.local;
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) {
        const float gi = rg[i] * s.grad_scale;
        const float mi = s.beta1 * rm[i] + (1.0f - s.beta1) * gi;
        const float vi = s.beta2 * rv[i] + (1.0f - s.beta2) * gi * gi;
        rm[i] = mi;
        rv[i] = vi;
        // Decoupled weight decay (Loshchilov & Hutter), applied to the weight before the step.
        rp[i] -= decay * rp[i] + step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + s.eps);
      }
      if (compute_copy.empty() || hi <= lo) continue;
      dispatch_float(compute_copy.dtype, [&](auto tag) {
        using T = decltype(tag);
        T* c = compute_copy.as<T>() + r.flat;
        for (int64_t i = lo; i < hi; ++i) store(c, i, rp[i]);
      });
    }
  }
}

double sum_squares(Tensor flat, std::span<const FlatSpan> spans, std::vector<double>& partials,
                   std::vector<int64_t>& first_block) {
  expect(flat.dtype == DType::f32, "sum_squares: f32");
  first_block.resize(spans.size() + 1);
  int64_t blocks = 0;
  for (size_t k = 0; k < spans.size(); ++k) {
    expect(spans[k].count >= 0 && spans[k].offset + spans[k].count <= flat.numel(),
           "sum_squares: span inside the tensor");
    first_block[k] = blocks;
    blocks += (spans[k].count + kSumBlock - 1) / kSumBlock;
  }
  first_block[spans.size()] = blocks;
  partials.resize(static_cast<size_t>(blocks));  // grows once: later steps reuse it
  const float* p = flat.as<float>();
  // Every block of every span in one region; block b belongs to the last span starting at or
  // before it.
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const size_t k = static_cast<size_t>(
        std::upper_bound(first_block.begin(), first_block.end() - 1, b) - first_block.begin() - 1);
    const int64_t begin = (b - first_block[k]) * kSumBlock;
    const int64_t n = std::min(kSumBlock, spans[k].count - begin);
    partials[static_cast<size_t>(b)] = sum_squares_block(p + spans[k].offset + begin, n);
  }
  // In order: each span's blocks, then the spans. The result does not depend on the threads.
  double sum = 0;
  for (size_t k = 0; k < spans.size(); ++k) {
    double span_sum = 0;
    for (int64_t b = first_block[k]; b < first_block[k + 1]; ++b) span_sum += partials[static_cast<size_t>(b)];
    sum += span_sum;
  }
  return sum;
}

}  // namespace jumbo::cpu
