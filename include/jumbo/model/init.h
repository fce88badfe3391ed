#pragma once
// Counter-based initialisation: element i of tensor `name` gets a value that depends only on
// (seed, name, i) through Philox4x32-10, so every layout initialises the same logical weights
// and a rank generates only the slice it holds.
#include <cstdint>
#include <string_view>
#include <vector>

namespace jumbo {

uint64_t name_hash(std::string_view name);  // FNV-1a 64
// A standard normal for global element `index` of the tensor keyed by (seed, name_hash).
float counter_normal(uint64_t seed, uint64_t name_key, uint64_t index);

// A rectangular slice of a 1-d or 2-d global tensor.
struct Slice {
  std::vector<int64_t> global_shape;
  std::vector<int64_t> offset;  // start of the slice per dim
  std::vector<int64_t> shape;   // extent of the slice per dim
  int64_t numel() const;
};

// Fills out[slice.numel()] with std * N(0,1) for the slice's global indices (row-major).
void init_normal_slice(float* out, uint64_t seed, std::string_view name, const Slice& slice,
                       float std);
// The same for the slice's elements [begin, begin + count) in row-major order (a ZeRO shard
// of the master, or a chunk of a tensor).
void init_normal_range(float* out, uint64_t seed, std::string_view name, const Slice& slice,
                       float std, int64_t begin, int64_t count);

}  // namespace jumbo
