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

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    cuda::check(cudaSetDevice(device), "cudaSetDevice");
    cudaDeviceProp prop{};
    cuda::check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    name_ = fmt::format("cuda:{} ({}, sm_{}{})", device, prop.name, prop.major, prop.minor);
    cuda::check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda::check(cudaMalloc(&gemm_workspace_, kGemmWorkspace), "cudaMalloc (cuBLASLt workspace)");
    cuda::check(cudaMalloc(&partials_, cuda::sum_squares_partials() * sizeof(double) +
                                           sizeof(double)),
                "cudaMalloc (reduction partials)");
    cuda::check(cudaMallocHost(&host_scalar_, sizeof(double)), "cudaMallocHost (scalar)");
    cuda::check(cudaMalloc(&sums_, kMaxSums * sizeof(double)), "cudaMalloc (sums)");
    cuda::check(cudaMallocHost(&host_sums_, kMaxSums * sizeof(double)), "cudaMallocHost (sums)");
    gemm_ = std::make_unique<cuda::Gemm>(gemm_workspace_, kGemmWorkspace);
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    gemm_.reset();
    cudaFreeHost(host_sums_);
    cudaFree(sums_);
    cudaFreeHost(host_scalar_);
    cudaFree(partials_);
    cudaFree(gemm_workspace_);
    cudaStreamDestroy(stream_);
  }

  Device device() const override { return Device::cuda; }
  std::string name() const override { return name_; }
  void* stream() override { return stream_; }
  MemoryInfo device_memory() const override {
    size_t free = 0, total = 0;
    cuda::check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    return {static_cast<uint64_t>(total - free), static_cast<uint64_t>(total)};
  }
  void synchronize() override { cuda::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

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

  void fill(Tensor t, float value) override { cuda::fill(stream_, t, value); }
  void copy(Tensor dst, Tensor src) override {
    if (dst.numel() != src.numel())
      throw std::invalid_argument(fmt::format("copy: {} <- {}", dst.describe(), src.describe()));
    if (dst.device == Device::cuda && src.device == Device::cuda) {
      cuda::convert_copy(stream_, dst, src);
    } else if (dst.dtype == src.dtype) {  // host <-> device, same dtype
      cuda::check(cudaMemcpyAsync(dst.data, src.data, dst.bytes(), cudaMemcpyDefault, stream_),
                  "cudaMemcpyAsync (copy)");
      if (dst.device == Device::cpu) synchronize();  // the host reads it next
    } else {
      throw std::invalid_argument(fmt::format("copy between host and device converts dtype: {} "
                                              "<- {}", dst.describe(), src.describe()));
    }
  }
  void fill_columns(Tensor t, int64_t first_col, float value) override {
    cuda::fill_columns(stream_, t, first_col, value);
  }

  void token_embedding_fwd(Tensor out, Tensor tokens, Tensor wte, int64_t vocab_start) override {
    cuda::token_embedding_fwd(stream_, out, tokens, wte, vocab_start);
  }
  void token_embedding_bwd(Tensor dwte, Tensor dout, Tensor tokens, int64_t vocab_start) override {
    auto* scratch = static_cast<int*>(tok_scratch_.get(
        cuda::token_embedding_bwd_scratch_ints(tokens.numel(), dwte.dim(0)) * sizeof(int),
        stream_));
    cuda::token_embedding_bwd(stream_, dwte, dout, tokens, vocab_start, scratch);
  }
  void position_embedding_fwd(Tensor out, Tensor wpe) override {
    cuda::position_embedding_fwd(stream_, out, wpe);
  }
  void position_embedding_bwd(Tensor dwpe, Tensor dout) override {
    cuda::position_embedding_bwd(stream_, dwpe, dout);
  }
  void layernorm_fwd(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w, Tensor b,
                     float eps) override {
    cuda::layernorm_fwd(stream_, out, mean, rstd, x, w, b, eps);
  }
  void layernorm_bwd(Tensor dx, Tensor dw, Tensor db, Tensor dout, Tensor x, Tensor w,
                     Tensor mean, Tensor rstd) override {
    const int64_t cols = x.dim(-1), rows = x.numel() / cols;
    auto* scratch = static_cast<float*>(
        ln_scratch_.get(cuda::layernorm_bwd_scratch_floats(rows, cols) * sizeof(float), stream_));
    cuda::layernorm_bwd(stream_, dx, dw, db, dout, x, w, mean, rstd, scratch);
  }
  void linear_fwd(Tensor out, Tensor in, Tensor w, Tensor bias) override {
    gemm_->linear_fwd(stream_, out, in, w, bias);
  }
  void linear_gelu_fwd(Tensor out, Tensor pre, Tensor in, Tensor w, Tensor bias) override {
    gemm_->linear_gelu_fwd(stream_, out, pre, in, w, bias);
  }
  void linear_bwd(Tensor din, Tensor dw, Tensor dbias, Tensor dout, Tensor in, Tensor w,
                  bool accumulate_din) override {
    gemm_->linear_bwd(stream_, din, dw, dbias, dout, in, w, accumulate_din);
  }
  // Flash attention keeps one log-sum-exp per row, not the T x T probabilities.
  int64_t attention_stats_cols(int64_t) const override { return 1; }
  void attention_fwd(Tensor out, Tensor lse, Tensor qkv) override {
    cuda::flash_attention_fwd(stream_, out, lse, qkv);
  }
  void attention_bwd(Tensor dqkv, Tensor delta, Tensor dout, Tensor qkv, Tensor out,
                     Tensor lse) override {
    cuda::flash_attention_bwd(stream_, dqkv, delta, dout, qkv, out, lse);
  }
  void gelu_fwd(Tensor out, Tensor in) override { cuda::gelu_fwd(stream_, out, in); }
  void gelu_bwd(Tensor din, Tensor dout, Tensor in) override {
    cuda::gelu_bwd(stream_, din, dout, in);
  }
  void add(Tensor out, Tensor a, Tensor b) override { cuda::add(stream_, out, a, b); }
  void accumulate(Tensor dst, Tensor src) override { cuda::accumulate(stream_, dst, src); }

  void ce_local_max(Tensor max, Tensor logits) override { cuda::ce_local_max(stream_, max, logits); }
  void ce_local_sumexp(Tensor sumexp, Tensor logits, Tensor max) override {
    cuda::ce_local_sumexp(stream_, sumexp, logits, max);
  }
  void ce_target_logit(Tensor target_logit, Tensor logits, Tensor targets,
                       int64_t vocab_start) override {
    cuda::ce_target_logit(stream_, target_logit, logits, targets, vocab_start);
  }
  void ce_loss(Tensor losses, Tensor max, Tensor sumexp, Tensor target_logit) override {
    cuda::ce_loss(stream_, losses, max, sumexp, target_logit);
  }
  void ce_bwd(Tensor dlogits, Tensor logits, Tensor max, Tensor sumexp, Tensor targets,
              int64_t vocab_start, float scale) override {
    cuda::ce_bwd(stream_, dlogits, logits, max, sumexp, targets, vocab_start, scale);
  }

  void adamw(Tensor master, Tensor grad, Tensor m, Tensor v, Tensor compute_copy,
             const AdamWStep& s) override {
    cuda::adamw(stream_, master, grad, m, v, compute_copy, s);
  }
  // The contract returns a host value: the one synchronisation of the grad-norm path.
  double sum_squares(Tensor t) override {
    auto* result = reinterpret_cast<double*>(partials_) + cuda::sum_squares_partials();
    cuda::sum_squares(stream_, t, result, reinterpret_cast<double*>(partials_));
    cuda::check(cudaMemcpyAsync(host_scalar_, result, sizeof(double), cudaMemcpyDeviceToHost,
                                stream_),
                "cudaMemcpyAsync (sum_squares)");
    synchronize();
    return *host_scalar_;
  }
  // One device result per tensor, one copy to the host, the sum in order on the host (the
  // same order as the CPU's, so the result does not depend on the backend's grouping).
  double sum_squares_all(const std::vector<Tensor>& ts) override {
    double sum = 0;
    for (size_t first = 0; first < ts.size(); first += kMaxSums) {
      const size_t n = std::min(kMaxSums, ts.size() - first);
      for (size_t i = 0; i < n; ++i)
        cuda::sum_squares(stream_, ts[first + i], sums_ + i, reinterpret_cast<double*>(partials_));
      cuda::check(cudaMemcpyAsync(host_sums_, sums_, n * sizeof(double), cudaMemcpyDeviceToHost,
                                  stream_),
                  "cudaMemcpyAsync (sum_squares_all)");
      synchronize();
      for (size_t i = 0; i < n; ++i) sum += host_sums_[i];
    }
    return sum;
  }
  void scale(Tensor t, float s) override { cuda::scale(stream_, t, s); }
  void to_host(float* dst, Tensor t) override {
    if (t.dtype != DType::f32)
      throw std::invalid_argument("to_host: expected an f32 tensor, got " + t.describe());
    cuda::check(cudaMemcpyAsync(dst, t.data, t.bytes(), cudaMemcpyDeviceToHost, stream_),
                "cudaMemcpyAsync (to_host)");
    synchronize();
  }
  void from_host(Tensor dst, const void* src) override {
    uploads_.upload(dst.data, src, dst.bytes(), stream_);
  }

 private:
  static constexpr size_t kGemmWorkspace = 32u << 20;
  static constexpr size_t kMaxSums = 16384;  // tensors per read-back in sum_squares_all
  int device_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  void* gemm_workspace_ = nullptr;
  void* partials_ = nullptr;
  double* host_scalar_ = nullptr;
  double* sums_ = nullptr;       // device: one sum of squares per tensor
  double* host_sums_ = nullptr;  // pinned: their copy
  std::unique_ptr<cuda::Gemm> gemm_;
  DeviceScratch ln_scratch_, tok_scratch_;
  UploadRing uploads_;
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
