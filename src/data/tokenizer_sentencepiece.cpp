// A SentencePiece .model behind the Tokenizer facade: SentencePieceProcessor as it was used
// before tokenizer.json support, unchanged.
#include <fmt/format.h>
#include <sentencepiece_processor.h>

#include "jumbo/config/config.h"
#include "jumbo/data/tokenizer_model.h"

namespace jumbo {
namespace {

class SentencePieceModel final : public TokenizerModel {
 public:
  SentencePieceModel(const std::string& path, const std::string& bytes) : path_(path) {
    const auto status = sp_.LoadFromSerializedProto(bytes);
    if (!status.ok()) {
      throw UserError(fmt::format("{}: not a SentencePiece model ({} bytes): {}", path,
                                  bytes.size(), status.ToString()));
    }
    if (sp_.eos_id() < 0) {
      throw UserError(
          fmt::format("{}: the tokenizer has no EOS piece; documents need one", path));
    }
  }

  TokenizerKind kind() const override { return TokenizerKind::sentencepiece; }
  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  int32_t eos_id() const override { return sp_.eos_id(); }
  int32_t bos_id() const override { return sp_.bos_id(); }
  std::vector<int32_t> document_start() const override { return {}; }
  std::string piece(int32_t id) const override { return sp_.IdToPiece(id); }
  bool is_learned(int32_t id) const override {
    return !sp_.IsControl(id) && !sp_.IsUnknown(id) && !sp_.IsByte(id) && !sp_.IsUnused(id);
  }

  std::optional<int32_t> token_id(std::string_view text) const override {
    const int id = sp_.PieceToId(text);  // the unknown piece's id when there is no such piece
    if (id < 0 || sp_.IdToPiece(id) != text) return std::nullopt;
    return id;
  }

  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int> ids;
    const auto status = sp_.Encode(text, &ids);
    if (!status.ok()) {
      throw UserError(fmt::format("{}: cannot encode text of {} bytes: {}", path_, text.size(),
                                  status.ToString()));
    }
    return {ids.begin(), ids.end()};
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string text;
    const std::vector<int> as_int(ids.begin(), ids.end());
    const auto status = sp_.Decode(as_int, &text);
    if (!status.ok()) {
      throw UserError(
          fmt::format("{}: cannot decode {} ids: {}", path_, ids.size(), status.ToString()));
    }
    return text;
  }

  // A learned piece with "▁" as one space, a byte piece ("<0x0A>") its byte, control and
  // unknown pieces nothing.
  std::string token_bytes(int32_t id) const override {
    if (id < 0 || id >= vocab_size()) return {};
    const std::string p = sp_.IdToPiece(id);
    if (is_learned(id)) {
      static const std::string kSpace = "\xE2\x96\x81";
      std::string out;
      for (size_t i = 0; i < p.size();) {
        if (p.compare(i, kSpace.size(), kSpace) == 0) {
          out += ' ';
          i += kSpace.size();
        } else {
          out += p[i++];
        }
      }
      return out;
    }
    if (p.size() == 6 && p.rfind("<0x", 0) == 0 && p.back() == '>') {
      return std::string(1, static_cast<char>(std::stoi(p.substr(3, 2), nullptr, 16)));
    }
    return {};
  }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  std::string path_;
};

}  // namespace

std::unique_ptr<TokenizerModel> load_sentencepiece_model(const std::string& path,
                                                         const std::string& bytes) {
  return std::make_unique<SentencePieceModel>(path, bytes);
}

}  // namespace jumbo
