#include "jumbo/infer/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "jumbo/ckpt/checkpointer.h"
#include "jumbo/model/lora.h"
#include "jumbo/parallel/stage_plan.h"
#include "jumbo/train/checkpoint_io.h"

namespace jumbo {
namespace {

// What world rank 0 broadcasts: a step, the end of follow(), or a change of adapters.
enum class Command : int64_t { step, stop, load_adapter, remove_adapter };

// The step as bytes (plain records; every rank runs the same binary).
struct WireSampled {
  int32_t row;
  int32_t target;
  double temperature, top_p, frequency_penalty, presence_penalty;
  int64_t top_k, logprobs, index, logit_bias;
  uint64_t seed, stream;
};

template <class T>
void put(std::vector<char>& out, const T& v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}
template <class T>
T get(const std::vector<char>& in, size_t& at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof(T));
  at += sizeof(T);
  return v;
}

std::vector<char> encode_command(Command c, int32_t slot = -1, const std::string& path = {}) {
  std::vector<char> out;
  put(out, c);
  put(out, slot);
  put<int64_t>(out, static_cast<int64_t>(path.size()));
  out.insert(out.end(), path.begin(), path.end());
  return out;
}

struct Received {
  Command command = Command::step;
  int32_t slot = -1;
  std::string path;
};
// A step's bytes fill `s`; the others say what to do instead.
Received decode_command(const std::vector<char>& in, size_t& at) {
  Received r;
  r.command = get<Command>(in, at);
  if (r.command == Command::step) return r;
  r.slot = get<int32_t>(in, at);
  const auto n = static_cast<size_t>(get<int64_t>(in, at));
  r.path.assign(in.data() + at, n);
  at += n;
  return r;
}

// Collective: world rank 0's command (its slot and path) on every rank.
Received share_command(Comm& world, Command c, int32_t slot, const std::string& path) {
  std::vector<char> bytes = world.rank() == 0 ? encode_command(c, slot, path) : std::vector<char>{};
  world.broadcast_bytes(bytes, 0);
  size_t at = 0;
  return decode_command(bytes, at);  // rank 0's, on every rank
}

std::vector<char> encode_step(const EngineStep& s) {
  std::vector<char> out;
  put(out, Command::step);
  put<int64_t>(out, static_cast<int64_t>(s.rows.size()));
  put<int64_t>(out, static_cast<int64_t>(s.sampled.size()));
  for (const DecodeRow& r : s.rows) put(out, r);
  for (const SampledRow& r : s.sampled) {
    const SamplingParams& p = r.sampling;
    put(out, WireSampled{r.row, r.target, p.temperature, p.top_p, p.frequency_penalty,
                         p.presence_penalty, p.top_k, p.logprobs, r.index,
                         static_cast<int64_t>(p.logit_bias.size()), p.seed, r.stream});
    for (const auto& [id, bias] : p.logit_bias) {
      put(out, id);
      put(out, bias);
    }
  }
  return out;
}

void decode_step(const std::vector<char>& in, size_t at, EngineStep& s) {
  const int64_t rows = get<int64_t>(in, at), sampled = get<int64_t>(in, at);
  s.rows.resize(static_cast<size_t>(rows));
  for (DecodeRow& r : s.rows) r = get<DecodeRow>(in, at);
  s.sampled.resize(static_cast<size_t>(sampled));
  for (SampledRow& r : s.sampled) {
    const WireSampled w = get<WireSampled>(in, at);
    r.row = w.row;
    r.target = w.target;
    r.sampling = {w.temperature, w.top_k, w.top_p, w.seed, w.logprobs, w.frequency_penalty,
                  w.presence_penalty, {}};
    r.sampling.logit_bias.resize(static_cast<size_t>(w.logit_bias));
    for (auto& [id, bias] : r.sampling.logit_bias) {
      id = get<int32_t>(in, at);
      bias = get<float>(in, at);
    }
    r.stream = w.stream;
    r.index = w.index;
  }
}

std::vector<char> encode_picks(const std::vector<TokenPick>& picks) {
  std::vector<char> out;
  put<int64_t>(out, static_cast<int64_t>(picks.size()));
  for (const TokenPick& p : picks) {
    put(out, p.token);
    put(out, p.logprob);
    put<int64_t>(out, static_cast<int64_t>(p.top.size()));
    for (const auto& [id, lp] : p.top) {
      put(out, id);
      put(out, lp);
    }
  }
  return out;
}

std::vector<TokenPick> decode_picks(const std::vector<char>& in) {
  size_t at = 0;
  std::vector<TokenPick> picks(static_cast<size_t>(get<int64_t>(in, at)));
  for (TokenPick& p : picks) {
    p.token = get<int32_t>(in, at);
    p.logprob = get<float>(in, at);
    p.top.resize(static_cast<size_t>(get<int64_t>(in, at)));
    for (auto& [id, lp] : p.top) {
      id = get<int32_t>(in, at);
      lp = get<float>(in, at);
    }
  }
  return picks;
}

Layout engine_layout(const ModelConfig& model, const EngineOptions& opts, int world_size) {
  Layout layout;
  layout.tp = opts.tp;
  layout.pp = opts.pp;
  validate_layout(layout, model, "generation", LayoutKeys::flags);
  if (world_size != opts.tp * opts.pp) {
    throw UserError(fmt::format("generation runs one model replica: {} ranks, but --tp {} x --pp {} "
                                "= {}; start tp x pp ranks", world_size, opts.tp, opts.pp,
                                opts.tp * opts.pp));
  }
  return layout;
}

}  // namespace

GenerationEngine::GenerationEngine(const ModelConfig& model, const EngineOptions& opts,
                                   Backend& backend, std::shared_ptr<Comm> world)
    : model_(model),
      opts_(opts),
      layout_(engine_layout(model, opts, world->size())),
      backend_(backend),
      world_(world),
      stage_(world, model_, layout_, StepShape{.precision = opts.precision}) {
  if (opts_.sampled_vocab <= 0 || opts_.sampled_vocab > model_.vocab) opts_.sampled_vocab = model_.vocab;
  decoder_ = make_decode_stage(model_, stage_.options(), opts.shape, backend_, stage_.groups().tp);
  if (stage_.grid().last_stage()) {
    const int64_t s = decoder_->shape().max_sampled, vl = decoder_->vocab_local();
    gather_arena_ = backend_.device().make_arena(
        static_cast<size_t>(stage_.grid().tp_size() * s * vl) * 4 + Arena::kAlign, "sampled logits");
    gathered_ = gather_arena_.alloc(DType::f32, {stage_.grid().tp_size() * s * vl});
    host_logits_.resize(static_cast<size_t>(gathered_.numel()));
    row_logits_.resize(static_cast<size_t>(opts_.sampled_vocab));
    if (stage_.grid().tp_rank() == 0) {
      generated_.resize(static_cast<size_t>(opts.shape.cache_slots));
      for (auto& g : generated_) g.reserve(static_cast<size_t>(opts.shape.cache_positions));
      adjusted_logits_.resize(static_cast<size_t>(opts_.sampled_vocab));
      token_counts_.assign(static_cast<size_t>(opts_.sampled_vocab), 0);
    }
  }
}

void GenerationEngine::load(const ResolvedCheckpoint& ckpt) {
  load_weights(ckpt, decoder_->params(), backend_, stage_.grid().dp());
  base_ = ckpt.manifest;
  base_where_ = ckpt.storage->url(ckpt.dir);
}

std::vector<TokenPick> GenerationEngine::step(const EngineStep& step) {
  std::vector<char> bytes = leader() ? encode_step(step) : std::vector<char>{};
  world_->broadcast_bytes(bytes, 0);
  if (leader()) return run(step);
  EngineStep received;
  decode_step(bytes, sizeof(Command), received);
  return run(received);
}

void GenerationEngine::stop_followers() {
  std::vector<char> bytes = encode_command(Command::stop);
  world_->broadcast_bytes(bytes, 0);
}

LoraShape GenerationEngine::load_adapter(int32_t slot, const std::string& path) {
  const Received r = share_command(*world_, Command::load_adapter, slot, path);
  return install_adapter(r.slot, r.path);
}

void GenerationEngine::remove_adapter(int32_t slot) {
  decoder_->clear_adapter(share_command(*world_, Command::remove_adapter, slot, "").slot);
}

LoraShape GenerationEngine::install_adapter(int32_t slot, const std::string& path) {
  decoder_->clear_adapter(slot);
  const DecodeShape& shape = decoder_->shape();
  const std::string where = "adapter " + path;
  if (slot < 0 || slot >= shape.adapter_slots) {
    throw std::logic_error(fmt::format("load_adapter: slot {} of {}", slot, shape.adapter_slots));
  }
  const ResolvedCheckpoint adapter = open_checkpoint(path, S3Options{}, *world_);
  const Manifest& m = adapter.manifest;
  check_adapter_base(m, where, base_, "the served base " + base_where_);
  if (m.lora.rank > shape.max_lora_rank) {
    throw UserError(fmt::format("{}: LoRA rank {} is above --max-lora-rank {}", where,
                                m.lora.rank, shape.max_lora_rank));
  }
  StageOptions own = stage_.options();
  own.lora = m.lora;
  ParamStore store;
  for (ParamInfo& p : lora_stage_params(model_, own, stage_.grid().tp_rank(),
                                        stage_.grid().tp_size())) {
    store.add(std::move(p));
  }
  store.allocate(backend_, decoder_->params().compute_dtype(), 1, GradBuffer::none);
  std::string error;
  try {
    load_weights(adapter, store, backend_, stage_.grid().dp());
  } catch (const UserError& e) {
    error = e.what();
  }
  // A shard one stage cannot read fails every rank alike (rank 0 answers the caller).
  if (const std::optional<std::string> failed = first_error(*world_, error)) {
    throw UserError(error.empty() ? *failed : error);
  }
  decoder_->set_adapter(slot, store, m.lora);
  return m.lora;
}

void GenerationEngine::follow() {
  EngineStep step;
  for (;;) {
    std::vector<char> bytes;
    world_->broadcast_bytes(bytes, 0);
    size_t at = 0;
    const Received r = decode_command(bytes, at);
    switch (r.command) {
      case Command::step:
        decode_step(bytes, at, step);
        run(step);
        break;
      case Command::stop: return;
      case Command::load_adapter:
        try {
          install_adapter(r.slot, r.path);
        } catch (const UserError&) {  // world rank 0 reports it; this rank goes on
        }
        break;
      case Command::remove_adapter: decoder_->clear_adapter(r.slot); break;
    }
  }
}

std::vector<TokenPick> GenerationEngine::run(const EngineStep& step) {
  const int64_t n = static_cast<int64_t>(step.rows.size());
  Comm& pp = stage_.grid().pp();
  if (!stage_.grid().first_stage()) {
    CommRequest r = pp.irecv(decoder_->input(n), stage_.grid().pp_rank() - 1, 0);
    pp.wait(r);
  }
  sampled_rows_.clear();
  for (const SampledRow& s : step.sampled) sampled_rows_.push_back(s.row);
  decoder_->forward(step.rows, sampled_rows_);
  if (!stage_.grid().last_stage()) {
    CommRequest r = pp.isend(decoder_->output(n), stage_.grid().pp_rank() + 1, 0);
    pp.wait(r);
  }
  std::vector<char> bytes;
  const int root = stage_.grid().world_rank_of(0, 0, stage_.grid().pp_size() - 1);
  if (world_->rank() == root) bytes = encode_picks({});  // no sampled rows
  if (stage_.grid().last_stage() && !step.sampled.empty()) {
    const int64_t s = static_cast<int64_t>(step.sampled.size()), vl = decoder_->vocab_local();
    const int tp = stage_.grid().tp_size();
    Tensor mine = decoder_->logits(s).view({s * vl});
    Tensor all = gathered_.rows(0, tp * s * vl);
    stage_.grid().tp().all_gather(mine, all);  // [tp, s, vocab slice]
    if (stage_.grid().tp_rank() == 0) {
      backend_.to_host(host_logits_.data(), all);
      std::vector<TokenPick> picks;
      for (int64_t k = 0; k < s; ++k) {
        // The row's real vocabulary in id order: slice r holds ids [r vl, (r + 1) vl).
        for (int64_t id = 0; id < opts_.sampled_vocab; ++id) {
          const int64_t r = id / vl, c = id % vl;
          row_logits_[static_cast<size_t>(id)] =
              host_logits_[static_cast<size_t>((r * s + k) * vl + c)];
        }
        const SampledRow& sr = step.sampled[static_cast<size_t>(k)];
        if (sr.target >= 0) {
          picks.push_back(score_token(row_logits_, sr.target, sr.sampling.logprobs));
          continue;
        }
        std::vector<int32_t>& generated =
            generated_[static_cast<size_t>(step.rows[static_cast<size_t>(sr.row)].slot)];
        if (sr.index == 0) generated.clear();  // the slot holds a new completion
        std::span<const float> adjusted;
        if (sr.sampling.adjusts_logits()) {
          std::copy(row_logits_.begin(), row_logits_.end(), adjusted_logits_.begin());
          apply_logit_adjustments(adjusted_logits_, sr.sampling, generated, token_counts_);
          adjusted = adjusted_logits_;
        }
        picks.push_back(pick_token(row_logits_, sr.sampling, sr.stream, sr.index, adjusted));
        generated.push_back(picks.back().token);
      }
      bytes = encode_picks(picks);
    }
  }
  world_->broadcast_bytes(bytes, root);
  return decode_picks(bytes);
}

}  // namespace jumbo
