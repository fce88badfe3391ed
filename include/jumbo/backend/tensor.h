#pragma once
// Tensor: a non-owning view (pointer, dtype, shape, device). Memory belongs to an Arena.
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "jumbo/config/layout.h"  // Device

namespace jumbo {

enum class DType : uint8_t { f32, bf16, i32 };

size_t dtype_size(DType t);
const char* to_string(DType t);

struct Tensor {
  static constexpr int kMaxDims = 4;
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};

  Tensor() = default;
  Tensor(void* p, DType t, std::initializer_list<int64_t> dims, Device d = Device::cpu);

  int64_t numel() const;
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  int64_t dim(int i) const { return shape[i < 0 ? ndim + i : i]; }
  bool empty() const { return data == nullptr; }
  // A view of `count` rows starting at `row` along dim 0.
  Tensor rows(int64_t row, int64_t count) const;
  // Same memory, another shape with the same element count.
  Tensor view(std::initializer_list<int64_t> dims) const;
  template <class T> T* as() const { return static_cast<T*>(data); }
  std::string describe() const;
};

}  // namespace jumbo
