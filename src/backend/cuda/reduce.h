#pragma once
// Small reductions the GEMM wrapper needs (implemented in elementwise.cu).
#include <cuda_runtime.h>

#include "jumbo/backend/tensor.h"

namespace jumbo::cuda {

// sums[c] += sum over rows r of x[r, c], where x (f32 or bf16) is read as
// [x.numel() / sums.numel(), sums.numel()] row-major and sums is f32. Deterministic: a fixed
// partition of rows per column and a fixed combining order, no atomics. Used for the bias
// gradient of a linear layer (column sums of dout), which must accumulate into the main grad.
void add_column_sums(cudaStream_t stream, Tensor sums, Tensor x);

}  // namespace jumbo::cuda
