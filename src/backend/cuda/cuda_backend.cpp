// CudaBackend: device memory from cudaMalloc in arenas sized before the step loop, kernels
// queued on one compute stream (kernels.h, gemm.h), nothing synchronising the host except the
// calls whose contract returns a host value (sum_squares, to_host).
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "cuda_check.h"
#include "cuda_stream.h"
#include "gemm.h"
#include "jumbo/backend/backend.h"
#include "jumbo/config/config.h"
#include "kernels.h"

namespace jumbo {
namespace {

void release_device_memory(void* p) { cudaFree(p); }

// Device scratch that grows to the largest request and then stays: the first step sizes it,
// later steps reuse it (the step loop allocates nothing after warm-up).
class DeviceScratch {
 public:
  ~DeviceScratch() { cudaFree(data_); }
  void* get(size_t bytes, cudaStream_t stream) {
    if (bytes > bytes_) {
      // The old buffer may still be read by queued kernels.
      cuda::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (scratch growth)");
      cudaFree(data_);
      data_ = nullptr;
      cuda::check(cudaMalloc(&data_, bytes), "cudaMalloc (scratch)");
      bytes_ = bytes;
    }
    return data_;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Pinned host memory for host-to-device uploads (token ids per microbatch): copied into a
// slot, then an asynchronous copy from the slot. A slot is reused only after the event of
// its previous copy, so the host never waits unless every slot is still in flight.
class UploadRing {
 public:
  static constexpr int kSlots = 8;
  static constexpr size_t kSlotBytes = 4u << 20;
  UploadRing() {
    cuda::check(cudaMallocHost(&base_, kSlots * kSlotBytes), "cudaMallocHost (upload ring)");
    for (cudaEvent_t& e : done_)
      cuda::check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~UploadRing() {
    for (cudaEvent_t e : done_) cudaEventDestroy(e);
    cudaFreeHost(base_);
  }
  void upload(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
    if (bytes > kSlotBytes) {  // large and rare (initial state): plain synchronous copy
      cuda::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream),
                  "cudaMemcpyAsync (upload)");
      cuda::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (upload)");
      return;
    }
    char* slot = static_cast<char*>(base_) + next_ * kSlotBytes;
    cuda::check(cudaEventSynchronize(done_[next_]), "cudaEventSynchronize (upload slot)");
    std::memcpy(slot, src, bytes);
    cuda::check(cudaMemcpyAsync(dst, slot, bytes, cudaMemcpyHostToDevice, stream),
                "cudaMemcpyAsync (upload)");
    cuda::check(cudaEventRecord(done_[next_], stream), "cudaEventRecord (upload)");
    next_ = (next_ + 1) % kSlots;
  }

 private:
  void* base_ = nullptr;
  cudaEvent_t done_[kSlots] = {};
  int next_ = 0;
};

// The device part: the GPU, its memory, and device-memory arenas.
class CudaDevice final : public BackendDevice {
 public:
  explicit CudaDevice(int device) {
    cuda::check(cudaSetDevice(device), "cudaSetDevice");
    cudaDeviceProp prop{};
    cuda::check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    name_ = fmt::format("cuda:{} ({}, sm_{}{})", device, prop.name, prop.major, prop.minor);
  }
  Device kind() const override { return Device::cuda; }
  std::string name() const override { return name_; }
  MemoryInfo memory() const override {
    size_t free = 0, total = 0;
    cuda::check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    return {static_cast<uint64_t>(total - free), static_cast<uint64_t>(total)};
  }
  Arena make_arena(size_t bytes, const std::string& name) override {
    void* p = nullptr;
    const size_t rounded = std::max<size_t>((bytes + Arena::kAlign - 1) / Arena::kAlign * Arena::kAlign,
                                            Arena::kAlign);
    const cudaError_t e = cudaMalloc(&p, rounded);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free allocation error
      size_t free = 0, total = 0;
      cudaMemGetInfo(&free, &total);
      throw UserError(fmt::format("{}: cannot allocate the '{}' arena of {:.2f} GiB ({}); {:.2f} "
                                  "GiB of {:.2f} GiB free: a smaller micro batch, more "
                                  "recomputation or more pipeline stages (`jumbo plan`)",
                                  name_, name, static_cast<double>(rounded) / (1ull << 30),
                                  cudaGetErrorString(e), static_cast<double>(free) / (1ull << 30),
                                  static_cast<double>(total) / (1ull << 30)));
    }
    return Arena(p, rounded, name, Device::cuda, release_device_memory);
  }

 private:
  std::string name_;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    cuda::check(cudaMalloc(&gemm_workspace_, kGemmWorkspace), "cudaMalloc (cuBLASLt workspace)");
    gemm_ = std::make_unique<cuda::Gemm>(gemm_workspace_, kGemmWorkspace);
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(s());
    gemm_.reset();
    cudaFreeHost(host_sums_);
    cudaFree(sums_);
    cudaFree(gemm_workspace_);
  }

  BackendDevice& device() override { return device_; }
  Stream& stream() override { return stream_; }

  void fill(Tensor t, float value) override { cuda::fill(s(), t, value); }
  void copy(Tensor dst, Tensor src) override {
    if (dst.numel() != src.numel())
      throw std::invalid_argument(fmt::format("copy: {} <- {}", dst.describe(), src.describe()));
    if (dst.device == Device::cuda && src.device == Device::cuda) {
      cuda::convert_copy(s(), dst, src);
    } else if (dst.dtype == src.dtype) {  // host <-> device, same dtype
      cuda::check(cudaMemcpyAsync(dst.data, src.data, dst.bytes(), cudaMemcpyDefault, s()),
                  "cudaMemcpyAsync (copy)");
      if (dst.device == Device::cpu) stream_.synchronize();  // the host reads it next
    } else {
      throw std::invalid_argument(fmt::format("copy between host and device converts dtype: {} "
                                              "<- {}", dst.describe(), src.describe()));
    }
  }
  void fill_columns(Tensor t, int64_t first_col, float value) override {
    cuda::fill_columns(s(), t, first_col, value);
  }

  void token_embedding_fwd(Tensor out, Tensor tokens, Tensor wte, int64_t vocab_start) override {
    cuda::token_embedding_fwd(s(), out, tokens, wte, vocab_start);
  }
  void token_embedding_bwd(Tensor dwte, Tensor dout, Tensor tokens, int64_t vocab_start) override {
    auto* scratch = static_cast<int*>(tok_scratch_.get(
        cuda::token_embedding_bwd_scratch_ints(tokens.numel(), dwte.dim(0)) * sizeof(int), s()));
    cuda::token_embedding_bwd(s(), dwte, dout, tokens, vocab_start, scratch);
  }
  void position_embedding_fwd(Tensor out, Tensor wpe, Tensor positions = {}) override {
    cuda::position_embedding_fwd(s(), out, wpe, positions);
  }
  void position_embedding_bwd(Tensor dwpe, Tensor dout, Tensor positions = {}) override {
    // Packed sequences scatter by position: the token embedding's sorted, deterministic
    // scatter with positions as the rows.
    if (!positions.empty()) return token_embedding_bwd(dwpe, dout, positions, 0);
    cuda::position_embedding_bwd(s(), dwpe, dout);
  }
  void layernorm_fwd(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w, Tensor b,
                     float eps) override {
    cuda::layernorm_fwd(s(), out, mean, rstd, x, w, b, eps);
  }
  void layernorm_bwd(Tensor dx, Tensor dw, Tensor db, Tensor dout, Tensor x, Tensor w,
                     Tensor mean, Tensor rstd) override {
    const int64_t cols = x.dim(-1), rows = x.numel() / cols;
    auto* scratch = static_cast<float*>(
        ln_scratch_.get(cuda::layernorm_bwd_scratch_floats(rows, cols) * sizeof(float), s()));
    cuda::layernorm_bwd(s(), dx, dw, db, dout, x, w, mean, rstd, scratch);
  }
  void rmsnorm_fwd(Tensor out, Tensor rstd, Tensor x, Tensor w, float eps) override {
    cuda::rmsnorm_fwd(s(), out, rstd, x, w, eps);
  }
  void rmsnorm_bwd(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd) override {
    float* scratch = nullptr;
    if (!dw.empty()) {
      const int64_t cols = x.ndim > 0 ? x.dim(-1) : 0, rows = cols > 0 ? x.numel() / cols : 0;
      scratch = static_cast<float*>(
          ln_scratch_.get(cuda::rmsnorm_bwd_scratch_floats(rows, cols) * sizeof(float), s()));
    }
    cuda::rmsnorm_bwd(s(), dx, dw, dout, x, w, rstd, scratch);
  }
  void qk_norm_fwd(Tensor out, Tensor rstd, Tensor qkv, Tensor q_weight, Tensor k_weight,
                   int64_t kv_heads, float eps) override {
    cuda::qk_norm_fwd(s(), out, rstd, qkv, q_weight, k_weight, kv_heads, eps);
  }
  void qk_norm_bwd(Tensor dqkv, Tensor dq_weight, Tensor dk_weight, Tensor dout, Tensor qkv,
                   Tensor q_weight, Tensor k_weight, Tensor rstd, int64_t kv_heads) override {
    float* scratch = nullptr;
    if (!dq_weight.empty() || !dk_weight.empty()) {
      // H and G from qkv's width and D (the launcher checks the shapes): the scratch size.
      const int64_t d = q_weight.numel(), width = qkv.ndim > 0 ? qkv.dim(-1) : 0;
      const int64_t rows = width > 0 ? qkv.numel() / width : 0;
      const int64_t kv = kv_heads > 0 ? kv_heads : 1;
      const int64_t heads = d > 0 ? width / d - 2 * kv : 0;
      scratch = static_cast<float*>(ln_scratch_.get(
          cuda::qk_norm_bwd_scratch_floats(rows, heads, kv, d) * sizeof(float), s()));
    }
    cuda::qk_norm_bwd(s(), dqkv, dq_weight, dk_weight, dout, qkv, q_weight, k_weight, rstd,
                      kv_heads, scratch);
  }
  void linear_fwd(Tensor out, Tensor in, Tensor w, Tensor bias) override {
    gemm_->linear_fwd(s(), out, in, w, bias);
  }
  void linear_gelu_fwd(Tensor out, Tensor pre, Tensor in, Tensor w, Tensor bias) override {
    gemm_->linear_gelu_fwd(s(), out, pre, in, w, bias);
  }
  void linear_bwd(Tensor din, Tensor dw, Tensor dbias, Tensor dout, Tensor in, Tensor w) override {
    gemm_->linear_bwd(s(), din, dw, dbias, dout, in, w);
  }
  // Flash attention keeps one log-sum-exp per row, not the T x T probabilities.
  int64_t attention_stats_cols(int64_t) const override { return 1; }
  void attention_fwd(Tensor out, Tensor lse, Tensor qkv, int64_t kv_heads,
                     Tensor positions = {}) override {
    cuda::flash_attention_fwd(s(), out, lse, qkv, kv_heads, positions);
  }
  void attention_bwd(Tensor dqkv, Tensor delta, Tensor dout, Tensor qkv, Tensor out,
                     Tensor lse, int64_t kv_heads, Tensor positions = {}) override {
    cuda::flash_attention_bwd(s(), dqkv, delta, dout, qkv, out, lse, kv_heads, positions);
  }
  void attention_kv_cache(Tensor out, Tensor qkv, Tensor k_cache, Tensor v_cache,
                          Tensor rows) override {
    cuda::attention_kv_cache(s(), out, qkv, k_cache, v_cache, rows);
  }
  void rope(Tensor qkv, Tensor table, Tensor positions, int64_t kv_heads,
            RopeDirection direction) override {
    cuda::rope(s(), qkv, table, positions, kv_heads, direction);
  }
  void swiglu_fwd(Tensor out, Tensor gate_up) override { cuda::swiglu_fwd(s(), out, gate_up); }
  void swiglu_bwd(Tensor dgate_up, Tensor dout, Tensor gate_up) override {
    cuda::swiglu_bwd(s(), dgate_up, dout, gate_up);
  }
  void gelu_fwd(Tensor out, Tensor in) override { cuda::gelu_fwd(s(), out, in); }
  void gelu_bwd(Tensor din, Tensor dout, Tensor in) override { cuda::gelu_bwd(s(), din, dout, in); }
  void scale(Tensor t, float factor) override { cuda::scale(s(), t, factor); }
  void add_to_column_blocks(Tensor wide, Tensor narrow, const ColumnBlocks& at) override {
    cuda::add_to_column_blocks(s(), wide, narrow, at);
  }
  void copy_from_column_blocks(Tensor narrow, Tensor wide, const ColumnBlocks& at) override {
    cuda::copy_from_column_blocks(s(), narrow, wide, at);
  }
  void dropout(Tensor out, Tensor in, const DropoutMask& mask) override {
    cuda::dropout(s(), out, in, mask);
  }
  void add(Tensor out, Tensor a, Tensor b) override { cuda::add(s(), out, a, b); }

  void ce_local_max(Tensor max, Tensor logits) override { cuda::ce_local_max(s(), max, logits); }
  void ce_local_sumexp(Tensor sumexp, Tensor logits, Tensor max) override {
    cuda::ce_local_sumexp(s(), sumexp, logits, max);
  }
  void ce_target_logit(Tensor target_logit, Tensor logits, Tensor targets,
                       int64_t vocab_start) override {
    cuda::ce_target_logit(s(), target_logit, logits, targets, vocab_start);
  }
  void ce_loss(Tensor losses, Tensor max, Tensor sumexp, Tensor target_logit,
               Tensor targets = {}) override {
    cuda::ce_loss(s(), losses, max, sumexp, target_logit, targets);
  }
  void ce_bwd(Tensor dlogits, Tensor logits, Tensor max, Tensor sumexp, Tensor targets,
              int64_t vocab_start, float scale) override {
    cuda::ce_bwd(s(), dlogits, logits, max, sumexp, targets, vocab_start, scale);
  }

  void adamw(Tensor master, Tensor grad, Tensor m, Tensor v, Tensor compute_copy,
             std::span<const AdamWRange> ranges, const AdamWStep& st) override {
    cuda::adamw(s(), master, grad, m, v, compute_copy, ranges, st, adamw_table_);
  }
  // One device sum per span (two launches for all of them), one copy to the host, the spans
  // added in order on the host: the CPU's order, whatever the device's grouping. The
  // contract returns a host value: the one synchronisation of the grad-norm path.
  double sum_squares(Tensor flat, std::span<const FlatSpan> spans) override {
    if (spans.empty()) return 0;
    if (spans.size() > sums_capacity_) {
      cudaFreeHost(host_sums_);
      cudaFree(sums_);
      host_sums_ = nullptr;
      sums_ = nullptr;
      cuda::check(cudaMalloc(&sums_, spans.size() * sizeof(double)), "cudaMalloc (sums)");
      cuda::check(cudaMallocHost(&host_sums_, spans.size() * sizeof(double)), "cudaMallocHost (sums)");
      sums_capacity_ = spans.size();
    }
    cuda::sum_squares(s(), flat, spans, sums_, norm_table_);
    cuda::check(cudaMemcpyAsync(host_sums_, sums_, spans.size() * sizeof(double),
                                cudaMemcpyDeviceToHost, s()),
                "cudaMemcpyAsync (sum_squares)");
    stream_.synchronize();
    double sum = 0;
    for (size_t k = 0; k < spans.size(); ++k) sum += host_sums_[k];
    return sum;
  }
  void to_host(float* dst, Tensor t) override {
    if (t.dtype != DType::f32)
      throw std::invalid_argument("to_host: expected an f32 tensor, got " + t.describe());
    cuda::check(cudaMemcpyAsync(dst, t.data, t.bytes(), cudaMemcpyDeviceToHost, s()),
                "cudaMemcpyAsync (to_host)");
    stream_.synchronize();
  }
  void from_host(Tensor dst, const void* src) override {
    uploads_.upload(dst.data, src, dst.bytes(), s());
  }

 private:
  static constexpr size_t kGemmWorkspace = 32u << 20;
  cudaStream_t s() const { return stream_.handle(); }

  CudaDevice device_;  // first: it selects the GPU the stream and buffers below are made on
  cuda::CudaStream stream_;
  void* gemm_workspace_ = nullptr;
  double* sums_ = nullptr;       // device: one sum of squares per span
  double* host_sums_ = nullptr;  // pinned: their copy
  size_t sums_capacity_ = 0;
  std::unique_ptr<cuda::Gemm> gemm_;
  DeviceScratch ln_scratch_, tok_scratch_;
  UploadRing uploads_;
  cuda::RangeTable adamw_table_, norm_table_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device) {
  const int count = cuda_device_count();
  if (count == 0) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    throw UserError(fmt::format("train.device = \"cuda\": no usable GPU ({})",
                                e == cudaSuccess ? "the driver shows none" : cudaGetErrorString(e)));
  }
  if (device < 0 || device >= count) {
    throw UserError(fmt::format("train.device = \"cuda\": local rank {} has no GPU of its own "
                                "({} GPUs on this node): start one rank per GPU",
                                device, count));
  }
  return std::make_unique<CudaBackend>(device);
}

std::string cuda_unsupported_kernels(const KernelRequirements& r) {
  if (!cuda::flash_attention_supports(r.head_dim)) {
    return fmt::format("attention head size {}: the CUDA flash attention kernels are built for "
                       "head sizes 64, 128 and 144", r.head_dim);
  }
  return "";
}

bool cuda_backend_built() { return true; }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace jumbo
