#pragma once
// Checkpoint shards: one HDF5 file per rank that holds unique state. Every dataset is a
// piece of one logical tensor: a rectangle of the global tensor and a row-major element
// range of that rectangle (all of it, unless the distributed optimizer cut the tensor
// between data-parallel ranks). Datasets carry their global shape, rectangle and range as
// attributes, so h5py reads a shard without jumbo. See docs/checkpoint-format.md.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace jumbo {

// Elements of a tensor or rectangle of this shape (1 for a scalar's empty shape).
int64_t shape_numel(const std::vector<int64_t>& shape);

// The per-element state saved for every parameter: the fp32 master weight and AdamW's
// moments. The compute copy (bf16) is the master rounded, so it is not saved.
inline constexpr std::array<const char*, 3> kCheckpointStates = {"master", "exp_avg",
                                                                "exp_avg_sq"};

struct TensorPiece {
  std::string name;
  std::vector<int64_t> global_shape;  // 1-d or 2-d
  std::vector<int64_t> offset;        // the rectangle's start per dim
  std::vector<int64_t> shape;         // the rectangle's extent per dim
  int64_t flat_begin = 0;             // [flat_begin, flat_end): row-major elements of the
  int64_t flat_end = 0;               // rectangle this piece holds
  // Rows at or beyond this index of dim 0 are padding (the vocabulary padded to a multiple of
  // 128 x tp): a checkpoint saved with other padding still loads. -1: no padding.
  int64_t valid_rows = -1;

  int64_t rect_numel() const;
  int64_t count() const { return flat_end - flat_begin; }
  bool whole() const { return flat_begin == 0 && flat_end == rect_numel(); }
  // The dataset's name inside the shard file for one state: "master/layers.0.ln1.weight",
  // or "master/layers.0.ln1.weight@1024" for a piece that starts at element 1024.
  std::string dataset(const char* state) const;
};

// A piece with its data: one pointer per entry of kCheckpointStates, count() floats each.
struct PieceData {
  TensorPiece piece;
  std::array<float*, kCheckpointStates.size()> state{};
};

// zlib's CRC-32 of a whole file (the manifest's checksum).
uint32_t file_crc32(const std::vector<char>& bytes);

// The HDF5 file holding `pieces`, built in memory (this is the host copy an asynchronous
// save writes out while training goes on). `file_attrs` become attributes of the root group.
std::vector<char> build_shard_image(const std::vector<PieceData>& pieces,
                                    const std::vector<std::pair<std::string, int64_t>>& file_attrs);
// The same into `image`, reusing its memory (a rank saves the same size every time: keeping
// the buffer saves a page-faulting allocation of the whole shard per save).
void build_shard_image(const std::vector<PieceData>& pieces,
                       const std::vector<std::pair<std::string, int64_t>>& file_attrs,
                       std::vector<char>& image);

// The size of the file build_shard_image writes for `pieces`: the three states' float32 data
// (12 bytes per element) plus HDF5's metadata (superblock, groups, an object header with four
// attributes per dataset): an upper bound fitted to this HDF5's images (tests/plan/
// storage_test.cpp: never below a real image, at most 2% + 8 KiB above). The one formula
// behind `jumbo plan`'s checkpoint bytes and the trainer's free-space check.
int64_t shard_file_bytes(const std::vector<TensorPiece>& pieces);

// zlib's CRC-32 and size of a local file, read in blocks (never whole): for shards written or
// verified by the offline tools, whose memory must not grow with the model.
uint32_t local_file_crc32(const std::string& path, int64_t& bytes);

// An HDF5 shard written straight to a local file, piece by piece, rather than built in memory:
// `jumbo ckpt import` and `merge` write a whole model this way in the memory of one piece.
// The file is what build_shard_image writes for the same pieces whose moments are zero, except
// that the moments' datasets have no storage: HDF5 (and h5py) read them as their fill value 0.
class ShardFileWriter {
 public:
  ShardFileWriter(const std::string& path,
                  const std::vector<std::pair<std::string, int64_t>>& file_attrs);
  ~ShardFileWriter();
  ShardFileWriter(const ShardFileWriter&) = delete;
  ShardFileWriter& operator=(const ShardFileWriter&) = delete;
  // `master`: the piece's count() master elements. Its exp_avg and exp_avg_sq are zero.
  void add_piece_with_zero_moments(const TensorPiece& piece, const float* master);
  // Flushes and closes the file (the destructor closes without flushing errors).
  void close();

 private:
  std::string path_;
  long long file_ = -1;  // hid_t
};

// Reads pieces out of a shard held in memory (verified by the caller), or of a local file.
class ShardReader {
 public:
  // `name` names the file in messages.
  ShardReader(const std::vector<char>& image, std::string name);
  struct LocalFile {
    std::string path;
  };
  // Opened in place, read-only: memory holds only what is read.
  ShardReader(const LocalFile& file, std::string name);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;
  // Copies the elements of `stored` (a piece of this file) that `target` holds into
  // target_data (target.count() floats), for state index `state`. Returns elements copied.
  int64_t copy_overlap(const TensorPiece& stored, int state, const TensorPiece& target,
                       float* target_data);
  // All count() elements of `stored` (a piece of this file) for state index `state`, in the
  // piece's row-major order: tools stream a checkpoint out one piece at a time with it.
  std::vector<float> read_piece(const TensorPiece& stored, int state);
  // The pieces stored in this file, from the datasets' attributes (for tools and checks).
  std::vector<TensorPiece> pieces();

 private:
  std::string name_;
  long long file_ = -1;  // hid_t
  std::vector<float> scratch_;
};

// The elements shared by two pieces of the same tensor, as runs of contiguous elements in
// both: (offset within a's range, offset within b's range, length). Pure geometry; used by
// the reader and by the tests.
struct OverlapRun {
  int64_t a, b, length;
};
std::vector<OverlapRun> piece_overlap(const TensorPiece& a, const TensorPiece& b);

}  // namespace jumbo
