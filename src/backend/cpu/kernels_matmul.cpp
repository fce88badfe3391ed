// Linear layers through OpenBLAS sgemm (row-major, weight [out, in] as in PyTorch).
// bf16 operands are widened into grow-once f32 scratch first: no Debian BLAS has bf16 GEMM.
#include <cblas.h>

#include <algorithm>

#include "kernels.h"
#include "simd_math.h"

namespace jumbo::cpu {

float* Scratch::get(int slot, size_t count) {
  if (slots_.size() <= static_cast<size_t>(slot)) slots_.resize(slot + 1);
  auto& v = slots_[slot];
  if (v.size() < count) v.resize(count);
  return v.data();
}

namespace {

// An f32 pointer to t's data: t itself when f32, else a widened copy in scratch slot `slot`.
const float* as_f32(Scratch& s, int slot, Tensor t) {
  if (t.dtype == DType::f32) return t.as<float>();
  float* dst = s.get(slot, t.numel());
  copy(Tensor(dst, DType::f32, {t.numel()}), t);
  return dst;
}

// Decode steps multiply a few rows by every weight: memory-bound, where sgemm would pack the
// whole weight matrix (and, in bf16, widen it) on every call. Here each weight row is read
// once, in its own dtype, and dotted with every input row (held in cache as f32).
constexpr int64_t kFewRows = 16;
// Up to kRowsKernelRows (kernels.h: a prefill chunk) linear_fwd_rows, which reads the weights
// in place, is faster than sgemm, which packs the whole weight matrix per call; training's
// usual N (micro batch x sequence) is beyond it.

// Several input rows per pass over a weight row: independent accumulators hide the FMA
// latency, and each weight element loaded feeds one FMA per row. (Written out: GCC does not
// vectorise an array reduction as well.)
template <class W>
void dot8(const W* row, const float* x, int64_t k, float* acc) {
  float d0 = 0, d1 = 0, d2 = 0, d3 = 0, d4 = 0, d5 = 0, d6 = 0, d7 = 0;
#pragma omp simd reduction(+ : d0, d1, d2, d3, d4, d5, d6, d7)
  for (int64_t i = 0; i < k; ++i) {
    const float w = load(row, i);
    d0 += x[i] * w;
    d1 += x[k + i] * w;
    d2 += x[2 * k + i] * w;
    d3 += x[3 * k + i] * w;
    d4 += x[4 * k + i] * w;
    d5 += x[5 * k + i] * w;
    d6 += x[6 * k + i] * w;
    d7 += x[7 * k + i] * w;
  }
  acc[0] = d0, acc[1] = d1, acc[2] = d2, acc[3] = d3;
  acc[4] = d4, acc[5] = d5, acc[6] = d6, acc[7] = d7;
}

template <class W>
void dot4(const W* row, const float* x, int64_t k, float* acc) {
  float d0 = 0, d1 = 0, d2 = 0, d3 = 0;
#pragma omp simd reduction(+ : d0, d1, d2, d3)
  for (int64_t i = 0; i < k; ++i) {
    const float w = load(row, i);
    d0 += x[i] * w;
    d1 += x[k + i] * w;
    d2 += x[2 * k + i] * w;
    d3 += x[3 * k + i] * w;
  }
  acc[0] = d0, acc[1] = d1, acc[2] = d2, acc[3] = d3;
}

template <class W>
void dot1(const W* row, const float* x, int64_t k, float* acc) {
  float d = 0;
#pragma omp simd reduction(+ : d)
  for (int64_t i = 0; i < k; ++i) d += x[i] * load(row, i);
  acc[0] = d;
}

template <class W, class O>
void few_rows_linear(O* out, const float* in, const W* w, const float* bias, int64_t n,
                     int64_t o, int64_t k) {
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < o; ++j) {
    const W* row = w + j * k;
    float acc[kFewRows];
    int64_t r = 0;
    for (; r + 8 <= n; r += 8) dot8(row, in + r * k, k, acc + r);
    for (; r + 4 <= n; r += 4) dot4(row, in + r * k, k, acc + r);
    for (; r < n; ++r) dot1(row, in + r * k, k, acc + r);
    const float b = bias ? bias[j] : 0.0f;
    for (r = 0; r < n; ++r) store(out + r * o, j, acc[r] + b);
  }
}

}  // namespace

void linear_fwd(Scratch& s, Tensor out, Tensor in, Tensor w, Tensor bias) {
  const int64_t o = w.dim(0), k = w.dim(1);
  const int64_t n = in.numel() / k;
  expect(in.numel() == n * k && out.numel() == n * o, "linear_fwd: shapes");
  if (n <= kFewRows) {
    expect(bias.empty() || bias.numel() == o, "linear_fwd: bias shape");
    const float* pin = as_f32(s, 0, in);
    const float* pb = bias.empty() ? nullptr : as_f32(s, 3, bias);
    dispatch_float(w.dtype, [&](auto wt) {
      dispatch_float(out.dtype, [&](auto ot) {
        few_rows_linear(out.as<decltype(ot)>(), pin, w.as<decltype(wt)>(), pb, n, o, k);
      });
    });
    return;
  }
  const float* pin = as_f32(s, 0, in);
  if (n <= kRowsKernelRows) {
    expect(bias.empty() || bias.numel() == o, "linear_fwd: bias shape");
    if (linear_fwd_rows(s, out, pin, w, bias.empty() ? nullptr : as_f32(s, 3, bias))) return;
  }
  const float* pw = as_f32(s, 1, w);
  float* pout = out.dtype == DType::f32 ? out.as<float>() : s.get(2, out.numel());
  float beta = 0.0f;
  if (!bias.empty()) {
    expect(bias.numel() == o, "linear_fwd: bias shape");
    const float* pb = as_f32(s, 3, bias);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; ++r) std::copy(pb, pb + o, pout + r * o);
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, o, k, 1.0f, pin, k, pw, k, beta, pout, o);
  if (out.dtype != DType::f32) copy(out, Tensor(pout, DType::f32, {out.numel()}));
}

void linear_bwd(Scratch& s, Tensor din, Tensor dw, Tensor dbias, Tensor dout, Tensor in, Tensor w) {
  const int64_t o = w.dim(0), k = w.dim(1);
  const int64_t n = in.numel() / k;
  expect(dout.numel() == n * o && (dw.empty() || (dw.dtype == DType::f32 && dw.numel() == o * k)),
         "linear_bwd: shapes/dtypes");
  const float* pg = as_f32(s, 0, dout);
  const float* pin = as_f32(s, 1, in);
  if (!din.empty()) {
    expect(din.numel() == n * k, "linear_bwd: din shape");
    const float* pw = as_f32(s, 2, w);
    if (din.dtype == DType::f32) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, k, o, 1.0f, pg, o, pw, k, 0.0f,
                  din.as<float>(), k);
    } else {
      float* tmp = s.get(3, din.numel());
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, k, o, 1.0f, pg, o, pw, k, 0.0f,
                  tmp, k);
      copy(din, Tensor(tmp, DType::f32, {din.numel()}));
    }
  }
  // Weight gradient accumulates straight into the f32 main grad (none for a frozen weight).
  if (!dw.empty()) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o, k, n, 1.0f, pg, o, pin, k, 1.0f,
                dw.as<float>(), k);
  }
  if (!dbias.empty()) {
    expect(dbias.dtype == DType::f32 && dbias.numel() == o, "linear_bwd: dbias");
    float* pdb = dbias.as<float>();
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < o; c0 += 64) {
      const int64_t c1 = std::min(o, c0 + 64);
      for (int64_t r = 0; r < n; ++r) {
        const float* g = pg + r * o;
#pragma omp simd
        for (int64_t i = c0; i < c1; ++i) pdb[i] += g[i];
      }
    }
  }
}

}  // namespace jumbo::cpu

namespace jumbo {

int64_t cpu_linear_scratch_bytes(int64_t rows, int64_t k) {
  if (rows <= cpu::kFewRows || rows > cpu::kRowsKernelRows) return 0;  // no panels kept
  return 4 * cpu::linear_rows_panel_floats(rows, k);
}

}  // namespace jumbo
