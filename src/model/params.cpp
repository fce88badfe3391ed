#include "jumbo/model/params.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace jumbo {

int ParamStore::add(ParamInfo info) {
  if (weights_) throw std::logic_error("ParamStore::add after allocate");
  if (info.packed_with_previous) {
    if (params_.empty()) throw std::logic_error("ParamStore::add: nothing to pack " + info.name + " after");
    const ParamInfo& prev = params_.back();
    total_ = prev.flat_offset + prev.numel();
  }
  info.flat_offset = total_;
  // Keep every tensor 64-byte aligned inside the flat buffers (a packed pair as one).
  total_ += (info.numel() + 15) / 16 * 16;
  params_.push_back(std::move(info));
  return static_cast<int>(params_.size() - 1);
}

void ParamStore::allocate(Backend& backend, DType compute_dtype, int64_t multiple,
                          GradBuffer grads) {
  compute_dtype_ = compute_dtype;
  pad_to(multiple);
  const size_t weight_bytes = static_cast<size_t>(total_) * dtype_size(compute_dtype);
  const size_t grad_bytes = grads == GradBuffer::allocated ? static_cast<size_t>(total_) * 4 : 0;
  device_ = backend.device().kind();
  arena_ = backend.device().make_arena(weight_bytes + grad_bytes + 2 * Arena::kAlign, "params");
  weights_ = arena_.alloc_bytes(weight_bytes);
  grads_ = grad_bytes > 0 ? arena_.alloc_bytes(grad_bytes) : nullptr;
  backend.fill(all_weights(), 0.0f);  // padding between tensors stays zero
  if (grads_) backend.fill(all_grads(), 0.0f);
}

void ParamStore::initial_values(int i, uint64_t seed, int64_t begin, int64_t count,
                                float* out) const {
  const ParamInfo& p = params_[static_cast<size_t>(i)];
  switch (p.init) {
    case InitKind::normal:
      init_normal_range(out, seed, p.name, p.slice, p.init_std, begin, count);
      break;
    case InitKind::ones: std::fill(out, out + count, 1.0f); break;
    case InitKind::zeros: std::fill(out, out + count, 0.0f); break;
  }
}

void ParamStore::initialize(Backend& backend, uint64_t seed) {
  init_seed_ = seed;
  // Generated on the host a chunk at a time, then rounded to the compute dtype in place or
  // uploaded: a start-up buffer of 256 KiB whatever the largest tensor (a larger one would
  // stay in the heap and in the run's peak resident set).
  constexpr int64_t kChunk = int64_t{1} << 16;
  std::vector<float> values;
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamInfo& p = params_[i];
    for (int64_t at = 0; at < p.numel(); at += kChunk) {
      const int64_t n = std::min(kChunk, p.numel() - at);
      values.resize(static_cast<size_t>(n));
      initial_values(static_cast<int>(i), seed, at, n, values.data());
      write_from_f32(backend, all_weights().rows(p.flat_offset + at, n), values.data());
    }
  }
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

Tensor ParamStore::grad(int i) const { return shaped(grads_, DType::f32, i); }

Tensor ParamStore::joined(void* base, DType t, int first, int last) const {
  Tensor head = shaped(base, t, first);
  if (last < 0 || last == first || head.empty()) return head;
  int64_t rows = head.dim(0);
  for (int i = first + 1; i <= last; ++i) {
    const ParamInfo& p = params_[i];
    if (!p.packed_with_previous || static_cast<int>(p.slice.shape.size()) != head.ndim ||
        (head.ndim == 2 && p.slice.shape[1] != head.dim(1))) {
      throw std::logic_error("ParamStore::joined: " + p.name + " is not packed after " +
                             params_[i - 1].name);
    }
    rows += p.slice.shape[0];
  }
  if (head.ndim == 1) return Tensor(head.data, t, {rows}, device_);
  return Tensor(head.data, t, {rows, head.dim(1)}, device_);
}
Tensor ParamStore::joined_weights(int first, int last) const {
  return joined(weights_, compute_dtype_, first, last);
}
Tensor ParamStore::joined_grads(int first, int last) const {
  return joined(grads_, DType::f32, first, last);
}
Tensor ParamStore::weight(int i) const { return shaped(weights_, compute_dtype_, i); }

ParamInfo make_param(std::string name, std::vector<int64_t> global, std::vector<int64_t> offset,
                     std::vector<int64_t> local, InitKind init, float std, bool decay,
                     bool replicated) {
  ParamInfo p;
  p.name = std::move(name);
  p.slice = Slice{std::move(global), std::move(offset), std::move(local)};
  p.init = init;
  p.init_std = std;
  p.weight_decay = decay;
  p.tp_replicated = replicated;
  return p;
}

}  // namespace jumbo
