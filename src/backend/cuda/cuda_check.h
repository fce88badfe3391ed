#pragma once
// Error checks for CUDA runtime and cuBLAS(Lt) calls: a failed status throws
// std::runtime_error naming the call, the caller's file:line and the library's error string.
//   jumbo::cuda::check(cudaMemcpyAsync(...), "cudaMemcpyAsync");   // file:line of this line
//   jumbo::cuda::check_cublas(cublasLtMatmul(...), "cublasLtMatmul");
//   JUMBO_CUDA_CHECK(cudaStreamSynchronize(s));      // cudaError_t or cublasStatus_t; the
//                                                    // message quotes the call's text
//   jumbo::cuda::check_last("my_kernel");            // after a kernel launch
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <source_location>
#include <stdexcept>
#include <string>

namespace jumbo::cuda {

[[noreturn]] inline void throw_cuda_error(const char* lib, const char* what, const char* err_name,
                                          const char* err_str, const std::source_location& at) {
  std::string msg = std::string(lib) + " error in " + (what ? what : "?") + " at " +
                    at.file_name() + ":" + std::to_string(at.line()) + ": " +
                    (err_name ? err_name : "?");
  if (err_str && *err_str) msg += std::string(" (") + err_str + ")";
  throw std::runtime_error(msg);
}

inline void check(cudaError_t e, const char* what,
                  const std::source_location& at = std::source_location::current()) {
  if (e != cudaSuccess) {
    throw_cuda_error("CUDA", what, cudaGetErrorName(e), cudaGetErrorString(e), at);
  }
}

inline void check_cublas(cublasStatus_t s, const char* what,
                         const std::source_location& at = std::source_location::current()) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw_cuda_error("cuBLAS", what, cublasLtGetStatusName(s), cublasLtGetStatusString(s), at);
  }
}

// The same for cuBLAS statuses, so one macro serves both libraries.
inline void check(cublasStatus_t s, const char* what,
                  const std::source_location& at = std::source_location::current()) {
  check_cublas(s, what, at);
}

// After a kernel launch: reports launch-configuration errors (not asynchronous faults, which
// surface at the next synchronising call).
inline void check_last(const char* what,
                       const std::source_location& at = std::source_location::current()) {
  check(cudaGetLastError(), what, at);
}

}  // namespace jumbo::cuda

#define JUMBO_CUDA_CHECK(call) ::jumbo::cuda::check((call), #call)
#define JUMBO_CUDA_CHECK_LAST(what) ::jumbo::cuda::check_last(what)
