#include "metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace jumbo::serve {
namespace {

// Latencies of a CPU test model to a 178B one on many GPUs: 1 ms .. 60 s.
std::vector<double> latency_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

std::string number(double v) { return fmt::format("{}", v); }

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double seconds) {
  const size_t b = static_cast<size_t>(
      std::lower_bound(bounds_.begin(), bounds_.end(), seconds) - bounds_.begin());
  std::lock_guard lock(mu_);
  ++counts_[b];
  sum_ += seconds;
  ++count_;
}

std::string Histogram::render(const std::string& name) const {
  std::lock_guard lock(mu_);
  std::string out;
  uint64_t cumulative = 0;
  for (size_t b = 0; b < bounds_.size(); ++b) {
    cumulative += counts_[b];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, number(bounds_[b]), cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, count_);
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, number(sum_), name, count_);
  return out;
}

ServeMetrics::ServeMetrics()
    : time_to_first_token(latency_bounds()),
      inter_token_latency(latency_bounds()),
      request_duration(latency_bounds()) {}

void ServeMetrics::count_request(const std::string& route, int status) {
  std::lock_guard lock(mu_);
  ++requests_[{route, status}];
}

void ServeMetrics::count_tokens(int64_t prompt, int64_t generated) {
  prompt_tokens_ += static_cast<uint64_t>(prompt);
  generation_tokens_ += static_cast<uint64_t>(generated);
}

void ServeMetrics::set_engine(const EngineGauges& g) {
  std::lock_guard lock(mu_);
  engine_ = g;
}

std::string ServeMetrics::render() const {
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  EngineGauges g;
  {
    std::lock_guard lock(mu_);
    g = engine_;
    family("jumbo_http_requests_total", "counter", "HTTP requests answered, by route and status.");
    for (const auto& [key, count] : requests_) {
      out += fmt::format("jumbo_http_requests_total{{route=\"{}\",status=\"{}\"}} {}\n", key.first,
                         key.second, count);
    }
  }
  family("jumbo_prompt_tokens_total", "counter", "Prompt tokens of the requests run.");
  out += fmt::format("jumbo_prompt_tokens_total {}\n", prompt_tokens_.load());
  family("jumbo_generation_tokens_total", "counter", "Tokens generated.");
  out += fmt::format("jumbo_generation_tokens_total {}\n", generation_tokens_.load());
  family("jumbo_time_to_first_token_seconds", "histogram",
         "From a request's arrival to its first generated token.");
  out += time_to_first_token.render("jumbo_time_to_first_token_seconds");
  family("jumbo_inter_token_latency_seconds", "histogram",
         "Between consecutive generated tokens of a sequence.");
  out += inter_token_latency.render("jumbo_inter_token_latency_seconds");
  family("jumbo_request_duration_seconds", "histogram",
         "From a generation request's arrival to its last token.");
  out += request_duration.render("jumbo_request_duration_seconds");
  family("jumbo_queue_requests", "gauge", "Requests waiting in the queue for a KV-cache slot.");
  out += fmt::format("jumbo_queue_requests {}\n", g.queued);
  family("jumbo_running_sequences", "gauge", "Sequences holding a KV-cache slot.");
  out += fmt::format("jumbo_running_sequences {}\n", g.running);
  family("jumbo_waiting_sequences", "gauge", "Sequences submitted, waiting for a slot.");
  out += fmt::format("jumbo_waiting_sequences {}\n", g.waiting);
  family("jumbo_cache_slots", "gauge", "KV-cache slots (--max-batch).");
  out += fmt::format("jumbo_cache_slots {}\n", g.slots);
  family("jumbo_batch_occupancy_ratio", "gauge", "Running sequences over KV-cache slots.");
  out += fmt::format("jumbo_batch_occupancy_ratio {}\n",
                     number(g.slots ? static_cast<double>(g.running) / static_cast<double>(g.slots) : 0.0));
  family("jumbo_kv_cache_usage_ratio", "gauge", "KV-cache positions holding a token, of all.");
  out += fmt::format("jumbo_kv_cache_usage_ratio {}\n",
                     number(g.cache_positions ? static_cast<double>(g.cached_positions) /
                                                    static_cast<double>(g.cache_positions)
                                              : 0.0));
  family("jumbo_adapters", "gauge", "LoRA adapters served over the base.");
  out += fmt::format("jumbo_adapters {}\n", g.adapters);
  family("jumbo_adapter_slots", "gauge", "LoRA adapter slots (--max-adapters).");
  out += fmt::format("jumbo_adapter_slots {}\n", g.adapter_slots);
  family("jumbo_mixed_adapter_steps_total", "counter",
         "Engine steps whose rows ran more than one model (adapters, or adapters and the base).");
  out += fmt::format("jumbo_mixed_adapter_steps_total {}\n", g.mixed_adapter_steps);
  return out;
}

}  // namespace jumbo::serve
