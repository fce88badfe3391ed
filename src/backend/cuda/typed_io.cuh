#pragma once
// Shared by elementwise.cu and optim.cu: values as __nv_bfloat16 or float, loaded to fp32 and
// stored with round-to-nearest-even (as jumbo/backend/bf16.h rounds on the CPU), 16-byte packs,
// and the grid-stride launch shape. Included inside each file's anonymous namespace, after
// <cuda_bf16.h> and <cstdint>.

using bf16_t = __nv_bfloat16;

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;  // grid-stride beyond: enough to fill any current GPU

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16_t x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16_t from_f32<bf16_t>(float x) {
  return __float2bfloat16_rn(x);
}

// N elements loaded or stored as one aligned vector access.
template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};
