// jumbo's token pair: PREFIX.bin (tokens) + PREFIX.idx (64-byte header + document offsets),
// both little endian; layout in docs/data-format.md. The writer, and the reader as one
// TokenSegment, which maps both files and checks every size and offset before anything reads a
// token, so a bad file fails at open with one line.
#include <algorithm>

#include "jumbo/data/indexed_dataset.h"
#include "token_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "jumbo/config/config.h"

namespace jumbo {
namespace {

constexpr char kMagic[8] = {'J', 'U', 'M', 'B', 'O', 'I', 'D', 'X'};
// Version 1: plain documents. Version 2: prompt-completion examples, the offsets followed by
// each document's loss start (docs/data-format.md).
constexpr uint32_t kVersionText = 1, kVersionExamples = 2;
constexpr size_t kHeaderBytes = 64;
// Token ids are int32 in memory, so vocabularies stop at 2^31.
constexpr uint64_t kMaxVocab = uint64_t{1} << 31;

// Header fields at fixed byte offsets (docs/data-format.md).
constexpr size_t kOffVersion = 8, kOffDtype = 12, kOffVocab = 16, kOffFingerprint = 24,
                 kOffNumDocs = 32, kOffNumTokens = 40;

static_assert(std::endian::native == std::endian::little, "the format is little endian");

size_t token_bytes(TokenDType d) { return d == TokenDType::u16 ? 2 : 4; }
TokenDType dtype_for_vocab(uint64_t vocab) {
  return vocab <= 65536 ? TokenDType::u16 : TokenDType::u32;
}

template <typename T>
void store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

void write_all(std::FILE* f, const void* data, size_t bytes, const std::string& path) {
  if (bytes > 0 && std::fwrite(data, 1, bytes, f) != bytes) {
    throw UserError(fmt::format("{}: write failed ({})", path, std::strerror(errno)));
  }
}

}  // namespace

std::string printable(const uint8_t* p, size_t n) {
  std::string s = "\"";
  for (size_t i = 0; i < n; ++i) {
    if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '"' && p[i] != '\\') s += static_cast<char>(p[i]);
    else s += fmt::format("\\x{:02x}", p[i]);
  }
  return s + "\"";
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw UserError(fmt::format("{}: cannot open ({})", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw UserError(fmt::format("{}: cannot stat ({})", path, std::strerror(err)));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw UserError(fmt::format("{}: cannot map {} bytes ({})", path, size_, std::strerror(err)));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

// ---- writer ----

struct IndexedDatasetWriter::Impl {
  std::string prefix;
  DatasetHeader header;
  std::vector<uint64_t> offsets{0};
  std::vector<uint64_t> loss_starts;  // prompt-completion only
  std::FILE* bin = nullptr;
  std::vector<uint8_t> buffer;  // one document's tokens in the file's dtype
  bool finished = false;

  std::string bin_tmp() const { return prefix + ".bin.tmp"; }
  std::string idx_tmp() const { return prefix + ".idx.tmp"; }
};

IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix, uint64_t vocab_size,
                                           uint64_t tokenizer_fingerprint, DocumentKind kind)
    : impl_(std::make_unique<Impl>()) {
  impl_->header.kind = kind;
  if (vocab_size == 0 || vocab_size > kMaxVocab) {
    throw UserError(fmt::format("{}: vocab size {} cannot be stored, expected 1 .. 2^31", prefix,
                                vocab_size));
  }
  impl_->prefix = prefix;
  impl_->header.dtype = dtype_for_vocab(vocab_size);
  impl_->header.vocab_size = vocab_size;
  impl_->header.tokenizer_fingerprint = tokenizer_fingerprint;
  impl_->bin = std::fopen(impl_->bin_tmp().c_str(), "wb");
  if (!impl_->bin) {
    throw UserError(fmt::format("{}: cannot create ({})", impl_->bin_tmp(), std::strerror(errno)));
  }
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (!impl_->finished) {  // abandoned (an exception): leave no half-written files
    if (impl_->bin) std::fclose(impl_->bin);
    std::remove(impl_->bin_tmp().c_str());
    std::remove(impl_->idx_tmp().c_str());
  }
}

void IndexedDatasetWriter::add_document(const std::vector<int32_t>& tokens) {
  if (impl_->header.kind != DocumentKind::text) {
    throw std::logic_error("IndexedDatasetWriter: an example needs its loss start");
  }
  write_tokens(tokens);
}

void IndexedDatasetWriter::add_example(const std::vector<int32_t>& tokens, uint64_t loss_start) {
  if (impl_->header.kind != DocumentKind::prompt_completion || loss_start >= tokens.size()) {
    throw std::logic_error("IndexedDatasetWriter::add_example: a prompt-completion writer and "
                           "a loss start inside the example");
  }
  impl_->loss_starts.push_back(loss_start);
  write_tokens(tokens);
}

void IndexedDatasetWriter::write_tokens(const std::vector<int32_t>& tokens) {
  Impl& w = *impl_;
  if (w.finished) throw std::logic_error("IndexedDatasetWriter::add_document after finish()");
  const size_t width = token_bytes(w.header.dtype);
  w.buffer.resize(tokens.size() * width);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t t = tokens[i];
    if (t < 0 || static_cast<uint64_t>(t) >= w.header.vocab_size) {
      throw UserError(fmt::format("{}: token {} in document {} is outside the vocabulary [0, {})",
                                  w.bin_tmp(), t, w.header.num_docs, w.header.vocab_size));
    }
    if (width == 2) store(&w.buffer[i * 2], static_cast<uint16_t>(t));
    else store(&w.buffer[i * 4], static_cast<uint32_t>(t));
  }
  write_all(w.bin, w.buffer.data(), w.buffer.size(), w.bin_tmp());
  w.header.num_tokens += tokens.size();
  w.header.num_docs += 1;
  w.offsets.push_back(w.header.num_tokens);
}

DatasetHeader IndexedDatasetWriter::finish() {
  Impl& w = *impl_;
  if (w.finished) return w.header;
  if (std::fclose(w.bin) != 0) {
    w.bin = nullptr;
    throw UserError(fmt::format("{}: write failed ({})", w.bin_tmp(), std::strerror(errno)));
  }
  w.bin = nullptr;

  std::vector<uint8_t> head(kHeaderBytes, 0);
  std::memcpy(head.data(), kMagic, sizeof kMagic);
  const bool examples = w.header.kind == DocumentKind::prompt_completion;
  store(&head[kOffVersion], examples ? kVersionExamples : kVersionText);
  head[kOffDtype] = static_cast<uint8_t>(w.header.dtype);
  store(&head[kOffVocab], w.header.vocab_size);
  store(&head[kOffFingerprint], w.header.tokenizer_fingerprint);
  store(&head[kOffNumDocs], w.header.num_docs);
  store(&head[kOffNumTokens], w.header.num_tokens);
  std::FILE* idx = std::fopen(w.idx_tmp().c_str(), "wb");
  if (!idx) throw UserError(fmt::format("{}: cannot create ({})", w.idx_tmp(), std::strerror(errno)));
  try {
    write_all(idx, head.data(), head.size(), w.idx_tmp());
    write_all(idx, w.offsets.data(), w.offsets.size() * sizeof(uint64_t), w.idx_tmp());
    write_all(idx, w.loss_starts.data(), w.loss_starts.size() * sizeof(uint64_t), w.idx_tmp());
  } catch (...) {
    std::fclose(idx);
    throw;
  }
  if (std::fclose(idx) != 0) {
    throw UserError(fmt::format("{}: write failed ({})", w.idx_tmp(), std::strerror(errno)));
  }
  // .bin first: a crash in between leaves a new .bin with an old .idx, which the reader's
  // size checks reject, never a silently mismatched pair.
  for (const char* ext : {".bin", ".idx"}) {
    const std::string tmp = w.prefix + ext + ".tmp", final_name = w.prefix + ext;
    if (std::rename(tmp.c_str(), final_name.c_str()) != 0) {
      throw UserError(fmt::format("{}: cannot rename to {} ({})", tmp, final_name, std::strerror(errno)));
    }
  }
  w.finished = true;
  return w.header;
}


// ---- reader ----

namespace {

// Offsets are checked pairwise: all of them up to this many documents, else this many evenly
// spaced pairs (reading 1.6 GB of offsets of a 1 TB corpus on every rank at every start would
// cost more than the check is worth; the sampler never reads them).
constexpr uint64_t kFullOffsetCheck = uint64_t{1} << 24;

class JumboSegment final : public TokenSegment {
 public:
  explicit JumboSegment(const std::string& prefix)
      : idx_(prefix + ".idx"), bin_(prefix + ".bin") {
    const std::string& idx_path = idx_.path();
    const uint8_t* idx = idx_.data();
    if (idx_.size() < kHeaderBytes) {
      throw UserError(fmt::format("{}: size {} bytes, too small for the {}-byte header", idx_path,
                                  idx_.size(), kHeaderBytes));
    }
    if (std::memcmp(idx, kMagic, sizeof kMagic) != 0) {
      throw UserError(fmt::format("{}: magic {} at offset 0, expected \"JUMBOIDX\" (jumbo) or "
                                  "\"MMIDIDX\" (Megatron-LM): not an indexed dataset index", idx_path, printable(idx, sizeof kMagic)));
    }
    const auto version = load<uint32_t>(idx + kOffVersion);
    if (version != kVersionText && version != kVersionExamples) {
      throw UserError(fmt::format("{}: format version {} at offset {}, expected {} (documents) or "
                                  "{} (prompt-completion examples)", idx_path, version,
                                  kOffVersion, kVersionText, kVersionExamples));
    }
    header_.kind = version == kVersionExamples ? DocumentKind::prompt_completion : DocumentKind::text;
    const uint8_t dtype = idx[kOffDtype];
    if (dtype != static_cast<uint8_t>(TokenDType::u16) && dtype != static_cast<uint8_t>(TokenDType::u32)) {
      throw UserError(fmt::format("{}: dtype {} at offset {}, expected 1 (uint16) or 2 (uint32)",
                                  idx_path, dtype, kOffDtype));
    }
    header_.dtype = static_cast<TokenDType>(dtype);
    header_.vocab_size = load<uint64_t>(idx + kOffVocab);
    header_.tokenizer_fingerprint = load<uint64_t>(idx + kOffFingerprint);
    header_.num_docs = load<uint64_t>(idx + kOffNumDocs);
    header_.num_tokens = load<uint64_t>(idx + kOffNumTokens);
    const uint64_t max_vocab = header_.dtype == TokenDType::u16 ? 65536 : kMaxVocab;
    if (header_.vocab_size == 0 || header_.vocab_size > max_vocab) {
      throw UserError(fmt::format("{}: vocab size {} at offset {}, expected 1 .. {} for {} tokens",
                                  idx_path, header_.vocab_size, kOffVocab, max_vocab,
                                  dtype == 1 ? "uint16" : "uint32"));
    }
    const bool examples = header_.kind == DocumentKind::prompt_completion;
    const uint64_t expected_idx =
        kHeaderBytes + (header_.num_docs + 1) * 8 + (examples ? header_.num_docs * 8 : 0);
    if (header_.num_docs > (idx_.size() / 8) || idx_.size() != expected_idx) {
      throw UserError(fmt::format("{}: size {} bytes, expected {} ({}-byte header + {} x 8-byte "
                                  "offsets{} for {} documents)", idx_path, idx_.size(), expected_idx,
                                  kHeaderBytes, header_.num_docs + 1,
                                  examples ? " + a loss start each" : "", header_.num_docs));
    }
    offsets_ = reinterpret_cast<const uint64_t*>(idx + kHeaderBytes);  // 8-byte aligned
    if (examples) loss_starts_ = offsets_ + header_.num_docs + 1;
    check_offsets();
    const size_t width = token_bytes(header_.dtype);
    if (header_.num_tokens > bin_.size() || bin_.size() != header_.num_tokens * width) {
      throw UserError(fmt::format("{}: size {} bytes, expected {} ({} tokens x {} bytes from {})",
                                  bin_.path(), bin_.size(), header_.num_tokens * width,
                                  header_.num_tokens, width, idx_path));
    }
  }

  const DatasetHeader& header() const { return header_; }
  const std::string& bin_path() const override { return bin_.path(); }
  uint64_t num_tokens() const override { return header_.num_tokens; }
  uint64_t num_docs() const override { return header_.num_docs; }
  uint64_t doc_offset(uint64_t doc) const override { return offsets_[doc]; }
  DocumentKind kind() const override { return header_.kind; }
  uint64_t loss_start(uint64_t doc) const override { return loss_starts_ ? loss_starts_[doc] : 0; }
  uint64_t vocab_size() const override { return header_.vocab_size; }
  uint64_t tokenizer_fingerprint() const override { return header_.tokenizer_fingerprint; }

  void read(uint64_t start, uint64_t count, int32_t* out) const override {
    if (header_.dtype == TokenDType::u16) {
      const uint8_t* p = bin_.data() + start * 2;
      for (uint64_t i = 0; i < count; ++i) out[i] = load<uint16_t>(p + i * 2);
    } else {
      const uint8_t* p = bin_.data() + start * 4;
      for (uint64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(load<uint32_t>(p + i * 4));
    }
  }

  void check_tokens_below(uint64_t vocab, uint64_t max_checked) const override {
    const uint64_t n = header_.num_tokens, checks = std::min(n, std::max<uint64_t>(max_checked, 1));
    const size_t width = token_bytes(header_.dtype);
    for (uint64_t k = 0; k < checks; ++k) {
      const uint64_t pos = checks == n ? k : k * (n / checks);
      const uint64_t t = width == 2 ? load<uint16_t>(bin_.data() + pos * 2)
                                    : load<uint32_t>(bin_.data() + pos * 4);
      if (t >= vocab) {
        throw UserError(fmt::format("{}: token {} at position {} is outside the vocabulary [0, {}) "
                                    "of {}", bin_.path(), t, pos, vocab, idx_.path()));
      }
    }
  }

 private:
  void check_offsets() const {
    const uint64_t docs = header_.num_docs;
    if (offsets_[0] != 0) {
      throw UserError(fmt::format("{}: document 0 starts at token {} (byte {}), expected 0",
                                  idx_.path(), offsets_[0], kHeaderBytes));
    }
    const uint64_t checks = std::min(docs, kFullOffsetCheck);
    for (uint64_t k = 1; k <= checks; ++k) {
      const uint64_t d = checks == docs ? k : std::max<uint64_t>(1, k * (docs / checks));
      if (offsets_[d] < offsets_[d - 1]) {
        throw UserError(fmt::format("{}: offset {} (byte {}) is {}, below offset {} = {}; offsets "
                                    "must not decrease", idx_.path(), d, kHeaderBytes + 8 * d,
                                    offsets_[d], d - 1, offsets_[d - 1]));
      }
    }
    for (uint64_t k = 0; loss_starts_ && k < checks; ++k) {
      const uint64_t d = checks == docs ? k : k * (docs / checks);
      if (loss_starts_[d] >= offsets_[d + 1] - offsets_[d]) {
        throw UserError(fmt::format("{}: loss start of example {} (byte {}) is {}, expected below "
                                    "its {} tokens", idx_.path(), d,
                                    kHeaderBytes + 8 * (docs + 1 + d), loss_starts_[d],
                                    offsets_[d + 1] - offsets_[d]));
      }
    }
    if (offsets_[docs] != header_.num_tokens) {
      throw UserError(fmt::format("{}: last offset (byte {}) is {}, expected num_tokens = {}",
                                  idx_.path(), kHeaderBytes + 8 * docs, offsets_[docs],
                                  header_.num_tokens));
    }
  }

  MappedFile idx_, bin_;
  DatasetHeader header_;
  const uint64_t* offsets_ = nullptr;
  const uint64_t* loss_starts_ = nullptr;
};

}  // namespace

std::unique_ptr<TokenSegment> open_jumbo_segment(const std::string& prefix) {
  return std::make_unique<JumboSegment>(prefix);
}

TokenDType jumbo_segment_dtype(const TokenSegment& segment) {
  return dynamic_cast<const JumboSegment&>(segment).header().dtype;
}

DatasetHeader read_jumbo_header(const std::string& prefix) {
  return JumboSegment(prefix).header();
}

}  // namespace jumbo
