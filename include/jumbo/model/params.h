#pragma once
// ParamStore: every parameter of this rank's stage in two flat buffers (Megatron's
// contiguous buffers): the weights in the compute dtype and the f32 main grads. In fp32 the
// weights are the master weights; in mixed precision (bf16 weights) the f32 master is the
// optimizer's (train/optimizer.h), sharded over data parallelism with ZeRO. Flat buffers make
// the optimizer, the grad norm and the data-parallel buckets single passes over memory.
#include <optional>
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
  // Its gradient on this rank is a partial sum over the tp ranks, which GradSync adds up:
  // with sequence parallelism (this rank saw only its part of the sequence: layernorms, the
  // position embedding) and LoRA's A of a column-parallel map (this rank's output slice).
  bool tp_partial_grad = false;
  int64_t valid_rows = -1;    // rows >= this are padding (the padded vocabulary); -1: none
  // Stored right after the parameter before it, with no alignment padding between, so the two
  // read as one tensor (ParamStore::joined): SwiGLU's gate and up maps, one GEMM.
  bool packed_with_previous = false;
  int64_t flat_offset = 0;    // element offset in the flat buffers
  int64_t numel() const { return slice.numel(); }
};

// A parameter's description: its name, global shape, this rank's rectangle of it (offset,
// shape), initialisation, weight decay and whether every tp rank holds the same values.
ParamInfo make_param(std::string name, std::vector<int64_t> global, std::vector<int64_t> offset,
                     std::vector<int64_t> local, InitKind init, float std, bool decay,
                     bool replicated);

class ParamStore {
 public:
  // Registers a parameter (before allocate); returns its index.
  int add(ParamInfo info);
  // Allocates the flat buffers, their length padded to a multiple of `multiple` (data-parallel
  // shards divide it). Without gradients, grad() and all_grads() are empty tensors.
  void allocate(Backend& backend, DType compute_dtype, int64_t multiple = 1,
                GradBuffer grads = GradBuffer::allocated);
  // Pads the flat length to a multiple of `multiple` without allocating (layout only).
  void pad_to(int64_t multiple) { total_ = (total_ + multiple - 1) / multiple * multiple; }
  // Initialises every weight from (seed, name, global index), in the compute dtype.
  void initialize(Backend& backend, uint64_t seed);
  // The f32 initial values of elements [begin, begin + count) of parameter i (row-major in
  // its slice) for `seed`: what initialize() rounds to the compute dtype, and what the
  // optimizer's master starts from. The one rule for initial values.
  void initial_values(int i, uint64_t seed, int64_t begin, int64_t count, float* out) const;
  // The seed of the last initialize(), if any.
  std::optional<uint64_t> init_seed() const { return init_seed_; }

  size_t size() const { return params_.size(); }
  const ParamInfo& info(int i) const { return params_[i]; }
  int64_t total_numel() const { return total_; }
  Tensor grad(int i) const;
  Tensor weight(int i) const;  // in the compute dtype and the parameter's shape
  // Parameters first .. last (each packed_with_previous after the first, of equal trailing
  // shape) as one tensor, rows after rows: weights or grads. first alone when last < 0.
  Tensor joined_weights(int first, int last) const;
  Tensor joined_grads(int first, int last) const;
  Tensor all_grads() const { return flat(grads_, DType::f32); }
  Tensor all_weights() const { return flat(weights_, compute_dtype_); }
  DType compute_dtype() const { return compute_dtype_; }
  bool mixed_precision() const { return compute_dtype_ != DType::f32; }
  size_t bytes() const { return arena_.used(); }

 private:
  Tensor flat(void* base, DType t) const;
  Tensor shaped(void* base, DType t, int i) const;
  Tensor joined(void* base, DType t, int first, int last) const;
  std::vector<ParamInfo> params_;
  int64_t total_ = 0;
  Arena arena_;
  Device device_ = Device::cpu;  // where the flat buffers live (the backend's device)
  void* weights_ = nullptr;
  void* grads_ = nullptr;
  DType compute_dtype_ = DType::f32;
  std::optional<uint64_t> init_seed_;
};

}  // namespace jumbo
