#pragma once
// `jumbo bench serve`: a load generator against the real server on loopback. It starts
// `jumbo serve` (this binary) as a child process on a free port, drives it from C client
// threads per concurrency level with streamed POST /v1/completions, and reports throughput,
// time to first token and inter-token latency; then a batch-B decode run of the server
// against the generation engine alone (bench/bench_generate.h) on the same model config:
// the server's overhead. The child is stopped (SIGTERM, then waited for) on every path.
// docs/serve.md, "Benchmark: `jumbo bench serve`".
#include <cstdint>
#include <string>
#include <vector>

namespace jumbo {

struct ServeBenchOptions {
  std::string checkpoint;                       // --checkpoint
  std::vector<int64_t> concurrency = {1, 8, 32};  // --concurrency: client threads per level
  int64_t requests = 64;                        // --requests: per level
  double rate = 0;                              // --rate: Poisson arrivals/s; 0 = closed loop
  std::vector<int64_t> prompt_tokens = {16, 128};  // --prompt-tokens: each request draws one
  std::vector<int64_t> output_tokens = {16, 64};   // --output-tokens: its max_tokens
  uint64_t seed = 1;                            // --seed: the request mix, arrivals, sampling
  int64_t max_batch = 8;                        // --max-batch: the server's, and the overhead batch
  std::string server_binary;                    // empty: this binary (/proc/self/exe)
  double start_timeout_s = 180;                 // for the "listening on" line
};

struct LatencySummary {
  int64_t samples = 0;
  double p50 = 0, p90 = 0, p99 = 0;  // seconds; nearest rank
};

struct ServeBenchLevel {
  int64_t concurrency = 0;
  int64_t requests = 0;  // sent
  int64_t errors = 0;    // non-200, transport or stream-parse failures
  int64_t output_tokens = 0;
  double wall_s = 0;     // first send to last end
  double output_tokens_per_s = 0, requests_per_s = 0;
  LatencySummary ttft, itl;
};

// The decode rate of B equal requests run together (closed loop, a warm-up round then the
// median of `rounds`): tokens that arrive between the last first token and the last end,
// divided by that time; the engine's: bench_generate at batch B with the same lengths.
struct ServeBenchOverhead {
  int64_t batch = 0, prompt_tokens = 0, output_tokens = 0, rounds = 0;
  double server_decode_tokens_per_s = 0;
  double engine_decode_tokens_per_s = 0;
  double ratio = 0;  // server / engine
  int64_t ended_early = 0;  // timed server requests that stopped at EOS before output_tokens
  int64_t errors = 0;
};

struct ServeBenchResult {
  std::string model_name;  // as served (GET /v1/models)
  std::string precision;
  int64_t vocab = 0, context = 0;
  std::vector<ServeBenchLevel> levels;
  ServeBenchOverhead overhead;
  std::vector<std::string> error_messages;  // the first few, one line each
  int64_t errors() const;
};

// Throws UserError (one line naming the flag) on bad options or a checkpoint that is not one,
// std::runtime_error when the server cannot be started. The server is stopped before it
// returns or throws.
ServeBenchResult bench_serve(const ServeBenchOptions& opts);

// The human table.
std::string describe(const ServeBenchResult& r, const ServeBenchOptions& opts);
// One JSON line (no newline).
std::string to_json_line(const ServeBenchResult& r, const ServeBenchOptions& opts);

}  // namespace jumbo
