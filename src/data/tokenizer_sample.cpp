// The tokenizer's training sample: every input streamed once, a bottom-k sample of its
// sentences kept under a byte budget. Inputs of any size pass through in constant memory.
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string_view>

#include "jumbo/config/config.h"
#include "jumbo/config/hashing.h"
#include "jumbo/data/prepare.h"
#include "jumbo/data/tokenizer.h"
#include "prepare_input.h"

namespace jumbo {
namespace {

// The key depends only on where the sentence is, so a sentence's fate does not depend on
// what else was read, in what order, by how many threads.
uint64_t sentence_key(uint64_t seed, uint64_t input, uint64_t line, uint64_t part) {
  return splitmix64(splitmix64(splitmix64(splitmix64(seed) ^ input) ^ line) ^ part);
}

// Opens for streaming with a large buffer; `buffer` must outlive the stream.
void open_input(std::ifstream& in, const std::string& path, std::vector<char>& buffer) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw UserError(fmt::format("{}: is a directory, expected a .jsonl or text file", path));
  }
  buffer.resize(size_t{1} << 20);
  in.rdbuf()->pubsetbuf(buffer.data(), static_cast<std::streamsize>(buffer.size()));
  in.open(path, std::ios::binary);
  if (!in) throw UserError(fmt::format("{}: cannot open ({})", path, std::strerror(errno)));
}

void check_read(const std::ifstream& in, const std::string& path) {
  if (in.bad()) throw UserError(fmt::format("{}: read error ({})", path, std::strerror(errno)));
}

bool blank(const std::string& line) { return line.find_first_not_of(" \t\r") == std::string::npos; }

// The document of one JSON line; errors name file, line and what was expected.
std::string parse_json_line(const std::string& line, const std::string& path, int64_t line_no,
                            const std::string& json_key) {
  std::string doc;
  const std::string why = document_of_json_line(line, json_key, doc);
  if (!why.empty()) throw UserError(fmt::format("{}:{}: {}", path, line_no, why));
  return doc;
}

// The smallest-key sentences whose total fits the byte (and count) budget. A max-heap on the
// key; once anything has been evicted, keys at or above the smallest evicted key can never
// enter again (everything kept is smaller), so the final set is exactly the longest prefix in
// key order that fits, whatever the order of offers.
class BottomK {
 public:
  struct Entry {
    uint64_t key;
    int32_t input;
    std::string text;
  };

  BottomK(int64_t budget_bytes, int64_t max_count) : budget_(budget_bytes), max_count_(max_count) {}

  bool may_enter(uint64_t key) const { return !full_ || key < threshold_; }

  void offer(uint64_t key, int32_t input, std::string_view text) {
    if (!may_enter(key)) return;
    heap_.push_back({key, input, std::string(text)});
    std::push_heap(heap_.begin(), heap_.end(), by_key);
    bytes_ += static_cast<int64_t>(text.size());
    while (bytes_ > budget_ ||
           (max_count_ > 0 && static_cast<int64_t>(heap_.size()) > max_count_)) {
      std::pop_heap(heap_.begin(), heap_.end(), by_key);
      full_ = true;
      threshold_ = heap_.back().key;
      bytes_ -= static_cast<int64_t>(heap_.back().text.size());
      heap_.pop_back();
    }
  }

  int64_t bytes() const { return bytes_; }
  std::vector<Entry> take_sorted() {
    std::sort_heap(heap_.begin(), heap_.end(), by_key);
    return std::move(heap_);
  }

 private:
  static bool by_key(const Entry& a, const Entry& b) { return a.key < b.key; }
  int64_t budget_, max_count_;
  int64_t bytes_ = 0;
  bool full_ = false;
  uint64_t threshold_ = std::numeric_limits<uint64_t>::max();
  std::vector<Entry> heap_;
};

// Offers the non-empty lines of a document: part j is the document's j-th line.
void offer_paragraphs(BottomK& sample, SampleStats& stats, const std::string& doc, uint64_t seed,
                      int32_t input, int64_t line_no) {
  uint64_t part = 0;
  size_t begin = 0;
  while (begin <= doc.size()) {
    size_t end = doc.find('\n', begin);
    if (end == std::string::npos) end = doc.size();
    const size_t len = end - begin;
    if (len > 0) {
      ++stats.sentences_seen;
      if (static_cast<int64_t>(len) > kMaxSentenceBytes) {
        ++stats.too_long;
      } else {
        sample.offer(sentence_key(seed, input, line_no, part), input,
                     std::string_view(doc).substr(begin, len));
      }
    }
    ++part;
    begin = end + 1;
  }
}

// True if no paragraph of this raw JSON line can enter: a document has at most one more
// line than the line holds "\n" escapes. A "\u" escape could hide a newline, so such lines
// are always parsed.
bool cannot_enter(const BottomK& sample, const std::string& raw, uint64_t seed, int32_t input,
                  int64_t line_no) {
  if (raw.find("\\u") != std::string::npos) return false;
  uint64_t parts = 1;
  for (size_t at = raw.find("\\n"); at != std::string::npos; at = raw.find("\\n", at + 2)) ++parts;
  for (uint64_t part = 0; part < parts; ++part) {
    if (sample.may_enter(sentence_key(seed, input, line_no, part))) return false;
  }
  return true;
}

// Streams the lines of `path` (numbered from 1) to on_line, counting the bytes and lines read.
template <class OnLine>
void stream_lines(SampleStats& stats, const std::string& path, OnLine&& on_line) {
  std::ifstream in;
  std::vector<char> buffer;
  open_input(in, path, buffer);
  std::string line;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    stats.bytes_read += static_cast<int64_t>(line.size()) + (in.eof() ? 0 : 1);
    ++stats.lines_read;
    on_line(line, line_no);
  }
  check_read(in, path);
}

void sample_jsonl(BottomK& sample, SampleStats& stats, const std::string& path, int32_t input,
                  uint64_t seed) {
  stream_lines(stats, path, [&](const std::string& line, int64_t line_no) {
    if (blank(line)) return;
    if (cannot_enter(sample, line, seed, input, line_no)) {
      // Not parsed, so only checked to look like one object: a skipped line could still
      // lack the key. Parsing it would cost more than reading it.
      const size_t first = line.find_first_not_of(" \t\r");
      const size_t last = line.find_last_not_of(" \t\r");
      if (line[first] != '{' || line[last] != '}') {
        throw UserError(fmt::format("{}:{}: not valid JSON (expected one JSON object per line)",
                                    path, line_no));
      }
      ++stats.lines_not_parsed;
      return;
    }
    offer_paragraphs(sample, stats, parse_json_line(line, path, line_no, "text"), seed, input,
                     line_no);
  });
}

// A text file is one document; its lines are streamed, each keyed by its line number.
void sample_text(BottomK& sample, SampleStats& stats, const std::string& path, int32_t input,
                 uint64_t seed) {
  stream_lines(stats, path, [&](const std::string& line, int64_t line_no) {
    offer_paragraphs(sample, stats, line, seed, input, line_no);
  });
}

}  // namespace

void for_each_input_document(const std::string& path, const std::string& json_key,
                             const std::function<void(const std::string&, int64_t)>& fn) {
  std::ifstream in;
  std::vector<char> buffer;
  open_input(in, path, buffer);
  if (!is_jsonl(path)) {
    const std::string doc{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    check_read(in, path);
    fn(doc, 0);
    return;
  }
  std::string line;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    if (blank(line)) continue;
    fn(parse_json_line(line, path, line_no, json_key), line_no);
  }
  check_read(in, path);
}

SentenceSample sample_training_sentences(const TokenizerTrainOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  SentenceSample out;
  SampleStats& stats = out.stats;
  BottomK sample(opts.sample_bytes, opts.input_sentence_size);
  // Files or quoted patterns ('corpus/*.jsonl'), expanded as `data prepare` does.
  const std::vector<std::string> inputs = expand_inputs(opts.inputs);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string& path = inputs[i];
    const auto input = static_cast<int32_t>(i);
    if (is_jsonl(path)) {
      sample_jsonl(sample, stats, path, input, opts.seed);
    } else {
      sample_text(sample, stats, path, input, opts.seed);
    }
  }
  stats.files = static_cast<int64_t>(inputs.size());
  stats.sampled_bytes = sample.bytes();
  stats.sampled_per_input.assign(inputs.size(), 0);
  auto entries = sample.take_sorted();
  out.sentences.reserve(entries.size());
  for (auto& e : entries) {
    ++stats.sampled_per_input[static_cast<size_t>(e.input)];
    out.sentences.push_back(std::move(e.text));
  }
  stats.sampled_sentences = static_cast<int64_t>(out.sentences.size());
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace jumbo
