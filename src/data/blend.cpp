// Blend: integer weights, one period of the largest-lag rule, then O(1) per pick.
#include "jumbo/data/blend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "jumbo/config/config.h"

namespace jumbo {
namespace {

// A period longer than this is apportioned instead (weights accurate to 1e-6 of the total).
constexpr int64_t kMaxPeriod = int64_t{1} << 20;

// Decimal weights as written ("0.6", "0.25", "3") as integers, or empty if some weight needs
// more than 6 decimal places or the period would be too long.
std::vector<int64_t> exact_integers(std::span<const double> w) {
  double scale = 1;
  for (int places = 0; places <= 6; ++places, scale *= 10) {
    std::vector<int64_t> out;
    bool exact = true;
    for (double x : w) {
      const double s = x * scale, r = std::round(s);
      exact = exact && r >= 1 && std::fabs(s - r) <= 1e-9 * std::max(1.0, s) && r < 1e15;
      out.push_back(static_cast<int64_t>(r));
    }
    if (!exact) continue;
    int64_t g = 0;
    for (int64_t v : out) g = std::gcd(g, v);
    int64_t sum = 0;
    for (int64_t& v : out) sum += (v /= g);
    if (sum <= kMaxPeriod) return out;
    return {};
  }
  return {};
}

// Largest-remainder apportionment of kMaxPeriod samples, at least one per dataset.
std::vector<int64_t> apportioned(std::span<const double> w) {
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  const int64_t slots = std::max<int64_t>(kMaxPeriod, static_cast<int64_t>(w.size()));
  std::vector<int64_t> out(w.size());
  std::vector<std::pair<double, size_t>> remainder;
  int64_t used = 0;
  for (size_t d = 0; d < w.size(); ++d) {
    const double share = w[d] / total * static_cast<double>(slots);
    out[d] = std::max<int64_t>(1, static_cast<int64_t>(std::floor(share)));
    used += out[d];
    remainder.emplace_back(share - std::floor(share), d);
  }
  std::stable_sort(remainder.begin(), remainder.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t k = 0; used < slots; k = (k + 1) % remainder.size(), ++used) out[remainder[k].second]++;
  return out;
}

}  // namespace

Blend::Blend(std::span<const double> weights) {
  if (weights.empty()) throw std::invalid_argument("Blend of no datasets");
  for (double w : weights) {
    if (!(std::isfinite(w) && w > 0)) throw std::invalid_argument(fmt::format("blend weight {}", w));
  }
  weights_ = exact_integers(weights);
  if (weights_.empty()) weights_ = apportioned(weights);
  const int64_t period = std::accumulate(weights_.begin(), weights_.end(), int64_t{0});
  // lag_d = w_d x (n + 1) - period x count_d: how far dataset d is behind its share after
  // n + 1 samples. Each sample goes to the largest lag; after `period` samples every count is
  // exactly w_d and every lag is 0 again, so the table repeats.
  std::vector<int64_t> lag(weights_.size(), 0), count(weights_.size(), 0);
  period_dataset_.resize(static_cast<size_t>(period));
  period_rank_.resize(static_cast<size_t>(period));
  for (int64_t n = 0; n < period; ++n) {
    size_t best = 0;
    for (size_t d = 0; d < weights_.size(); ++d) {
      lag[d] += weights_[d];
      if (lag[d] > lag[best]) best = d;
    }
    period_dataset_[n] = static_cast<uint32_t>(best);
    period_rank_[n] = static_cast<uint32_t>(count[best]++);
    lag[best] -= period;
  }
  for (size_t d = 0; d < weights_.size(); ++d) {
    if (count[d] != weights_[d]) throw std::logic_error("blend period does not close");
  }
}

Blend::Pick Blend::pick(int64_t global_index) const {
  if (global_index < 0) throw std::out_of_range(fmt::format("sample index {} is negative", global_index));
  const int64_t period = this->period();
  const int64_t cycle = global_index / period, at = global_index % period;
  const size_t d = period_dataset_[static_cast<size_t>(at)];
  return {d, cycle * weights_[d] + period_rank_[static_cast<size_t>(at)]};
}

BlendedSampler::BlendedSampler(std::vector<std::unique_ptr<SampleSource>> samplers,
                               std::span<const double> weights)
    : samplers_(std::move(samplers)), blend_(weights) {
  if (samplers_.size() != weights.size()) throw std::invalid_argument("one weight per sampler");
  for (const auto& s : samplers_) holds_examples_ = holds_examples_ || s->holds_examples();
}

void BlendedSampler::sample(int64_t index, const SampleView& out) const {
  const Blend::Pick p = blend_.pick(index);
  samplers_[p.dataset]->sample(p.index, out);
}

int64_t BlendedSampler::loss_tokens(int64_t index) const {
  const Blend::Pick p = blend_.pick(index);
  return samplers_[p.dataset]->loss_tokens(p.index);
}

}  // namespace jumbo
