// save_pretrained's sharded safetensors, written tensor by tensor (ckpt/safetensors_shards.h).
#include "jumbo/ckpt/safetensors_shards.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "jumbo/backend/bf16.h"
#include "jumbo/ckpt/shard.h"
#include "jumbo/config/config.h"

namespace jumbo {
namespace {

namespace fs = std::filesystem;

void write_exactly(int fd, const void* data, int64_t bytes, int64_t offset, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, p, static_cast<size_t>(bytes), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw UserError(fmt::format("{}: cannot write ({})", path, std::strerror(errno)));
    p += n;
    bytes -= n;
    offset += n;
  }
}

}  // namespace

std::string safetensors_file_header(nlohmann::ordered_json header,
                                    const std::vector<std::pair<std::string, std::string>>& metadata) {
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  for (const auto& [key, value] : metadata) meta[key] = value;
  header["__metadata__"] = meta;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  const uint64_t n = text.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);  // little-endian, as every host jumbo runs on
  return out + text;
}

int64_t parse_shard_size(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    return -1;
  }
  const std::string unit = text.substr(used);
  const double scale = unit.empty() || unit == "B" ? 1
                       : unit == "KB"              ? 1e3
                       : unit == "MB"              ? 1e6
                       : unit == "GB"              ? 1e9
                                                   : -1;
  if (scale < 0 || value * scale < 1) return -1;
  return static_cast<int64_t>(value * scale);
}

SafetensorsShardWriter::SafetensorsShardWriter(
    std::string dir, std::vector<SafetensorsOut> tensors, SafetensorsOutDtype dtype,
    int64_t max_shard_bytes, std::vector<std::pair<std::string, std::string>> metadata)
    : dir_(std::move(dir)), dtype_(dtype), tensors_(std::move(tensors)) {
  const int64_t esize = dtype == SafetensorsOutDtype::bf16 ? 2 : 4;
  // huggingface_hub's split_state_dict_into_shards: in order, a tensor larger than the limit
  // gets a file of its own; otherwise a new file starts when this one would overflow.
  std::vector<std::vector<size_t>> groups;
  std::vector<size_t> current;
  int64_t current_bytes = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const int64_t bytes = shape_numel(tensors_[i].shape) * esize;
    data_bytes_ += bytes;
    if (bytes > max_shard_bytes) {
      groups.push_back({i});
      continue;
    }
    if (current_bytes + bytes > max_shard_bytes && !current.empty()) {
      groups.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(i);
    current_bytes += bytes;
  }
  if (!current.empty() || groups.empty()) groups.push_back(std::move(current));
  placed_.resize(tensors_.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    File f;
    f.name = groups.size() == 1 ? "model.safetensors"
                                : fmt::format("model-{:05d}-of-{:05d}.safetensors", g + 1,
                                              groups.size());
    f.tmp = (fs::path(dir_) / (f.name + ".tmp")).string();
    nlohmann::ordered_json header;
    int64_t at = 0;
    for (size_t i : groups[g]) {
      const int64_t numel = shape_numel(tensors_[i].shape);
      header[tensors_[i].name] = {{"dtype", esize == 2 ? "BF16" : "F32"},
                                  {"shape", tensors_[i].shape},
                                  {"data_offsets", {at, at + numel * esize}}};
      placed_[i] = {static_cast<int>(g), at, numel, false};
      at += numel * esize;
    }
    const std::string head = safetensors_file_header(std::move(header), metadata);
    const auto data_start = static_cast<int64_t>(head.size());
    for (size_t i : groups[g]) placed_[i].offset += data_start;
    f.fd = ::open(f.tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f.fd < 0) throw UserError(fmt::format("{}: cannot create ({})", f.tmp, std::strerror(errno)));
    files_.push_back(f);  // from here the destructor removes it
    if (const int err = ::posix_fallocate(f.fd, 0, static_cast<off_t>(data_start + at)); err != 0) {
      throw UserError(fmt::format("{}: cannot allocate {} bytes ({})", f.tmp, data_start + at,
                                  std::strerror(err)));
    }
    write_exactly(f.fd, head.data(), data_start, 0, f.tmp);
  }
}

SafetensorsShardWriter::~SafetensorsShardWriter() {
  for (File& f : files_) {
    if (f.fd >= 0) ::close(f.fd);
    if (!committed_) ::unlink(f.tmp.c_str());
  }
}

void SafetensorsShardWriter::write(const std::string& name, const float* values) {
  size_t i = 0;
  while (i < tensors_.size() && tensors_[i].name != name) ++i;
  if (i == tensors_.size()) throw std::logic_error("SafetensorsShardWriter: no tensor " + name);
  Placed& p = placed_[i];
  const File& f = files_[static_cast<size_t>(p.file)];
  if (dtype_ == SafetensorsOutDtype::f32) {
    write_exactly(f.fd, values, p.numel * 4, p.offset, f.tmp);
  } else {
    constexpr int64_t kBlock = int64_t{1} << 20;
    std::vector<uint16_t> block(static_cast<size_t>(std::min(kBlock, p.numel)));
    for (int64_t b = 0; b < p.numel; b += kBlock) {
      const int64_t n = std::min(kBlock, p.numel - b);
      for (int64_t e = 0; e < n; ++e) block[static_cast<size_t>(e)] = f32_to_bf16(values[b + e]).bits;
      write_exactly(f.fd, block.data(), n * 2, p.offset + b * 2, f.tmp);
    }
  }
  p.written = true;
}

std::vector<std::string> SafetensorsShardWriter::commit() {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (!placed_[i].written) {
      throw std::logic_error("SafetensorsShardWriter: " + tensors_[i].name + " never written");
    }
  }
  std::vector<std::string> names;
  for (File& f : files_) {
    if (::fsync(f.fd) != 0) {
      throw UserError(fmt::format("{}: cannot write ({})", f.tmp, std::strerror(errno)));
    }
    ::close(f.fd);
    f.fd = -1;
    names.push_back(f.name);
  }
  const fs::path index = fs::path(dir_) / "model.safetensors.index.json";
  std::error_code ec;
  fs::remove(index, ec);  // an earlier export's, which may name other files
  for (File& f : files_) {
    fs::rename(f.tmp, fs::path(dir_) / f.name, ec);
    if (ec) throw UserError(fmt::format("{}: cannot rename ({})", f.tmp, ec.message()));
  }
  committed_ = true;
  if (files_.size() > 1) {
    nlohmann::json map = nlohmann::json::object();  // sorted keys, as transformers writes it
    for (size_t i = 0; i < tensors_.size(); ++i) {
      map[tensors_[i].name] = files_[static_cast<size_t>(placed_[i].file)].name;
    }
    const nlohmann::json doc = {{"metadata", {{"total_size", data_bytes_}}}, {"weight_map", map}};
    const std::string tmp = index.string() + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary);
      out << doc.dump(2) << "\n";
      if (!out.flush()) throw UserError(fmt::format("{}: cannot write", tmp));
    }
    fs::rename(tmp, index, ec);
    if (ec) throw UserError(fmt::format("{}: cannot rename ({})", tmp, ec.message()));
  }
  return names;
}

}  // namespace jumbo
