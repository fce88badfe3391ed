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
  c.world = make_world_comm(*c.backend);
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
  InferenceSession s{open_checkpoint_for(o, verb), nullptr, ""};
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
  s.engine = std::make_unique<GenerationEngine>(m.model, e, *s.backend, s.world);
  s.engine->load(s.checkpoint);
  return s;
}

}  // namespace jumbo
