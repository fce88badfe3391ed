// Elementwise, embedding and normalisation kernels: memory-bound loops, OpenMP across rows or
// elements, SIMD within.
#include <algorithm>
#include <cmath>

#include "kernels.h"
#include "simd_math.h"

namespace jumbo::cpu {

void fill(Tensor t, float value) {
  const int64_t n = t.numel();
  if (t.dtype == DType::i32) {
    int32_t* p = t.as<int32_t>();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(value);
    return;
  }
  dispatch_float(t.dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = t.as<T>();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) store(p, i, value);
  });
}

void fill_columns(Tensor t, int64_t first_col, float value) {
  const int64_t cols = t.dim(-1), rows = t.numel() / cols;
  if (first_col >= cols) return;
  dispatch_float(t.dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = t.as<T>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = first_col; c < cols; ++c) store(p + r * cols, c, value);
    }
  });
}

void copy(Tensor dst, Tensor src) {
  expect(dst.numel() == src.numel(), "copy: element counts differ");
  const int64_t n = dst.numel();
  if (dst.dtype == DType::i32 || src.dtype == DType::i32) {
    expect(dst.dtype == src.dtype, "copy: i32 converts to nothing");
    const int32_t* s = src.as<int32_t>();
    int32_t* d = dst.as<int32_t>();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) d[i] = s[i];
    return;
  }
  dispatch_float(dst.dtype, [&](auto dtag) {
    using D = decltype(dtag);
    dispatch_float(src.dtype, [&](auto stag) {
      using S = decltype(stag);
      const S* s = src.as<S>();
      D* d = dst.as<D>();
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) store(d, i, load(s, i));
    });
  });
}

namespace {
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
}

void scale(Tensor t, float factor) {
  dispatch_float(t.dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = t.as<T>();
    const int64_t n = t.numel();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) store(p, i, load(p, i) * factor);
  });
}

void dropout(Tensor out, Tensor in, const DropoutMask& m) {
  expect(out.numel() == in.numel() && out.dtype == in.dtype && in.ndim >= 1 && m.p >= 0 &&
             m.p < 1,
         "dropout: shapes/dtypes, or p outside [0, 1)");
  const int64_t cols = in.dim(-1), rows = cols > 0 ? in.numel() / cols : 0;
  const int64_t total = m.cols_total > 0 ? m.cols_total : cols;
  const float keep_scale = 1.0f / (1.0f - m.p);
  dispatch_float(in.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* s = in.as<T>();
    T* d = out.as<T>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t i = r * cols + c;
        const auto logical = static_cast<uint64_t>(r * total + m.col_offset + c);
        store(d, i, dropout_keeps(m.seed, logical, m.p) ? load(s, i) * keep_scale : 0.0f);
      }
    }
  });
}

void gelu_fwd(Tensor out, Tensor in) {
  expect(out.numel() == in.numel() && out.dtype == in.dtype, "gelu_fwd: shapes/dtypes");
  const int64_t n = in.numel();
  dispatch_float(in.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = in.as<T>();
    T* y = out.as<T>();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float v = load(x, i);
      const float u = kGeluC * (v + 0.044715f * v * v * v);
      store(y, i, 0.5f * v * (1.0f + fast_tanhf(u)));
    }
  });
}

void gelu_bwd(Tensor din, Tensor dout, Tensor in) {
  expect(din.numel() == in.numel() && dout.numel() == in.numel(), "gelu_bwd: shapes");
  const int64_t n = in.numel();
  dispatch_float(in.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = in.as<T>();
    const T* g = dout.as<T>();
    T* dx = din.as<T>();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float v = load(x, i);
      const float u = kGeluC * (v + 0.044715f * v * v * v);
      const float th = fast_tanhf(u);
      const float sech2 = 1.0f - th * th;
      const float d = 0.5f * (1.0f + th) + 0.5f * v * sech2 * kGeluC * (1.0f + 3.0f * 0.044715f * v * v);
      store(dx, i, load(g, i) * d);
    }
  });
}

// silu(g) = g sigmoid(g); fast_expf keeps the loops vectorised (its clamp of |g| at ~87
// moves sigmoid by under 1e-37 there).
void swiglu_fwd(Tensor out, Tensor gate_up) {
  const int64_t f = out.ndim > 0 ? out.dim(-1) : 0, rows = f > 0 ? out.numel() / f : 0;
  expect(out.dtype == gate_up.dtype && gate_up.dim(-1) == 2 * f &&
             gate_up.numel() == 2 * out.numel(),
         "swiglu_fwd: out [N, F], gate_up [N, 2F], one dtype");
  dispatch_float(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* pgu = gate_up.as<T>();
    T* po = out.as<T>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const T* gate = pgu + r * 2 * f;
      const T* up = gate + f;
      T* o = po + r * f;
#pragma omp simd
      for (int64_t i = 0; i < f; ++i) {
        const float x = load(gate, i);
        store(o, i, x / (1.0f + fast_expf(-x)) * load(up, i));
      }
    }
  });
}

void swiglu_bwd(Tensor dgate_up, Tensor dout, Tensor gate_up) {
  const int64_t f = dout.ndim > 0 ? dout.dim(-1) : 0, rows = f > 0 ? dout.numel() / f : 0;
  expect(dout.dtype == gate_up.dtype && dgate_up.dtype == gate_up.dtype &&
             gate_up.dim(-1) == 2 * f && gate_up.numel() == 2 * dout.numel() &&
             dgate_up.numel() == gate_up.numel(),
         "swiglu_bwd: dout [N, F], gate_up and dgate_up [N, 2F], one dtype");
  dispatch_float(dout.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* pgu = gate_up.as<T>();
    const T* pg = dout.as<T>();
    T* pd = dgate_up.as<T>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const T* gate = pgu + r * 2 * f;
      const T* up = gate + f;
      const T* g = pg + r * f;
      T* dgate = pd + r * 2 * f;
      T* dup = dgate + f;
#pragma omp simd
      for (int64_t i = 0; i < f; ++i) {
        const float x = load(gate, i), u = load(up, i), dy = load(g, i);
        const float sig = 1.0f / (1.0f + fast_expf(-x));
        // d silu / dx = sig (1 + x (1 - sig))
        store(dgate, i, dy * u * sig * (1.0f + x * (1.0f - sig)));
        store(dup, i, dy * x * sig);
      }
    }
  });
}

void add(Tensor out, Tensor a, Tensor b) {
  expect(out.numel() == a.numel() && a.numel() == b.numel(), "add: shapes");
  expect(out.dtype == a.dtype && a.dtype == b.dtype, "add: dtypes");
  const int64_t n = out.numel();
  dispatch_float(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* pa = a.as<T>();
    const T* pb = b.as<T>();
    T* po = out.as<T>();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) store(po, i, load(pa, i) + load(pb, i));
  });
}

void token_embedding_fwd(Tensor out, Tensor tokens, Tensor wte, int64_t vocab_start) {
  expect(tokens.dtype == DType::i32 && out.dtype == wte.dtype, "token_embedding_fwd: dtypes");
  const int64_t n_tok = tokens.numel();
  const int64_t c = wte.dim(-1);
  const int64_t rows = wte.dim(0);
  expect(out.numel() == n_tok * c, "token_embedding_fwd: out shape");
  const int32_t* tok = tokens.as<int32_t>();
  dispatch_float(wte.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* w = wte.as<T>();
    T* o = out.as<T>();
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < n_tok; ++n) {
      const int64_t row = static_cast<int64_t>(tok[n]) - vocab_start;
      T* dst = o + n * c;
      if (row >= 0 && row < rows) {
        const T* src = w + row * c;
        for (int64_t i = 0; i < c; ++i) dst[i] = src[i];
      } else {
        for (int64_t i = 0; i < c; ++i) store(dst, i, 0.0f);
      }
    }
  });
}

void token_embedding_bwd(Tensor dwte, Tensor dout, Tensor tokens, int64_t vocab_start) {
  expect(dwte.dtype == DType::f32 && tokens.dtype == DType::i32, "token_embedding_bwd: dtypes");
  const int64_t n_tok = tokens.numel();
  const int64_t c = dwte.dim(-1);
  const int64_t rows = dwte.dim(0);
  const int32_t* tok = tokens.as<int32_t>();
  float* dw = dwte.as<float>();
  dispatch_float(dout.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* g = dout.as<T>();
    // Threads own disjoint column blocks, so repeated tokens never race.
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < c; c0 += 64) {
      const int64_t c1 = std::min(c, c0 + 64);
      for (int64_t n = 0; n < n_tok; ++n) {
        const int64_t row = static_cast<int64_t>(tok[n]) - vocab_start;
        if (row < 0 || row >= rows) continue;
        float* d = dw + row * c;
        const T* s = g + n * c;
#pragma omp simd
        for (int64_t i = c0; i < c1; ++i) d[i] += load(s, i);
      }
    }
  });
}

void position_embedding_fwd(Tensor out, Tensor wpe, Tensor positions) {
  expect(out.ndim == 3 && out.dtype == wpe.dtype, "position_embedding_fwd: out [B,T,C]");
  const int64_t b = out.dim(0), t = out.dim(1), c = out.dim(2);
  expect((positions.empty() ? t <= wpe.dim(0) : positions.numel() == b * t) && c == wpe.dim(1),
         "position_embedding_fwd: wpe shape, positions [B*T]");
  const int32_t* pos = positions.empty() ? nullptr : positions.as<int32_t>();
  dispatch_float(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* w = wpe.as<T>();
    T* o = out.as<T>();
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t bi = 0; bi < b; ++bi) {
      for (int64_t ti = 0; ti < t; ++ti) {
        T* dst = o + (bi * t + ti) * c;
        const T* src = w + (pos ? pos[bi * t + ti] : ti) * c;
#pragma omp simd
        for (int64_t i = 0; i < c; ++i) store(dst, i, load(dst, i) + load(src, i));
      }
    }
  });
}

void position_embedding_bwd(Tensor dwpe, Tensor dout, Tensor positions) {
  expect(dout.ndim == 3 && dwpe.dtype == DType::f32, "position_embedding_bwd: dout [B,T,C]");
  const int64_t b = dout.dim(0), t = dout.dim(1), c = dout.dim(2);
  float* dw = dwpe.as<float>();
  if (!positions.empty()) {
    // Packed sequences: a scatter by position, in token order within each column block (the
    // blocks are disjoint, so threads never share a row element and the order is fixed).
    expect(positions.numel() == b * t, "position_embedding_bwd: positions [B*T]");
    const int32_t* pos = positions.as<int32_t>();
    constexpr int64_t kBlock = 64;
    dispatch_float(dout.dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* g = dout.as<T>();
#pragma omp parallel for schedule(static)
      for (int64_t c0 = 0; c0 < c; c0 += kBlock) {
        const int64_t c1 = std::min(c, c0 + kBlock);
        for (int64_t n = 0; n < b * t; ++n) {
          float* d = dw + static_cast<int64_t>(pos[n]) * c;
          const T* s = g + n * c;
          for (int64_t i = c0; i < c1; ++i) d[i] += load(s, i);
        }
      }
    });
    return;
  }
  dispatch_float(dout.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* g = dout.as<T>();
#pragma omp parallel for schedule(static)
    for (int64_t ti = 0; ti < t; ++ti) {
      float* d = dw + ti * c;
      for (int64_t bi = 0; bi < b; ++bi) {
        const T* s = g + (bi * t + ti) * c;
#pragma omp simd
        for (int64_t i = 0; i < c; ++i) d[i] += load(s, i);
      }
    }
  });
}

namespace {

// LayerNorm, or with kRms RMSNorm (no mean, no bias): one loop for both, the RMS form the
// LayerNorm one with the mean taken as 0. mean and b are unused (may be empty) with kRms.
template <bool kRms>
void norm_fwd(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w, Tensor b, float eps) {
  const int64_t c = x.dim(-1);
  const int64_t rows = c > 0 ? x.numel() / c : 0;
  dispatch_float(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.as<T>();
    const T* pw = w.as<T>();
    const T* pb = kRms ? nullptr : b.as<T>();
    T* po = out.as<T>();
    float* pm = kRms ? nullptr : mean.as<float>();
    float* pr = rstd.as<float>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = px + r * c;
      float m = 0;
      if constexpr (!kRms) {
        float sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < c; ++i) sum += load(xr, i);
        m = sum / static_cast<float>(c);
      }
      float var = 0;  // RMS: the mean square
#pragma omp simd reduction(+ : var)
      for (int64_t i = 0; i < c; ++i) {
        const float d = load(xr, i) - m;
        var += d * d;
      }
      const float s = 1.0f / std::sqrt(var / static_cast<float>(c) + eps);
      T* orow = po + r * c;
#pragma omp simd
      for (int64_t i = 0; i < c; ++i) {
        if constexpr (kRms) {
          store(orow, i, load(xr, i) * s * load(pw, i));
        } else {
          store(orow, i, (load(xr, i) - m) * s * load(pw, i) + load(pb, i));
        }
      }
      if constexpr (!kRms) pm[r] = m;
      pr[r] = s;
    }
  });
}

// dx += rstd (dnorm - mean(dnorm) - norm mean(dnorm norm)), dnorm = dout w, norm = (x - mean)
// rstd; RMSNorm without the mean terms. dw (+ db) summed by threads that own column blocks,
// each over the rows in order (deterministic); an empty dw (a frozen weight) is skipped.
template <bool kRms>
void norm_bwd(Tensor dx, Tensor dw, Tensor db, Tensor dout, Tensor x, Tensor w, Tensor mean,
              Tensor rstd) {
  const int64_t c = x.dim(-1);
  const int64_t rows = c > 0 ? x.numel() / c : 0;
  float* pdw = dw.empty() ? nullptr : dw.as<float>();
  float* pdb = kRms ? nullptr : db.as<float>();
  const float* pm = kRms ? nullptr : mean.as<float>();
  const float* pr = rstd.as<float>();
  dispatch_float(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.as<T>();
    const T* pw = w.as<T>();
    const T* pg = dout.as<T>();
    T* pdx = dx.as<T>();
    // dx: rows are independent.
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = px + r * c;
      const T* gr = pg + r * c;
      const float m = kRms ? 0.0f : pm[r], s = pr[r];
      float dnorm_mean = 0, dnorm_norm_mean = 0;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
      for (int64_t i = 0; i < c; ++i) {
        const float norm = (load(xr, i) - m) * s;
        const float dnorm = load(pw, i) * load(gr, i);
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
      }
      dnorm_mean = kRms ? 0.0f : dnorm_mean / static_cast<float>(c);
      dnorm_norm_mean /= static_cast<float>(c);
      T* dxr = pdx + r * c;
#pragma omp simd
      for (int64_t i = 0; i < c; ++i) {
        const float norm = (load(xr, i) - m) * s;
        const float dnorm = load(pw, i) * load(gr, i);
        store(dxr, i, load(dxr, i) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
      }
    }
    if (pdw == nullptr) return;
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < c; c0 += 64) {
      const int64_t c1 = std::min(c, c0 + 64);
      for (int64_t r = 0; r < rows; ++r) {
        const T* xr = px + r * c;
        const T* gr = pg + r * c;
        const float m = kRms ? 0.0f : pm[r], s = pr[r];
#pragma omp simd
        for (int64_t i = c0; i < c1; ++i) {
          const float g = load(gr, i);
          if constexpr (!kRms) pdb[i] += g;
          pdw[i] += (load(xr, i) - m) * s * g;
        }
      }
    }
  });
}

}  // namespace

void layernorm_fwd(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w, Tensor b, float eps) {
  expect(mean.dtype == DType::f32 && rstd.dtype == DType::f32, "layernorm_fwd: stats are f32");
  norm_fwd<false>(out, mean, rstd, x, w, b, eps);
}

void layernorm_bwd(Tensor dx, Tensor dw, Tensor db, Tensor dout, Tensor x, Tensor w, Tensor mean,
                   Tensor rstd) {
  expect(dw.dtype == DType::f32 && db.dtype == DType::f32, "layernorm_bwd: grads are f32");
  norm_bwd<false>(dx, dw, db, dout, x, w, mean, rstd);
}

void rmsnorm_fwd(Tensor out, Tensor rstd, Tensor x, Tensor w, float eps) {
  const int64_t c = x.dim(-1), rows = c > 0 ? x.numel() / c : 0;
  expect(rstd.dtype == DType::f32 && rstd.numel() == rows && out.dtype == x.dtype &&
             w.dtype == x.dtype && out.numel() == x.numel() && w.numel() == c,
         "rmsnorm_fwd: out and x [N, C], weight [C], rstd f32 [N]");
  norm_fwd<true>(out, Tensor{}, rstd, x, w, Tensor{}, eps);
}

void rmsnorm_bwd(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd) {
  const int64_t c = x.dim(-1), rows = c > 0 ? x.numel() / c : 0;
  expect(rstd.dtype == DType::f32 && rstd.numel() == rows && dx.dtype == x.dtype &&
             dout.dtype == x.dtype && w.dtype == x.dtype && dx.numel() == x.numel() &&
             dout.numel() == x.numel() && w.numel() == c &&
             (dw.empty() || (dw.dtype == DType::f32 && dw.numel() == c)),
         "rmsnorm_bwd: dx, dout, x [N, C], weight [C], dweight f32 [C] or empty, rstd f32 [N]");
  norm_bwd<true>(dx, dw, Tensor{}, dout, x, w, Tensor{}, rstd);
}

}  // namespace jumbo::cpu
