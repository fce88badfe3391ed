#include "jumbo/backend/tensor.h"

#include <fmt/format.h>

#include <stdexcept>

namespace jumbo {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::i32: return 4;
  }
  return 0;
}

const char* to_string(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
  }
  return "?";
}

Tensor::Tensor(void* p, DType t, std::initializer_list<int64_t> dims, Device d)
    : data(p), dtype(t), device(d), ndim(static_cast<int>(dims.size())) {
  if (dims.size() > kMaxDims) throw std::logic_error("Tensor: more than 4 dims");
  int i = 0;
  for (int64_t v : dims) shape[i++] = v;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return ndim == 0 ? 0 : n;
}

Tensor Tensor::rows(int64_t row, int64_t count) const {
  Tensor t = *this;
  const int64_t row_elems = numel() / shape[0];
  t.data = static_cast<char*>(data) + row * row_elems * static_cast<int64_t>(dtype_size(dtype));
  t.shape[0] = count;
  return t;
}

Tensor Tensor::view(std::initializer_list<int64_t> dims) const {
  Tensor t(data, dtype, dims, device);
  if (t.numel() != numel()) {
    throw std::logic_error(fmt::format("Tensor::view: {} elements as {}", numel(), t.describe()));
  }
  return t;
}

std::string Tensor::describe() const {
  std::string s = fmt::format("{}[", to_string(dtype));
  for (int i = 0; i < ndim; ++i) s += fmt::format("{}{}", i ? "," : "", shape[i]);
  return s + "]";
}

}  // namespace jumbo
