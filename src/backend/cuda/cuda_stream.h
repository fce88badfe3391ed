#pragma once
// The CUDA backend's compute stream. NcclComm takes it (as a Stream, checked to be this one):
// its blocking collectives queue on it, and its own streams wait on it through events.
#include <cuda_runtime.h>

#include "cuda_check.h"
#include "jumbo/backend/stream.h"

namespace jumbo::cuda {

class CudaStream final : public Stream {
 public:
  CudaStream() { check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~CudaStream() override { cudaStreamDestroy(stream_); }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  Device device() const override { return Device::cuda; }
  void synchronize() override { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }
  cudaStream_t handle() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace jumbo::cuda
