#include "jumbo/infer/session.h"

#include <fmt/format.h>

#include <algorithm>

#include "jumbo/runtime/device.h"

namespace jumbo {

namespace {

UserError flag_error(const std::string& verb, const std::string& flag, const std::string& value,
                     const std::string& expected) {
  return UserError(fmt::format("jumbo {}: {} {}: expected {}", verb, flag, value, expected));
}

}  // namespace

OpenedCheckpoint open_checkpoint_for(const CheckpointOptions& o, const std::string& verb) {
  OpenedCheckpoint c;
  c.backend = make_backend(o.device);
  c.world = make_world_comm(*c.backend, o.comm_emulate);
  c.checkpoint = open_checkpoint(o.checkpoint, S3Options{}, *c.world);
  const Manifest& m = c.checkpoint.manifest;
  c.precision = o.precision.value_or(m.precision);
  if (c.world->rank() == 0) {
    const std::string path = o.tokenizer.empty() ? m.tokenizer : o.tokenizer;
    if (path.empty()) {
      throw UserError(fmt::format("jumbo {}: the checkpoint names no tokenizer: pass --tokenizer",
                                  verb));
    }
    c.tokenizer.emplace(path);
    if (c.tokenizer->vocab_size() > m.model.vocab) {
      throw UserError(fmt::format("jumbo {}: tokenizer {} has {} pieces, more than the "
                                  "checkpoint's model.vocab = {}", verb, path,
                                  c.tokenizer->vocab_size(), m.model.vocab));
    }
  }
  return c;
}

InferenceSession open_inference_session(const InferenceOptions& o, const std::string& verb) {
  if (o.max_batch < 1 || o.max_batch > 4096) {
    throw flag_error(verb, "--max-batch", std::to_string(o.max_batch), "1 .. 4096");
  }
  if (o.prefill_chunk < 1) {
    throw flag_error(verb, "--prefill-chunk", std::to_string(o.prefill_chunk), ">= 1");
  }
  if (o.max_adapters < 0 || o.max_adapters > 1024) {
    throw flag_error(verb, "--max-adapters", std::to_string(o.max_adapters), "0 .. 1024");
  }
  if (o.max_adapters > 0 && o.max_adapters < static_cast<int64_t>(o.adapters.size())) {
    throw flag_error(verb, "--max-adapters", std::to_string(o.max_adapters),
                     fmt::format("at least the {} adapters given", o.adapters.size()));
  }
  if (o.max_lora_rank < 0 || o.max_lora_rank > 4096) {
    throw flag_error(verb, "--max-lora-rank", std::to_string(o.max_lora_rank), "0 .. 4096");
  }
  InferenceSession s{open_checkpoint_for(o, verb), nullptr, "", {}};
  const Manifest& m = s.checkpoint.manifest;
  s.model_name = fmt::format("{}@{}", m.model.name, s.checkpoint.dir);
  // The last stage picks tokens: it must know the tokenizer's vocabulary too.
  const double pieces = s.world->all_reduce_scalar(
      s.tokenizer ? static_cast<double>(s.tokenizer->vocab_size()) : 0.0, ReduceOp::max);
  EngineOptions e;
  e.tp = o.tp;
  e.pp = o.pp;
  e.precision = s.precision;
  e.shape.cache_slots = o.max_batch;
  // Beyond one sampled row per sequence, room for the prompt rows that echo with logprobs
  // scores (Scheduler): 32 a step.
  e.shape.max_sampled = o.max_batch + 32;
  e.shape.max_rows = std::max(o.prefill_chunk, e.shape.max_sampled);
  e.shape.cache_positions = m.model.context;
  e.sampled_vocab = static_cast<int64_t>(pieces);
  // The slots' rank: the flag, else the largest adapter's (their manifests, read on rank 0).
  int64_t largest = 0;
  for (const AdapterSpec& a : o.adapters) {
    largest = std::max(largest, open_checkpoint(a.path, S3Options{}, *s.world).manifest.lora.rank);
  }
  e.shape.adapter_slots = std::max<int64_t>(o.max_adapters, static_cast<int64_t>(o.adapters.size()));
  e.shape.max_lora_rank = o.max_lora_rank > 0 ? o.max_lora_rank : largest > 0 ? largest : 16;
  s.engine = std::make_unique<GenerationEngine>(m.model, e, *s.backend, s.world);
  s.engine->load(s.checkpoint);
  for (size_t k = 0; k < o.adapters.size(); ++k) {
    const auto slot = static_cast<int32_t>(k);
    try {
      s.adapters.push_back({o.adapters[k], slot, s.engine->load_adapter(slot, o.adapters[k].path)});
    } catch (const UserError& err) {
      throw UserError(fmt::format("jumbo {}: --adapter {}: {}", verb,
                                  o.adapters[k].name.empty() || o.adapters[k].name == o.adapters[k].path
                                      ? o.adapters[k].path
                                      : o.adapters[k].name + "=" + o.adapters[k].path,
                                  err.what()));
    }
  }
  return s;
}

}  // namespace jumbo
