#include "jumbo/backend/arena.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <utility>

namespace jumbo {

Arena::Arena(size_t capacity, std::string name) : capacity_(capacity), name_(std::move(name)) {
  const size_t rounded = (capacity + kAlign - 1) / kAlign * kAlign;
  base_ = static_cast<char*>(std::aligned_alloc(kAlign, rounded > 0 ? rounded : kAlign));
  if (!base_) {
    throw std::bad_alloc();
  }
}

Arena::Arena(void* base, size_t capacity, std::string name, Device device, void (*release)(void*))
    : base_(static_cast<char*>(base)),
      release_(release),
      device_(device),
      capacity_(capacity),
      name_(std::move(name)) {
  if (!base_) throw std::bad_alloc();
}

void Arena::reset() {
  if (base_) {
    if (release_) {
      release_(base_);
    } else {
      std::free(base_);
    }
  }
  base_ = nullptr;
}

Arena::~Arena() { reset(); }

Arena::Arena(Arena&& o) noexcept
    : base_(std::exchange(o.base_, nullptr)),
      release_(std::exchange(o.release_, nullptr)),
      device_(o.device_),
      capacity_(std::exchange(o.capacity_, 0)),
      used_(std::exchange(o.used_, 0)),
      name_(std::move(o.name_)) {}

Arena& Arena::operator=(Arena&& o) noexcept {
  if (this != &o) {
    reset();
    base_ = std::exchange(o.base_, nullptr);
    release_ = std::exchange(o.release_, nullptr);
    device_ = o.device_;
    capacity_ = std::exchange(o.capacity_, 0);
    used_ = std::exchange(o.used_, 0);
    name_ = std::move(o.name_);
  }
  return *this;
}

void* Arena::alloc_bytes(size_t bytes) {
  const size_t offset = used_;
  used_ += (bytes + kAlign - 1) / kAlign * kAlign;
  if (!base_) return nullptr;  // counting pass
  if (used_ > capacity_) {
    // A programming error: the counting pass and the real layout disagree.
    throw std::logic_error(fmt::format("arena '{}' overflow: {} of {} bytes", name_, used_,
                                       capacity_));
  }
  return base_ + offset;
}

Tensor Arena::alloc(DType dtype, std::initializer_list<int64_t> dims) {
  Tensor t(nullptr, dtype, dims, device_);
  t.data = alloc_bytes(t.bytes());
  return t;
}

}  // namespace jumbo
