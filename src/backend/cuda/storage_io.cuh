#pragma once
// Shared by the elementwise-style kernels (embedding.cu, layernorm.cu, loss.cu): bf16 stored as
// raw 16-bit values and converted exactly as jumbo::f32_to_bf16 does, 16-byte vector loads and
// stores of N elements as floats, argument checks, and the f32/bf16 x vector/scalar dispatch.
// Included inside each file's anonymous namespace (after <cstdint>, <string>, <stdexcept>,
// <initializer_list>, <type_traits> and kernels.h).

// ---- storage helpers (f32 or bf16 bits) ----

__device__ __forceinline__ float to_f32(uint16_t v) {
  return __uint_as_float(static_cast<uint32_t>(v) << 16);
}
// Round to nearest even, NaN stays a quiet NaN: jumbo::f32_to_bf16 bit for bit.
__device__ __forceinline__ uint16_t bf16_bits(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) {
    return static_cast<uint16_t>((u >> 16) | 0x40u);
  }
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ void from_f32(uint16_t& dst, float v) { dst = bf16_bits(v); }

// Elements of T in one 16-byte vector.
template <class T>
inline constexpr int kVec = static_cast<int>(16 / sizeof(T));

// N consecutive elements at p as floats. N == 1: one scalar; otherwise N * sizeof(T) is a
// multiple of 16 and p is 16-byte aligned.
template <int N>
__device__ __forceinline__ void load_n(const float* p, float (&o)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int k = 0; k < N / 4; ++k) {
      const float4 r = reinterpret_cast<const float4*>(p)[k];
      o[4 * k + 0] = r.x;
      o[4 * k + 1] = r.y;
      o[4 * k + 2] = r.z;
      o[4 * k + 3] = r.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) o[k] = p[k];
  }
}
template <int N>
__device__ __forceinline__ void load_n(const uint16_t* p, float (&o)[N]) {
  if constexpr (N % 8 == 0) {
#pragma unroll
    for (int k = 0; k < N / 8; ++k) {
      const uint4 r = reinterpret_cast<const uint4*>(p)[k];
      const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        o[8 * k + 2 * j] = __uint_as_float(w[j] << 16);
        o[8 * k + 2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
      }
    }
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) o[k] = to_f32(p[k]);
  }
}
template <int N>
__device__ __forceinline__ void store_n(float* p, const float (&v)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int k = 0; k < N / 4; ++k) {
      reinterpret_cast<float4*>(p)[k] =
          make_float4(v[4 * k + 0], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) p[k] = v[k];
  }
}
template <int N>
__device__ __forceinline__ void store_n(uint16_t* p, const float (&v)[N]) {
  if constexpr (N % 8 == 0) {
#pragma unroll
    for (int k = 0; k < N / 8; ++k) {
      uint32_t w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        w[j] = static_cast<uint32_t>(bf16_bits(v[8 * k + 2 * j])) |
               (static_cast<uint32_t>(bf16_bits(v[8 * k + 2 * j + 1])) << 16);
      }
      reinterpret_cast<uint4*>(p)[k] = make_uint4(w[0], w[1], w[2], w[3]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) from_f32(p[k], v[k]);
  }
}

// ---- validation ----

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

void require(bool ok, const char* op, const char* what) {
  if (!ok) fail(std::string(op) + ": " + what);
}

void require_cuda(const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    if (t->device != Device::cuda) fail(std::string(op) + ": " + t->describe() + " is not on the GPU");
    if (t->data == nullptr && t->numel() > 0) fail(std::string(op) + ": null tensor " + t->describe());
  }
}

bool is_float(DType t) { return t == DType::f32 || t == DType::bf16; }

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Calls f with a value of T (float or uint16_t for bf16) and of whether the vector path applies.
template <class F>
void dispatch(DType dtype, bool vector_ok_f32, bool vector_ok_bf16, F&& f) {
  if (dtype == DType::f32) {
    if (vector_ok_f32) f(float{}, std::true_type{});
    else f(float{}, std::false_type{});
  } else {
    if (vector_ok_bf16) f(uint16_t{}, std::true_type{});
    else f(uint16_t{}, std::false_type{});
  }
}
