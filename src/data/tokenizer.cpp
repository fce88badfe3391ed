// SentencePiece tokenizer: option checks, training through the C++ trainer API on the sample
// (sentences are handed over from memory, no temporary text file); the Tokenizer facade
// (a SentencePiece .model or a tokenizer.json: tokenizer_model.h), and inspection of a
// vocabulary.
#include "jumbo/data/tokenizer.h"
#include "jumbo/data/utf8.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>
#include <thread>
#include <unordered_map>

#include "jumbo/config/config.h"
#include "jumbo/config/hashing.h"

// Exported by libsentencepiece but not declared in its public headers: the trainer logs every
// EM iteration to stderr unless the level is raised.
namespace sentencepiece::logging {
void SetMinLogLevel(int level);
}

namespace jumbo {
namespace {

constexpr int kMaxPieceLength = 64;
constexpr int kMaxThreads = 128;  // SentencePiece refuses more
constexpr int kMaxVocab = 4000000;
constexpr int64_t kMinSampleBytes = 1024;
constexpr int64_t kMaxSampleBytes = int64_t{16} << 30;
// Above this the trainer's int32 suffix array could overflow (characters plus one boundary a
// sentence), so it switches to int64 indices, which doubles its memory.
constexpr int64_t kInt32SuffixArrayBytes = int64_t{1} << 30;

// Feeds the trainer the sample, freeing each sentence once the trainer has copied it, so the
// sample and the trainer's copy are not both held in full.
class SampleIterator : public sentencepiece::SentenceIterator {
 public:
  explicit SampleIterator(std::vector<std::string>& lines) : lines_(lines) {}
  bool done() const override { return next_ >= lines_.size(); }
  void Next() override { std::string().swap(lines_[next_++]); }
  const std::string& value() const override { return lines_[next_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  std::vector<std::string>& lines_;
  size_t next_ = 0;
};

[[noreturn]] void bad_option(const std::string& flag, const std::string& value,
                             const std::string& expected) {
  throw UserError(fmt::format("tokenizer training: {} {}: expected {}", flag, value, expected));
}

int trainer_threads(int requested) {
  if (requested > 0) return requested;
  return static_cast<int>(
      std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, kMaxThreads));
}

}  // namespace

void check_tokenizer_options(const TokenizerTrainOptions& o) {
  if (o.inputs.empty()) throw UserError("tokenizer training: no input files given (--input)");
  if (o.model_prefix.empty())
    throw UserError("tokenizer training: no model prefix given (--output)");
  const std::vector<std::string> types = {"unigram", "bpe", "char", "word"};
  if (std::find(types.begin(), types.end(), o.model_type) == types.end()) {
    bad_option("--model-type", o.model_type, "unigram, bpe, char or word");
  }
  // Byte fallback needs its 256 byte pieces plus <unk>, <s>, </s> before any learned piece.
  const int min_vocab = o.byte_fallback ? 260 : 4;
  if (o.vocab_size < min_vocab || o.vocab_size > kMaxVocab) {
    bad_option("--vocab-size", std::to_string(o.vocab_size),
               fmt::format("{} .. {} pieces{}", min_vocab, kMaxVocab,
                           o.byte_fallback ? " (byte fallback takes 259)" : ""));
  }
  if (o.sample_bytes < kMinSampleBytes || o.sample_bytes > kMaxSampleBytes) {
    bad_option("--sample-bytes", std::to_string(o.sample_bytes),
               fmt::format("{} .. {} bytes (suffixes K, M, G: binary units)", kMinSampleBytes,
                           kMaxSampleBytes));
  }
  if (o.input_sentence_size < 0) {
    bad_option("--input-sentence-size", std::to_string(o.input_sentence_size),
               "0 (no limit) or a number of sentences");
  }
  if (o.max_piece_length < 1 || o.max_piece_length > kMaxPieceLength) {
    bad_option("--max-piece-length", std::to_string(o.max_piece_length),
               fmt::format("1 .. {} characters", kMaxPieceLength));
  }
  if (o.model_type == "unigram" && (o.seed_pieces < o.vocab_size || o.seed_pieces > 100000000)) {
    bad_option("--seed-pieces", std::to_string(o.seed_pieces),
               fmt::format("{} (--vocab-size) .. 100000000 unigram candidates", o.vocab_size));
  }
  if (o.threads < 0 || o.threads > kMaxThreads) {
    bad_option("--threads", std::to_string(o.threads),
               fmt::format("0 (all cores) .. {}", kMaxThreads));
  }
}

double train_tokenizer_on(SentenceSample&& sample, const TokenizerTrainOptions& opts) {
  check_tokenizer_options(opts);
  const auto t0 = std::chrono::steady_clock::now();
  const SampleStats stats = sample.stats;
  if (sample.sentences.empty()) {
    throw UserError(
        fmt::format("tokenizer training: {} holds no text", fmt::join(opts.inputs, ", ")));
  }
  // Identity normalisation and kept whitespace make decode(encode(text)) == text for any UTF-8
  // text; characters outside the vocabulary (newlines included) become byte pieces.
  const std::unordered_map<std::string, std::string> args = {
      {"model_prefix", opts.model_prefix},
      {"model_type", opts.model_type},
      {"vocab_size", std::to_string(opts.vocab_size)},
      {"split_by_whitespace", opts.split_by_whitespace ? "true" : "false"},
      {"byte_fallback", opts.byte_fallback ? "true" : "false"},
      {"max_sentencepiece_length", std::to_string(opts.max_piece_length)},
      {"seed_sentencepiece_size", std::to_string(opts.seed_pieces)},
      {"input_sentence_size", "0"},  // the sample is the training set: no second sampling
      {"shuffle_input_sentence", "false"},
      {"train_extremely_large_corpus",
       opts.sample_bytes > kInt32SuffixArrayBytes ? "true" : "false"},
      {"num_threads", std::to_string(trainer_threads(opts.threads))},
      {"max_sentence_length", std::to_string(kMaxSentenceBytes)},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
  };
  sentencepiece::SetRandomGeneratorSeed(static_cast<unsigned>(opts.seed & 0x7fffffffu));
  sentencepiece::logging::SetMinLogLevel(opts.verbose ? 0 : 1);  // else warnings and errors
  SampleIterator it(sample.sentences);
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &it);
  sample.sentences = {};
  if (!status.ok()) {
    std::string msg = status.ToString();
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    const bool too_few = msg.find("too high") != std::string::npos;
    throw UserError(fmt::format(
        "tokenizer training on {} (--vocab-size {}, sample of {} sentences, {} bytes): {}{}",
        fmt::join(opts.inputs, ", "), opts.vocab_size, stats.sampled_sentences, stats.sampled_bytes,
        msg, too_few ? " (raise --sample-bytes or --seed-pieces, or lower --vocab-size)" : ""));
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TokenizerTrainReport train_tokenizer(const TokenizerTrainOptions& opts) {
  check_tokenizer_options(opts);  // before reading anything
  TokenizerTrainReport report;
  SentenceSample sample = sample_training_sentences(opts);
  report.sample = sample.stats;
  report.train_seconds = train_tokenizer_on(std::move(sample), opts);
  return report;
}

bool looks_like_tokenizer_json(std::string_view bytes) {
  for (char c : bytes) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
    return c == '{';
  }
  return false;
}

Tokenizer::Tokenizer(const std::string& model_path) : path_(model_path) {
  std::ifstream in(model_path, std::ios::binary);
  if (!in) {
    throw UserError(
        fmt::format("{}: cannot open tokenizer model (does the file exist?)", model_path));
  }
  const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  model_ = looks_like_tokenizer_json(bytes) ? load_tokenizer_json(model_path, bytes)
                                            : load_sentencepiece_model(model_path, bytes);
  fingerprint_ = fnv1a64(bytes);
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;

TokenizerKind Tokenizer::kind() const { return model_->kind(); }
int64_t Tokenizer::vocab_size() const { return model_->vocab_size(); }
int32_t Tokenizer::eos_id() const { return model_->eos_id(); }
int32_t Tokenizer::bos_id() const { return model_->bos_id(); }
std::vector<int32_t> Tokenizer::document_start() const { return model_->document_start(); }
std::vector<int32_t> with_prefix_once(std::vector<int32_t> tokens,
                                      const std::vector<int32_t>& prefix, size_t* added) {
  const bool has = tokens.size() >= prefix.size() &&
                   std::equal(prefix.begin(), prefix.end(), tokens.begin());
  if (added) *added = has ? 0 : prefix.size();
  if (!has) tokens.insert(tokens.begin(), prefix.begin(), prefix.end());
  return tokens;
}

std::vector<int32_t> Tokenizer::prompt_prefix() const {
  if (model_->kind() == TokenizerKind::sentencepiece) return {model_->eos_id()};
  return model_->document_start();
}
std::optional<int32_t> Tokenizer::token_id(std::string_view text) const {
  return model_->token_id(text);
}
std::string Tokenizer::piece(int32_t id) const { return model_->piece(id); }
bool Tokenizer::is_learned(int32_t id) const { return model_->is_learned(id); }
std::string Tokenizer::token_bytes(int32_t id) const { return model_->token_bytes(id); }
std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  return model_->encode(text);
}
std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  return model_->decode(ids);
}

namespace {

bool is_byte_piece(const Tokenizer& tokenizer, int32_t id) {
  if (tokenizer.is_learned(id)) return false;
  const std::string p = tokenizer.piece(id);
  return p.size() == 6 && p.rfind("<0x", 0) == 0 && p.back() == '>';
}

}  // namespace

std::vector<int32_t> encode_after_boundary(const Tokenizer& tokenizer, const std::string& text) {
  if (text.empty()) return {};
  // Byte-level BPE marks no word start: a text encodes the same anywhere.
  if (tokenizer.kind() != TokenizerKind::sentencepiece) return tokenizer.encode(text);
  // A character outside the vocabulary (a byte-fallback character: no piece holds it) ends
  // every piece before it, so what follows is segmented as if the text began there; encode
  // puts its word-start mark before the sentinel, not before the text.
  static const char* const kSentinels[] = {"\n", "\x01", "\xee\x80\x80"};
  for (const char* sentinel : kSentinels) {
    const std::vector<int32_t> head = tokenizer.encode(sentinel);
    if (head.empty() || !is_byte_piece(tokenizer, head.back())) continue;
    const std::vector<int32_t> all = tokenizer.encode(sentinel + text);
    if (all.size() < head.size() || !std::equal(head.begin(), head.end(), all.begin())) continue;
    return {all.begin() + static_cast<std::ptrdiff_t>(head.size()), all.end()};
  }
  throw UserError(fmt::format(
      "{}: no character outside the vocabulary (a newline, U+0001 or U+E000) to encode a "
      "continuation after a piece boundary with",
      tokenizer.path()));
}

int64_t utf8_chars(const std::string& s) {
  // Every byte but a continuation byte (10xxxxxx) starts a character.
  return std::count_if(s.begin(), s.end(),
                       [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

TokenizerInspection inspect_tokenizer(const std::string& model_path, const std::string& sample,
                                      int top_pieces) {
  const Tokenizer tok(model_path);
  TokenizerInspection r;
  r.vocab_size = tok.vocab_size();
  const std::string boundary = "\xE2\x96\x81";         // "▁", U+2581: SentencePiece's space
  std::vector<std::pair<int64_t, int32_t>> by_length;  // (-chars, id): longest, then likeliest
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (!tok.is_learned(id)) {
      if (tok.piece(id).rfind("<0x", 0) == 0) ++r.byte_pieces;
      continue;
    }
    ++r.learned;
    // A byte-level BPE token reads as the text it decodes to (a cut character as U+FFFD).
    const std::string p = tok.kind() == TokenizerKind::sentencepiece
                              ? tok.piece(id)
                              : sanitize_utf8(tok.token_bytes(id));
    // Searching from byte 1 finds a "▁" after the first character: a lead byte never sits
    // inside another character.
    if (p.find(boundary, 1) != std::string::npos) ++r.multi_word;
    by_length.emplace_back(-utf8_chars(p), id);
  }
  const size_t top = std::min(by_length.size(), static_cast<size_t>(std::max(top_pieces, 0)));
  std::partial_sort(by_length.begin(), by_length.begin() + static_cast<std::ptrdiff_t>(top),
                    by_length.end());
  for (size_t i = 0; i < top; ++i) {
    const int32_t id = by_length[i].second;
    r.longest.push_back({tok.kind() == TokenizerKind::sentencepiece
                             ? tok.piece(id)
                             : sanitize_utf8(tok.token_bytes(id)),
                         -by_length[i].first});
  }

  if (sample.empty()) return r;
  r.sample = sample;
  for_each_input_document(sample, "text", [&](const std::string& doc, int64_t) {
    ++r.sample_documents;
    r.sample_bytes += static_cast<int64_t>(doc.size());
    r.sample_tokens += static_cast<int64_t>(tok.encode(doc).size());
    bool in_word = false;
    for (unsigned char c : doc) {
      const bool space = c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
      if (!space && !in_word) ++r.sample_words;
      in_word = !space;
    }
  });
  return r;
}

}  // namespace jumbo
