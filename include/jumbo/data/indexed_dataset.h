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

struct DatasetHeader {
  TokenDType dtype = TokenDType::u16;
  uint64_t vocab_size = 0;
  uint64_t tokenizer_fingerprint = 0;
  uint64_t num_docs = 0;
  uint64_t num_tokens = 0;
};

class IndexedDatasetWriter {
 public:
  // Writes PREFIX.bin.tmp / PREFIX.idx.tmp, renamed into place by finish().
  IndexedDatasetWriter(const std::string& prefix, uint64_t vocab_size,
                       uint64_t tokenizer_fingerprint);
  ~IndexedDatasetWriter();
  void add_document(const std::vector<int32_t>& tokens);  // caller appends EOS
  DatasetHeader finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class IndexedDataset {
 public:
  // Opens and checks PREFIX.idx and PREFIX.bin; throws UserError naming the file, the field or
  // offset, the value and what was expected (missing, truncated, bad magic, sizes disagree).
  explicit IndexedDataset(const std::string& prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const DatasetHeader& header() const { return header_; }
  uint64_t num_tokens() const { return header_.num_tokens; }
  uint64_t num_docs() const { return header_.num_docs; }
  uint64_t doc_offset(uint64_t doc) const;  // token offset of a document's start
  // Copies tokens [start, start + count) into out as int32.
  void read(uint64_t start, uint64_t count, int32_t* out) const;
  // Throws UserError unless the dataset was made with this tokenizer (vocab and fingerprint).
  void check_tokenizer(uint64_t vocab_size, uint64_t fingerprint,
                       const std::string& tokenizer_path) const;
  const std::string& prefix() const { return prefix_; }

 private:
  std::string prefix_;
  DatasetHeader header_;
  const uint8_t* bin_ = nullptr;
  size_t bin_bytes_ = 0;
  const uint8_t* idx_ = nullptr;
  size_t idx_bytes_ = 0;
  const uint64_t* doc_offsets_ = nullptr;
};

}  // namespace jumbo
