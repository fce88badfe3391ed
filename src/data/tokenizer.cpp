// SentencePiece tokenizer: training through the C++ trainer API (sentences are streamed from
// memory, no temporary text file) and loading/encoding with SentencePieceProcessor.
#include "jumbo/data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fstream>
#include <iterator>
#include <thread>
#include <unordered_map>

#include "jumbo/config/config.h"
#include "jumbo/data/prepare.h"

// Exported by libsentencepiece but not declared in its public headers: the trainer logs every
// EM iteration to stderr unless the level is raised.
namespace sentencepiece::logging {
void SetMinLogLevel(int level);
}

namespace jumbo {
namespace {

// Feeds the trainer one paragraph (non-empty line of a document) at a time.
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::vector<std::string>& lines) : lines_(lines) {}
  bool done() const override { return next_ >= lines_.size(); }
  void Next() override { ++next_; }
  const std::string& value() const override { return lines_[next_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& lines_;
  size_t next_ = 0;
};

std::vector<std::string> training_lines(const std::vector<std::string>& inputs) {
  std::vector<std::string> lines;
  for (const auto& path : inputs) {
    for (const auto& doc : read_documents(path, "text")) {
      size_t begin = 0;
      while (begin <= doc.size()) {
        size_t end = doc.find('\n', begin);
        if (end == std::string::npos) end = doc.size();
        if (end > begin) lines.emplace_back(doc, begin, end - begin);
        begin = end + 1;
      }
    }
  }
  return lines;
}

uint64_t fnv1a64(const std::string& bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

void train_tokenizer(const TokenizerTrainOptions& opts) {
  if (opts.inputs.empty()) throw UserError("tokenizer training: no input files given");
  if (opts.model_prefix.empty()) throw UserError("tokenizer training: no model prefix given");
  const std::vector<std::string> lines = training_lines(opts.inputs);
  if (lines.empty()) {
    throw UserError(fmt::format("tokenizer training: {} holds no text", fmt::join(opts.inputs, ", ")));
  }
  const int threads =
      opts.threads > 0 ? opts.threads : std::max(1u, std::thread::hardware_concurrency());

  // Identity normalisation and kept whitespace make decode(encode(text)) == text for any UTF-8
  // text; characters outside the vocabulary (newlines included) become byte pieces.
  const std::unordered_map<std::string, std::string> args = {
      {"model_prefix", opts.model_prefix},
      {"model_type", opts.model_type},
      {"vocab_size", std::to_string(opts.vocab_size)},
      {"split_by_whitespace", opts.split_by_whitespace ? "true" : "false"},
      {"byte_fallback", opts.byte_fallback ? "true" : "false"},
      {"input_sentence_size", std::to_string(opts.input_sentence_size)},
      {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(threads)},
      {"max_sentence_length", "16384"},  // Brown paragraphs reach ~10 KB; the default drops them
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
  };
  sentencepiece::SetRandomGeneratorSeed(static_cast<unsigned>(opts.seed & 0x7fffffffu));
  sentencepiece::logging::SetMinLogLevel(1);  // warnings and errors only
  LineIterator it(lines);
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &it);
  if (!status.ok()) {
    throw UserError(fmt::format("tokenizer training on {} (vocab_size {}, {} paragraphs): {}",
                                fmt::join(opts.inputs, ", "), opts.vocab_size, lines.size(),
                                status.ToString()));
  }
}

Tokenizer::Tokenizer(const std::string& model_path)
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()), path_(model_path) {
  std::ifstream in(model_path, std::ios::binary);
  if (!in) {
    throw UserError(fmt::format("{}: cannot open tokenizer model (does the file exist?)", model_path));
  }
  const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const auto status = sp_->LoadFromSerializedProto(bytes);
  if (!status.ok()) {
    throw UserError(fmt::format("{}: not a SentencePiece model ({} bytes): {}", model_path,
                                bytes.size(), status.ToString()));
  }
  if (sp_->eos_id() < 0) {
    throw UserError(fmt::format("{}: the tokenizer has no EOS piece; documents need one", model_path));
  }
  fingerprint_ = fnv1a64(bytes);
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;

int64_t Tokenizer::vocab_size() const { return sp_->GetPieceSize(); }
int32_t Tokenizer::eos_id() const { return sp_->eos_id(); }

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  const auto status = sp_->Encode(text, &ids);
  if (!status.ok()) {
    throw UserError(fmt::format("{}: cannot encode text of {} bytes: {}", path_, text.size(),
                                status.ToString()));
  }
  return {ids.begin(), ids.end()};
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  const std::vector<int> as_int(ids.begin(), ids.end());
  const auto status = sp_->Decode(as_int, &text);
  if (!status.ok()) {
    throw UserError(fmt::format("{}: cannot decode {} ids: {}", path_, ids.size(), status.ToString()));
  }
  return text;
}

}  // namespace jumbo
