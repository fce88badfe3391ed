#include "jumbo/bench/bench_generate.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "jumbo/infer/engine.h"
#include "jumbo/infer/scheduler.h"
#include "jumbo/model/activations.h"
#include "jumbo/model/lora.h"
#include "jumbo/parallel/stage_plan.h"

namespace jumbo {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

double measure_copy_bytes_per_s(size_t bytes) {
  const size_t n = bytes / sizeof(float);
  std::vector<float> a(n, 1.0f), b(n, 0.0f);
  double best = 0;
  for (int pass = 0; pass < 5; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) b[i] = a[i];
    const double dt = seconds_since(t0);
    best = std::max(best, 2.0 * static_cast<double>(n * sizeof(float)) / dt);
    std::swap(a, b);
  }
  return best;
}

namespace {

// Prompt rows one step may add: the option, or every prompt of the largest batch at once.
int64_t prefill_rows(const GenerateBenchOptions& o) {
  if (o.prefill_chunk > 0) return o.prefill_chunk;
  return *std::max_element(o.batches.begin(), o.batches.end()) * o.prompt_tokens;
}

}  // namespace

GenerateBenchResult bench_generate(const ModelConfig& model, const GenerateBenchOptions& o,
                                   Backend& backend, std::shared_ptr<Comm> world) {
  if (o.prompt_tokens + o.new_tokens > model.context) {
    throw UserError(fmt::format("bench generate: --prompt {} + --new-tokens {} exceed the "
                                "context of {}", o.prompt_tokens, o.new_tokens, model.context));
  }
  const int64_t max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  EngineOptions e;
  e.precision = o.precision;
  e.shape.cache_slots = max_batch;
  e.shape.max_sampled = max_batch;
  e.shape.max_rows = std::max(prefill_rows(o), max_batch);
  e.shape.adapter_slots = o.adapters;
  e.shape.max_lora_rank = o.lora_rank;
  GenerationEngine engine(model, e, backend, world);
  engine.decoder().params().initialize(backend, 1234);
  // Random adapters (B too: a fresh B of zeros is the same work, but a real adapter's is not).
  const LoraShape lora{.rank = o.lora_rank, .alpha = 2.0 * static_cast<double>(o.lora_rank),
                       .targets = every_lora_target(model)};
  const StageOptions stage = plan_stage(model, Layout{}, StepShape{.lora = lora}, GridCoords{}).model;
  for (int64_t k = 0; k < o.adapters; ++k) {
    ParamStore store;
    for (ParamInfo& p : lora_stage_params(model, stage, 0, 1)) {
      p.init = InitKind::normal;
      store.add(std::move(p));
    }
    store.allocate(backend, engine.decoder().params().compute_dtype(), 1, GradBuffer::none);
    store.initialize(backend, 77 + static_cast<uint64_t>(k));
    engine.decoder().set_adapter(static_cast<int32_t>(k), store, lora);
  }

  GenerateBenchResult r;
  r.weight_bytes = static_cast<double>(engine.decoder().params().all_weights().bytes());
  std::vector<int64_t> adapter_counts = {0};  // the base alone, then over the adapters
  if (o.adapters > 0) adapter_counts.push_back(o.adapters);
  for (int64_t batch : o.batches) {
   for (const int64_t adapters : adapter_counts) {
    std::vector<double> prefill, decode;
    for (int64_t rep = 0; rep < o.repeats + 1; ++rep) {  // the first is a warm-up
      Scheduler s(engine, -1);
      const auto t0 = std::chrono::steady_clock::now();
      double first_token_at = 0;
      int64_t tokens = 0;
      for (int64_t b = 0; b < batch; ++b) {
        GenerationRequest q;
        for (int64_t t = 0; t < o.prompt_tokens; ++t) {
          q.prompt.push_back(static_cast<int32_t>((b * 7919 + t * 104729) % model.vocab));
        }
        q.max_new_tokens = o.new_tokens;
        q.stop_at_eos = false;
        q.adapter = adapters > 0 ? static_cast<int32_t>(b % adapters) : -1;
        s.submit(q, [&](const TokenEvent& ev) {
          if (ev.index == 0 && ++tokens == batch) first_token_at = seconds_since(t0);
          return true;
        });
      }
      while (!s.idle()) s.step();
      const double total = seconds_since(t0);
      if (rep == 0) continue;
      // Prefill: until every sequence has its first token (one prompt chunk per step);
      // decode: the remaining new_tokens - 1 steps of the whole batch.
      prefill.push_back(static_cast<double>(batch * o.prompt_tokens) / first_token_at);
      decode.push_back((total - first_token_at) / static_cast<double>(o.new_tokens - 1));
    }
    GenerateBenchRow row;
    row.batch = batch;
    row.adapters = std::min(adapters, batch);
    row.prefill_tokens_per_s = median(prefill);
    row.decode_step_s = median(decode);
    row.decode_tokens_per_s = static_cast<double>(batch) / row.decode_step_s;
    r.rows.push_back(row);
   }
  }
  r.copy_bytes_per_s = measure_copy_bytes_per_s(size_t{512} << 20);
  for (const GenerateBenchRow& row : r.rows) {
    if (row.batch == 1 && row.adapters == 0) r.batch1_bandwidth_fraction = r.weight_bytes / row.decode_step_s / r.copy_bytes_per_s;
  }
  return r;
}

std::string describe(const GenerateBenchResult& r, const ModelConfig& model,
                     const GenerateBenchOptions& o) {
  std::string out = fmt::format(
      "bench generate: {} ({} weight bytes, {}), prompt {} tokens, {} new tokens, prefill chunk {} "
      "rows, {} threads\n"
      "{:>6} {:>8} {:>16} {:>16} {:>14}\n",
      model.name, static_cast<int64_t>(r.weight_bytes), to_string(o.precision), o.prompt_tokens,
      o.new_tokens, prefill_rows(o), omp_get_max_threads(), "batch", "adapters", "prefill tok/s", "decode tok/s", "decode step");
  nlohmann::json rows = nlohmann::json::array();
  for (const GenerateBenchRow& row : r.rows) {
    out += fmt::format("{:>6} {:>8} {:>16.1f} {:>16.1f} {:>11.2f} ms\n", row.batch,
                       row.adapters, row.prefill_tokens_per_s, row.decode_tokens_per_s, 1e3 * row.decode_step_s);
    rows.push_back({{"batch", row.batch},
                    {"adapters", row.adapters},
                    {"prefill_tokens_per_s", row.prefill_tokens_per_s},
                    {"decode_tokens_per_s", row.decode_tokens_per_s}});
  }
  out += fmt::format("memory: copy {:.2f} GB/s (read + write, measured now); batch-1 decode reads "
                     "the weights at {:.2f} GB/s = {:.0f}% of it\n",
                     r.copy_bytes_per_s / 1e9, r.batch1_bandwidth_fraction * r.copy_bytes_per_s / 1e9,
                     100 * r.batch1_bandwidth_fraction);
  // The decoder's KV cache (model/activations.h): what each sequence holds per token, and
  // what the engine allocated (a slot per sequence of the largest batch, context positions).
  const int64_t kv_token = kv_cache_bytes_per_token(model, o.precision);
  const int64_t largest_batch = *std::max_element(o.batches.begin(), o.batches.end());
  out += fmt::format("kv cache: {} bytes per token (2 x {} layers x {} key/value heads x {} x "
                     "{} bytes), {:.2f} MiB allocated for {} sequences x {} positions\n",
                     kv_token, model.layers, model.kv_head_count(), model.head_dim(),
                     o.precision == Precision::bf16 ? 2 : 4,
                     static_cast<double>(kv_token * largest_batch * model.context) / (1 << 20),
                     largest_batch, model.context);
  out += nlohmann::json{{"model", model.name},
                        {"precision", to_string(o.precision)},
                        {"weight_bytes", r.weight_bytes},
                        {"kv_cache_bytes_per_token", kv_token},
                        {"copy_bytes_per_s", r.copy_bytes_per_s},
                        {"batch1_bandwidth_fraction", r.batch1_bandwidth_fraction},
                        {"rows", rows}}
             .dump();
  return out;
}

}  // namespace jumbo
