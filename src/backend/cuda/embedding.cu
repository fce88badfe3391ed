// Token and position embeddings, forward and backward.
//
// Storage is f32 or bf16 (bf16 held as raw uint16_t bits on the device, converted exactly as
// jumbo::f32_to_bf16 does), math is fp32. Rows whose width is a multiple of one 16-byte vector
// and whose pointers are 16-byte aligned go through 16-byte loads and stores; others element
// by element.
//
// token_embedding_bwd is deterministic without float atomics:
//   1. keys[n] = the token's local row (tokens outside this rank's slice get the key `rows`,
//      which sorts last and is skipped), values[n] = n;
//   2. a stable radix sort (CUB) of (key, n) over the bits `rows` needs: tokens grouped by
//      row, each group in token order;
//   3. one block per sorted position (x) and column tile (y): the block at the first position
//      of a group loads dwte's row and adds the group's dout rows to it in token order, then
//      stores it; every other block returns at once.
// The additions are the CPU reference's, in its order (dwte[row] += dout[n] for n ascending),
// so the f32 result is bit-identical to CpuBackend and from run to run.
#include <cub/device/device_radix_sort.cuh>

#include <climits>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda_check.h"
#include "kernels.h"

namespace jumbo::cuda {
namespace {

#include "storage_io.cuh"

constexpr int kThreads = 256;

int64_t blocks_for(int64_t work, int threads) {
  const int64_t b = (work + threads - 1) / threads;
  return b < 1 ? 1 : (b > (1ll << 30) ? (1ll << 30) : b);  // grid-stride loops cover the rest
}

// ---- kernels ----

template <class T, int V>
__global__ void token_embedding_fwd_kernel(T* __restrict__ out, const int32_t* __restrict__ tokens,
                                           const T* __restrict__ wte, int64_t n_tok, int64_t c,
                                           int64_t rows, int64_t vocab_start) {
  const int64_t nvec = c / V;
  const int64_t total = n_tok * nvec;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = i / nvec, v = i - n * nvec;
    const int64_t row = static_cast<int64_t>(tokens[n]) - vocab_start;
    T* dst = out + n * c + v * V;
    if (row >= 0 && row < rows) {
      const T* src = wte + row * c + v * V;
      if constexpr (V == 1) {
        *dst = *src;  // a copy of the stored bits, like the CPU
      } else {
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
      }
    } else {
      if constexpr (V == 1) {
        *dst = T{};  // +0 in both f32 and bf16
      } else {
        *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
      }
    }
  }
}

// keys[n] = local row of token n, or `rows` outside the slice; vals[n] = n.
__global__ void token_keys_kernel(uint32_t* __restrict__ keys, int32_t* __restrict__ vals,
                                  const int32_t* __restrict__ tokens, int n_tok, int64_t rows,
                                  int64_t vocab_start) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= n_tok) return;
  const int64_t row = static_cast<int64_t>(tokens[n]) - vocab_start;
  keys[n] = (row >= 0 && row < rows) ? static_cast<uint32_t>(row) : static_cast<uint32_t>(rows);
  vals[n] = n;
}

constexpr int kBwdThreads = 128;

// Block (i, tile): if sorted position i starts a group of one valid row, adds the group's
// dout rows (in token order: the sort is stable) to that row of dwte, columns of this tile.
template <class T, int V>
__global__ void token_embedding_bwd_kernel(float* __restrict__ dwte, const T* __restrict__ dout,
                                           const uint32_t* __restrict__ keys,
                                           const int32_t* __restrict__ order, int n_tok,
                                           int64_t c, uint32_t rows) {
  const int i = blockIdx.x;
  const uint32_t key = keys[i];
  if (key >= rows) return;                      // tokens of other ranks' slices (sorted last)
  if (i > 0 && keys[i - 1] == key) return;      // not the first of its group
  const int64_t v = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (v >= c / V) return;
  int end = i + 1;
  while (end < n_tok && keys[end] == key) ++end;

  float* d = dwte + static_cast<int64_t>(key) * c + v * V;
  float acc[V];
  load_n<V>(d, acc);
  int j = i;
  // Eight rows' loads in flight at a time; the additions stay in token order.
  for (; j + 8 <= end; j += 8) {
    float g[8][V];
#pragma unroll
    for (int u = 0; u < 8; ++u) load_n<V>(dout + static_cast<int64_t>(order[j + u]) * c + v * V, g[u]);
#pragma unroll
    for (int u = 0; u < 8; ++u) {
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] += g[u][k];
    }
  }
  for (; j < end; ++j) {
    float g[V];
    load_n<V>(dout + static_cast<int64_t>(order[j]) * c + v * V, g);
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] += g[k];
  }
  store_n<V>(d, acc);
}

template <class T, int V>
__global__ void position_embedding_fwd_kernel(T* __restrict__ out, const T* __restrict__ wpe,
                                              const int32_t* __restrict__ positions,
                                              int64_t b, int64_t t, int64_t c) {
  const int64_t nvec = c / V;
  const int64_t total = b * t * nvec;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t bt = i / nvec, v = i - bt * nvec;
    const int64_t ti = positions ? positions[bt] : bt % t;
    T* dst = out + bt * c + v * V;
    float o[V], w[V];
    load_n<V>(dst, o);
    load_n<V>(wpe + ti * c + v * V, w);
#pragma unroll
    for (int k = 0; k < V; ++k) o[k] += w[k];
    store_n<V>(dst, o);
  }
}

// dwpe[t] += dout[0, t] + ... + dout[b-1, t], added one batch row after another (the CPU's
// order): one thread per (t, vector of columns).
template <class T, int V>
__global__ void position_embedding_bwd_kernel(float* __restrict__ dwpe, const T* __restrict__ dout,
                                              int64_t b, int64_t t, int64_t c) {
  const int64_t nvec = c / V;
  const int64_t total = t * nvec;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t ti = i / nvec, v = i - ti * nvec;
    float* d = dwpe + ti * c + v * V;
    float acc[V];
    load_n<V>(d, acc);
    int64_t bi = 0;
    for (; bi + 4 <= b; bi += 4) {
      float g[4][V];
#pragma unroll
      for (int u = 0; u < 4; ++u) load_n<V>(dout + ((bi + u) * t + ti) * c + v * V, g[u]);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += g[u][k];
      }
    }
    for (; bi < b; ++bi) {
      float g[V];
      load_n<V>(dout + (bi * t + ti) * c + v * V, g);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] += g[k];
    }
    store_n<V>(d, acc);
  }
}

// ---- token_embedding_bwd scratch layout (ints) ----
// [keys_in | keys_out | vals_in | vals_out | CUB temporary storage], each array padded to 64
// ints (256 bytes); CUB aligns its own part.
int64_t padded_ints(int64_t n) { return (n + 63) / 64 * 64; }

// Bits the sort looks at: enough for the largest key, `rows` (the out-of-slice key).
int key_bits(int64_t rows) {
  int bits = 1;
  while (bits < 32 && (static_cast<uint64_t>(rows) >> bits) != 0) ++bits;
  return bits;
}

size_t cub_sort_bytes(int n_tok, int bits) {
  size_t bytes = 0;
  check(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint32_t*>(nullptr),
                                        static_cast<uint32_t*>(nullptr),
                                        static_cast<const int32_t*>(nullptr),
                                        static_cast<int32_t*>(nullptr), n_tok, 0, bits),
        "cub::DeviceRadixSort::SortPairs (temporary storage size)");
  return bytes;
}

}  // namespace

void token_embedding_fwd(cudaStream_t stream, Tensor out, Tensor tokens, Tensor wte,
                         int64_t vocab_start) {
  const char* op = "token_embedding_fwd";
  require_cuda(op, {&out, &tokens, &wte});
  require(tokens.dtype == DType::i32, op, "tokens must be i32");
  require(is_float(wte.dtype) && out.dtype == wte.dtype, op, "out and wte must share dtype f32 or bf16");
  require(wte.ndim == 2, op, "wte must be [rows, C]");
  const int64_t n_tok = tokens.numel(), c = wte.dim(1), rows = wte.dim(0);
  require(c > 0 && out.numel() == n_tok * c && out.dim(-1) == c, op, "out must be [N, C] for N tokens");
  if (n_tok == 0) return;
  const bool aligned = aligned16(out.data) && aligned16(wte.data);
  dispatch(wte.dtype, aligned && c % kVec<float> == 0, aligned && c % kVec<uint16_t> == 0,
           [&](auto tag, auto vec) {
             using T = decltype(tag);
             constexpr int V = decltype(vec)::value ? kVec<T> : 1;
             const int64_t work = n_tok * (c / V);
             token_embedding_fwd_kernel<T, V>
                 <<<static_cast<unsigned>(blocks_for(work, kThreads)), kThreads, 0, stream>>>(
                     static_cast<T*>(out.data), tokens.as<int32_t>(),
                     static_cast<const T*>(wte.data), n_tok, c, rows, vocab_start);
           });
  JUMBO_CUDA_CHECK_LAST("token_embedding_fwd_kernel");
}

size_t token_embedding_bwd_scratch_ints(int64_t n_tokens, int64_t rows) {
  if (n_tokens <= 0) return 0;
  if (n_tokens > INT_MAX || rows <= 0 || rows >= (int64_t{1} << 32) - 1) {
    throw std::invalid_argument("token_embedding_bwd_scratch_ints: n_tokens or rows out of range");
  }
  const size_t cub_bytes = cub_sort_bytes(static_cast<int>(n_tokens), key_bits(rows));
  return static_cast<size_t>(4 * padded_ints(n_tokens)) + (cub_bytes + 3) / 4;
}

void token_embedding_bwd(cudaStream_t stream, Tensor dwte, Tensor dout, Tensor tokens,
                         int64_t vocab_start, int* scratch) {
  const char* op = "token_embedding_bwd";
  require_cuda(op, {&dwte, &dout, &tokens});
  require(dwte.dtype == DType::f32, op, "dwte must be f32");
  require(tokens.dtype == DType::i32, op, "tokens must be i32");
  require(is_float(dout.dtype), op, "dout must be f32 or bf16");
  require(dwte.ndim == 2, op, "dwte must be [rows, C]");
  const int64_t n_tok = tokens.numel(), c = dwte.dim(1), rows = dwte.dim(0);
  require(c > 0 && dout.numel() == n_tok * c && dout.dim(-1) == c, op, "dout must be [N, C] for N tokens");
  if (n_tok == 0) return;
  require(n_tok <= INT_MAX, op, "more than INT_MAX tokens");
  require(rows > 0 && rows < (int64_t{1} << 32) - 1, op, "dwte rows out of range");
  require(scratch != nullptr && aligned16(scratch), op,
          "scratch (token_embedding_bwd_scratch_ints ints) must be 16-byte aligned device memory");
  const int n = static_cast<int>(n_tok);
  const int bits = key_bits(rows);
  const int64_t np = padded_ints(n_tok);
  auto* keys_in = reinterpret_cast<uint32_t*>(scratch);
  auto* keys_out = reinterpret_cast<uint32_t*>(scratch + np);
  int32_t* vals_in = scratch + 2 * np;
  int32_t* vals_out = scratch + 3 * np;
  void* temp = scratch + 4 * np;
  size_t temp_bytes = cub_sort_bytes(n, bits);

  token_keys_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      keys_in, vals_in, tokens.as<int32_t>(), n, rows, vocab_start);
  JUMBO_CUDA_CHECK_LAST("token_keys_kernel");
  check(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, static_cast<const uint32_t*>(keys_in),
                                        keys_out, static_cast<const int32_t*>(vals_in), vals_out, n,
                                        0, bits, stream),
        "cub::DeviceRadixSort::SortPairs (token_embedding_bwd)");

  const bool aligned = aligned16(dwte.data) && aligned16(dout.data);
  dispatch(dout.dtype, aligned && c % kVec<float> == 0, aligned && c % kVec<uint16_t> == 0,
           [&](auto tag, auto vec) {
             using T = decltype(tag);
             constexpr int V = decltype(vec)::value ? kVec<T> : 1;
             const int64_t tiles = (c / V + kBwdThreads - 1) / kBwdThreads;
             require(tiles <= 65535, op, "C too large");
             const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(tiles));
             token_embedding_bwd_kernel<T, V><<<grid, kBwdThreads, 0, stream>>>(
                 dwte.as<float>(), static_cast<const T*>(dout.data), keys_out, vals_out, n, c,
                 static_cast<uint32_t>(rows));
           });
  JUMBO_CUDA_CHECK_LAST("token_embedding_bwd_kernel");
}

void position_embedding_fwd(cudaStream_t stream, Tensor out, Tensor wpe, Tensor positions) {
  const char* op = "position_embedding_fwd";
  require_cuda(op, {&out, &wpe});
  require(is_float(out.dtype) && out.dtype == wpe.dtype, op, "out and wpe must share dtype f32 or bf16");
  require(out.ndim == 3 && wpe.ndim == 2, op, "out must be [B, T, C], wpe [rows, C]");
  const int64_t b = out.dim(0), t = out.dim(1), c = out.dim(2);
  require(c == wpe.dim(1) && (positions.empty() ? t <= wpe.dim(0) : true), op, "wpe must be [>= T, C]");
  require(positions.empty() || (positions.dtype == DType::i32 && positions.numel() == b * t &&
                                positions.device == Device::cuda),
          op, "positions must be empty or i32 [B*T] on the GPU");
  if (b * t * c == 0) return;
  const bool aligned = aligned16(out.data) && aligned16(wpe.data);
  dispatch(out.dtype, aligned && c % kVec<float> == 0, aligned && c % kVec<uint16_t> == 0,
           [&](auto tag, auto vec) {
             using T = decltype(tag);
             constexpr int V = decltype(vec)::value ? kVec<T> : 1;
             const int64_t work = b * t * (c / V);
             position_embedding_fwd_kernel<T, V>
                 <<<static_cast<unsigned>(blocks_for(work, kThreads)), kThreads, 0, stream>>>(
                     static_cast<T*>(out.data), static_cast<const T*>(wpe.data),
                     positions.empty() ? nullptr : positions.as<int32_t>(), b, t, c);
           });
  JUMBO_CUDA_CHECK_LAST("position_embedding_fwd_kernel");
}

void position_embedding_bwd(cudaStream_t stream, Tensor dwpe, Tensor dout) {
  const char* op = "position_embedding_bwd";
  require_cuda(op, {&dwpe, &dout});
  require(dwpe.dtype == DType::f32, op, "dwpe must be f32");
  require(is_float(dout.dtype), op, "dout must be f32 or bf16");
  require(dout.ndim == 3 && dwpe.ndim == 2, op, "dout must be [B, T, C], dwpe [rows, C]");
  const int64_t b = dout.dim(0), t = dout.dim(1), c = dout.dim(2);
  require(c == dwpe.dim(1) && t <= dwpe.dim(0), op, "dwpe must be [>= T, C]");
  if (b * t * c == 0) return;
  const bool aligned = aligned16(dwpe.data) && aligned16(dout.data);
  dispatch(dout.dtype, aligned && c % kVec<float> == 0, aligned && c % kVec<uint16_t> == 0,
           [&](auto tag, auto vec) {
             using T = decltype(tag);
             constexpr int V = decltype(vec)::value ? kVec<T> : 1;
             const int64_t work = t * (c / V);
             position_embedding_bwd_kernel<T, V>
                 <<<static_cast<unsigned>(blocks_for(work, kThreads)), kThreads, 0, stream>>>(
                     dwpe.as<float>(), static_cast<const T*>(dout.data), b, t, c);
           });
  JUMBO_CUDA_CHECK_LAST("position_embedding_bwd_kernel");
}

}  // namespace jumbo::cuda
