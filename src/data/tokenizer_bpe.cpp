// Byte-level BPE (Hugging Face tokenizer.json): added-token splitting as tokenizers'
// AddedVocabulary does it, PCRE2 (UTF + UCP, JIT) for the pre-tokenizer's regexes, GPT-2's byte
// alphabet, merges by rank (a heap, lowest rank first, then leftmost, as tokenizers' Word), and
// a bounded per-thread cache of encoded words.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "jumbo/data/tokenizer_bpe.h"

#include <fmt/format.h>
#include <pcre2.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <tuple>

#include "jumbo/config/config.h"
#include "jumbo/data/utf8.h"

namespace jumbo {

// ----- UTF-8 --------------------------------------------------------------------------------

namespace {

size_t next_char(std::string_view s, size_t i) {
  ++i;
  while (i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) ++i;
  return i;
}

size_t prev_char(std::string_view s, size_t i) {
  --i;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

}  // namespace

// ----- PCRE2 --------------------------------------------------------------------------------

namespace {

// Per thread: match data (the whole match is all we read) and a JIT stack that may grow to
// 16 MiB, for long runs a backtracking pattern walks (a page of spaces).
struct ThreadMatch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 << 10, 16 << 20, nullptr);
  ThreadMatch() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~ThreadMatch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

ThreadMatch& thread_match() {
  thread_local ThreadMatch m;
  return m;
}

}  // namespace

struct ByteLevelBpe::Regex {
  pcre2_code* code = nullptr;
  Regex(const std::string& path, const std::string& field, const std::string& pattern,
        bool literal) {
    int err = 0;
    PCRE2_SIZE at = 0;
    const uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                         &err, &at, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw UserError(fmt::format("{}: {} = {}: not a regex PCRE2 accepts (at offset {}: {})",
                                  path, field, pattern, at, reinterpret_cast<const char*>(msg)));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // without JIT (not built in) it interprets
  }
  ~Regex() { pcre2_code_free(code); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The first match in s at or after `from` ([begin, end)); false when none. `anchored`: only
  // a match starting at `from`. s must be valid UTF-8 and `from` a character boundary.
  bool find(std::string_view s, size_t from, size_t& begin, size_t& end,
            bool anchored = false) const {
    ThreadMatch& m = thread_match();
    const uint32_t opts = PCRE2_NO_UTF_CHECK | (anchored ? PCRE2_ANCHORED : 0);
    int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), from, opts,
                         m.data, m.context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), from,
                       opts | PCRE2_NO_JIT, m.data, m.context);
    }
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw UserError(fmt::format("tokenizer regex failed on a text of {} bytes: {}", s.size(),
                                  reinterpret_cast<const char*>(msg)));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.data);
    begin = ov[0];
    end = ov[1];
    return true;
  }
};

// ----- added tokens -------------------------------------------------------------------------

// A byte trie of added tokens' contents: at each position the longest content starting there,
// the leftmost position first (aho-corasick's LeftmostLongest in tokenizers).
struct ByteLevelBpe::AddedMatcher {
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> next;
    int32_t token = -1;  // index into tokens
  };
  std::vector<Node> nodes{1};
  std::vector<AddedTokenSpec> tokens;
  bool first[256] = {};

  void add(const AddedTokenSpec& t) {
    if (t.content.empty()) return;
    int32_t at = 0;
    for (unsigned char c : t.content) {
      auto& nx = nodes[static_cast<size_t>(at)].next;
      auto it = std::find_if(nx.begin(), nx.end(), [c](const auto& p) { return p.first == c; });
      if (it != nx.end()) {
        at = it->second;
      } else {
        nodes[static_cast<size_t>(at)].next.emplace_back(c, static_cast<int32_t>(nodes.size()));
        at = static_cast<int32_t>(nodes.size());
        nodes.emplace_back();
      }
    }
    if (nodes[static_cast<size_t>(at)].token < 0) {
      nodes[static_cast<size_t>(at)].token = static_cast<int32_t>(tokens.size());
      tokens.push_back(t);
    }
    first[static_cast<unsigned char>(t.content[0])] = true;
  }

  // The longest content at s[i]: its token index and length, or -1.
  int32_t longest_at(std::string_view s, size_t i, size_t& len) const {
    int32_t at = 0, found = -1;
    for (size_t k = i; k < s.size(); ++k) {
      const auto& nx = nodes[static_cast<size_t>(at)].next;
      const unsigned char c = static_cast<unsigned char>(s[k]);
      auto it = std::find_if(nx.begin(), nx.end(), [c](const auto& p) { return p.first == c; });
      if (it == nx.end()) break;
      at = it->second;
      if (nodes[static_cast<size_t>(at)].token >= 0) {
        found = nodes[static_cast<size_t>(at)].token;
        len = k + 1 - i;
      }
    }
    return found;
  }
};

namespace {

struct Segment {
  size_t begin, end;
  int32_t added_id;  // -1: text to pre-tokenize
};

}  // namespace

// ----- ByteLevelBpe -------------------------------------------------------------------------

ByteLevelBpe::~ByteLevelBpe() = default;

ByteLevelBpe::ByteLevelBpe(BpeSpec spec)
    : path_(spec.path),
      vocab_(std::move(spec.vocab)),
      ignore_merges_(spec.ignore_merges),
      add_prefix_space_(spec.add_prefix_space),
      nfc_(spec.nfc),
      post_processor_(spec.post_processor),
      document_start_(spec.document_start),
      eos_id_(spec.eos_id),
      bos_id_(spec.bos_id) {
  static std::atomic<uint64_t> serials{0};
  serial_ = ++serials;
  // GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
  // for U+0100 onwards in byte order.
  uint32_t shifted = 256;
  for (int b = 0; b < 256; ++b) {
    const bool kept = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    append_utf8(byte_chars_[b], kept ? static_cast<uint32_t>(b) : shifted++);
  }
  std::unordered_map<std::string, unsigned char> char_bytes;
  for (int b = 0; b < 256; ++b) char_bytes[byte_chars_[b]] = static_cast<unsigned char>(b);

  int64_t size = 0;
  for (const auto& [text, id] : vocab_) size = std::max<int64_t>(size, int64_t{id} + 1);
  for (const auto& t : spec.added) size = std::max<int64_t>(size, int64_t{t.id} + 1);
  pieces_.assign(static_cast<size_t>(size), {});
  bytes_.assign(static_cast<size_t>(size), {});
  kinds_.assign(static_cast<size_t>(size), kUnused);
  for (const auto& [text, id] : vocab_) {
    const auto i = static_cast<size_t>(id);
    pieces_[i] = text;
    kinds_[i] = kVocab;
    // tokenizers' ByteLevel decoder: a token all of whose characters are in the alphabet is
    // those bytes; any other token stands for its own UTF-8.
    std::string bytes;
    bool all = true;
    for (size_t k = 0; k < text.size() && all;) {
      const size_t n = std::max<size_t>(1, next_char(text, k) - k);
      auto it = char_bytes.find(text.substr(k, n));
      if (it == char_bytes.end()) all = false;
      else bytes += static_cast<char>(it->second);
      k += n;
    }
    bytes_[i] = all ? bytes : text;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(byte_chars_[b]);
    if (it == vocab_.end()) {
      throw UserError(fmt::format(
          "{}: model.vocab lacks \"{}\", the byte-level character of byte 0x{:02X}: not a "
          "byte-level BPE vocabulary (jumbo needs all 256)",
          path_, byte_chars_[b], b));
    }
    byte_ids_[b] = it->second;
  }
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const auto& [a, b] = spec.merges[rank];
    const auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
    const char* missing = ia == vocab_.end()    ? a.c_str()
                          : ib == vocab_.end()  ? b.c_str()
                          : iab == vocab_.end() ? "their concatenation"
                                                : nullptr;
    if (missing != nullptr) {
      throw UserError(fmt::format(
          "{}: model.merges[{}] = \"{} {}\": {} is not in model.vocab", path_, rank, a, b,
          missing == a.c_str() || missing == b.c_str() ? fmt::format("\"{}\"", missing)
                                                       : std::string(missing)));
    }
    const uint64_t key = (uint64_t{static_cast<uint32_t>(ia->second)} << 32) |
                         static_cast<uint32_t>(ib->second);
    merges_.try_emplace(key, static_cast<int32_t>(rank), iab->second);  // the first rank wins
  }
  unnormalized_ = std::make_unique<AddedMatcher>();
  normalized_ = std::make_unique<AddedMatcher>();
  for (const auto& t : spec.added) {
    const auto i = static_cast<size_t>(t.id);
    pieces_[i] = t.content;
    bytes_[i] = t.content;
    kinds_[i] = kAdded;
    added_ids_[t.content] = t.id;
    (t.normalized ? normalized_ : unnormalized_)->add(t);
  }
  for (size_t k = 0; k < spec.split_regexes.size(); ++k) {
    splits_.push_back(std::make_unique<Regex>(
        path_, fmt::format("pre_tokenizer Split pattern {}", k), spec.split_regexes[k],
        k < spec.split_literal.size() && spec.split_literal[k]));
  }
  if (spec.byte_level_regex) {
    byte_level_regex_ =
        std::make_unique<Regex>(path_, "pre_tokenizer ByteLevel regex", kGpt2SplitRegex, false);
  }
  space_ = std::make_unique<Regex>(path_, "whitespace", R"(\s)", false);
  word_ = std::make_unique<Regex>(path_, "word", R"(\w)", false);
}

std::optional<int32_t> ByteLevelBpe::token_id(std::string_view text) const {
  const std::string key(text);
  if (auto it = added_ids_.find(key); it != added_ids_.end()) return it->second;
  if (auto it = vocab_.find(key); it != vocab_.end()) return it->second;
  return std::nullopt;
}

std::string ByteLevelBpe::piece(int32_t id) const {
  return id >= 0 && id < vocab_size() ? pieces_[static_cast<size_t>(id)] : std::string();
}

bool ByteLevelBpe::is_learned(int32_t id) const {
  return id >= 0 && id < vocab_size() && kinds_[static_cast<size_t>(id)] == kVocab;
}

std::string ByteLevelBpe::token_bytes(int32_t id) const {
  return id >= 0 && id < vocab_size() ? bytes_[static_cast<size_t>(id)] : std::string();
}

std::string ByteLevelBpe::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      throw UserError(fmt::format("{}: cannot decode id {}: outside the vocabulary [0, {})",
                                  path_, id, vocab_size()));
    }
    out += bytes_[static_cast<size_t>(id)];
  }
  // Byte-level tokens may cut a character: lossy, as tokenizers' from_utf8_lossy.
  return is_valid_utf8(out) ? out : sanitize_utf8(out);
}

namespace {

bool is_char(const ByteLevelBpe::Regex& re, std::string_view s, size_t at) {
  size_t b = 0, e = 0;
  return re.find(s, at, b, e, /*anchored=*/true) && e > b;
}

// tokenizers' AddedVocabulary::find_matches on s: the matches of `m`, honouring single_word,
// lstrip (the match takes the whitespace before it) and rstrip (and after it).
template <class Matcher>
void split_added(const Matcher& m, const ByteLevelBpe::Regex& space, const ByteLevelBpe::Regex& word,
                 std::string_view s, std::vector<Segment>& out) {
  size_t offset = 0;  // end of the last match
  for (size_t i = 0; i < s.size();) {
    size_t len = 0;
    const int32_t t = m.first[static_cast<unsigned char>(s[i])] ? m.longest_at(s, i, len) : -1;
    if (t < 0) {
      ++i;
      continue;
    }
    const AddedTokenSpec& tok = m.tokens[static_cast<size_t>(t)];
    size_t start = i, stop = i + len;
    if (tok.single_word) {
      const bool word_before = start > 0 && is_char(word, s, prev_char(s, start));
      const bool word_after = stop < s.size() && is_char(word, s, stop);
      if (word_before || word_after) {  // not a word of its own: left as text
        i = stop;
        continue;
      }
    }
    if (tok.lstrip) {
      size_t b = start;
      while (b > offset && is_char(space, s, prev_char(s, b))) b = prev_char(s, b);
      start = b;
    }
    if (tok.rstrip) {
      while (stop < s.size() && is_char(space, s, stop)) stop = next_char(s, stop);
    }
    if (offset < start) out.push_back({offset, start, -1});
    out.push_back({start, stop, tok.id});
    offset = stop;
    i = stop;
  }
  if (offset < s.size()) out.push_back({offset, s.size(), -1});
}

// Calls fn(piece) for the pieces of s that `re` splits it into, Isolated: each match and each
// non-empty stretch between matches, in order.
template <class Fn>
void split_isolated(const ByteLevelBpe::Regex& re, std::string_view s, Fn&& fn) {
  size_t from = 0, last = 0, b = 0, e = 0;
  while (from < s.size() && re.find(s, from, b, e)) {
    if (e == b) {  // an empty match splits nothing
      from = next_char(s, b);
      continue;
    }
    if (b > last) fn(s.substr(last, b - last));
    fn(s.substr(b, e - b));
    last = from = e;
  }
  if (last < s.size()) fn(s.substr(last));
}

// Per thread, for the tokenizer that used it last: words (pre-tokens' bytes) to their ids.
struct WordCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<int32_t>> ids;
};
constexpr size_t kCacheWords = 1 << 16;
constexpr size_t kCacheWordBytes = 64;

}  // namespace

std::vector<int32_t> ByteLevelBpe::encode(const std::string& text) const {
  std::string cleaned;
  std::string_view s = text;
  if (!is_valid_utf8(s)) {
    cleaned = sanitize_utf8(s);
    s = cleaned;
  }
  std::vector<int32_t> out;
  out.reserve(s.size() / 3 + 1);
  std::vector<Segment> first, second;
  split_added(*unnormalized_, *space_, *word_, s, first);
  for (const Segment& seg : first) {
    if (seg.added_id >= 0) {
      out.push_back(seg.added_id);
      continue;
    }
    std::string_view part = s.substr(seg.begin, seg.end - seg.begin);
    // As HF's AddedVocabulary: the normalizer runs on the text between unnormalized added
    // tokens, then the normalized ones are split out of its output.
    std::string normalized;
    if (nfc_) {
      normalized = nfc_normalized(part);
      part = normalized;
    }
    second.clear();
    split_added(*normalized_, *space_, *word_, part, second);
    for (const Segment& sub : second) {
      if (sub.added_id >= 0) out.push_back(sub.added_id);
      else encode_section(part.substr(sub.begin, sub.end - sub.begin), out);
    }
  }
  return out;
}

void ByteLevelBpe::encode_section(std::string_view text, std::vector<int32_t>& out) const {
  // Each Split regex cuts every piece of the one before; then ByteLevel.
  const auto byte_level = [&](std::string_view piece) {
    std::string prefixed;
    if (add_prefix_space_ && (piece.empty() || piece[0] != ' ')) {
      prefixed.reserve(piece.size() + 1);
      prefixed += ' ';
      prefixed.append(piece);
      piece = prefixed;
    }
    if (byte_level_regex_) {
      split_isolated(*byte_level_regex_, piece, [&](std::string_view w) { encode_word(w, out); });
    } else {
      encode_word(piece, out);
    }
  };
  std::function<void(std::string_view, size_t)> level = [&](std::string_view piece, size_t k) {
    if (k == splits_.size()) return byte_level(piece);
    split_isolated(*splits_[k], piece, [&](std::string_view p) { level(p, k + 1); });
  };
  level(text, 0);
}

void ByteLevelBpe::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (word.size() == 1) {
    out.push_back(byte_ids_[static_cast<unsigned char>(word[0])]);
    return;
  }
  thread_local WordCache cache;
  const bool cached = word.size() <= kCacheWordBytes;
  if (cached) {
    if (cache.owner != serial_) {
      cache.ids.clear();
      cache.owner = serial_;
    }
    if (auto it = cache.ids.find(std::string(word)); it != cache.ids.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t from = out.size();
  bool whole = false;
  if (ignore_merges_) {  // a word that is itself a token is that token (Llama 3)
    std::string chars;
    for (unsigned char c : word) chars += byte_chars_[c];
    if (auto it = vocab_.find(chars); it != vocab_.end()) {
      out.push_back(it->second);
      whole = true;
    }
  }
  if (!whole) merge_word(word, out);
  if (cached) {
    if (cache.ids.size() >= kCacheWords) cache.ids.clear();
    cache.ids.emplace(std::string(word), std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(from), out.end()));
  }
}

void ByteLevelBpe::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id, prev, next;
  };
  // (rank, position, merged id), smallest rank then leftmost position first.
  using Merge = std::tuple<int32_t, int32_t, int32_t>;
  thread_local std::vector<Symbol> sym;
  thread_local std::vector<Merge> heap;
  const auto n = static_cast<int32_t>(word.size());
  sym.resize(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    sym[static_cast<size_t>(i)] = {byte_ids_[static_cast<unsigned char>(word[static_cast<size_t>(i)])],
                                   i - 1, i + 1 < n ? i + 1 : -1};
  }
  const auto pair_of = [&](int32_t left, int32_t right) -> const std::pair<int32_t, int32_t>* {
    const uint64_t key = (uint64_t{static_cast<uint32_t>(left)} << 32) | static_cast<uint32_t>(right);
    auto it = merges_.find(key);
    return it == merges_.end() ? nullptr : &it->second;
  };
  heap.clear();
  const auto push = [&](int32_t pos) {
    const Symbol& s = sym[static_cast<size_t>(pos)];
    if (s.next < 0) return;
    if (const auto* m = pair_of(s.id, sym[static_cast<size_t>(s.next)].id)) {
      heap.emplace_back(m->first, pos, m->second);
      std::push_heap(heap.begin(), heap.end(), std::greater<>{});
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>{});
    const auto [rank, pos, merged] = heap.back();
    heap.pop_back();
    Symbol& s = sym[static_cast<size_t>(pos)];
    if (s.id < 0 || s.next < 0) continue;
    Symbol& right = sym[static_cast<size_t>(s.next)];
    const auto* m = pair_of(s.id, right.id);
    if (m == nullptr || m->second != merged) continue;  // stale: a neighbour changed
    s.id = merged;
    right.id = -1;
    s.next = right.next;
    if (s.next >= 0) sym[static_cast<size_t>(s.next)].prev = pos;
    if (s.prev >= 0) push(s.prev);
    push(pos);
  }
  for (int32_t i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) out.push_back(sym[static_cast<size_t>(i)].id);
}

}  // namespace jumbo
