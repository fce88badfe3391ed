// Causal multi-head attention, one (batch, head) pair per OpenMP task. Each task widens its
// head's q, k, v into thread-local f32 buffers and runs single-threaded sgemms (OpenBLAS runs
// one thread inside a parallel region). The probabilities are kept for the backward pass:
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

struct Dims {
  int64_t b, t, h, d;
};

// qkv is [B, T, H*3*D]; the head count comes from probs [B, H, T, T].
Dims qkv_dims(Tensor qkv) {
  expect(qkv.ndim == 3, "attention: qkv is [B, T, H*3*D]");
  return {qkv.dim(0), qkv.dim(1), 0, 0};
}

// Copies one head's q, k, v (rows strided by H*3*D) into contiguous f32 [T, D] buffers.
template <class T>
void gather_head(const T* qkv, int64_t b, int64_t h, const Dims& s, float* q, float* k, float* v) {
  const int64_t row = s.h * 3 * s.d;
  for (int64_t t = 0; t < s.t; ++t) {
    const T* base = qkv + (b * s.t + t) * row + h * 3 * s.d;
    for (int64_t i = 0; i < s.d; ++i) {
      q[t * s.d + i] = load(base, i);
      k[t * s.d + i] = load(base, s.d + i);
      v[t * s.d + i] = load(base, 2 * s.d + i);
    }
  }
}

Dims dims_of(Tensor qkv, Tensor probs) {
  Dims s = qkv_dims(qkv);
  expect(probs.ndim == 4 && probs.dim(0) == s.b && probs.dim(2) == s.t && probs.dim(3) == s.t,
         "attention: probs is [B,H,T,T]");
  s.h = probs.dim(1);
  s.d = qkv.numel() / (s.b * s.t * s.h * 3);
  expect(s.b * s.t * s.h * 3 * s.d == qkv.numel(), "attention: qkv size");
  return s;
}

}  // namespace

// The first key row t may see: 0 (causal), or t - positions[b*T + t] (packed sequences).
static int64_t first_key(const int32_t* positions, int64_t b, int64_t t, int64_t seq) {
  return positions ? t - positions[b * seq + t] : 0;
}

void attention_fwd(Tensor out, Tensor probs, Tensor qkv, Tensor positions) {
  expect(probs.dtype == DType::f32 && out.dtype == qkv.dtype, "attention_fwd: dtypes");
  const Dims s = dims_of(qkv, probs);
  expect(positions.empty() || positions.numel() == s.b * s.t, "attention_fwd: positions [B*T]");
  const int32_t* pos = positions.empty() ? nullptr : positions.as<int32_t>();
  expect(out.numel() == s.b * s.t * s.h * s.d, "attention_fwd: out size");
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  dispatch_float(qkv.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* pqkv = qkv.as<T>();
    T* po = out.as<T>();
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < s.b; ++b) {
      for (int64_t h = 0; h < s.h; ++h) {
        HeadBuffers& hb = head_buffers(s.t * s.d);
        gather_head(pqkv, b, h, s, hb.q.data(), hb.k.data(), hb.v.data());
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
                   Tensor positions) {
  expect(probs.dtype == DType::f32 && dprobs.dtype == DType::f32, "attention_bwd: probs f32");
  const Dims s = dims_of(qkv, probs);
  expect(positions.empty() || positions.numel() == s.b * s.t, "attention_bwd: positions [B*T]");
  const int32_t* pos = positions.empty() ? nullptr : positions.as<int32_t>();
  expect(dqkv.numel() == qkv.numel() && dout.numel() == s.b * s.t * s.h * s.d,
         "attention_bwd: sizes");
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  dispatch_float(qkv.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* pqkv = qkv.as<T>();
    const T* pg = dout.as<T>();
    T* pd = dqkv.as<T>();
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < s.b; ++b) {
      for (int64_t h = 0; h < s.h; ++h) {
        HeadBuffers& hb = head_buffers(s.t * s.d);
        gather_head(pqkv, b, h, s, hb.q.data(), hb.k.data(), hb.v.data());
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
                    s.d, 0.0f, hb.dv.data(), s.d);
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
                    hb.q.data(), s.d, 0.0f, hb.dk.data(), s.d);
        const int64_t row = s.h * 3 * s.d;
        for (int64_t t = 0; t < s.t; ++t) {
          T* base = pd + (b * s.t + t) * row + h * 3 * s.d;
          for (int64_t i = 0; i < s.d; ++i) {
            store(base, i, hb.dq[t * s.d + i]);
            store(base, s.d + i, hb.dk[t * s.d + i]);
            store(base, 2 * s.d + i, hb.dv[t * s.d + i]);
          }
        }
      }
    }
  });
}

}  // namespace jumbo::cpu
