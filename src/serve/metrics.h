#pragma once
// What `GET /metrics` reports, in Prometheus' text format (version 0.0.4): requests by route
// and status, tokens in and out, latency histograms (time to first token, between tokens, a
// whole request), and the engine's state (queue, running sequences, batch occupancy, KV-cache
// use). Handler threads and the leader update it; every method is thread-safe.
#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace jumbo::serve {

// Cumulative buckets, as Prometheus' histogram type: upper bounds in seconds, then +Inf.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double seconds);
  // Its sample lines ("NAME_bucket{le=...} N", "NAME_sum", "NAME_count").
  std::string render(const std::string& name) const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// The engine's state as the leader last saw it.
struct EngineGauges {
  int64_t queued = 0, running = 0, waiting = 0, slots = 0;
  int64_t cached_positions = 0, cache_positions = 0;  // KV-cache positions in use, of all
  int64_t adapters = 0, adapter_slots = 0;  // LoRA adapters served, of the slots
  int64_t mixed_adapter_steps = 0;          // engine steps that ran more than one model
};

class ServeMetrics {
 public:
  ServeMetrics();
  void count_request(const std::string& route, int status);
  void count_tokens(int64_t prompt, int64_t generated);
  Histogram time_to_first_token, inter_token_latency, request_duration;
  void set_engine(const EngineGauges& g);
  std::string render() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;  // (route, status)
  EngineGauges engine_;
  std::atomic<uint64_t> prompt_tokens_{0}, generation_tokens_{0};
};

}  // namespace jumbo::serve
