#pragma once
// Prepared token data: PREFIX.bin (tokens, uint16 or uint32 little endian, documents back to
// back, each followed by EOS) and PREFIX.idx (header + document offsets). Read through mmap:
// opening a 300B-token dataset costs the index only, and ranks read just their samples.
// Format: docs/data-format.md.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace jumbo {

enum class TokenDType : uint8_t { u16 = 1, u32 = 2 };

// What a dataset's documents are: text (every token is trained on) or prompt-completion
// examples (each records the first token its loss counts: the completion's).
enum class DocumentKind { text, prompt_completion };
const char* to_string(DocumentKind k);

struct DatasetHeader {
  TokenDType dtype = TokenDType::u16;
  DocumentKind kind = DocumentKind::text;
  uint64_t vocab_size = 0;
  uint64_t tokenizer_fingerprint = 0;
  uint64_t num_docs = 0;
  uint64_t num_tokens = 0;
};

class IndexedDatasetWriter {
 public:
  // Writes PREFIX.bin.tmp / PREFIX.idx.tmp, renamed into place by finish().
  IndexedDatasetWriter(const std::string& prefix, uint64_t vocab_size,
                       uint64_t tokenizer_fingerprint, DocumentKind kind = DocumentKind::text);
  ~IndexedDatasetWriter();
  void add_document(const std::vector<int32_t>& tokens);  // caller appends EOS
  // A prompt-completion example: prompt, completion and EOS; the loss counts the tokens from
  // `loss_start` (the completion's first) on.
  void add_example(const std::vector<int32_t>& tokens, uint64_t loss_start);
  DatasetHeader finish();

 private:
  void write_tokens(const std::vector<int32_t>& tokens);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A tokenizer fingerprint as messages and PREFIX.parts write it: "0x0123456789abcdef".
std::string fingerprint_text(uint64_t fingerprint);

// Where a dataset's tokens live: one jumbo pair, the parts of a dataset prepared over many
// ranks (PREFIX.parts lists them), or a Megatron-LM MMIDIDX pair.
enum class DatasetFormat { jumbo, jumbo_parts, megatron };
const char* to_string(DatasetFormat f);

class TokenSegment;

// One dataset read as one token stream, whatever its format (docs/data-format.md).
class IndexedDataset {
 public:
  // Opens PREFIX.parts if it exists, else PREFIX.idx (jumbo's or Megatron's, by its magic) and
  // PREFIX.bin, and checks them; throws UserError naming the file, the field or offset, the
  // value and what was expected (missing, truncated, bad magic, sizes disagree).
  explicit IndexedDataset(const std::string& prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  // vocab_size and tokenizer_fingerprint are 0 for a format that records no tokenizer
  // (Megatron's); dtype is the storage of a jumbo dataset.
  const DatasetHeader& header() const { return header_; }
  DatasetFormat format() const { return format_; }
  size_t num_segments() const { return segments_.size(); }
  uint64_t num_tokens() const { return header_.num_tokens; }
  uint64_t num_docs() const { return header_.num_docs; }
  uint64_t doc_offset(uint64_t doc) const;  // token offset of a document's start
  DocumentKind kind() const { return header_.kind; }
  // A prompt-completion example's first token counted in the loss (relative to its start);
  // 0 for text.
  uint64_t doc_loss_start(uint64_t doc) const;
  // Copies tokens [start, start + count) into out as int32.
  void read(uint64_t start, uint64_t count, int32_t* out) const;
  // Throws UserError unless the dataset was made with this tokenizer (vocab and fingerprint);
  // for Megatron's format, which records neither, unless every token (or an evenly spaced
  // sample) is below the tokenizer's vocabulary.
  void check_tokenizer(uint64_t vocab_size, uint64_t fingerprint,
                       const std::string& tokenizer_path) const;
  const std::string& prefix() const { return prefix_; }

 private:
  void open_parts(const std::string& parts_path);
  size_t segment_of_token(uint64_t token) const;

  std::string prefix_;
  DatasetFormat format_ = DatasetFormat::jumbo;
  DatasetHeader header_;
  std::vector<std::unique_ptr<TokenSegment>> segments_;
  // Cumulative starts per segment (size segments + 1): token_starts_[s] is segment s's first
  // token in the stream.
  std::vector<uint64_t> token_starts_, doc_starts_;
};

// A dataset of parts: PREFIX.parts (JSON) lists PREFIX.part-NNNNNN pairs in stream order.
struct DatasetPart {
  std::string name;  // the part's prefix relative to PREFIX's directory
  uint64_t num_docs = 0;
  uint64_t num_tokens = 0;
};
// The prefix of part `index` of a dataset: "PREFIX.part-000042".
std::string part_prefix(const std::string& prefix, uint64_t index);
// Writes PREFIX.parts (through PREFIX.parts.tmp and a rename, so it appears complete or not at
// all) listing the parts with the tokenizer they were made with.
void write_parts_index(const std::string& prefix, const std::vector<DatasetPart>& parts,
                       uint64_t vocab_size, uint64_t tokenizer_fingerprint);

}  // namespace jumbo
