// The one safetensors writer (ckpt/safetensors.h): streams a checkpoint's pieces into a
// memory-mapped output, each tensor rearranged as its caller says.
#include "jumbo/ckpt/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>

#include "jumbo/backend/bf16.h"
#include "jumbo/ckpt/safetensors_shards.h"
#include "jumbo/ckpt/shard.h"
#include "jumbo/config/config.h"

namespace jumbo {
namespace {

// safetensors and our raw writes are little endian; so is every host jumbo runs on.
static_assert(std::endian::native == std::endian::little, "export assumes a little-endian host");

// The elements of one exported tensor written so far, as disjoint [begin, end) runs: pieces
// replicated over tensor-parallel ranks (norms, biases) overlap, and must count once.
class Coverage {
 public:
  void add(int64_t b, int64_t e) {
    auto it = runs_.upper_bound(b);
    if (it != runs_.begin() && std::prev(it)->second >= b) --it;
    while (it != runs_.end() && it->first <= e) {  // merge overlapping and adjacent runs
      b = std::min(b, it->first);
      e = std::max(e, it->second);
      total_ -= it->second - it->first;
      it = runs_.erase(it);
    }
    runs_[b] = e;
    total_ += e - b;
  }
  int64_t covered() const { return total_; }

 private:
  std::map<int64_t, int64_t> runs_;
  int64_t total_ = 0;
};

// The output file, memory-mapped whole: a rearranged tensor's elements land far apart, and
// stores into the mapping leave the gathering to the page cache (no copy of the model in
// memory). Removed unless commit() renamed it into place.
class MappedOutput {
 public:
  MappedOutput(std::string tmp, std::string target, int64_t size)
      : tmp_(std::move(tmp)), target_(std::move(target)), size_(static_cast<size_t>(size)) {
    fd_ = ::open(tmp_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("create");
    // Allocated, not just sized: a full disk fails here in one line, where stores into a
    // sparse mapping would die of SIGBUS.
    if (const int err = ::posix_fallocate(fd_, 0, static_cast<off_t>(size)); err != 0) {
      errno = err;
      fail("allocate");
    }
    void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) fail("map");
    data_ = static_cast<char*>(p);
  }
  MappedOutput(const MappedOutput&) = delete;
  MappedOutput& operator=(const MappedOutput&) = delete;
  ~MappedOutput() {
    if (data_) ::munmap(data_, size_);
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  char* data() { return data_; }
  void commit() {
    if (::msync(data_, size_, MS_SYNC) != 0) fail("write");  // write-back errors surface here
    ::munmap(data_, size_);
    data_ = nullptr;
    if (::fsync(fd_) != 0) fail("fsync");
    ::close(fd_);
    fd_ = -1;
    if (::rename(tmp_.c_str(), target_.c_str()) != 0) fail("rename");
    committed_ = true;
  }

 private:
  [[noreturn]] void fail(const char* what) const {
    throw UserError(fmt::format("{}: cannot {} ({})", tmp_, what, std::strerror(errno)));
  }
  std::string tmp_, target_;
  size_t size_ = 0;
  int fd_ = -1;
  char* data_ = nullptr;
  bool committed_ = false;
};

// Where one exported tensor's elements go: element (r, c) of its [rows, cols] source (real
// shape; 1-d: one column) is stored at element index
//   transpose ? c * rows + row(r) : row(r) * cols + c,   row(r) = order.empty() ? r : order[r]
// of the tensor's data, which starts at byte `at` of the output.
struct Placement {
  int64_t rows = 0, cols = 1;
  const std::vector<int64_t>* order = nullptr;  // empty: rows keep their place
  bool transpose = false;
  char* at = nullptr;
  bool bf16 = false;

  void store(int64_t index, const float* src, int64_t n) const {  // n consecutive elements
    if (!bf16) {
      std::memcpy(at + index * 4, src, static_cast<size_t>(n) * 4);
      return;
    }
    for (int64_t e = 0; e < n; ++e) {
      const uint16_t bits = f32_to_bf16(src[e]).bits;
      std::memcpy(at + (index + e) * 2, &bits, 2);
    }
  }
  // Stores n source elements starting at the source's row-major element s.
  void place(int64_t s, const float* src, int64_t n) const {
    if (order->empty() && !transpose) return store(s, src, n);  // as stored: one run
    while (n > 0) {  // row by row: a row segment is contiguous unless transposed
      const int64_t r = s / cols, c = s % cols, len = std::min(n, cols - c);
      const int64_t row = order->empty() ? r : (*order)[static_cast<size_t>(r)];
      if (!transpose) {
        store(row * cols + c, src, len);
      } else {
        for (int64_t k = 0; k < len; ++k) store((c + k) * rows + row, src + k, 1);
      }
      s += len;
      src += len;
      n -= len;
    }
  }
};

}  // namespace

std::vector<int64_t> checkpoint_tensor_shape(const Manifest& manifest, const std::string& name,
                                             const TensorListing& listing) {
  const auto it = manifest.tensors.find(name);
  if (it == manifest.tensors.end() || it->second.empty()) {
    throw UserError(fmt::format("the checkpoint has no tensor {}", name));
  }
  return listing.real_shape(manifest.model, name, it->second.front().piece.global_shape,
                            "checkpoint");
}

SafetensorsMetadata checkpoint_metadata(const Storage& storage, const std::string& dir,
                                        const Manifest& manifest, const std::string& dtype) {
  const ModelConfig& mc = manifest.model;
  const CheckpointProgress& pr = manifest.progress;
  return {{"format", "pt"},  // what Hugging Face loaders expect
          {"producer", "jumbo ckpt export"},
          {"source", storage.url(dir)},
          {"step", std::to_string(pr.step)},
          {"consumed_samples", std::to_string(pr.consumed_samples)},
          {"consumed_tokens", std::to_string(pr.consumed_tokens)},
          {"dtype", dtype == "bf16" ? "bf16 (fp32 master weights rounded to nearest even)" : dtype},
          {"model.name", mc.name},
          {"model.layers", std::to_string(mc.layers)},
          {"model.d_model", std::to_string(mc.d_model)},
          {"model.heads", std::to_string(mc.heads)},
          {"model.ffn", std::to_string(mc.ffn_dim())},
          {"model.vocab", std::to_string(mc.vocab)},
          {"model.context", std::to_string(mc.context)},
          {"model.vocab_multiple", std::to_string(mc.vocab_multiple)}};
}

ExportStats write_safetensors(Storage& storage, const std::string& dir, const Manifest& manifest,
                              const std::string& out_path, const std::string& dtype,
                              const std::vector<SafetensorsTensor>& tensors,
                              const SafetensorsMetadata& metadata) {
  if (dtype != "f32" && dtype != "bf16") {
    throw UserError(fmt::format("--dtype {}: expected f32 or bf16", dtype));
  }
  const bool bf16_out = dtype == "bf16";
  const int64_t esize = bf16_out ? 2 : 4;
  const std::string where = storage.url(join_dir(dir, "manifest.json"));

  // The layout of the output, from the manifest and the list alone.
  struct Out {
    std::vector<int64_t> global, shape;  // the source as saved; as exported (real)
    int64_t begin = 0, numel = 0;        // byte offset in the data section; elements
    Placement place;
    Coverage written;                    // in the source's element indices
  };
  std::map<std::string, Out> outs;  // by source
  std::set<std::string> names;
  nlohmann::ordered_json header;
  int64_t data_bytes = 0, params = 0;
  for (const SafetensorsTensor& t : tensors) {
    const auto it = manifest.tensors.find(t.source);
    if (it == manifest.tensors.end() || it->second.empty()) {
      throw UserError(fmt::format("{}: the checkpoint has no tensor {} (for {})", where,
                                  t.source, t.name));
    }
    if (outs.count(t.source) || !names.insert(t.name).second || t.name == "__metadata__") {
      throw std::logic_error(fmt::format("write_safetensors: {} <- {} named twice", t.name,
                                         t.source));
    }
    Out o;
    o.global = it->second.front().piece.global_shape;
    o.shape = t.shape;
    // The real shape is the stored one with its first dimension cut, or as stored.
    if (o.shape.size() != o.global.size() || (!o.shape.empty() && o.shape[0] > o.global[0]) ||
        (o.shape.size() == 2 && o.shape[1] != o.global[1])) {
      throw std::logic_error(fmt::format("write_safetensors: {}: shape [{}] is not the stored "
                                         "[{}] or fewer of its rows", t.name,
                                         fmt::join(o.shape, ", "), fmt::join(o.global, ", ")));
    }
    o.numel = shape_numel(o.shape);
    o.place.rows = o.shape.empty() ? 1 : o.shape[0];
    o.place.cols = o.shape.size() == 2 ? o.shape[1] : 1;
    o.place.order = &t.row_order;
    o.place.transpose = t.transpose;
    o.place.bf16 = bf16_out;
    if ((t.transpose && o.shape.size() != 2) || o.shape.size() > 2) {
      throw std::logic_error(fmt::format("write_safetensors: {}: cannot rearrange a {}-d tensor",
                                         t.name, o.shape.size()));
    }
    if (!t.row_order.empty()) {  // a permutation of the rows, so every element lands once
      std::vector<char> hit(static_cast<size_t>(o.place.rows), 0);
      bool ok = static_cast<int64_t>(t.row_order.size()) == o.place.rows;
      for (int64_t r : t.row_order) {
        ok = ok && r >= 0 && r < o.place.rows && !hit[static_cast<size_t>(r)];
        if (ok) hit[static_cast<size_t>(r)] = 1;
      }
      if (!ok) {
        throw std::logic_error(fmt::format("write_safetensors: {}: row_order is not a "
                                           "permutation of its {} rows", t.name, o.place.rows));
      }
    }
    const std::vector<int64_t> file_shape =
        t.transpose ? std::vector<int64_t>{o.shape[1], o.shape[0]} : o.shape;
    o.begin = data_bytes;
    data_bytes += o.numel * esize;
    params += o.numel;
    header[t.name] = {{"dtype", bf16_out ? "BF16" : "F32"},
                      {"shape", file_shape},
                      {"data_offsets", {o.begin, data_bytes}}};
    outs.emplace(t.source, std::move(o));
  }
  const std::string head = safetensors_file_header(std::move(header), metadata);
  const auto data_start = static_cast<int64_t>(head.size());

  MappedOutput out(out_path + ".tmp", out_path, data_start + data_bytes);
  std::memcpy(out.data(), head.data(), head.size());
  for (auto& [source, o] : outs) o.place.at = out.data() + data_start + o.begin;

  // Each shard file once: verified, then its master pieces' elements stored at their places.
  std::vector<std::vector<const StoredPiece*>> by_file(manifest.files.size());
  for (const auto& [name, pieces] : manifest.tensors) {
    if (!outs.count(name)) continue;
    for (const StoredPiece& sp : pieces) by_file[static_cast<size_t>(sp.file)].push_back(&sp);
  }
  for (size_t i = 0; i < manifest.files.size(); ++i) {
    if (by_file[i].empty()) continue;
    std::string why;
    const std::optional<std::vector<char>> bytes =
        read_verified_shard_file(storage, dir, manifest.files[i], why);
    if (!bytes) throw UserError(why);
    ShardReader reader(*bytes, storage.url(join_dir(dir, manifest.files[i].name)));
    for (const StoredPiece* sp : by_file[i]) {
      Out& o = outs.at(sp->piece.name);
      TensorPiece full;  // the whole exported source, as a piece of the saved one
      full.name = sp->piece.name;
      full.global_shape = o.global;
      full.offset.assign(o.shape.size(), 0);
      full.shape = o.shape;
      full.flat_end = o.numel;
      const std::vector<OverlapRun> runs = piece_overlap(sp->piece, full);
      if (runs.empty()) continue;  // only padding rows
      const std::vector<float> values = reader.read_piece(sp->piece, 0);
      for (const OverlapRun& run : runs) {
        o.place.place(run.b, values.data() + run.a, run.length);
        o.written.add(run.b, run.b + run.length);
      }
    }
  }
  for (const auto& [source, o] : outs) {
    if (o.written.covered() != o.numel) {
      throw UserError(fmt::format("{}: tensor {}: the shards hold {} of its {} elements (the "
                                  "manifest is incomplete); nothing written to {}", where, source,
                                  o.written.covered(), o.numel, out_path));
    }
  }
  out.commit();
  return {static_cast<int64_t>(outs.size()), params, data_start + data_bytes};
}

ExportStats export_safetensors(Storage& storage, const std::string& dir, const Manifest& manifest,
                               const std::string& out_path, const std::string& dtype,
                               const TensorListing& listing) {
  const std::vector<std::string> names = listing.names_of(manifest);
  std::vector<SafetensorsTensor> tensors;
  for (const std::string& name : names) {
    tensors.push_back({.name = name, .source = name,
                       .shape = checkpoint_tensor_shape(manifest, name, listing),
                       .row_order = {}, .transpose = false});
  }
  return write_safetensors(storage, dir, manifest, out_path, dtype, tensors,
                           checkpoint_metadata(storage, dir, manifest, dtype));
}

}  // namespace jumbo
