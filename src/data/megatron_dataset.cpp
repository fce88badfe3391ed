// Megatron-LM's indexed dataset (PREFIX.bin + PREFIX.idx, magic "MMIDIDX\0\0", version 1), as
// written by megatron/core/datasets/indexed_dataset.py and tools/preprocess_data.py. Read as a
// TokenSegment: the token stream is the sequences in order, documents are runs of sequences.
// Layout and what is accepted: docs/data-format.md. Every count, size and offset is checked at
// open, so a damaged or foreign file fails with one line before any token is read.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <type_traits>

#include "jumbo/config/config.h"
#include "token_segment.h"

namespace jumbo {
namespace {

static_assert(std::endian::native == std::endian::little, "the format is little endian");

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kVersion = 1;
// Header fields at fixed byte offsets: magic[9], version u64, dtype u8, sequence_count u64,
// document_count u64; the arrays follow from byte 34 (so they are not aligned: read by memcpy).
constexpr size_t kOffVersion = 9, kOffDtype = 17, kOffSequenceCount = 18, kOffDocumentCount = 26,
                 kHeaderBytes = 34;
// sequence_modes (newer Megatron-Core, multimodal builders): 0 is text, 1 an image's raw bytes.
constexpr int8_t kTextMode = 0;

struct DTypeInfo {
  uint8_t code;
  const char* name;
  size_t itemsize;
  bool integer;
};
// Megatron's DType enum (codes 6 and 7 were np.float / np.double in Megatron-LM before Core,
// float64 / float32 since; both are floats, which jumbo refuses either way).
constexpr DTypeInfo kDTypes[] = {
    {1, "uint8", 1, true},    {2, "int8", 1, true},     {3, "int16", 2, true},
    {4, "int32", 4, true},    {5, "int64", 8, true},    {6, "float64", 8, false},
    {7, "float32", 4, false}, {8, "uint16", 2, true},
};
constexpr const char* kIntegerDTypes = "1 uint8, 2 int8, 3 int16, 4 int32, 5 int64 or 8 uint16";

const DTypeInfo* dtype_of(uint8_t code) {
  for (const auto& d : kDTypes) {
    if (d.code == code) return &d;
  }
  return nullptr;
}


// The checked contents of a .idx; the arrays point into its mapping.
struct MegatronIndex {
  const DTypeInfo* dtype = nullptr;
  uint64_t sequence_count = 0;
  uint64_t document_count = 0;  // entries of document_indices: documents + 1
  const uint8_t* sequence_pointers = nullptr;  // int64 x sequence_count
  const uint8_t* document_indices = nullptr;   // int64 x document_count
  uint64_t num_tokens = 0;
};

MegatronIndex check_index(const MappedFile& idx) {
  const std::string& path = idx.path();
  const uint8_t* p = idx.data();
  const size_t size = idx.size();
  if (size < kHeaderBytes) {
    throw UserError(fmt::format("{}: size {} bytes, too small for the {}-byte Megatron MMIDIDX "
                                "header", path, size, kHeaderBytes));
  }
  if (std::memcmp(p, kMagic, sizeof kMagic) != 0) {
    throw UserError(fmt::format("{}: magic {} at byte 0, expected \"MMIDIDX\\x00\\x00\" (not a "
                                "Megatron-LM mmap indexed dataset index)", path,
                                printable(p, sizeof kMagic)));
  }
  const auto version = load<uint64_t>(p + kOffVersion);
  if (version != kVersion) {
    throw UserError(fmt::format("{}: version {} at byte {}, expected {}", path, version,
                                kOffVersion, kVersion));
  }
  MegatronIndex index;
  const uint8_t code = p[kOffDtype];
  index.dtype = dtype_of(code);
  if (!index.dtype || !index.dtype->integer) {
    throw UserError(fmt::format("{}: dtype code {} ({}) at byte {}, expected an integer dtype: {}",
                                path, code, index.dtype ? index.dtype->name : "unknown",
                                kOffDtype, kIntegerDTypes));
  }
  index.sequence_count = load<uint64_t>(p + kOffSequenceCount);
  index.document_count = load<uint64_t>(p + kOffDocumentCount);
  const uint64_t s = index.sequence_count, d = index.document_count;
  if (d == 0) {
    throw UserError(fmt::format("{}: document_count 0 at byte {}, expected at least 1 "
                                "(document_indices starts with 0)", path, kOffDocumentCount));
  }
  // Counts beyond the file's size cannot be right; bounding them first keeps the size
  // arithmetic below from overflowing.
  if (s > size / 12 || d > size / 8) {
    throw UserError(fmt::format("{}: size {} bytes, too small for sequence_count {} (byte {}) and "
                                "document_count {} (byte {})", path, size, s, kOffSequenceCount,
                                d, kOffDocumentCount));
  }
  const uint64_t off_lengths = kHeaderBytes, off_pointers = off_lengths + 4 * s,
                 off_documents = off_pointers + 8 * s, expected = off_documents + 8 * d;
  // Megatron-Core's multimodal builders append int8 sequence_modes[sequence_count]; accepted
  // when every sequence is text, since the tokens are then ordinary token ids.
  const bool has_modes = s > 0 && size == expected + s;
  if (size != expected && !has_modes) {
    throw UserError(fmt::format("{}: size {} bytes, expected {} ({}-byte header + {} x 4-byte "
                                "sequence_lengths + {} x 8-byte sequence_pointers + {} x 8-byte "
                                "document_indices), or {} with int8 sequence_modes", path, size,
                                expected, kHeaderBytes, s, s, d, expected + s));
  }
  if (has_modes) {
    for (uint64_t i = 0; i < s; ++i) {
      const auto mode = static_cast<int8_t>(p[expected + i]);
      if (mode != kTextMode) {
        throw UserError(fmt::format("{}: sequence_modes[{}] at byte {} is {}, expected {} (text); "
                                    "multimodal datasets are not read", path, i, expected + i,
                                    mode, kTextMode));
      }
    }
  }

  // jumbo reads the .bin as one token stream, so sequences must lie back to back in order,
  // which is what Megatron's writer produces (pointer = bytes of the sequences before).
  const uint64_t itemsize = index.dtype->itemsize;
  uint64_t bytes_before = 0;
  for (uint64_t i = 0; i < s; ++i) {
    const auto length = load<int32_t>(p + off_lengths + 4 * i);
    if (length < 0) {
      throw UserError(fmt::format("{}: sequence_lengths[{}] at byte {} is {}, expected >= 0",
                                  path, i, off_lengths + 4 * i, length));
    }
    const auto pointer = load<int64_t>(p + off_pointers + 8 * i);
    if (pointer < 0 || static_cast<uint64_t>(pointer) != bytes_before) {
      throw UserError(fmt::format("{}: sequence_pointers[{}] at byte {} is {}, expected {} (the "
                                  "bytes of the {} sequences before it; jumbo reads only "
                                  "contiguous sequences)", path, i, off_pointers + 8 * i, pointer,
                                  bytes_before, i));
    }
    // At most 2^31 x 8 bytes per step, so no overflow before the next pointer fails to match.
    bytes_before += static_cast<uint64_t>(length) * itemsize;
  }
  index.num_tokens = bytes_before / itemsize;

  const uint8_t* docs = p + off_documents;
  const auto first = load<int64_t>(docs);
  if (first != 0) {
    throw UserError(fmt::format("{}: document_indices[0] at byte {} is {}, expected 0", path,
                                off_documents, first));
  }
  int64_t previous = 0;
  for (uint64_t i = 1; i < d; ++i) {
    const auto value = load<int64_t>(docs + 8 * i);
    if (value < previous) {
      throw UserError(fmt::format("{}: document_indices[{}] at byte {} is {}, below "
                                  "document_indices[{}] = {}; document indices must not decrease",
                                  path, i, off_documents + 8 * i, value, i - 1, previous));
    }
    previous = value;
  }
  if (static_cast<uint64_t>(previous) != s) {
    throw UserError(fmt::format("{}: document_indices[{}] (the last) at byte {} is {}, expected "
                                "sequence_count = {}", path, d - 1, off_documents + 8 * (d - 1),
                                previous, s));
  }
  index.sequence_pointers = p + off_pointers;
  index.document_indices = docs;
  return index;
}

// One class per token type, so read() and the token check are tight loops the compiler can
// vectorise, with one virtual call per read instead of one per token.
template <typename T>
class MegatronSegment final : public TokenSegment {
 public:
  MegatronSegment(std::unique_ptr<MappedFile> idx, std::unique_ptr<MappedFile> bin,
                  const MegatronIndex& index)
      : idx_(std::move(idx)), bin_(std::move(bin)), index_(index) {}

  const std::string& bin_path() const override { return bin_->path(); }
  uint64_t num_tokens() const override { return index_.num_tokens; }
  uint64_t num_docs() const override { return index_.document_count - 1; }

  uint64_t doc_offset(uint64_t doc) const override {
    const auto sequence = static_cast<uint64_t>(load<int64_t>(index_.document_indices + 8 * doc));
    if (sequence == index_.sequence_count) return index_.num_tokens;
    return static_cast<uint64_t>(load<int64_t>(index_.sequence_pointers + 8 * sequence)) /
           sizeof(T);
  }

  void read(uint64_t start, uint64_t count, int32_t* out) const override {
    const uint8_t* p = bin_->data() + start * sizeof(T);
    if constexpr (sizeof(T) < sizeof(int32_t) || std::is_same_v<T, int32_t>) {
      for (uint64_t i = 0; i < count; ++i) out[i] = load<T>(p + i * sizeof(T));
    } else {
      // int64: a value outside int32 would wrap silently. The open-time check may have sampled
      // past it, so check here (a min/max over the batch, not a branch per token).
      int64_t lo = 0, hi = 0;
      for (uint64_t i = 0; i < count; ++i) {
        const int64_t t = load<int64_t>(p + i * 8);
        lo = std::min(lo, t);
        hi = std::max(hi, t);
        out[i] = static_cast<int32_t>(t);
      }
      if (lo < std::numeric_limits<int32_t>::min() || hi > std::numeric_limits<int32_t>::max()) {
        for (uint64_t i = 0; i < count; ++i) {
          const int64_t t = load<int64_t>(p + i * 8);
          if (t != static_cast<int32_t>(t)) {
            throw UserError(fmt::format("{}: token {} at position {} (byte {}) does not fit a "
                                        "32-bit token id", bin_path(), t, start + i,
                                        (start + i) * 8));
          }
        }
      }
    }
  }

  uint64_t vocab_size() const override { return 0; }             // not recorded by the format
  uint64_t tokenizer_fingerprint() const override { return 0; }  // likewise

  void check_tokens_below(uint64_t vocab_size, uint64_t max_checked) const override {
    const uint64_t n = index_.num_tokens;
    const uint64_t checks = std::min(n, max_checked);
    const uint8_t* p = bin_->data();
    for (uint64_t k = 0; k < checks; ++k) {
      // Evenly spaced over the whole stream, the last sample near its end.
      const uint64_t pos =
          checks == n ? k : static_cast<uint64_t>(static_cast<unsigned __int128>(k) * n / checks);
      const T t = load<T>(p + pos * sizeof(T));
      bool negative = false;
      if constexpr (std::is_signed_v<T>) negative = t < 0;
      if (negative || static_cast<uint64_t>(t) >= vocab_size) {
        throw UserError(fmt::format("{}: token {} at position {} (byte {}) is outside the "
                                    "vocabulary [0, {}) of data.tokenizer", bin_path(),
                                    static_cast<int64_t>(t), pos, pos * sizeof(T), vocab_size));
      }
    }
  }

 private:
  std::unique_ptr<MappedFile> idx_, bin_;  // kept mapped: index_ and reads point into them
  MegatronIndex index_;
};

template <typename T>
std::unique_ptr<TokenSegment> make_segment(std::unique_ptr<MappedFile> idx,
                                           std::unique_ptr<MappedFile> bin,
                                           const MegatronIndex& index) {
  return std::make_unique<MegatronSegment<T>>(std::move(idx), std::move(bin), index);
}

}  // namespace

std::unique_ptr<TokenSegment> open_megatron_segment(const std::string& prefix) {
  auto idx = std::make_unique<MappedFile>(prefix + ".idx");
  const MegatronIndex index = check_index(*idx);
  auto bin = std::make_unique<MappedFile>(prefix + ".bin");
  const uint64_t itemsize = index.dtype->itemsize;
  if (bin->size() != index.num_tokens * itemsize) {
    throw UserError(fmt::format("{}: size {} bytes, expected {} ({} tokens x {} bytes of {} from "
                                "{})", bin->path(), bin->size(), index.num_tokens * itemsize,
                                index.num_tokens, itemsize, index.dtype->name, idx->path()));
  }
  switch (index.dtype->code) {
    case 1: return make_segment<uint8_t>(std::move(idx), std::move(bin), index);
    case 2: return make_segment<int8_t>(std::move(idx), std::move(bin), index);
    case 3: return make_segment<int16_t>(std::move(idx), std::move(bin), index);
    case 4: return make_segment<int32_t>(std::move(idx), std::move(bin), index);
    case 5: return make_segment<int64_t>(std::move(idx), std::move(bin), index);
    case 8: return make_segment<uint16_t>(std::move(idx), std::move(bin), index);
  }
  throw std::logic_error("open_megatron_segment: integer dtype without a reader");  // unreachable
}

}  // namespace jumbo
