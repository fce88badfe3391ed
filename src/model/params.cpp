#include "jumbo/model/params.h"

#include <stdexcept>
#include <vector>

namespace jumbo {

int ParamStore::add(ParamInfo info) {
  if (master_) throw std::logic_error("ParamStore::add after allocate");
  info.flat_offset = total_;
  // Keep every tensor 64-byte aligned inside the flat buffers.
  total_ += (info.numel() + 15) / 16 * 16;
  params_.push_back(std::move(info));
  return static_cast<int>(params_.size() - 1);
}

void ParamStore::allocate(Backend& backend, DType compute_dtype, int64_t multiple,
                          GradBuffer grads) {
  compute_dtype_ = compute_dtype;
  pad_to(multiple);
  const size_t f32_bytes = static_cast<size_t>(total_) * 4;
  const bool separate_copy = compute_dtype != DType::f32;
  const size_t copy_bytes = separate_copy ? static_cast<size_t>(total_) * dtype_size(compute_dtype) : 0;
  device_ = backend.device().kind();
  const size_t grad_bytes = grads == GradBuffer::allocated ? f32_bytes : 0;
  arena_ = backend.device().make_arena(f32_bytes + grad_bytes + copy_bytes + 3 * Arena::kAlign,
                                       "params");
  master_ = arena_.alloc_bytes(f32_bytes);
  grads_ = grad_bytes > 0 ? arena_.alloc_bytes(grad_bytes) : nullptr;
  compute_ = separate_copy ? arena_.alloc_bytes(copy_bytes) : master_;
  backend.fill(all_master(), 0.0f);  // padding between tensors stays zero
  if (grads_) backend.fill(all_grads(), 0.0f);
}

void ParamStore::initialize(Backend& backend, uint64_t seed) {
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamInfo& p = params_[i];
    Tensor m = master(static_cast<int>(i));
    switch (p.init) {
      case InitKind::normal:
        if (m.device == Device::cpu) {
          init_normal_slice(m.as<float>(), seed, p.name, p.slice, p.init_std);
        } else {  // generated on the host, one tensor at a time, then uploaded
          std::vector<float> host(static_cast<size_t>(m.numel()));
          init_normal_slice(host.data(), seed, p.name, p.slice, p.init_std);
          backend.from_host(m, host.data());
          backend.stream().synchronize();  // `host` is freed next
        }
        break;
      case InitKind::ones: backend.fill(m, 1.0f); break;
      case InitKind::zeros: backend.fill(m, 0.0f); break;
    }
  }
  refresh_compute_copy(backend);
}

void ParamStore::refresh_compute_copy(Backend& backend) {
  if (compute_ != master_) backend.copy(all_compute(), all_master());
}

Tensor ParamStore::flat(void* base, DType t) const {
  return base ? Tensor(base, t, {total_}, device_) : Tensor{};
}

Tensor ParamStore::shaped(void* base, DType t, int i) const {
  const ParamInfo& p = params_[i];
  if (!base) return Tensor{};
  char* data = static_cast<char*>(base) + p.flat_offset * static_cast<int64_t>(dtype_size(t));
  if (p.slice.shape.size() == 1) return Tensor(data, t, {p.slice.shape[0]}, device_);
  return Tensor(data, t, {p.slice.shape[0], p.slice.shape[1]}, device_);
}

Tensor ParamStore::master(int i) const { return shaped(master_, DType::f32, i); }
Tensor ParamStore::grad(int i) const { return shaped(grads_, DType::f32, i); }
Tensor ParamStore::weight(int i) const { return shaped(compute_, compute_dtype_, i); }

}  // namespace jumbo
