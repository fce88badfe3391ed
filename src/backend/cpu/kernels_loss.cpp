// Cross-entropy from parts, so the vocabulary can be split over tensor-parallel ranks: each
// rank reduces its logits slice to (max, sum of exp, target logit) per token; the model
// all-reduces those, and the full logits never exist on one rank.
#include <cmath>

#include "kernels.h"
#include "simd_math.h"

namespace jumbo::cpu {

namespace {
int64_t rows_of(Tensor logits) { return logits.numel() / logits.dim(-1); }
}  // namespace

void ce_local_max(Tensor max, Tensor logits) {
  expect(max.dtype == DType::f32 && max.numel() == rows_of(logits), "ce_local_max: max [N] f32");
  const int64_t n = rows_of(logits), v = logits.dim(-1);
  float* pm = max.as<float>();
  dispatch_float(logits.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* pl = logits.as<T>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; ++r) {
      const T* row = pl + r * v;
      float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
      for (int64_t i = 0; i < v; ++i) {
        const float x = load(row, i);
        mx = x > mx ? x : mx;
      }
      pm[r] = mx;
    }
  });
}

void ce_local_sumexp(Tensor sumexp, Tensor logits, Tensor max) {
  expect(sumexp.dtype == DType::f32 && sumexp.numel() == rows_of(logits), "ce_local_sumexp");
  const int64_t n = rows_of(logits), v = logits.dim(-1);
  float* ps = sumexp.as<float>();
  const float* pm = max.as<float>();
  dispatch_float(logits.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* pl = logits.as<T>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; ++r) {
      const T* row = pl + r * v;
      const float mx = pm[r];
      float sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t i = 0; i < v; ++i) sum += fast_expf(load(row, i) - mx);
      ps[r] = sum;
    }
  });
}

void ce_target_logit(Tensor target_logit, Tensor logits, Tensor targets, int64_t vocab_start) {
  expect(targets.dtype == DType::i32 && target_logit.dtype == DType::f32, "ce_target_logit");
  const int64_t n = rows_of(logits), v = logits.dim(-1);
  expect(targets.numel() == n && target_logit.numel() == n, "ce_target_logit: sizes");
  const int32_t* tg = targets.as<int32_t>();
  float* pt = target_logit.as<float>();
  dispatch_float(logits.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* pl = logits.as<T>();
    for (int64_t r = 0; r < n; ++r) {
      const int64_t col = static_cast<int64_t>(tg[r]) - vocab_start;
      pt[r] = (col >= 0 && col < v) ? load(pl + r * v, col) : 0.0f;
    }
  });
}

void ce_loss(Tensor losses, Tensor max, Tensor sumexp, Tensor target_logit, Tensor targets) {
  const int64_t n = losses.numel();
  const int32_t* tg = targets.empty() ? nullptr : targets.as<int32_t>();
  float* pl = losses.as<float>();
  const float* pm = max.as<float>();
  const float* ps = sumexp.as<float>();
  const float* pt = target_logit.as<float>();
  for (int64_t r = 0; r < n; ++r) pl[r] = tg && tg[r] < 0 ? 0.0f : std::log(ps[r]) + pm[r] - pt[r];
}

void ce_bwd(Tensor dlogits, Tensor logits, Tensor max, Tensor sumexp, Tensor targets,
            int64_t vocab_start, float scale) {
  const int64_t n = rows_of(logits), v = logits.dim(-1);
  expect(dlogits.numel() == logits.numel() && dlogits.dtype == logits.dtype, "ce_bwd: shapes");
  const int32_t* tg = targets.as<int32_t>();
  const float* pm = max.as<float>();
  const float* ps = sumexp.as<float>();
  dispatch_float(logits.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* pl = logits.as<T>();
    T* pd = dlogits.as<T>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; ++r) {
      const T* row = pl + r * v;
      T* drow = pd + r * v;
      const float mx = pm[r];
      if (tg[r] < 0) {  // not in the loss
        for (int64_t i = 0; i < v; ++i) store(drow, i, 0.0f);
        continue;
      }
      const float inv = scale / ps[r];
#pragma omp simd
      for (int64_t i = 0; i < v; ++i) store(drow, i, fast_expf(load(row, i) - mx) * inv);
      const int64_t col = static_cast<int64_t>(tg[r]) - vocab_start;
      if (col >= 0 && col < v) store(drow, col, load(drow, col) - scale);
    }
  });
}

}  // namespace jumbo::cpu
