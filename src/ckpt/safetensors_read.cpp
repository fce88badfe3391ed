// Reading safetensors files in place (ckpt/safetensors_read.h).
#include "jumbo/ckpt/safetensors_read.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>

#include "jumbo/ckpt/shard.h"
#include "jumbo/config/config.h"

namespace jumbo {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

int64_t element_bytes(SafetensorsDtype d) { return d == SafetensorsDtype::f32 ? 4 : 2; }

void read_exactly(int fd, void* out, int64_t bytes, int64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, static_cast<size_t>(bytes), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw UserError(fmt::format("{}: cannot read {} bytes at {} ({})", path, bytes, offset,
                                  n < 0 ? std::strerror(errno) : "the file is shorter"));
    }
    p += n;
    bytes -= n;
    offset += n;
  }
}

}  // namespace

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu, bits = sign;
  if (exponent == 31) {
    bits |= 0x7f800000u | (mantissa << 13);  // inf, nan
  } else if (exponent != 0) {
    bits |= ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa != 0) {  // subnormal: normalise
    exponent = 113;
    while (!(mantissa & 0x400u)) {
      mantissa <<= 1;
      --exponent;
    }
    bits |= (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

SafetensorsReader::SafetensorsReader(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw UserError(fmt::format("{}: {}", path_, std::strerror(errno)));
  struct stat st {};
  ::fstat(fd_, &st);
  const auto size = static_cast<int64_t>(st.st_size);
  if (size < 8) throw UserError(fmt::format("{}: {} bytes, not a safetensors file", path_, size));
  unsigned char len_bytes[8];
  read_exactly(fd_, len_bytes, 8, 0, path_);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | len_bytes[i];  // little-endian
  if (header_len > static_cast<uint64_t>(size - 8) || header_len > (uint64_t{100} << 20)) {
    throw UserError(fmt::format("{}: header of {} bytes in a file of {}: not a safetensors file",
                                path_, header_len, size));
  }
  std::string text(static_cast<size_t>(header_len), '\0');
  read_exactly(fd_, text.data(), static_cast<int64_t>(header_len), 8, path_);
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    throw UserError(fmt::format("{}: the header is not JSON ({})", path_, e.what()));
  }
  if (!header.is_object()) throw UserError(fmt::format("{}: the header is not an object", path_));
  const int64_t data_start = 8 + static_cast<int64_t>(header_len), data_len = size - data_start;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    SafetensorsEntry t;
    t.name = name;
    try {
      t.dtype_name = entry.at("dtype").get<std::string>();
      t.shape = entry.at("shape").get<std::vector<int64_t>>();
      const auto offsets = entry.at("data_offsets").get<std::vector<int64_t>>();
      if (offsets.size() != 2 || offsets[0] < 0 || offsets[0] > offsets[1] ||
          offsets[1] > data_len) {
        throw UserError(fmt::format("{}: tensor {}: data_offsets {} outside the {} bytes of "
                                    "data", path_, name, entry.at("data_offsets").dump(),
                                    data_len));
      }
      t.offset = data_start + offsets[0];
      t.bytes = offsets[1] - offsets[0];
    } catch (const json::exception& e) {
      throw UserError(fmt::format("{}: tensor {}: malformed header entry ({})", path_, name,
                                  e.what()));
    }
    for (int64_t d : t.shape) {
      if (d < 0) throw UserError(fmt::format("{}: tensor {}: negative dimension", path_, name));
    }
    t.dtype = t.dtype_name == "F32"    ? SafetensorsDtype::f32
              : t.dtype_name == "BF16" ? SafetensorsDtype::bf16
              : t.dtype_name == "F16"  ? SafetensorsDtype::f16
                                       : SafetensorsDtype::other;
    tensors_.emplace(name, std::move(t));
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

void check_float_tensor(const SafetensorsEntry& t, const std::string& file) {
  if (t.dtype == SafetensorsDtype::other) {
    throw UserError(fmt::format("{}: tensor {} has dtype {}: expected F32, BF16 or F16", file,
                                t.name, t.dtype_name));
  }
  const int64_t need = shape_numel(t.shape) * element_bytes(t.dtype);
  if (t.bytes != need) {
    throw UserError(fmt::format("{}: tensor {}: {} bytes of data, {} [{}] needs {}", file,
                                t.name, t.bytes, t.dtype_name, fmt::join(t.shape, ", "), need));
  }
}

void SafetensorsReader::read_f32(const SafetensorsEntry& t, int64_t first, int64_t n,
                                 float* out) const {
  const int64_t esize = element_bytes(t.dtype);
  if (t.dtype == SafetensorsDtype::f32) {
    read_exactly(fd_, out, n * 4, t.offset + first * 4, path_);
    return;
  }
  // Widen in place from the back: the 2-byte elements fill the first half of `out`.
  auto* half = reinterpret_cast<uint16_t*>(out);
  read_exactly(fd_, half, n * esize, t.offset + first * esize, path_);
  for (int64_t i = n - 1; i >= 0; --i) {
    const uint16_t h = half[i];
    if (t.dtype == SafetensorsDtype::f16) {
      out[i] = f16_to_f32(h);
    } else {
      const uint32_t bits = static_cast<uint32_t>(h) << 16;
      std::memcpy(&out[i], &bits, 4);
    }
  }
}

SafetensorsSet open_safetensors_dir(const std::string& dir) {
  SafetensorsSet set;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (!fs::exists(index)) {
    const fs::path single = fs::path(dir) / "model.safetensors";
    if (!fs::exists(single)) {
      throw UserError(fmt::format("{}: neither model.safetensors nor model.safetensors.index.json;"
                                  " expected a Hugging Face model's weights", dir));
    }
    set.files.push_back(std::make_unique<SafetensorsReader>(single.string()));
    for (const auto& [name, t] : set.files.back()->tensors()) set.tensors.emplace(name, t);
    return set;
  }
  set.index = index.string();
  json parsed;
  try {
    std::ifstream in(index);
    parsed = json::parse(std::string(std::istreambuf_iterator<char>(in), {}));
  } catch (const json::exception& e) {
    throw UserError(fmt::format("{}: not JSON ({})", set.index, e.what()));
  }
  if (!parsed.is_object() || !parsed.contains("weight_map") || !parsed["weight_map"].is_object()) {
    throw UserError(fmt::format("{}: no weight_map object; expected {{\"weight_map\": {{tensor: "
                                "file}}}}", set.index));
  }
  std::map<std::string, int> file_index;
  for (const auto& [name, file_json] : parsed["weight_map"].items()) {
    if (!file_json.is_string()) {
      throw UserError(fmt::format("{}: weight_map[\"{}\"] = {}: expected a file name", set.index,
                                  name, file_json.dump()));
    }
    const std::string file = file_json.get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
      throw UserError(fmt::format("{}: weight_map[\"{}\"] = \"{}\": expected a file name in {}",
                                  set.index, name, file, dir));
    }
    auto it = file_index.find(file);
    if (it == file_index.end()) {
      const fs::path path = fs::path(dir) / file;
      if (!fs::exists(path)) {
        throw UserError(fmt::format("{}: no such file, named by {} for tensor {}", path.string(),
                                    set.index, name));
      }
      it = file_index.emplace(file, static_cast<int>(set.files.size())).first;
      set.files.push_back(std::make_unique<SafetensorsReader>(path.string()));
    }
    const SafetensorsReader& reader = *set.files[static_cast<size_t>(it->second)];
    const auto found = reader.tensors().find(name);
    if (found == reader.tensors().end()) {
      throw UserError(fmt::format("{}: no tensor {}, which {} places there", reader.path(), name,
                                  set.index));
    }
    SafetensorsEntry t = found->second;
    t.file = it->second;
    set.tensors.emplace(name, std::move(t));
  }
  return set;
}

}  // namespace jumbo
