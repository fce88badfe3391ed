#include "reference.h"

#include <cmath>
#include <limits>

namespace jumbo::ref {

namespace {
bool in_slice(int64_t token, int64_t vocab_start, int64_t rows) {
  return token >= vocab_start && token < vocab_start + rows;
}
}  // namespace

Vec token_embedding_fwd(const Ids& tokens, const Vec& wte, int64_t rows, int64_t C,
                        int64_t vocab_start) {
  const int64_t N = static_cast<int64_t>(tokens.size());
  Vec out(N * C, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    if (!in_slice(tokens[n], vocab_start, rows)) continue;
    const int64_t row = tokens[n] - vocab_start;
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = wte[row * C + c];
  }
  return out;
}

void token_embedding_bwd(Vec& dwte, const Vec& dout, const Ids& tokens, int64_t rows, int64_t C,
                         int64_t vocab_start) {
  for (size_t n = 0; n < tokens.size(); ++n) {
    if (!in_slice(tokens[n], vocab_start, rows)) continue;
    const int64_t row = tokens[n] - vocab_start;
    for (int64_t c = 0; c < C; ++c) dwte[row * C + c] += dout[n * C + c];
  }
}

void position_embedding_fwd(Vec& out, const Vec& wpe, int64_t B, int64_t T, int64_t C) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) out[(b * T + t) * C + c] += wpe[t * C + c];
}

void position_embedding_bwd(Vec& dwpe, const Vec& dout, int64_t B, int64_t T, int64_t C) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) dwpe[t * C + c] += dout[(b * T + t) * C + c];
}

LayerNormOut layernorm_fwd(const Vec& x, const Vec& weight, const Vec& bias, int64_t N, int64_t C,
                           double eps) {
  LayerNormOut r{Vec(N * C), Vec(N), Vec(N)};
  for (int64_t n = 0; n < N; ++n) {
    const double* row = &x[n * C];
    double mean = 0;
    for (int64_t c = 0; c < C; ++c) mean += row[c];
    mean /= C;
    double var = 0;
    for (int64_t c = 0; c < C; ++c) var += (row[c] - mean) * (row[c] - mean);
    var /= C;
    const double rstd = 1.0 / std::sqrt(var + eps);
    for (int64_t c = 0; c < C; ++c)
      r.out[n * C + c] = (row[c] - mean) * rstd * weight[c] + bias[c];
    r.mean[n] = mean;
    r.rstd[n] = rstd;
  }
  return r;
}

void layernorm_bwd(Vec& dx, Vec& dweight, Vec& dbias, const Vec& dout, const Vec& x,
                   const Vec& weight, const Vec& mean, const Vec& rstd, int64_t N, int64_t C) {
  for (int64_t n = 0; n < N; ++n) {
    // dx = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = dout * weight.
    double mean_dnorm = 0, mean_dnorm_norm = 0;
    for (int64_t c = 0; c < C; ++c) {
      const double norm = (x[n * C + c] - mean[n]) * rstd[n];
      const double dnorm = dout[n * C + c] * weight[c];
      mean_dnorm += dnorm;
      mean_dnorm_norm += dnorm * norm;
    }
    mean_dnorm /= C;
    mean_dnorm_norm /= C;
    for (int64_t c = 0; c < C; ++c) {
      const double norm = (x[n * C + c] - mean[n]) * rstd[n];
      const double dnorm = dout[n * C + c] * weight[c];
      dbias[c] += dout[n * C + c];
      dweight[c] += norm * dout[n * C + c];
      dx[n * C + c] += rstd[n] * (dnorm - mean_dnorm - norm * mean_dnorm_norm);
    }
  }
}

Vec linear_fwd(const Vec& in, const Vec& weight, const Vec& bias, int64_t N, int64_t I,
               int64_t O) {
  Vec out(N * O);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o) {
      double acc = bias.empty() ? 0.0 : bias[o];
      for (int64_t i = 0; i < I; ++i) acc += in[n * I + i] * weight[o * I + i];
      out[n * O + o] = acc;
    }
  return out;
}

void linear_bwd(Vec* din, Vec& dweight, Vec* dbias, const Vec& dout, const Vec& in,
                const Vec& weight, int64_t N, int64_t I, int64_t O) {
  if (din) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < I; ++i) {
        double acc = 0;
        for (int64_t o = 0; o < O; ++o) acc += dout[n * O + o] * weight[o * I + i];
        (*din)[n * I + i] = acc;
      }
  }
  for (int64_t o = 0; o < O; ++o)
    for (int64_t i = 0; i < I; ++i) {
      double acc = 0;
      for (int64_t n = 0; n < N; ++n) acc += dout[n * O + o] * in[n * I + i];
      dweight[o * I + i] += acc;
    }
  if (dbias) {
    for (int64_t o = 0; o < O; ++o)
      for (int64_t n = 0; n < N; ++n) (*dbias)[o] += dout[n * O + o];
  }
}

namespace {
// Offsets into qkv[B,T,H,3,D] and out[B,T,H,D], probs[B,H,T,T].
struct AttentionIndex {
  const AttentionShape& s;
  int64_t qkv(int64_t b, int64_t t, int64_t h, int64_t which) const {
    return (((b * s.T + t) * s.H + h) * 3 + which) * s.D;
  }
  int64_t out(int64_t b, int64_t t, int64_t h) const { return ((b * s.T + t) * s.H + h) * s.D; }
  int64_t probs(int64_t b, int64_t h, int64_t t) const { return ((b * s.H + h) * s.T + t) * s.T; }
};
}  // namespace

void attention_fwd(Vec& out, Vec& probs, const Vec& qkv, const AttentionShape& s) {
  const AttentionIndex ix{s};
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.D));
  out.assign(s.B * s.T * s.H * s.D, 0.0);
  probs.assign(s.B * s.H * s.T * s.T, 0.0);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t t = 0; t < s.T; ++t) {
        double* p = &probs[ix.probs(b, h, t)];
        const double* q = &qkv[ix.qkv(b, t, h, 0)];
        double max = -std::numeric_limits<double>::infinity();
        for (int64_t u = 0; u <= t; ++u) {
          const double* k = &qkv[ix.qkv(b, u, h, 1)];
          double dot = 0;
          for (int64_t d = 0; d < s.D; ++d) dot += q[d] * k[d];
          p[u] = dot * scale;
          max = std::max(max, p[u]);
        }
        double sum = 0;
        for (int64_t u = 0; u <= t; ++u) sum += (p[u] = std::exp(p[u] - max));
        for (int64_t u = 0; u <= t; ++u) p[u] /= sum;
        double* o = &out[ix.out(b, t, h)];
        for (int64_t u = 0; u <= t; ++u) {
          const double* v = &qkv[ix.qkv(b, u, h, 2)];
          for (int64_t d = 0; d < s.D; ++d) o[d] += p[u] * v[d];
        }
      }
}

Vec attention_bwd(const Vec& dout, const Vec& qkv, const Vec& probs, const AttentionShape& s) {
  const AttentionIndex ix{s};
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.D));
  Vec dqkv(qkv.size(), 0.0);
  Vec dp(s.T);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t t = 0; t < s.T; ++t) {
        const double* p = &probs[ix.probs(b, h, t)];
        const double* dy = &dout[ix.out(b, t, h)];
        // out_t = sum_u p_tu v_u
        double p_dot_dp = 0;
        for (int64_t u = 0; u <= t; ++u) {
          const double* v = &qkv[ix.qkv(b, u, h, 2)];
          double* dv = &dqkv[ix.qkv(b, u, h, 2)];
          dp[u] = 0;
          for (int64_t d = 0; d < s.D; ++d) {
            dp[u] += dy[d] * v[d];
            dv[d] += p[u] * dy[d];
          }
          p_dot_dp += p[u] * dp[u];
        }
        // softmax backward, then score_tu = scale * q_t . k_u
        const double* q = &qkv[ix.qkv(b, t, h, 0)];
        double* dq = &dqkv[ix.qkv(b, t, h, 0)];
        for (int64_t u = 0; u <= t; ++u) {
          const double dscore = p[u] * (dp[u] - p_dot_dp) * scale;
          const double* k = &qkv[ix.qkv(b, u, h, 1)];
          double* dk = &dqkv[ix.qkv(b, u, h, 1)];
          for (int64_t d = 0; d < s.D; ++d) {
            dq[d] += dscore * k[d];
            dk[d] += dscore * q[d];
          }
        }
      }
  return dqkv;
}

namespace {
const double kGeluC = std::sqrt(2.0 / M_PI);
}

double gelu(double x) { return 0.5 * x * (1.0 + std::tanh(kGeluC * (x + 0.044715 * x * x * x))); }

double gelu_grad(double x) {
  const double inner = kGeluC * (x + 0.044715 * x * x * x);
  const double th = std::tanh(inner);
  const double dinner = kGeluC * (1.0 + 3.0 * 0.044715 * x * x);
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * dinner;
}

Vec gelu_fwd(const Vec& in) {
  Vec out(in.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = gelu(in[i]);
  return out;
}

Vec gelu_bwd(const Vec& dout, const Vec& in) {
  Vec din(in.size());
  for (size_t i = 0; i < in.size(); ++i) din[i] = dout[i] * gelu_grad(in[i]);
  return din;
}

Vec ce_local_max(const Vec& logits, int64_t N, int64_t V) {
  Vec max(N, -std::numeric_limits<double>::infinity());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = 0; v < V; ++v) max[n] = std::max(max[n], logits[n * V + v]);
  return max;
}

Vec ce_local_sumexp(const Vec& logits, const Vec& max, int64_t N, int64_t V) {
  Vec sum(N, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = 0; v < V; ++v) sum[n] += std::exp(logits[n * V + v] - max[n]);
  return sum;
}

Vec ce_target_logit(const Vec& logits, const Ids& targets, int64_t N, int64_t V,
                    int64_t vocab_start) {
  Vec target(N, 0.0);
  for (int64_t n = 0; n < N; ++n)
    if (in_slice(targets[n], vocab_start, V)) target[n] = logits[n * V + targets[n] - vocab_start];
  return target;
}

Vec ce_loss(const Vec& max, const Vec& sumexp, const Vec& target_logit) {
  Vec loss(max.size());
  for (size_t n = 0; n < max.size(); ++n)
    loss[n] = std::log(sumexp[n]) + max[n] - target_logit[n];
  return loss;
}

Vec ce_bwd(const Vec& logits, const Vec& max, const Vec& sumexp, const Ids& targets, int64_t N,
           int64_t V, int64_t vocab_start, double scale) {
  Vec d(N * V);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = 0; v < V; ++v) {
      const double softmax = std::exp(logits[n * V + v] - max[n]) / sumexp[n];
      const double onehot = (targets[n] == vocab_start + v) ? 1.0 : 0.0;
      d[n * V + v] = (softmax - onehot) * scale;
    }
  return d;
}

Vec cross_entropy_direct(const Vec& logits, const Ids& targets, int64_t N, int64_t V) {
  Vec loss(N);
  for (int64_t n = 0; n < N; ++n) {
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(logits[n * V + v]);
    loss[n] = -(logits[n * V + targets[n]] - std::log(sum));
  }
  return loss;
}

void adamw(Vec& master, const Vec& grad, Vec& m, Vec& v, const AdamWStep& s) {
  const double b1 = s.beta1, b2 = s.beta2;
  const double correction1 = 1.0 - std::pow(b1, static_cast<double>(s.step));
  const double correction2 = 1.0 - std::pow(b2, static_cast<double>(s.step));
  for (size_t i = 0; i < master.size(); ++i) {
    const double g = grad[i] * static_cast<double>(s.grad_scale);
    m[i] = b1 * m[i] + (1.0 - b1) * g;
    v[i] = b2 * v[i] + (1.0 - b2) * g * g;
    const double mhat = m[i] / correction1;
    const double vhat = v[i] / correction2;
    master[i] -= static_cast<double>(s.lr) *
                 (mhat / (std::sqrt(vhat) + static_cast<double>(s.eps)) +
                  static_cast<double>(s.weight_decay) * master[i]);
  }
}

double sum_squares(const Vec& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return s;
}

double round_to_bf16(double x) {
  if (std::isnan(x) || std::isinf(x) || x == 0.0) return x;
  // First to f32 (the backend's input is an f32 value), then the significand to 8 bits.
  const double xf = static_cast<float>(x);
  if (std::fabs(xf) < std::ldexp(1.0, -126)) {  // subnormal: fixed spacing 2^-133
    return std::ldexp(std::nearbyint(std::ldexp(xf, 133)), -133);
  }
  int exponent = 0;
  const double significand = std::frexp(xf, &exponent);       // in [0.5, 1)
  const double rounded = std::nearbyint(significand * 256.0);  // default mode: ties to even
  const double r = std::ldexp(rounded, exponent - 8);
  // bf16 has f32's exponent range: anything past f32's largest finite value is infinity.
  if (std::fabs(r) > std::numeric_limits<float>::max())
    return std::copysign(std::numeric_limits<double>::infinity(), x);
  return r;
}

double round_to_f32(double x) { return static_cast<double>(static_cast<float>(x)); }

}  // namespace jumbo::ref
