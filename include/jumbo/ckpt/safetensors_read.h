#pragma once
// Reading safetensors files, as Hugging Face writes them: one file (model.safetensors) or a
// directory of shards named by model.safetensors.index.json's weight_map. Elements are read
// with pread where the caller asks, widened to float32 exactly (F32, BF16, F16), so a reader
// of a model larger than memory holds only what it asked for. Knows no model: infer/ decides
// what each tensor is.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace jumbo {

enum class SafetensorsDtype { f32, bf16, f16, other };

struct SafetensorsEntry {
  std::string name;
  std::string dtype_name;  // as stored: "BF16", "F32", "I64", ...
  SafetensorsDtype dtype = SafetensorsDtype::other;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // of the first byte, from the file's start
  int64_t bytes = 0;
  int file = 0;        // index into SafetensorsSet::files
};

// IEEE half to float, exact.
float f16_to_f32(uint16_t h);

// One file: its header parsed and every tensor's bytes checked to lie inside the file.
class SafetensorsReader {
 public:
  // Throws UserError naming the file: missing, unreadable, not safetensors.
  explicit SafetensorsReader(std::string path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::map<std::string, SafetensorsEntry>& tensors() const { return tensors_; }
  const std::string& path() const { return path_; }
  // Elements [first, first + n) of `t` (a tensor of this file, of a float dtype whose byte
  // count matches its shape: see check_float_tensor) as float32.
  void read_f32(const SafetensorsEntry& t, int64_t first, int64_t n, float* out) const;

 private:
  std::string path_;
  int fd_ = -1;
  std::map<std::string, SafetensorsEntry> tensors_;
};

// Throws UserError naming the file and tensor unless `t` is F32, BF16 or F16 and has the
// bytes its shape needs.
void check_float_tensor(const SafetensorsEntry& t, const std::string& file);

// A checkpoint of one file or many: the tensors by name, each naming its file.
struct SafetensorsSet {
  std::vector<std::unique_ptr<SafetensorsReader>> files;
  std::map<std::string, SafetensorsEntry> tensors;
  std::string index;  // the index file's path; "" for a single model.safetensors
  const SafetensorsReader& file_of(const SafetensorsEntry& t) const {
    return *files[static_cast<size_t>(t.file)];
  }
};

// DIR/model.safetensors.index.json (every shard its weight_map names must exist and hold the
// tensors it is named for) or DIR/model.safetensors. Throws UserError naming the file, and the
// tensor where one is at fault.
SafetensorsSet open_safetensors_dir(const std::string& dir);

}  // namespace jumbo
