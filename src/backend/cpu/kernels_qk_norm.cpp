// qk-norm: RMSNorm over each query and key head of the grouped qkv rows (backend.h). Each
// head is a contiguous D-vector; rows run in parallel, and the weights' gradients are summed
// by threads that own columns, each over the rows in order (deterministic).
#include <algorithm>
#include <cmath>
#include <tuple>

#include "kernels.h"

namespace jumbo::cpu {
namespace {

struct Heads {
  int64_t rows, groups, per_group, d, width;  // per_group: R query heads
  // The normed heads of a row: R query heads then a key head per group. Head j of the rstd
  // row (query heads in order, then key heads) sits at this column of the qkv row.
  int64_t column(int64_t j) const {
    const int64_t q = groups * per_group;
    return j < q ? (j / per_group) * (per_group + 2) * d + (j % per_group) * d
                 : (j - q) * (per_group + 2) * d + per_group * d;
  }
  int64_t normed() const { return groups * (per_group + 1); }
};

Heads heads_of(Tensor qkv, Tensor weight, int64_t kv_heads, const char* what) {
  Heads h{};
  h.d = weight.numel();
  h.width = qkv.dim(-1);
  h.rows = h.width > 0 ? qkv.numel() / h.width : 0;
  h.groups = kv_heads;
  expect(kv_heads > 0 && h.d > 0 && h.width % (kv_heads * h.d) == 0 &&
             h.width / (kv_heads * h.d) >= 3,
         what);
  h.per_group = h.width / (kv_heads * h.d) - 2;
  return h;
}

}  // namespace

void qk_norm_fwd(Tensor out, Tensor rstd, Tensor qkv, Tensor q_weight, Tensor k_weight,
                 int64_t kv_heads, float eps) {
  const Heads h = heads_of(qkv, q_weight, kv_heads, "qk_norm_fwd: qkv [N, G (R + 2) D], weights [D]");
  expect(out.dtype == qkv.dtype && out.numel() == qkv.numel() && q_weight.dtype == qkv.dtype &&
             k_weight.dtype == qkv.dtype && k_weight.numel() == h.d && rstd.dtype == DType::f32 &&
             rstd.numel() == h.rows * h.normed(),
         "qk_norm_fwd: out like qkv, rstd f32 [N, H + G]");
  if (out.data != qkv.data) copy(out, qkv);  // the value heads
  const int64_t d = h.d, q_heads = h.groups * h.per_group;
  dispatch_float(qkv.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* px = qkv.as<T>();
    T* po = out.as<T>();
    float* pr = rstd.as<float>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < h.rows; ++r) {
      for (int64_t j = 0; j < h.normed(); ++j) {
        const T* w = (j < q_heads ? q_weight : k_weight).template as<T>();
        const T* x = px + r * h.width + h.column(j);
        float ss = 0;
        for (int64_t i = 0; i < d; ++i) ss += load(x, i) * load(x, i);
        const float s = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
        T* o = po + r * h.width + h.column(j);
        for (int64_t i = 0; i < d; ++i) store(o, i, load(x, i) * s * load(w, i));
        pr[r * h.normed() + j] = s;
      }
    }
  });
}

void qk_norm_bwd(Tensor dqkv, Tensor dq_weight, Tensor dk_weight, Tensor dout, Tensor qkv,
                 Tensor q_weight, Tensor k_weight, Tensor rstd, int64_t kv_heads) {
  const Heads h = heads_of(qkv, q_weight, kv_heads, "qk_norm_bwd: qkv [N, G (R + 2) D], weights [D]");
  expect(dqkv.dtype == qkv.dtype && dout.dtype == qkv.dtype && dqkv.numel() == qkv.numel() &&
             dout.numel() == qkv.numel() && rstd.numel() == h.rows * h.normed() &&
             (dq_weight.empty() || (dq_weight.dtype == DType::f32 && dq_weight.numel() == h.d)) &&
             (dk_weight.empty() || (dk_weight.dtype == DType::f32 && dk_weight.numel() == h.d)),
         "qk_norm_bwd: dqkv and dout like qkv, dweights f32 [D] or empty, rstd f32 [N, H + G]");
  const int64_t d = h.d, q_heads = h.groups * h.per_group;
  const float* pr = rstd.as<float>();
  dispatch_float(qkv.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* px = qkv.as<T>();
    const T* pg = dout.as<T>();
    T* pdx = dqkv.as<T>();
    // The weights' gradients first: dout may be overwritten below (in place).
    for (auto [dw, first, last] : {std::tuple{dq_weight, int64_t{0}, q_heads},
                                   std::tuple{dk_weight, q_heads, h.normed()}}) {
      if (dw.empty()) continue;
      float* pdw = dw.template as<float>();
#pragma omp parallel for schedule(static)
      for (int64_t c0 = 0; c0 < d; c0 += 16) {
        const int64_t c1 = std::min(d, c0 + 16);
        for (int64_t r = 0; r < h.rows; ++r) {
          for (int64_t j = first; j < last; ++j) {
            const T* x = px + r * h.width + h.column(j);
            const T* g = pg + r * h.width + h.column(j);
            const float s = pr[r * h.normed() + j];
            for (int64_t i = c0; i < c1; ++i) pdw[i] += load(x, i) * s * load(g, i);
          }
        }
      }
    }
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < h.rows; ++r) {
      if (pdx != pg) {  // the value heads' gradients pass through
        for (int64_t g = 0; g < h.groups; ++g) {
          const int64_t v = r * h.width + g * (h.per_group + 2) * d + (h.per_group + 1) * d;
          for (int64_t i = 0; i < d; ++i) store(pdx + v, i, load(pg + v, i));
        }
      }
      for (int64_t j = 0; j < h.normed(); ++j) {
        const T* w = (j < q_heads ? q_weight : k_weight).template as<T>();
        const int64_t at = r * h.width + h.column(j);
        const T* x = px + at;
        const float s = pr[r * h.normed() + j];
        // dx = s (dnorm - norm mean(dnorm norm)), dnorm = dout w, norm = x s.
        float mean = 0;
        for (int64_t i = 0; i < d; ++i) mean += load(w, i) * load(pg + at, i) * load(x, i) * s;
        mean /= static_cast<float>(d);
        for (int64_t i = 0; i < d; ++i) {
          const float dnorm = load(w, i) * load(pg + at, i);
          store(pdx + at, i, (dnorm - load(x, i) * s * mean) * s);
        }
      }
    }
  });
}

}  // namespace jumbo::cpu
