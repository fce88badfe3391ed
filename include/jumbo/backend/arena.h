#pragma once
// Arena: one allocation sized before the step loop, handed out by bump pointer.
// Callers lay out their buffers twice: once into a counting arena (capacity 0) to learn the
// size, then into a real one. Nothing is allocated in the step loop.
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "jumbo/backend/tensor.h"

namespace jumbo {

class Arena {
 public:
  static constexpr size_t kAlign = 64;
  Arena() = default;                    // counting arena: records sizes, hands out null
  explicit Arena(size_t capacity, std::string name);  // host memory
  // Memory a backend allocated (device memory: cudaMalloc); `release` frees it with the arena.
  // Tensors handed out carry `device`.
  Arena(void* base, size_t capacity, std::string name, Device device, void (*release)(void*));
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  Arena(Arena&& other) noexcept;
  Arena& operator=(Arena&& other) noexcept;

  Tensor alloc(DType dtype, std::initializer_list<int64_t> dims);
  void* alloc_bytes(size_t bytes);
  bool counting() const { return base_ == nullptr; }
  size_t used() const { return used_; }
  size_t capacity() const { return capacity_; }
  const std::string& name() const { return name_; }

 private:
  void reset();

  char* base_ = nullptr;
  void (*release_)(void*) = nullptr;  // nullptr: std::free
  Device device_ = Device::cpu;
  size_t capacity_ = 0;
  size_t used_ = 0;
  std::string name_ = "counting";
};

}  // namespace jumbo
