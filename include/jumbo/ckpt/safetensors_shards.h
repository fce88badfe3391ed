#pragma once
// Writing a model as Hugging Face's save_pretrained does: safetensors files of at most
// max_shard_bytes (a larger tensor alone in its file), named model-0000i-of-0000n.safetensors
// with model.safetensors.index.json, or one model.safetensors. Tensors arrive in any order,
// one at a time, and go to their places with pwrite: memory holds one tensor, not the model.
// Knows no model: the caller names the tensors (infer/hf_llama.h).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace jumbo {

struct SafetensorsOut {
  std::string name;
  std::vector<int64_t> shape;
};

enum class SafetensorsOutDtype { f32, bf16 };

// transformers' default max_shard_size, "5GB" (decimal).
inline constexpr int64_t kHfMaxShardBytes = 5'000'000'000;

class SafetensorsShardWriter {
 public:
  // Plans the files (save_pretrained's rule, tensors in the given order) and creates them as
  // temporaries in `dir` (which must exist), their space allocated: a full disk fails here.
  SafetensorsShardWriter(std::string dir, std::vector<SafetensorsOut> tensors,
                         SafetensorsOutDtype dtype, int64_t max_shard_bytes,
                         std::vector<std::pair<std::string, std::string>> metadata);
  ~SafetensorsShardWriter();  // removes the temporaries unless committed
  SafetensorsShardWriter(const SafetensorsShardWriter&) = delete;
  SafetensorsShardWriter& operator=(const SafetensorsShardWriter&) = delete;

  // Tensor `name`'s elements (row-major, as many as its shape), stored in the dtype
  // (bf16: rounded to nearest even).
  void write(const std::string& name, const float* values);
  // Checks that every tensor was written, syncs, renames the files into place and writes the
  // index (sorted keys, as transformers writes it). Returns the files' names in order.
  std::vector<std::string> commit();
  int64_t data_bytes() const { return data_bytes_; }  // the tensors', as the index's total_size

 private:
  struct Placed {
    int file = 0;
    int64_t offset = 0, numel = 0;
    bool written = false;
  };
  struct File {
    std::string name, tmp;
    int fd = -1;
  };
  std::string dir_;
  SafetensorsOutDtype dtype_;
  std::vector<SafetensorsOut> tensors_;
  std::vector<Placed> placed_;
  std::vector<File> files_;
  int64_t data_bytes_ = 0;
  bool committed_ = false;
};

// A safetensors file's first bytes: the 8-byte little-endian length, then `header` (each
// tensor's dtype, shape and data_offsets) with `metadata` as its __metadata__, padded with
// spaces so the data starts 8-byte aligned. Both safetensors writers start their files so.
std::string safetensors_file_header(nlohmann::ordered_json header,
                                    const std::vector<std::pair<std::string, std::string>>& metadata);

// "5GB", "500MB", "200KB" (decimal, as transformers' max_shard_size) or bytes; -1 if not one.
int64_t parse_shard_size(const std::string& text);

}  // namespace jumbo
