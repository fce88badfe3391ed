// Causal grouped-query attention, and the rotary embedding of its queries and keys. qkv rows
// hold G groups of R query heads, one key head and one value head (backend.h); G = H (R = 1)
// is multi-head attention, and then every sgemm below is today's, in today's order, so GPT's
// results do not change by a bit.
//
// The forward runs one (batch, query head) pair per OpenMP task: it widens the head's q and
// its group's k, v into thread-local f32 buffers and runs single-threaded sgemms (OpenBLAS
// runs one thread inside a parallel region). The backward runs one (batch, group) per task,
// looping over the group's query heads, so the group's dk and dv sums stay in one thread's
// buffers: no race, no atomics, a fixed order. The probabilities are kept for the backward:
// this is the reference path; the CUDA backend's flash attention recomputes them instead.
#include <cblas.h>

#include <cmath>
#include <vector>

#include "kernels.h"
#include "simd_math.h"

namespace jumbo::cpu {
namespace {

struct HeadBuffers {
  std::vector<float> q, k, v, o, dq, dk, dv;
  void resize(size_t n) {
    for (auto* b : {&q, &k, &v, &o, &dq, &dk, &dv}) {
      if (b->size() < n) b->resize(n);
    }
  }
};

HeadBuffers& head_buffers(size_t n) {
  static thread_local HeadBuffers buffers;  // grows on the first step, then reused
  buffers.resize(n);
  return buffers;
}

// b, t, query heads h, kv heads g, query heads per group r = h / g, head size d; a qkv row is
// g * (r + 2) * d wide.
struct Dims {
  int64_t b, t, h, g, r, d;
  int64_t row() const { return g * (r + 2) * d; }
  // Column offsets in a qkv row of query head `head` and of its group's key and value.
  int64_t q_col(int64_t head) const { return (head / r) * (r + 2) * d + (head % r) * d; }
  int64_t k_col(int64_t head) const { return (head / r) * (r + 2) * d + r * d; }
  int64_t v_col(int64_t head) const { return k_col(head) + d; }
};

// The head count comes from probs [B, H, T, T], the kv heads from the caller.
Dims dims_of(Tensor qkv, Tensor probs, int64_t kv_heads) {
  expect(qkv.ndim == 3, "attention: qkv is [B, T, G*(R+2)*D]");
  Dims s{qkv.dim(0), qkv.dim(1), 0, kv_heads, 0, 0};
  expect(probs.ndim == 4 && probs.dim(0) == s.b && probs.dim(2) == s.t && probs.dim(3) == s.t,
         "attention: probs is [B,H,T,T]");
  s.h = probs.dim(1);
  expect(s.g > 0 && s.h % s.g == 0, "attention: kv_heads divides the query heads");
  s.r = s.h / s.g;
  s.d = qkv.dim(2) / (s.g * (s.r + 2));
  expect(s.d > 0 && s.row() == qkv.dim(2), "attention: qkv width is G*(R+2)*D");
  return s;
}

// Copies the D columns at `col` of every row of batch b (rows `row` apart) into f32 [T, D].
template <class T>
void gather(const T* src, int64_t b, int64_t col, const Dims& s, float* dst) {
  for (int64_t t = 0; t < s.t; ++t) {
    const T* base = src + (b * s.t + t) * s.row() + col;
    for (int64_t i = 0; i < s.d; ++i) dst[t * s.d + i] = load(base, i);
  }
}

template <class T>
void scatter(const float* src, int64_t b, int64_t col, const Dims& s, T* dst) {
  for (int64_t t = 0; t < s.t; ++t) {
    T* base = dst + (b * s.t + t) * s.row() + col;
    for (int64_t i = 0; i < s.d; ++i) store(base, i, src[t * s.d + i]);
  }
}

// The first key row t may see: 0 (causal), or t - positions[b*T + t] (packed sequences).
int64_t first_key(const int32_t* positions, int64_t b, int64_t t, int64_t seq) {
  return positions ? t - positions[b * seq + t] : 0;
}

}  // namespace

void attention_fwd(Tensor out, Tensor probs, Tensor qkv, int64_t kv_heads, Tensor positions) {
  expect(probs.dtype == DType::f32 && out.dtype == qkv.dtype, "attention_fwd: dtypes");
  const Dims s = dims_of(qkv, probs, kv_heads);
  expect(positions.empty() || positions.numel() == s.b * s.t, "attention_fwd: positions [B*T]");
  const int32_t* pos = positions.empty() ? nullptr : positions.as<int32_t>();
  expect(out.numel() == s.b * s.t * s.h * s.d, "attention_fwd: out size");
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  dispatch_float(qkv.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* pqkv = qkv.as<T>();
    T* po = out.as<T>();
    // Per query head: a group's k and v are gathered once per head, O(T D) beside the
    // head's O(T^2 D), and H tasks keep the cores busy even with one kv head.
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < s.b; ++b) {
      for (int64_t h = 0; h < s.h; ++h) {
        HeadBuffers& hb = head_buffers(s.t * s.d);
        gather(pqkv, b, s.q_col(h), s, hb.q.data());
        gather(pqkv, b, s.k_col(h), s, hb.k.data());
        gather(pqkv, b, s.v_col(h), s, hb.v.data());
        float* p = probs.as<float>() + (b * s.h + h) * s.t * s.t;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s.t, s.t, s.d, scale, hb.q.data(),
                    s.d, hb.k.data(), s.d, 0.0f, p, s.t);
        for (int64_t t = 0; t < s.t; ++t) {
          float* row = p + t * s.t;
          const int64_t lo = first_key(pos, b, t, s.t);
          float mx = row[lo];
          for (int64_t j = lo + 1; j <= t; ++j) mx = std::fmax(mx, row[j]);
          float sum = 0;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = lo; j <= t; ++j) {
            row[j] = fast_expf(row[j] - mx);
            sum += row[j];
          }
          const float inv = 1.0f / sum;
#pragma omp simd
          for (int64_t j = lo; j <= t; ++j) row[j] *= inv;
          for (int64_t j = 0; j < lo; ++j) row[j] = 0.0f;
          for (int64_t j = t + 1; j < s.t; ++j) row[j] = 0.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s.t, s.d, s.t, 1.0f, p, s.t,
                    hb.v.data(), s.d, 0.0f, hb.o.data(), s.d);
        for (int64_t t = 0; t < s.t; ++t) {
          T* dst = po + ((b * s.t + t) * s.h + h) * s.d;
          for (int64_t i = 0; i < s.d; ++i) store(dst, i, hb.o[t * s.d + i]);
        }
      }
    }
  });
}

void attention_bwd(Tensor dqkv, Tensor dprobs, Tensor dout, Tensor qkv, Tensor probs,
                   int64_t kv_heads, Tensor positions) {
  expect(probs.dtype == DType::f32 && dprobs.dtype == DType::f32, "attention_bwd: probs f32");
  const Dims s = dims_of(qkv, probs, kv_heads);
  expect(positions.empty() || positions.numel() == s.b * s.t, "attention_bwd: positions [B*T]");
  const int32_t* pos = positions.empty() ? nullptr : positions.as<int32_t>();
  expect(dqkv.numel() == qkv.numel() && dout.numel() == s.b * s.t * s.h * s.d &&
             dprobs.numel() == probs.numel(),
         "attention_bwd: sizes");
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  dispatch_float(qkv.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* pqkv = qkv.as<T>();
    const T* pg = dout.as<T>();
    T* pd = dqkv.as<T>();
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < s.b; ++b) {
      for (int64_t g = 0; g < s.g; ++g) {
        HeadBuffers& hb = head_buffers(s.t * s.d);
        const int64_t h0 = g * s.r;
        gather(pqkv, b, s.k_col(h0), s, hb.k.data());
        gather(pqkv, b, s.v_col(h0), s, hb.v.data());
        for (int64_t r = 0; r < s.r; ++r) {
          const int64_t h = h0 + r;
          // The first query head's sgemms write dk and dv (beta 0), the others add: with
          // R = 1 exactly the multi-head kernel's sgemms.
          const float beta = r == 0 ? 0.0f : 1.0f;
          gather(pqkv, b, s.q_col(h), s, hb.q.data());
          float* go = hb.o.data();  // dout of this head, [T, D]
          for (int64_t t = 0; t < s.t; ++t) {
            const T* src = pg + ((b * s.t + t) * s.h + h) * s.d;
            for (int64_t i = 0; i < s.d; ++i) go[t * s.d + i] = load(src, i);
          }
          const float* p = probs.as<float>() + (b * s.h + h) * s.t * s.t;
          float* dp = dprobs.as<float>() + (b * s.h + h) * s.t * s.t;
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s.t, s.t, s.d, 1.0f, go, s.d,
                      hb.v.data(), s.d, 0.0f, dp, s.t);
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, s.t, s.d, s.t, 1.0f, p, s.t, go,
                      s.d, beta, hb.dv.data(), s.d);
          // Softmax backward: dS = P * (dP - rowsum(P * dP)); zero above the diagonal.
          for (int64_t t = 0; t < s.t; ++t) {
            const float* pr = p + t * s.t;
            float* dr = dp + t * s.t;
            const int64_t lo = first_key(pos, b, t, s.t);
            float dot = 0;
#pragma omp simd reduction(+ : dot)
            for (int64_t j = lo; j <= t; ++j) dot += pr[j] * dr[j];
#pragma omp simd
            for (int64_t j = lo; j <= t; ++j) dr[j] = pr[j] * (dr[j] - dot);
            for (int64_t j = 0; j < lo; ++j) dr[j] = 0.0f;
            for (int64_t j = t + 1; j < s.t; ++j) dr[j] = 0.0f;
          }
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s.t, s.d, s.t, scale, dp, s.t,
                      hb.k.data(), s.d, 0.0f, hb.dq.data(), s.d);
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, s.t, s.d, s.t, scale, dp, s.t,
                      hb.q.data(), s.d, beta, hb.dk.data(), s.d);
          scatter(hb.dq.data(), b, s.q_col(h), s, pd);
        }
        scatter(hb.dk.data(), b, s.k_col(h0), s, pd);
        scatter(hb.dv.data(), b, s.v_col(h0), s, pd);
      }
    }
  });
}

void rope(Tensor qkv, Tensor table, Tensor positions, int64_t kv_heads, RopeDirection direction) {
  expect(table.dtype == DType::f32 && table.ndim == 2 && positions.dtype == DType::i32,
         "rope: table f32 [P, D], positions i32");
  const int64_t p_rows = table.dim(0), d = table.dim(1), half = d / 2;
  const int64_t w = qkv.ndim > 0 ? qkv.dim(-1) : 0, n = w > 0 ? qkv.numel() / w : 0;
  expect(d > 0 && d % 2 == 0 && kv_heads > 0 && w % (kv_heads * d) == 0 &&
             w / (kv_heads * d) >= 3,
         "rope: qkv width is G*(R+2)*D with D = the table's even width");
  // Positions: one per row, or (slot, position) pairs whose second column counts.
  const int64_t stride = positions.numel() == n ? 1 : 2;
  expect(positions.numel() == n * stride, "rope: positions i32 [N] or [N, 2]");
  const int32_t* pos = positions.as<int32_t>() + (stride - 1);
  for (int64_t i = 0; i < n; ++i) {
    expect(pos[i * stride] >= 0 && pos[i * stride] < p_rows, "rope: position outside the table");
  }
  const int64_t per_group = w / (kv_heads * d);  // R + 2 heads; all but the last (v) turn
  const float sign = direction == RopeDirection::forward ? 1.0f : -1.0f;
  const float* tab = table.as<float>();
  dispatch_float(qkv.dtype, [&](auto tag) {
    using T = decltype(tag);
    T* px = qkv.as<T>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float* cs = tab + pos[i * stride] * d;
      const float* sn = cs + half;
      for (int64_t g = 0; g < kv_heads; ++g) {
        for (int64_t head = 0; head + 1 < per_group; ++head) {
          T* x = px + i * w + (g * per_group + head) * d;
#pragma omp simd
          for (int64_t j = 0; j < half; ++j) {
            const float x1 = load(x, j), x2 = load(x, j + half), c = cs[j], s = sign * sn[j];
            store(x, j, x1 * c - x2 * s);
            store(x, j + half, x2 * c + x1 * s);
          }
        }
      }
    }
  });
}

}  // namespace jumbo::cpu
