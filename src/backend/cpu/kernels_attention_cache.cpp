// Attention over a KV cache: the decode and prefill steps of generation. Each query row
// attends to the cached keys and values of its own sequence (its slot) up to its position;
// one (row, head) pair per OpenMP task, a single pass of dot products over the cache rows,
// which are contiguous per (slot, head). The exponentials are the training kernel's, so a
// cached decode matches the full forward to rounding.
#include <cmath>
#include <vector>

#include "kernels.h"
#include "simd_math.h"

namespace jumbo::cpu {

void attention_kv_cache(Tensor out, Tensor qkv, Tensor k_cache, Tensor v_cache, Tensor rows) {
  expect(qkv.ndim == 2 && k_cache.ndim == 4 && v_cache.ndim == 4 && rows.ndim == 2 &&
             rows.dim(1) == 2 && rows.dtype == DType::i32,
         "attention_kv_cache: qkv [N, H*3*D], caches [slots, H, P, D], rows i32 [N, 2]");
  expect(k_cache.dtype == qkv.dtype && v_cache.dtype == qkv.dtype && out.dtype == qkv.dtype,
         "attention_kv_cache: one compute dtype");
  const int64_t n = qkv.dim(0), slots = k_cache.dim(0), h = k_cache.dim(1), p = k_cache.dim(2),
                d = k_cache.dim(3);
  expect(qkv.dim(1) == h * 3 * d && rows.dim(0) == n && out.numel() == n * h * d &&
             v_cache.numel() == k_cache.numel(),
         "attention_kv_cache: sizes");
  const int32_t* r = rows.as<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    expect(r[2 * i] >= 0 && r[2 * i] < slots && r[2 * i + 1] >= 0 && r[2 * i + 1] < p,
           "attention_kv_cache: row slot or position outside the cache");
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  dispatch_float(qkv.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* pqkv = qkv.as<T>();
    T* kc = k_cache.as<T>();
    T* vc = v_cache.as<T>();
    T* po = out.as<T>();
    auto cache_row = [&](int64_t slot, int64_t head, int64_t pos) {
      return ((slot * h + head) * p + pos) * d;
    };
    // Every row's keys and values first: a prefill's rows attend to each other.
#pragma omp parallel for collapse(2)
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t head = 0; head < h; ++head) {
        const T* src = pqkv + i * h * 3 * d + head * 3 * d;
        const int64_t at = cache_row(r[2 * i], head, r[2 * i + 1]);
        for (int64_t j = 0; j < d; ++j) {
          kc[at + j] = src[d + j];
          vc[at + j] = src[2 * d + j];
        }
      }
    }
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t head = 0; head < h; ++head) {
        static thread_local std::vector<float> q, scores, acc;
        q.resize(static_cast<size_t>(d));
        acc.assign(static_cast<size_t>(d), 0.0f);
        const int64_t slot = r[2 * i], len = r[2 * i + 1] + 1;
        if (scores.size() < static_cast<size_t>(len)) scores.resize(static_cast<size_t>(len));
        const T* src = pqkv + i * h * 3 * d + head * 3 * d;
        for (int64_t j = 0; j < d; ++j) q[j] = load(src, j);
        float mx = -INFINITY;
        for (int64_t t = 0; t < len; ++t) {
          const T* k = kc + cache_row(slot, head, t);
          float dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int64_t j = 0; j < d; ++j) dot += q[j] * load(k, j);
          scores[t] = dot * scale;
          mx = std::fmax(mx, scores[t]);
        }
        float sum = 0;
        for (int64_t t = 0; t < len; ++t) {
          scores[t] = fast_expf(scores[t] - mx);
          sum += scores[t];
        }
        const float inv = 1.0f / sum;
        for (int64_t t = 0; t < len; ++t) {
          const T* v = vc + cache_row(slot, head, t);
          const float w = scores[t] * inv;
#pragma omp simd
          for (int64_t j = 0; j < d; ++j) acc[j] += w * load(v, j);
        }
        T* dst = po + (i * h + head) * d;
        for (int64_t j = 0; j < d; ++j) store(dst, j, acc[j]);
      }
    }
  });
}

}  // namespace jumbo::cpu
