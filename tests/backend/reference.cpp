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

RmsNormOut rmsnorm_fwd(const Vec& x, const Vec& weight, int64_t N, int64_t C, double eps) {
  RmsNormOut r{Vec(N * C), Vec(N)};
  for (int64_t n = 0; n < N; ++n) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += x[n * C + c] * x[n * C + c];
    r.rstd[n] = 1.0 / std::sqrt(ss / C + eps);
    for (int64_t c = 0; c < C; ++c) r.out[n * C + c] = x[n * C + c] * r.rstd[n] * weight[c];
  }
  return r;
}

void rmsnorm_bwd(Vec& dx, Vec* dweight, const Vec& dout, const Vec& x, const Vec& weight,
                 const Vec& rstd, int64_t N, int64_t C) {
  for (int64_t n = 0; n < N; ++n) {
    // dx = rstd * (dnorm - norm * mean(dnorm * norm)), dnorm = dout * weight, norm = x * rstd.
    double mean_dnorm_norm = 0;
    for (int64_t c = 0; c < C; ++c)
      mean_dnorm_norm += dout[n * C + c] * weight[c] * x[n * C + c] * rstd[n];
    mean_dnorm_norm /= C;
    for (int64_t c = 0; c < C; ++c) {
      const double norm = x[n * C + c] * rstd[n];
      dx[n * C + c] += rstd[n] * (dout[n * C + c] * weight[c] - norm * mean_dnorm_norm);
      if (dweight) (*dweight)[c] += norm * dout[n * C + c];
    }
  }
}

namespace {
// Offsets into qkv[B,T,G,R+2,D] for query head h, and out[B,T,H,D], probs[B,H,T,T].
struct AttentionIndex {
  const AttentionShape& s;
  int64_t R() const { return s.H / s.kv(); }
  int64_t row(int64_t b, int64_t t) const { return (b * s.T + t) * s.width(); }
  int64_t group(int64_t h) const { return (h / R()) * (R() + 2) * s.D; }
  int64_t q(int64_t b, int64_t t, int64_t h) const {
    return row(b, t) + group(h) + (h % R()) * s.D;
  }
  int64_t k(int64_t b, int64_t t, int64_t h) const { return row(b, t) + group(h) + R() * s.D; }
  int64_t v(int64_t b, int64_t t, int64_t h) const { return k(b, t, h) + s.D; }
  int64_t out(int64_t b, int64_t t, int64_t h) const { return ((b * s.T + t) * s.H + h) * s.D; }
  int64_t probs(int64_t b, int64_t h, int64_t t) const { return ((b * s.H + h) * s.T + t) * s.T; }
};

int64_t first_key(const Ids& positions, const AttentionShape& s, int64_t b, int64_t t) {
  return positions.empty() ? 0 : t - positions[b * s.T + t];
}
}  // namespace

void attention_fwd(Vec& out, Vec& probs, const Vec& qkv, const AttentionShape& s,
                   const Ids& positions) {
  const AttentionIndex ix{s};
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.D));
  out.assign(s.B * s.T * s.H * s.D, 0.0);
  probs.assign(s.B * s.H * s.T * s.T, 0.0);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t t = 0; t < s.T; ++t) {
        const int64_t lo = first_key(positions, s, b, t);
        double* p = &probs[ix.probs(b, h, t)];
        const double* q = &qkv[ix.q(b, t, h)];
        double max = -std::numeric_limits<double>::infinity();
        for (int64_t u = lo; u <= t; ++u) {
          const double* k = &qkv[ix.k(b, u, h)];
          double dot = 0;
          for (int64_t d = 0; d < s.D; ++d) dot += q[d] * k[d];
          p[u] = dot * scale;
          max = std::max(max, p[u]);
        }
        double sum = 0;
        for (int64_t u = lo; u <= t; ++u) sum += (p[u] = std::exp(p[u] - max));
        for (int64_t u = lo; u <= t; ++u) p[u] /= sum;
        double* o = &out[ix.out(b, t, h)];
        for (int64_t u = lo; u <= t; ++u) {
          const double* v = &qkv[ix.v(b, u, h)];
          for (int64_t d = 0; d < s.D; ++d) o[d] += p[u] * v[d];
        }
      }
}

Vec attention_bwd(const Vec& dout, const Vec& qkv, const Vec& probs, const AttentionShape& s,
                  const Ids& positions) {
  const AttentionIndex ix{s};
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.D));
  Vec dqkv(qkv.size(), 0.0);
  Vec dp(s.T);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t t = 0; t < s.T; ++t) {
        const int64_t lo = first_key(positions, s, b, t);
        const double* p = &probs[ix.probs(b, h, t)];
        const double* dy = &dout[ix.out(b, t, h)];
        // out_t = sum_u p_tu v_u; a group's k and v collect from each of its query heads.
        double p_dot_dp = 0;
        for (int64_t u = lo; u <= t; ++u) {
          const double* v = &qkv[ix.v(b, u, h)];
          double* dv = &dqkv[ix.v(b, u, h)];
          dp[u] = 0;
          for (int64_t d = 0; d < s.D; ++d) {
            dp[u] += dy[d] * v[d];
            dv[d] += p[u] * dy[d];
          }
          p_dot_dp += p[u] * dp[u];
        }
        // softmax backward, then score_tu = scale * q_t . k_u
        const double* q = &qkv[ix.q(b, t, h)];
        double* dq = &dqkv[ix.q(b, t, h)];
        for (int64_t u = lo; u <= t; ++u) {
          const double dscore = p[u] * (dp[u] - p_dot_dp) * scale;
          const double* k = &qkv[ix.k(b, u, h)];
          double* dk = &dqkv[ix.k(b, u, h)];
          for (int64_t d = 0; d < s.D; ++d) {
            dq[d] += dscore * k[d];
            dk[d] += dscore * q[d];
          }
        }
      }
  return dqkv;
}

Vec rope(const Vec& qkv, const Vec& table, const Ids& positions, int64_t G, int64_t D,
         bool inverse) {
  const int64_t N = static_cast<int64_t>(positions.size());
  const int64_t W = static_cast<int64_t>(qkv.size()) / N, per_group = W / (G * D), half = D / 2;
  Vec out = qkv;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t head = 0; head < per_group - 1; ++head) {  // the value head stays
        double* x = &out[n * W + (g * per_group + head) * D];
        const double* cs = &table[positions[n] * D];
        for (int64_t i = 0; i < half; ++i) {
          const double c = cs[i], sn = inverse ? -cs[half + i] : cs[half + i];
          const double x1 = x[i], x2 = x[half + i];
          x[i] = x1 * c - x2 * sn;
          x[half + i] = x2 * c + x1 * sn;
        }
      }
  return out;
}

Vec rope_table(int64_t P, int64_t D, double theta) {
  Vec table(P * D);
  for (int64_t p = 0; p < P; ++p)
    for (int64_t i = 0; i < D / 2; ++i) {
      const double angle = p * std::pow(theta, -2.0 * i / D);
      table[p * D + i] = std::cos(angle);
      table[p * D + D / 2 + i] = std::sin(angle);
    }
  return table;
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

Vec swiglu_fwd(const Vec& gate_up, int64_t N, int64_t F) {
  Vec out(N * F);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < F; ++i) {
      const double g = gate_up[n * 2 * F + i], u = gate_up[n * 2 * F + F + i];
      out[n * F + i] = g / (1.0 + std::exp(-g)) * u;
    }
  return out;
}

Vec swiglu_bwd(const Vec& dout, const Vec& gate_up, int64_t N, int64_t F) {
  Vec d(N * 2 * F);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < F; ++i) {
      const double g = gate_up[n * 2 * F + i], u = gate_up[n * 2 * F + F + i];
      const double sig = 1.0 / (1.0 + std::exp(-g)), dy = dout[n * F + i];
      d[n * 2 * F + i] = dy * u * (sig + g * sig * (1.0 - sig));
      d[n * 2 * F + F + i] = dy * g * sig;
    }
  return d;
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
