#pragma once
// ParamStore: every parameter of this rank's stage in three flat buffers (Megatron's
// contiguous buffers): f32 master weights, f32 main grads, and the compute copy (bf16 in
// mixed precision; the master itself in fp32). Flat buffers make the optimizer, the grad norm
// and the data-parallel buckets single passes over memory.
#include <cstdint>
#include <string>
#include <vector>

#include "jumbo/backend/arena.h"
#include "jumbo/backend/backend.h"
#include "jumbo/model/init.h"

namespace jumbo {

enum class InitKind { normal, ones, zeros };

// Whether a ParamStore holds gradients: training does, inference (evaluation, generation,
// serving) holds only the weights.
enum class GradBuffer { allocated, none };

struct ParamInfo {
  std::string name;      // e.g. "layers.3.attn.qkv.weight"
  Slice slice;           // global shape and the part this rank holds
  InitKind init = InitKind::normal;
  float init_std = 0.02f;
  bool weight_decay = false;  // matrices and embeddings decay; biases and norms do not
  bool tp_replicated = true;  // same values on every tp rank (counted once in the grad norm)
  bool tied_embedding = false;  // the token embedding, also the head: on first and last stage
  bool pipeline_copy = false; // the last stage's copy of the tied embedding (not in the norm)
  // Sequence parallelism: this rank saw only its part of the sequence, so its gradient is a
  // partial sum over the tp ranks (layernorms, the position embedding).
  bool sequence_partial = false;
  int64_t valid_rows = -1;    // rows >= this are padding (the padded vocabulary); -1: none
  int64_t flat_offset = 0;    // element offset in the flat buffers
  int64_t numel() const { return slice.numel(); }
};

class ParamStore {
 public:
  // Registers a parameter (before allocate); returns its index.
  int add(ParamInfo info);
  // Allocates the flat buffers, their length padded to a multiple of `multiple` (data-parallel
  // shards divide it); compute dtype f32 aliases the master weights. Without gradients,
  // grad() and all_grads() are empty tensors.
  void allocate(Backend& backend, DType compute_dtype, int64_t multiple = 1,
                GradBuffer grads = GradBuffer::allocated);
  // Pads the flat length to a multiple of `multiple` without allocating (layout only).
  void pad_to(int64_t multiple) { total_ = (total_ + multiple - 1) / multiple * multiple; }
  // Initialises every master weight from (seed, name, global index) and refreshes the copy.
  void initialize(Backend& backend, uint64_t seed);
  // Copies master weights into the compute copy (no-op in fp32).
  void refresh_compute_copy(Backend& backend);

  size_t size() const { return params_.size(); }
  const ParamInfo& info(int i) const { return params_[i]; }
  int64_t total_numel() const { return total_; }
  Tensor master(int i) const;
  Tensor grad(int i) const;
  Tensor weight(int i) const;  // compute copy, in the parameter's shape
  Tensor all_master() const { return flat(master_, DType::f32); }
  Tensor all_grads() const { return flat(grads_, DType::f32); }
  Tensor all_compute() const { return flat(compute_, compute_dtype_); }
  DType compute_dtype() const { return compute_dtype_; }
  bool mixed_precision() const { return compute_dtype_ != DType::f32; }
  size_t bytes() const { return arena_.used(); }

 private:
  Tensor flat(void* base, DType t) const;
  Tensor shaped(void* base, DType t, int i) const;
  std::vector<ParamInfo> params_;
  int64_t total_ = 0;
  Arena arena_;
  Device device_ = Device::cpu;  // where the flat buffers live (the backend's device)
  void* master_ = nullptr;
  void* grads_ = nullptr;
  void* compute_ = nullptr;
  DType compute_dtype_ = DType::f32;
};

}  // namespace jumbo
