#include <cstring>
#include <stdexcept>
#include <vector>

#include "jumbo/backend/backend.h"
#include "jumbo/backend/bf16.h"

namespace jumbo {

void write_from_f32(Backend& backend, Tensor dst, const float* src) {
  const auto n = static_cast<size_t>(dst.numel());
  if (dst.dtype != DType::f32 && dst.dtype != DType::bf16) {
    throw std::logic_error("write_from_f32: " + dst.describe() + " is not f32 or bf16");
  }
  if (dst.device == Device::cpu) {  // in place, no staging
    if (dst.dtype == DType::f32) {
      std::memcpy(dst.data, src, n * 4);
    } else {
      bf16* out = dst.as<bf16>();
      for (size_t i = 0; i < n; ++i) out[i] = f32_to_bf16(src[i]);
    }
    return;
  }
  std::vector<bf16> rounded;
  const void* bytes = src;
  if (dst.dtype == DType::bf16) {
    rounded.resize(n);
    for (size_t i = 0; i < n; ++i) rounded[i] = f32_to_bf16(src[i]);
    bytes = rounded.data();
  }
  backend.from_host(dst, bytes);
  backend.stream().synchronize();  // the host buffers are reused or freed next
}

}  // namespace jumbo
