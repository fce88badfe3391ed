#include "jumbo/infer/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "jumbo/config/hashing.h"

namespace jumbo {

uint64_t sampling_stream(const std::vector<int32_t>& prompt, int64_t choice) {
  uint64_t h = splitmix64(static_cast<uint64_t>(prompt.size()));
  for (int32_t t : prompt) h = splitmix64(h ^ static_cast<uint32_t>(t));
  return splitmix64(h ^ static_cast<uint64_t>(choice));
}

double uniform_of(uint64_t seed, uint64_t stream, int64_t index) {
  const uint64_t h = splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ static_cast<uint64_t>(index));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

namespace {

// The most likely id (ties: the lower).
int32_t argmax(std::span<const float> logits) {
  const int64_t v = static_cast<int64_t>(logits.size());
  double mx = -INFINITY;
  int32_t best = 0;
  for (int64_t i = 0; i < v; ++i) {
    if (logits[i] > mx) {
      mx = logits[i];
      best = static_cast<int32_t>(i);
    }
  }
  return best;
}

// log of the softmax's normaliser, in double, and the argmax.
std::pair<double, int32_t> log_z_and_argmax(std::span<const float> logits) {
  const int64_t v = static_cast<int64_t>(logits.size());
  const int32_t best = argmax(logits);
  const double mx = logits[best];
  double sum = 0;
  for (int64_t i = 0; i < v; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  return {mx + std::log(sum), best};
}

void add_top(TokenPick& pick, std::span<const float> logits, double log_z, int64_t count) {
  const int64_t v = static_cast<int64_t>(logits.size());
  const int64_t k = std::min<int64_t>(count, v);
  if (k <= 0) return;
  std::vector<int32_t> ids(static_cast<size_t>(v));
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  for (int64_t j = 0; j < k; ++j) {
    pick.top.emplace_back(ids[j], static_cast<float>(logits[ids[j]] - log_z));
  }
}

}  // namespace

void apply_logit_adjustments(std::span<float> logits, const SamplingParams& params,
                             std::span<const int32_t> generated, std::span<int32_t> counts) {
  if (params.frequency_penalty != 0 || params.presence_penalty != 0) {
    for (int32_t t : generated) ++counts[t];
    for (int32_t t : generated) {
      if (counts[t] == 0) continue;  // already applied
      logits[t] -= static_cast<float>(counts[t] * params.frequency_penalty +
                                      params.presence_penalty);
      counts[t] = 0;
    }
  }
  for (const auto& [id, bias] : params.logit_bias) {
    if (id >= 0 && static_cast<size_t>(id) < logits.size()) logits[id] += bias;
  }
}

TokenPick score_token(std::span<const float> logits, int32_t target, int64_t alternatives) {
  const double log_z = log_z_and_argmax(logits).first;
  TokenPick pick;
  pick.token = target;
  pick.logprob = static_cast<float>(logits[target] - log_z);
  add_top(pick, logits, log_z, alternatives);
  return pick;
}

TokenPick pick_token(std::span<const float> model_logits, const SamplingParams& params,
                     uint64_t stream, int64_t index, std::span<const float> adjusted) {
  const auto [log_z, model_best] = log_z_and_argmax(model_logits);
  // What the token is picked from: the adjusted row when there is one.
  const std::span<const float> logits = adjusted.empty() ? model_logits : adjusted;
  const int64_t v = static_cast<int64_t>(logits.size());
  const int32_t best = adjusted.empty() ? model_best : argmax(adjusted);
  const double mx = logits[best];

  TokenPick pick;
  if (params.temperature <= 0) {
    pick.token = best;
  } else {
    // Candidates: every token, or the top_k / top_p set in probability order (ties: lower id).
    const double inv_t = 1.0 / params.temperature;
    std::vector<int32_t> ids;
    const bool filtered = (params.top_k > 0 && params.top_k < v) || params.top_p < 1;
    if (filtered) {
      ids.resize(static_cast<size_t>(v));
      std::iota(ids.begin(), ids.end(), 0);
      auto more_likely = [&](int32_t a, int32_t b) {
        return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
      };
      const int64_t k = params.top_k > 0 ? std::min(params.top_k, v) : v;
      std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), more_likely);
      ids.resize(static_cast<size_t>(k));
    }
    auto weight = [&](int32_t id) { return std::exp((static_cast<double>(logits[id]) - mx) * inv_t); };
    if (filtered && params.top_p < 1) {
      double total = 0;
      for (int32_t id : ids) total += weight(id);
      double kept = 0;
      size_t n = 0;
      while (n < ids.size()) {
        kept += weight(ids[n++]) / total;
        if (kept >= params.top_p) break;
      }
      ids.resize(n);
    }
    double total = 0;
    if (filtered) {
      for (int32_t id : ids) total += weight(id);
    } else {
      for (int64_t i = 0; i < v; ++i) total += weight(static_cast<int32_t>(i));
    }
    const double target = uniform_of(params.seed, stream, index) * total;
    double acc = 0;
    pick.token = filtered ? ids.back() : static_cast<int32_t>(v - 1);
    const int64_t count = filtered ? static_cast<int64_t>(ids.size()) : v;
    for (int64_t j = 0; j < count; ++j) {
      const int32_t id = filtered ? ids[static_cast<size_t>(j)] : static_cast<int32_t>(j);
      acc += weight(id);
      if (acc > target) {
        pick.token = id;
        break;
      }
    }
  }
  pick.logprob = static_cast<float>(model_logits[pick.token] - log_z);
  add_top(pick, model_logits, log_z, params.logprobs);
  return pick;
}

}  // namespace jumbo
