#pragma once
// The linear layers through cuBLASLt: bf16 (or f32) operands, fp32 accumulation, bias and
// GELU fused into the epilogue, weight gradients accumulated straight into f32 main grads.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>

#include "jumbo/backend/tensor.h"

namespace jumbo::cuda {

struct PlanCache;  // descriptors, layouts and the chosen algorithm per shape (gemm.cpp)

class Gemm {
 public:
  // `workspace` (device, workspace_bytes) is cuBLASLt's scratch, allocated by the backend
  // once; 32 MiB is what cuBLAS recommends on Hopper.
  Gemm(void* workspace, size_t workspace_bytes);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // out[N,O] = in[N,I] @ weight[O,I]^T + bias[O] (bias may be empty: Tensor::empty()).
  void linear_fwd(cudaStream_t stream, Tensor out, Tensor in, Tensor weight, Tensor bias);
  // out = gelu_tanh(pre), pre = in @ weight^T + bias: one GEMM with the GELU_AUX_BIAS epilogue.
  void linear_gelu_fwd(cudaStream_t stream, Tensor out, Tensor pre, Tensor in, Tensor weight,
                       Tensor bias);
  // din[N,I] = dout @ weight; dweight (f32) += dout^T @ in
  // (beta = 1 into the main grad); dbias (f32, may be empty) += column sums of dout, through
  // the BGRADB epilogue or a reduction kernel. din may be empty.
  void linear_bwd(cudaStream_t stream, Tensor din, Tensor dweight, Tensor dbias, Tensor dout,
                  Tensor in, Tensor weight);

 private:
  cublasLtHandle_t handle_ = nullptr;
  std::unique_ptr<PlanCache> plans_;  // filled on first use of each shape: steps reuse it
  void* workspace_;
  size_t workspace_bytes_;
};

}  // namespace jumbo::cuda
