#include "jumbo/infer/cloze.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "jumbo/infer/completion_text.h"

namespace jumbo {

std::vector<ClozeItem> read_cloze_task(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UserError(fmt::format("{}: cannot open the task file", path));
  std::vector<ClozeItem> items;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    auto bad = [&](const std::string& what) {
      return UserError(fmt::format("{}:{}: {}", path, n, what));
    };
    if (j.is_discarded() || !j.is_object()) throw bad("not a JSON object");
    ClozeItem item;
    if (!j.contains("context") || !j["context"].is_string()) throw bad("\"context\": expected a string");
    item.context = j["context"].get<std::string>();
    if (!j.contains("continuations") || !j["continuations"].is_array() || j["continuations"].empty()) {
      throw bad("\"continuations\": expected a non-empty array of strings");
    }
    for (const auto& c : j["continuations"]) {
      if (!c.is_string() || c.get<std::string>().empty()) {
        throw bad("\"continuations\": expected non-empty strings");
      }
      item.continuations.push_back(c.get<std::string>());
    }
    if (!j.contains("answer") || !j["answer"].is_number_integer()) throw bad("\"answer\": expected an integer");
    item.answer = j["answer"].get<int64_t>();
    if (item.answer < 0 || item.answer >= static_cast<int64_t>(item.continuations.size())) {
      throw bad(fmt::format("\"answer\": {} is not an index of the {} continuations", item.answer,
                            item.continuations.size()));
    }
    items.push_back(std::move(item));
  }
  if (items.empty()) throw UserError(fmt::format("{}: no items", path));
  return items;
}

std::optional<ClozeScoring> parse_cloze_scoring(const std::string& name) {
  if (name == "whole") return ClozeScoring::whole;
  if (name == "boundary") return ClozeScoring::boundary;
  return std::nullopt;
}

const char* to_string(ClozeScoring s) { return s == ClozeScoring::whole ? "whole" : "boundary"; }

namespace {

// The characters `tokens` add after `context` (both whole token lists, decoded as one
// document): decode(context + tokens) minus decode(context), or, where the context's text
// ends in bytes of a character the tokens finish, the tokens' own texts (token_texts).
std::string scored_text(const Tokenizer& tokenizer, const std::vector<int32_t>& context,
                        const std::vector<int32_t>& tokens) {
  std::vector<int32_t> all(context);
  all.insert(all.end(), tokens.begin(), tokens.end());
  const std::string whole = tokenizer.decode(all), head = tokenizer.decode(context);
  if (whole.compare(0, head.size(), head) == 0) return whole.substr(head.size());
  const std::vector<std::string> texts = token_texts(tokenizer, all);
  std::string out;
  for (size_t i = context.size(); i < texts.size(); ++i) out += texts[i];
  return out;
}

}  // namespace

PairTokens split_pair(const Tokenizer& tokenizer, const std::string& context,
                      const std::string& continuation, ClozeScoring scoring) {
  PairTokens p;
  if (scoring == ClozeScoring::whole) {
    // As lm-evaluation-harness does: the pair encoded whole (a continuation encoded alone
    // would start a new word piece), split after the context's own token count.
    const size_t ctx = encode_prompt(tokenizer, context).size();
    const std::vector<int32_t> whole = encode_prompt(tokenizer, context + continuation);
    const size_t split = std::min(ctx, whole.size() - 1);  // at least one scored token
    p.context.assign(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(split));
    p.continuation.assign(whole.begin() + static_cast<std::ptrdiff_t>(split), whole.end());
  } else {
    p.context = encode_prompt(tokenizer, context);
    // After an empty context the continuation starts the document: encoded as documents are.
    p.continuation = context.empty() ? tokenizer.encode(continuation)
                                     : encode_after_boundary(tokenizer, continuation);
  }
  return p;
}

SeamCounts count_seams(const Tokenizer& tokenizer, const std::vector<ClozeItem>& items) {
  SeamCounts n;
  for (const ClozeItem& item : items) {
    const std::vector<int32_t> own = encode_prompt(tokenizer, item.context);
    const std::string own_text = tokenizer.decode(own);
    for (const std::string& c : item.continuations) {
      const PairTokens p = split_pair(tokenizer, item.context, c, ClozeScoring::whole);
      const std::string head = tokenizer.decode(p.context);
      ++n.pairs;
      if (head.size() > own_text.size() && head.compare(0, own_text.size(), own_text) == 0) {
        ++n.merged;
      } else if (p.context != own) {
        ++n.changed;
        n.cut_inside += head != own_text;
      }
    }
  }
  return n;
}

std::string describe_seams(const SeamCounts& c) {
  return fmt::format(
      "{} pairs, {} merge the continuation into the context's last piece, {} more change the "
      "context's tokens ({} of them cut inside the context); whole rule",
      c.pairs, c.merged, c.changed, c.cut_inside);
}

namespace {

// Every (item, continuation) pair as one window: the pair's tokens, cut from the left to
// seq + 1, inputs and targets padded after the end; the continuation's targets are scored.
class PairWindows final : public WindowSource {
 public:
  PairWindows(std::vector<std::vector<int32_t>> contexts, std::vector<std::vector<int32_t>> conts,
              int64_t seq)
      : contexts_(std::move(contexts)), conts_(std::move(conts)), seq_(seq) {}
  int64_t count() const override { return static_cast<int64_t>(conts_.size()); }
  void window(int64_t k, WindowTokens& out) const override {
    const auto& ctx = contexts_[static_cast<size_t>(k)];
    const auto& cont = conts_[static_cast<size_t>(k)];
    std::vector<int32_t> all(ctx);
    all.insert(all.end(), cont.begin(), cont.end());
    const int64_t len = std::min<int64_t>(static_cast<int64_t>(all.size()), seq_ + 1);
    const int32_t* p = all.data() + all.size() - static_cast<size_t>(len);
    std::fill(out.tokens, out.tokens + seq_, 0);
    std::fill(out.targets, out.targets + seq_, 0);
    std::copy(p, p + len - 1, out.tokens);
    std::copy(p + 1, p + len, out.targets);
    out.end_scored = len - 1;
    out.first_scored = out.end_scored - static_cast<int64_t>(cont.size());
  }
  bool truncated(int64_t k) const {
    return static_cast<int64_t>(contexts_[static_cast<size_t>(k)].size() +
                                conts_[static_cast<size_t>(k)].size()) > seq_ + 1;
  }

 private:
  std::vector<std::vector<int32_t>> contexts_, conts_;
  int64_t seq_;
};

std::vector<char> pack(const std::vector<std::vector<int32_t>>& lists) {
  std::vector<char> out;
  for (const auto& l : lists) {
    const int64_t n = static_cast<int64_t>(l.size());
    const size_t at = out.size();
    out.resize(at + sizeof(n) + l.size() * sizeof(int32_t));
    std::memcpy(out.data() + at, &n, sizeof(n));
    if (n > 0) std::memcpy(out.data() + at + sizeof(n), l.data(), l.size() * sizeof(int32_t));
  }
  return out;
}

std::vector<std::vector<int32_t>> unpack(const std::vector<char>& in) {
  std::vector<std::vector<int32_t>> out;
  for (size_t at = 0; at < in.size();) {
    int64_t n = 0;
    std::memcpy(&n, in.data() + at, sizeof(n));
    at += sizeof(n);
    std::vector<int32_t> l(static_cast<size_t>(n));
    if (n > 0) std::memcpy(l.data(), in.data() + at, l.size() * sizeof(int32_t));
    at += l.size() * sizeof(int32_t);
    out.push_back(std::move(l));
  }
  return out;
}

}  // namespace

ClozeResult evaluate_cloze(Evaluator& ev, const Tokenizer* tokenizer,
                           const std::vector<ClozeItem>& items, ClozeScoring scoring) {
  Comm& world = ev.world();
  // Rank 0 tokenizes; every rank gets the pairs' tokens (contexts, then continuations).
  std::vector<std::vector<int32_t>> contexts, conts;
  std::vector<char> bytes;
  if (world.rank() == 0) {
    std::vector<std::vector<int32_t>> lists;
    for (const ClozeItem& item : items) {
      for (const std::string& c : item.continuations) {
        PairTokens p = split_pair(*tokenizer, item.context, c, scoring);
        lists.push_back(std::move(p.context));
        lists.push_back(std::move(p.continuation));
      }
    }
    bytes = pack(lists);
  }
  world.broadcast_bytes(bytes, 0);
  const std::vector<std::vector<int32_t>> lists = unpack(bytes);
  for (size_t i = 0; i + 1 < lists.size(); i += 2) {
    contexts.push_back(lists[i]);
    conts.push_back(lists[i + 1]);
  }
  for (const auto& c : conts) {
    if (c.empty()) throw UserError("jumbo eval: a continuation encodes to no tokens");
  }
  PairWindows source(contexts, conts, ev.seq());
  // Each holder's (pair, loglikelihood) results, gathered on rank 0.
  std::vector<char> mine;
  ev.score(source, [&](int64_t k, std::span<const float> losses) {
    double ll = 0;
    for (float l : losses) ll -= l;
    const size_t at = mine.size();
    mine.resize(at + sizeof(k) + sizeof(ll));
    std::memcpy(mine.data() + at, &k, sizeof(k));
    std::memcpy(mine.data() + at + sizeof(k), &ll, sizeof(ll));
  });
  const std::vector<std::vector<char>> all = world.gather_bytes(mine, 0);
  ClozeResult r;
  r.scoring = scoring;
  if (world.rank() != 0) return r;
  r.seams = count_seams(*tokenizer, items);
  std::vector<double> ll(conts.size(), 0.0);
  for (const std::vector<char>& part : all) {
    for (size_t at = 0; at + 16 <= part.size(); at += 16) {
      int64_t k = 0;
      double v = 0;
      std::memcpy(&k, part.data() + at, 8);
      std::memcpy(&v, part.data() + at + 8, 8);
      ll[static_cast<size_t>(k)] = v;
    }
  }
  size_t pair = 0;
  int64_t right = 0, right_norm = 0;
  for (const ClozeItem& item : items) {
    ItemScore s;
    s.answer = item.answer;
    s.context_tokens = contexts[pair];
    for (size_t c = 0; c < item.continuations.size(); ++c, ++pair) {
      r.truncated += source.truncated(static_cast<int64_t>(pair));
      std::string text = scored_text(*tokenizer, contexts[pair], conts[pair]);
      if (scoring == ClozeScoring::boundary && text != item.continuations[c]) {
        throw UserError(fmt::format(
            "jumbo eval --scoring boundary: item {}'s continuation {} decodes back from its "
            "tokens as {} (a tokenizer that normalizes text?)",
            r.items.size(), nlohmann::json(item.continuations[c]).dump(), nlohmann::json(text).dump()));
      }
      s.continuations.push_back({contexts[pair], conts[pair], std::move(text), ll[pair],
                                 static_cast<int64_t>(item.continuations[c].size())});
    }
    for (size_t c = 1; c < s.continuations.size(); ++c) {
      const ContinuationScore& a = s.continuations[c];
      if (a.loglikelihood > s.continuations[s.predicted].loglikelihood) s.predicted = static_cast<int64_t>(c);
      const ContinuationScore& b = s.continuations[static_cast<size_t>(s.predicted_norm)];
      if (a.loglikelihood / a.bytes > b.loglikelihood / b.bytes) s.predicted_norm = static_cast<int64_t>(c);
    }
    right += s.predicted == s.answer;
    right_norm += s.predicted_norm == s.answer;
    r.items.push_back(std::move(s));
  }
  r.accuracy = static_cast<double>(right) / static_cast<double>(items.size());
  r.accuracy_norm = static_cast<double>(right_norm) / static_cast<double>(items.size());
  return r;
}

}  // namespace jumbo
