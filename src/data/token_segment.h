#pragma once
// A token segment: one mapped .bin of tokens with its document boundaries. A dataset is one
// or more segments read as one stream (a jumbo .bin/.idx pair, the parts of a dataset
// prepared by many ranks, or a Megatron-LM MMIDIDX pair). Private to src/data.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "jumbo/data/indexed_dataset.h"

namespace jumbo {

// A little-endian value at p, of any alignment (the formats are little endian).
template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Bytes as text for an error message: printable ASCII kept, the rest as \xNN.
std::string printable(const uint8_t* p, size_t n);

// A whole file mapped read-only (an empty file maps to data == nullptr); unmapped on
// destruction. Throws UserError naming the file if it cannot be opened or mapped.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

class TokenSegment {
 public:
  virtual ~TokenSegment() = default;
  // The .bin file, for messages.
  virtual const std::string& bin_path() const = 0;
  virtual uint64_t num_tokens() const = 0;
  virtual uint64_t num_docs() const = 0;
  // Token offset of document `doc`'s start within this segment; doc == num_docs() gives
  // num_tokens(). The caller keeps doc <= num_docs().
  virtual uint64_t doc_offset(uint64_t doc) const = 0;
  // Prompt-completion examples record where each one's loss starts (docs/data-format.md).
  virtual DocumentKind kind() const { return DocumentKind::text; }
  virtual uint64_t loss_start(uint64_t /*doc*/) const { return 0; }
  // Copies tokens [start, start + count) of this segment into out as int32; the caller keeps
  // the range inside the segment.
  virtual void read(uint64_t start, uint64_t count, int32_t* out) const = 0;
  // What the file records of its tokenizer: 0 when the format records nothing (Megatron).
  virtual uint64_t vocab_size() const = 0;
  virtual uint64_t tokenizer_fingerprint() const = 0;
  // Throws UserError naming the .bin and the position if a token (all of them up to
  // `max_checked`, else an evenly spaced sample of that many) is >= vocab_size.
  virtual void check_tokens_below(uint64_t vocab_size, uint64_t max_checked) const = 0;
};

// jumbo's own pair: PREFIX.bin + PREFIX.idx (magic "JUMBOIDX"), docs/data-format.md.
std::unique_ptr<TokenSegment> open_jumbo_segment(const std::string& prefix);
// The header of a jumbo pair, after the same checks (a part's counts, for the parts index).
DatasetHeader read_jumbo_header(const std::string& prefix);
// The token storage of a segment open_jumbo_segment made.
TokenDType jumbo_segment_dtype(const TokenSegment& segment);

// Megatron-LM's indexed dataset: PREFIX.bin + PREFIX.idx (magic "MMIDIDX\0\0"), as written by
// megatron/core/datasets/indexed_dataset.py. Throws UserError naming the file, the field and
// the byte offset on any mismatch.
std::unique_ptr<TokenSegment> open_megatron_segment(const std::string& prefix);

}  // namespace jumbo
