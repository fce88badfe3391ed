#include "jumbo/infer/scheduler.h"

#include <fmt/format.h>

#include <algorithm>

namespace jumbo {

const char* to_string(FinishReason r) {
  switch (r) {
    case FinishReason::length: return "length";
    case FinishReason::stop: return "stop";
    case FinishReason::none: break;
  }
  return "none";
}

std::string request_problem(const GenerationRequest& r, const DecodeShape& shape,
                            int64_t vocab) {
  const int64_t prompt = static_cast<int64_t>(r.prompt.size());
  if (prompt == 0) return "prompt: is empty (no tokens)";
  for (int32_t t : r.prompt) {
    if (t < 0 || t >= vocab) return fmt::format("prompt: token id {} outside [0, {})", t, vocab);
  }
  if (r.max_new_tokens < 1) return fmt::format("max_tokens: {} is not >= 1", r.max_new_tokens);
  if (prompt + r.max_new_tokens > shape.cache_positions) {
    return fmt::format("prompt: {} tokens + max_tokens {} exceed the model's context of {} "
                       "tokens", prompt, r.max_new_tokens, shape.cache_positions);
  }
  if (r.sampling.temperature < 0) return fmt::format("temperature: {} is negative", r.sampling.temperature);
  if (!(r.sampling.top_p > 0 && r.sampling.top_p <= 1)) return fmt::format("top_p: {} is not in (0, 1]", r.sampling.top_p);
  if (r.sampling.top_k < 0) return fmt::format("top_k: {} is negative", r.sampling.top_k);
  if (r.sampling.logprobs < 0 || r.sampling.logprobs > 20) {
    return fmt::format("logprobs: {} is not in [0, 20]", r.sampling.logprobs);
  }
  if (r.score_prompt_from > 0 && shape.max_sampled <= shape.cache_slots) {
    return "echo: scoring the prompt needs sampled rows beyond one per KV-cache slot";
  }
  return "";
}

Scheduler::Scheduler(GenerationEngine& engine, int32_t eos_id) : engine_(engine), eos_id_(eos_id) {
  const DecodeShape& shape = engine_.shape();
  for (int32_t s = static_cast<int32_t>(shape.cache_slots) - 1; s >= 0; --s) free_slots_.push_back(s);
  running_.reserve(static_cast<size_t>(shape.cache_slots));
  step_.rows.reserve(static_cast<size_t>(shape.max_rows));
  step_.sampled.reserve(static_cast<size_t>(shape.max_sampled));
}

int64_t Scheduler::submit(GenerationRequest request, TokenSink sink) {
  Sequence s;
  s.id = next_id_++;
  s.tokens = request.prompt;
  s.key = sampling_stream(request.prompt, static_cast<int64_t>(request.stream));
  s.request = std::move(request);
  s.sink = std::move(sink);
  waiting_.push_back(std::move(s));
  return waiting_.back().id;
}

int64_t Scheduler::cached_positions() const {
  int64_t total = 0;
  for (const Sequence& s : running_) total += s.cached;
  return total;
}

bool Scheduler::uses_adapter(int32_t slot) const {
  auto uses = [slot](const Sequence& s) { return !s.cancelled && s.request.adapter == slot; };
  return std::any_of(running_.begin(), running_.end(), uses) ||
         std::any_of(waiting_.begin(), waiting_.end(), uses);
}

void Scheduler::cancel(int64_t id) {
  for (Sequence& s : running_) s.cancelled |= s.id == id;
  for (Sequence& s : waiting_) s.cancelled |= s.id == id;
}

void Scheduler::admit() {
  std::erase_if(waiting_, [](const Sequence& s) { return s.cancelled; });
  while (!free_slots_.empty() && !waiting_.empty()) {
    Sequence s = std::move(waiting_.front());
    waiting_.pop_front();
    s.slot = free_slots_.back();
    free_slots_.pop_back();
    running_.push_back(std::move(s));
  }
}

void Scheduler::finish(size_t i) {
  free_slots_.push_back(running_[i].slot);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
}

void Scheduler::step() {
  for (size_t i = running_.size(); i-- > 0;) {
    if (running_[i].cancelled) finish(i);
  }
  admit();
  if (running_.empty()) return;
  const DecodeShape& shape = engine_.shape();
  step_.rows.clear();
  step_.sampled.clear();
  sampled_of_.clear();
  scored_at_.clear();
  // Decode rows first (one per sequence whose prompt is cached), then prompt chunks in
  // arrival order with the rows left: a long prompt never stalls the running sequences.
  // Scored prompt rows share the sampled rows left over after one per running sequence.
  int64_t score_room = shape.max_sampled - static_cast<int64_t>(running_.size());
  auto feed = [&](size_t i, int64_t count) {
    Sequence& s = running_[i];
    const int64_t from = s.request.score_prompt_from;
    const int64_t prompt = static_cast<int64_t>(s.request.prompt.size());
    if (from > 0) {
      // Row p scores token p + 1 when from <= p + 1 < prompt: keep within score_room.
      int64_t scored = 0, allowed = 0;
      for (; allowed < count; ++allowed) {
        const int64_t target = s.cached + allowed + 1;
        const bool scores = target >= from && target < prompt;
        if (scores && scored == score_room) break;
        scored += scores;
      }
      count = allowed;
      score_room -= scored;
    }
    for (int64_t k = 0; k < count; ++k) {
      const int64_t pos = s.cached + k;
      step_.rows.push_back({s.tokens[static_cast<size_t>(pos)], s.slot, static_cast<int32_t>(pos),
                            s.request.adapter});
      const int64_t target = pos + 1;
      if (from > 0 && target >= from && target < prompt) {
        SampledRow scored{static_cast<int32_t>(step_.rows.size() - 1), s.request.sampling, s.key,
                          target, s.tokens[static_cast<size_t>(target)]};
        scored.sampling.logit_bias.clear();
        step_.sampled.push_back(std::move(scored));
        sampled_of_.push_back(i);
        scored_at_.push_back(target);
      }
    }
    s.cached += count;
    if (count > 0 && s.cached == static_cast<int64_t>(s.tokens.size())) {
      step_.sampled.push_back({static_cast<int32_t>(step_.rows.size() - 1), s.request.sampling,
                               s.key, s.generated});
      sampled_of_.push_back(i);
      scored_at_.push_back(-1);
    }
  };
  decode_order_.resize(running_.size());
  for (size_t i = 0; i < running_.size(); ++i) decode_order_[i] = i;
  std::stable_sort(decode_order_.begin(), decode_order_.end(), [this](size_t a, size_t b) {
    return running_[a].request.adapter < running_[b].request.adapter;
  });
  for (size_t i : decode_order_) {
    const Sequence& s = running_[i];
    if (static_cast<int64_t>(s.tokens.size()) - s.cached == 1) feed(i, 1);
  }
  for (size_t i = 0; i < running_.size(); ++i) {
    const Sequence& s = running_[i];
    const int64_t pending = static_cast<int64_t>(s.tokens.size()) - s.cached;
    const int64_t room = shape.max_rows - static_cast<int64_t>(step_.rows.size());
    if (pending > 1 && room > 0) feed(i, std::min(pending, room));
  }
  for (const DecodeRow& r : step_.rows) {
    if (r.adapter != step_.rows.front().adapter) {
      ++mixed_steps_;
      break;
    }
  }
  const std::vector<TokenPick> picks = engine_.step(step_);
  std::vector<size_t> done;
  for (size_t k = 0; k < picks.size(); ++k) {
    Sequence& s = running_[sampled_of_[k]];
    if (s.cancelled) continue;  // its sink said stop at a prompt score of this step
    TokenEvent e;
    e.pick = picks[k];
    if (scored_at_[k] >= 0) {
      e.prompt = true;
      e.index = scored_at_[k];
      if (!s.sink(e)) s.cancelled = true;  // ends at the next step
      continue;
    }
    e.index = s.generated++;
    e.eos = s.request.stop_at_eos && e.pick.token == eos_id_;
    if (e.eos) {
      e.finished = FinishReason::stop;
    } else if (s.generated == s.request.max_new_tokens) {
      e.finished = FinishReason::length;
    }
    s.tokens.push_back(e.pick.token);
    const bool go_on = s.sink(e);
    if (!go_on || e.finished != FinishReason::none) done.push_back(sampled_of_[k]);
  }
  std::sort(done.rbegin(), done.rend());
  for (size_t i : done) finish(i);
}

std::vector<Generated> generate_all(GenerationEngine& engine, int32_t eos_id,
                                    const std::vector<GenerationRequest>& requests,
                                    const StopCheck& stop_here) {
  std::vector<Generated> out(requests.size());
  Scheduler scheduler(engine, eos_id);
  for (size_t i = 0; i < requests.size(); ++i) {
    scheduler.submit(requests[i], [&out, &stop_here, i](const TokenEvent& e) {
      Generated& g = out[i];
      if (e.eos) {
        g.finish = FinishReason::stop;
        return false;
      }
      g.tokens.push_back(e.pick.token);
      g.logprobs.push_back(e.pick.logprob);
      g.finish = e.finished;
      if (stop_here && stop_here(i, g.tokens)) {
        g.finish = FinishReason::stop;
        return false;
      }
      return true;
    });
  }
  while (!scheduler.idle()) scheduler.step();
  return out;
}

}  // namespace jumbo
