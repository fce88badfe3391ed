// Column blocks of a wide tensor (backend.h's ColumnBlocks): a LoRA adapter's output added into
// its part of a packed output (q, k or v of the grouped q/k/v rows, SwiGLU's gate or up half),
// and that part's gradient copied back out. One thread per narrow element, grid-strided;
// consecutive threads take consecutive columns of a block (coalesced within a block).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda_check.h"
#include "kernels.h"

namespace jumbo::cuda {
namespace {

#include "typed_io.cuh"

template <class T, bool kAdd>
__global__ void column_blocks_kernel(T* __restrict__ wide, T* __restrict__ narrow, int64_t rows,
                                     int64_t narrow_cols, int64_t wide_cols, ColumnBlocks at) {
  const int64_t n = rows * narrow_cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / narrow_cols, c = i - r * narrow_cols;
    T* w = wide + r * wide_cols + at.first + (c / at.block) * at.period + c % at.block;
    if constexpr (kAdd) {
      *w = from_f32<T>(to_f32(*w) + to_f32(narrow[i]));
    } else {
      narrow[i] = *w;
    }
  }
}

template <bool kAdd>
void column_blocks(cudaStream_t stream, const char* what, Tensor wide, Tensor narrow,
                   const ColumnBlocks& at) {
  if (wide.device != Device::cuda || narrow.device != Device::cuda || wide.dtype != narrow.dtype ||
      (wide.dtype != DType::f32 && wide.dtype != DType::bf16) || narrow.ndim < 1 || wide.ndim < 1) {
    throw std::invalid_argument(std::string(what) + ": f32 or bf16 GPU tensors of one dtype, got " +
                                wide.describe() + " and " + narrow.describe());
  }
  const int64_t nc = narrow.dim(-1), wc = wide.dim(-1), rows = nc > 0 ? narrow.numel() / nc : 0;
  const int64_t blocks = at.block > 0 ? nc / at.block : 0;
  if (at.block <= 0 || nc % at.block != 0 || wide.numel() != rows * wc || at.first < 0 ||
      at.first + (blocks - 1) * at.period + at.block > wc || (blocks > 1 && at.period < at.block)) {
    throw std::invalid_argument(std::string(what) + ": narrow " + narrow.describe() +
                                " does not fit wide " + wide.describe() + " in blocks of " +
                                std::to_string(at.block));
  }
  const int64_t n = rows * nc;
  if (n == 0) return;
  const int grid = static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535));
  if (wide.dtype == DType::bf16) {
    column_blocks_kernel<bf16_t, kAdd><<<grid, kThreads, 0, stream>>>(
        wide.as<bf16_t>(), narrow.as<bf16_t>(), rows, nc, wc, at);
  } else {
    column_blocks_kernel<float, kAdd><<<grid, kThreads, 0, stream>>>(wide.as<float>(), narrow.as<float>(),
                                                                     rows, nc, wc, at);
  }
  check_last(what);
}

}  // namespace

void add_to_column_blocks(cudaStream_t stream, Tensor wide, Tensor narrow, const ColumnBlocks& at) {
  column_blocks<true>(stream, "add_to_column_blocks", wide, narrow, at);
}

void copy_from_column_blocks(cudaStream_t stream, Tensor narrow, Tensor wide, const ColumnBlocks& at) {
  column_blocks<false>(stream, "copy_from_column_blocks", wide, narrow, at);
}

}  // namespace jumbo::cuda
