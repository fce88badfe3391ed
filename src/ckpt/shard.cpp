// HDF5 shard files built and read in memory (the core driver and file images): the same bytes
// go to a file system or to S3, are checksummed once, and are read back without a temp file.
// The offline tools also write a shard straight to a local file (ShardFileWriter) and read
// one in place (ShardReader::LocalFile), so their memory does not grow with the model.
#include "jumbo/ckpt/shard.h"

#include <fmt/format.h>
#include <hdf5.h>
#include <hdf5_hl.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <stdexcept>

#include "jumbo/config/config.h"

namespace jumbo {
namespace {

// HDF5 prints its own error stack by default; we report one line instead.
void quiet_hdf5() {
  static const bool once = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)once;
}

// Closes an HDF5 handle at scope exit.
struct H5Handle {
  hid_t id;
  herr_t (*close)(hid_t);
  H5Handle(hid_t handle, herr_t (*closer)(hid_t)) : id(handle), close(closer) {}
  H5Handle(H5Handle&& other) noexcept : id(other.id), close(other.close) { other.id = -1; }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  H5Handle& operator=(H5Handle&&) = delete;
  ~H5Handle() {
    if (id >= 0) close(id);
  }
};

void check(herr_t rc, const char* what, const std::string& where) {
  if (rc < 0) throw std::runtime_error(fmt::format("HDF5: {} failed for {}", what, where));
}

void write_i64_attr(hid_t obj, const char* name, const std::vector<int64_t>& v,
                    const std::string& where) {
  const hsize_t n = v.size();
  H5Handle space{H5Screate_simple(1, &n, nullptr), H5Sclose};
  H5Handle attr{H5Acreate2(obj, name, H5T_STD_I64LE, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
  check(attr.id, "H5Acreate2", where);
  check(H5Awrite(attr.id, H5T_NATIVE_INT64, v.data()), "H5Awrite", where);
}

std::vector<int64_t> read_i64_attr(hid_t obj, const char* name, const std::string& where) {
  H5Handle attr{H5Aopen(obj, name, H5P_DEFAULT), H5Aclose};
  if (attr.id < 0) throw UserError(fmt::format("{}: attribute '{}' is missing", where, name));
  H5Handle space{H5Aget_space(attr.id), H5Sclose};
  const hssize_t n = H5Sget_simple_extent_npoints(space.id);
  std::vector<int64_t> v(static_cast<size_t>(std::max<hssize_t>(n, 0)));
  check(H5Aread(attr.id, H5T_NATIVE_INT64, v.data()), "H5Aread", where);
  return v;
}

// A piece as rows x cols of a 2-d view (1-d tensors are one row).
struct Rect {
  int64_t row0, rows, col0, cols;
};
Rect rect_of(const TensorPiece& p) {
  if (p.shape.size() == 1) return {0, 1, p.offset[0], p.shape[0]};
  return {p.offset[0], p.shape[0], p.offset[1], p.shape[1]};
}

// One state's dataset of a stored piece, whose element count must be the manifest's.
H5Handle open_stored(hid_t file, const std::string& file_name, const std::string& ds_name,
                     int64_t count) {
  H5Handle ds{H5Dopen2(file, ds_name.c_str(), H5P_DEFAULT), H5Dclose};
  if (ds.id < 0) throw UserError(fmt::format("{}: dataset '{}' is missing", file_name, ds_name));
  const H5Handle space{H5Dget_space(ds.id), H5Sclose};
  if (H5Sget_simple_extent_npoints(space.id) != count) {
    throw UserError(fmt::format("{}: dataset '{}' has {} elements, the manifest says {}",
                                file_name, ds_name, H5Sget_simple_extent_npoints(space.id), count));
  }
  return ds;
}

// A piece's three datasets (one per kCheckpointStates entry, created with `dcpl`) and their
// attributes; state s is written from data[s], or left unwritten when it is null (its
// storage never allocated: read as the fill value).
void write_piece_datasets(hid_t file, const TensorPiece& p, hid_t dcpl,
                          const std::array<const float*, kCheckpointStates.size()>& data,
                          const std::string& file_name) {
  std::vector<hsize_t> dims;
  if (p.whole()) {
    for (int64_t d : p.shape) dims.push_back(static_cast<hsize_t>(d));
  } else {
    dims.push_back(static_cast<hsize_t>(p.count()));
  }
  H5Handle space{H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose};
  H5Handle lcpl{H5Pcreate(H5P_LINK_CREATE), H5Pclose};
  H5Pset_create_intermediate_group(lcpl.id, 1);
  for (size_t s = 0; s < kCheckpointStates.size(); ++s) {
    const std::string ds_name = p.dataset(kCheckpointStates[s]);
    H5Handle ds{H5Dcreate2(file, ds_name.c_str(), H5T_IEEE_F32LE, space.id, lcpl.id, dcpl,
                           H5P_DEFAULT), H5Dclose};
    check(ds.id, "H5Dcreate2", ds_name);
    if (data[s] && H5Dwrite(ds.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data[s]) < 0) {
      throw UserError(fmt::format("{}: cannot write dataset '{}' (is the disk full?)", file_name,
                                  ds_name));
    }
    write_i64_attr(ds.id, "global_shape", p.global_shape, ds_name);
    write_i64_attr(ds.id, "offset", p.offset, ds_name);
    write_i64_attr(ds.id, "shape", p.shape, ds_name);
    write_i64_attr(ds.id, "flat_range", {p.flat_begin, p.flat_end}, ds_name);
  }
}

}  // namespace

uint32_t file_crc32(const std::vector<char>& bytes) {
  // Blocks on every OpenMP thread, joined with crc32_combine: one core reaches ~2 GB/s.
  constexpr size_t kBlock = size_t{16} << 20;
  const int64_t blocks = static_cast<int64_t>((bytes.size() + kBlock - 1) / kBlock);
  std::vector<uLong> crcs(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const size_t begin = static_cast<size_t>(b) * kBlock;
    const size_t n = std::min(kBlock, bytes.size() - begin);
    crcs[static_cast<size_t>(b)] = crc32(crc32(0L, Z_NULL, 0),
                                         reinterpret_cast<const Bytef*>(bytes.data() + begin),
                                         static_cast<uInt>(n));
  }
  uLong crc = crc32(0L, Z_NULL, 0);
  for (int64_t b = 0; b < blocks; ++b) {
    const size_t n = std::min(kBlock, bytes.size() - static_cast<size_t>(b) * kBlock);
    crc = crc32_combine(crc, crcs[static_cast<size_t>(b)], static_cast<z_off_t>(n));
  }
  return static_cast<uint32_t>(crc);
}

int64_t shape_numel(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

int64_t TensorPiece::rect_numel() const { return shape_numel(shape); }

std::string TensorPiece::dataset(const char* state) const {
  if (whole()) return fmt::format("{}/{}", state, name);
  return fmt::format("{}/{}@{}", state, name, flat_begin);
}

std::vector<OverlapRun> piece_overlap(const TensorPiece& a, const TensorPiece& b) {
  std::vector<OverlapRun> runs;
  if (a.shape.size() != b.shape.size()) return runs;
  const Rect ra = rect_of(a), rb = rect_of(b);
  // Rows that hold any element of each piece's range.
  const int64_t a_first = ra.row0 + a.flat_begin / ra.cols;
  const int64_t a_last = ra.row0 + (a.flat_end - 1) / ra.cols;
  const int64_t b_first = rb.row0 + b.flat_begin / rb.cols;
  const int64_t b_last = rb.row0 + (b.flat_end - 1) / rb.cols;
  if (a.count() <= 0 || b.count() <= 0) return runs;
  for (int64_t g = std::max(a_first, b_first); g <= std::min(a_last, b_last); ++g) {
    // Global columns of row g inside each piece's range.
    const int64_t ia = (g - ra.row0) * ra.cols, ib = (g - rb.row0) * rb.cols;
    const int64_t a0 = ra.col0 + std::max<int64_t>(a.flat_begin - ia, 0);
    const int64_t a1 = ra.col0 + std::min<int64_t>(a.flat_end - ia, ra.cols);
    const int64_t b0 = rb.col0 + std::max<int64_t>(b.flat_begin - ib, 0);
    const int64_t b1 = rb.col0 + std::min<int64_t>(b.flat_end - ib, rb.cols);
    const int64_t c0 = std::max(a0, b0), c1 = std::min(a1, b1);
    if (c0 >= c1) continue;
    const int64_t at = ia + (c0 - ra.col0) - a.flat_begin;
    const int64_t bt = ib + (c0 - rb.col0) - b.flat_begin;
    if (!runs.empty() && runs.back().a + runs.back().length == at &&
        runs.back().b + runs.back().length == bt) {
      runs.back().length += c1 - c0;  // whole rows of equal rectangles merge into one run
    } else {
      runs.push_back({at, bt, c1 - c0});
    }
  }
  return runs;
}

std::vector<char> build_shard_image(const std::vector<PieceData>& pieces,
                                    const std::vector<std::pair<std::string, int64_t>>& file_attrs) {
  std::vector<char> image;
  build_shard_image(pieces, file_attrs, image);
  return image;
}

void build_shard_image(const std::vector<PieceData>& pieces,
                       const std::vector<std::pair<std::string, int64_t>>& file_attrs,
                       std::vector<char>& image) {
  quiet_hdf5();
  size_t payload = 0;
  for (const PieceData& p : pieces) payload += static_cast<size_t>(p.piece.count()) * 4 * 3;
  H5Handle fapl{H5Pcreate(H5P_FILE_ACCESS), H5Pclose};
  // One allocation of the whole payload (plus room for metadata), never written to disk.
  check(H5Pset_fapl_core(fapl.id, payload + (size_t{1} << 20), 0), "H5Pset_fapl_core", "shard");
  H5Handle file{H5Fcreate("shard.h5", H5F_ACC_TRUNC, H5P_DEFAULT, fapl.id), H5Fclose};
  check(file.id, "H5Fcreate", "shard");
  for (const auto& [name, value] : file_attrs) write_i64_attr(file.id, name.c_str(), {value}, name);
  for (const PieceData& pd : pieces) {
    write_piece_datasets(file.id, pd.piece, H5P_DEFAULT, {pd.state[0], pd.state[1], pd.state[2]},
                         "shard");
  }
  check(H5Fflush(file.id, H5F_SCOPE_GLOBAL), "H5Fflush", "shard");
  const ssize_t size = H5Fget_file_image(file.id, nullptr, 0);
  if (size <= 0) throw std::runtime_error("HDF5: H5Fget_file_image failed for shard");
  image.resize(static_cast<size_t>(size));
  if (H5Fget_file_image(file.id, image.data(), image.size()) != size) {
    throw std::runtime_error("HDF5: H5Fget_file_image failed for shard");
  }
}

int64_t shard_file_bytes(const std::vector<TensorPiece>& pieces) {
  // The data: three float32 states per element, contiguous. The metadata of HDF5's default
  // (earliest) file format, which build_shard_image uses (HDF5 File Format Specification:
  // superblock v0, v1 object headers, v1 groups with a local heap and symbol-table nodes):
  // per piece, three datasets, each an object header with its dataspace, datatype, fill value,
  // layout and modification-time messages and four int64 attributes, its symbol-table entry
  // and its name in the group's heap (which grows by doubling). HDF5 allocates metadata in
  // blocks of 2 KiB (H5Pset_meta_block_size's default), so the sum is rounded unevenly: the
  // constants are a least-squares fit of 21 real images (4.0 KiB + 1391 bytes per piece + 16
  // per byte of its dataset name; residuals within +-2.6 KiB), raised by 3 KiB to bound them.
  // tests/plan/storage_test.cpp checks the bound on every writer of 9 layouts.
  constexpr int64_t kFileBytes = 8192, kPieceBytes = 1400, kPerNameByte = 16;
  int64_t bytes = kFileBytes;
  for (const TensorPiece& p : pieces) {
    const auto name = static_cast<int64_t>(p.dataset("").size());  // "/" + the name in a group
    bytes += 12 * p.count() + kPieceBytes + kPerNameByte * ((name + 7) / 8 * 8);
  }
  return bytes;
}

ShardReader::ShardReader(const std::vector<char>& image, std::string name) : name_(std::move(name)) {
  quiet_hdf5();
  // The image stays owned by the caller: no copy, no release by HDF5.
  file_ = H5LTopen_file_image(const_cast<char*>(image.data()), image.size(),
                              H5LT_FILE_IMAGE_DONT_COPY | H5LT_FILE_IMAGE_DONT_RELEASE);
  if (file_ < 0) throw UserError(fmt::format("{}: not a readable HDF5 file", name_));
}

ShardReader::ShardReader(const LocalFile& file, std::string name) : name_(std::move(name)) {
  quiet_hdf5();
  file_ = H5Fopen(file.path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file_ < 0) throw UserError(fmt::format("{}: not a readable HDF5 file", name_));
}

uint32_t local_file_crc32(const std::string& path, int64_t& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw UserError(fmt::format("{}: cannot open ({})", path, std::strerror(errno)));
  std::vector<unsigned char> block(size_t{8} << 20);
  uLong crc = crc32(0L, Z_NULL, 0);
  bytes = 0;
  size_t n = 0;
  while ((n = std::fread(block.data(), 1, block.size(), f)) > 0) {
    crc = crc32(crc, block.data(), static_cast<uInt>(n));
    bytes += static_cast<int64_t>(n);
  }
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) throw UserError(fmt::format("{}: read error", path));
  return static_cast<uint32_t>(crc);
}

ShardFileWriter::ShardFileWriter(const std::string& path,
                                 const std::vector<std::pair<std::string, int64_t>>& file_attrs)
    : path_(path) {
  quiet_hdf5();
  file_ = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (file_ < 0) {
    throw UserError(fmt::format("{}: cannot create the shard file ({})", path,
                                std::strerror(errno)));
  }
  for (const auto& [name, value] : file_attrs) write_i64_attr(file_, name.c_str(), {value}, name);
}

ShardFileWriter::~ShardFileWriter() {
  if (file_ >= 0) H5Fclose(file_);
}

void ShardFileWriter::add_piece_with_zero_moments(const TensorPiece& p, const float* master) {
  // Storage allocated at the first write, and the moments never written: no bytes on disk.
  H5Handle dcpl{H5Pcreate(H5P_DATASET_CREATE), H5Pclose};
  const float zero = 0.0f;
  check(H5Pset_fill_value(dcpl.id, H5T_NATIVE_FLOAT, &zero), "H5Pset_fill_value", p.name);
  check(H5Pset_alloc_time(dcpl.id, H5D_ALLOC_TIME_LATE), "H5Pset_alloc_time", p.name);
  check(H5Pset_fill_time(dcpl.id, H5D_FILL_TIME_IFSET), "H5Pset_fill_time", p.name);
  write_piece_datasets(file_, p, dcpl.id, {master, nullptr, nullptr}, path_);
}

void ShardFileWriter::close() {
  if (file_ < 0) return;
  const herr_t flushed = H5Fflush(file_, H5F_SCOPE_GLOBAL);
  const herr_t closed = H5Fclose(file_);
  file_ = -1;
  if (flushed < 0 || closed < 0) {
    throw UserError(fmt::format("{}: cannot write the shard file (is the disk full?)", path_));
  }
}

ShardReader::~ShardReader() {
  if (file_ >= 0) H5Fclose(file_);
}


int64_t ShardReader::copy_overlap(const TensorPiece& stored, int state, const TensorPiece& target,
                                  float* target_data) {
  const std::vector<OverlapRun> runs = piece_overlap(stored, target);
  if (runs.empty()) return 0;
  const std::string ds_name = stored.dataset(kCheckpointStates[state]);
  const H5Handle ds = open_stored(file_, name_, ds_name, stored.count());
  H5Handle space{H5Dget_space(ds.id), H5Sclose};
  // Read the stored elements [lo, hi) the runs need: a 1-d range, or whole rows of a 2-d set.
  int64_t lo = runs.front().a, hi = 0;
  for (const OverlapRun& r : runs) {
    lo = std::min(lo, r.a);
    hi = std::max(hi, r.a + r.length);
  }
  const int ndim = H5Sget_simple_extent_ndims(space.id);
  int64_t row_len = 1;
  if (ndim == 2) {
    hsize_t dims[2];
    H5Sget_simple_extent_dims(space.id, dims, nullptr);
    row_len = static_cast<int64_t>(dims[1]);
    lo = lo / row_len * row_len;
    hi = (hi + row_len - 1) / row_len * row_len;
  }
  scratch_.resize(static_cast<size_t>(hi - lo));
  hsize_t start[2] = {static_cast<hsize_t>(lo / row_len), 0};
  hsize_t count[2] = {static_cast<hsize_t>((hi - lo) / row_len), static_cast<hsize_t>(row_len)};
  if (ndim == 1) {
    start[0] = static_cast<hsize_t>(lo);
    count[0] = static_cast<hsize_t>(hi - lo);
  }
  check(H5Sselect_hyperslab(space.id, H5S_SELECT_SET, start, nullptr, count, nullptr),
        "H5Sselect_hyperslab", ds_name);
  const hsize_t mem_n = static_cast<hsize_t>(hi - lo);
  H5Handle mem{H5Screate_simple(1, &mem_n, nullptr), H5Sclose};
  if (H5Dread(ds.id, H5T_NATIVE_FLOAT, mem.id, space.id, H5P_DEFAULT, scratch_.data()) < 0) {
    throw UserError(fmt::format("{}: cannot read dataset '{}'", name_, ds_name));
  }
  int64_t copied = 0;
  for (const OverlapRun& r : runs) {
    std::memcpy(target_data + r.b, scratch_.data() + (r.a - lo), static_cast<size_t>(r.length) * 4);
    copied += r.length;
  }
  return copied;
}

std::vector<float> ShardReader::read_piece(const TensorPiece& stored, int state) {
  const std::string ds_name = stored.dataset(kCheckpointStates[state]);
  const H5Handle ds = open_stored(file_, name_, ds_name, stored.count());
  std::vector<float> out(static_cast<size_t>(stored.count()));
  if (H5Dread(ds.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0) {
    throw UserError(fmt::format("{}: cannot read dataset '{}'", name_, ds_name));
  }
  return out;
}

std::vector<TensorPiece> ShardReader::pieces() {
  std::vector<TensorPiece> out;
  // Pieces are listed once, under the first state's group.
  H5Handle group{H5Gopen2(file_, kCheckpointStates[0], H5P_DEFAULT), H5Gclose};
  if (group.id < 0) return out;
  hsize_t n = 0;
  H5Gget_num_objs(group.id, &n);
  for (hsize_t i = 0; i < n; ++i) {
    char buf[1024];
    H5Gget_objname_by_idx(group.id, i, buf, sizeof buf);
    const std::string where = fmt::format("{}: {}/{}", name_, kCheckpointStates[0], buf);
    H5Handle ds{H5Dopen2(group.id, buf, H5P_DEFAULT), H5Dclose};
    TensorPiece p;
    p.name = buf;
    if (const size_t at = p.name.find('@'); at != std::string::npos) p.name.resize(at);
    p.global_shape = read_i64_attr(ds.id, "global_shape", where);
    p.offset = read_i64_attr(ds.id, "offset", where);
    p.shape = read_i64_attr(ds.id, "shape", where);
    const std::vector<int64_t> range = read_i64_attr(ds.id, "flat_range", where);
    if (range.size() != 2) throw UserError(fmt::format("{}: flat_range is not [begin, end]", where));
    p.flat_begin = range[0];
    p.flat_end = range[1];
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace jumbo
