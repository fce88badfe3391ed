// Causal flash attention, forward and backward (Dao 2022; FlashAttention-2's work split).
//
// Layout (backend.h): qkv [B, T, G*(R+2)*D], grouped-query attention: each token's G groups
// consecutive, a group's R query heads, then its key head, then its value head (G = H: per head
// (q, k, v)); query head h = g*R + r attends with group g's key and value. out [B, T, H*D];
// lse f32 [B, H, T, 1] = log sum_j exp(scale * q_t . k_j) over j <= t, the only statistic the
// backward needs. No T x T matrix is ever stored.
//
// bf16 storage runs on tensor cores: mma.sync.m16n8k16 (bf16 in, fp32 accumulate) fed by
// ldmatrix from padded shared memory (row stride D + 8 halves: 16-byte aligned rows, no bank
// conflicts for D = 64, 128, 144). A block has 4 warps; each warp owns 16 rows of the block's
// resident tile and keeps its accumulators in registers, in the mma C layout:
//   lane = 4*g + tq holds rows g and g+8, columns 2*tq and 2*tq+1 of every 8-wide n-tile.
// Two n-tiles of that C layout are exactly one A operand of the next mma (the FlashAttention-2
// register reuse), so P and dS never touch shared memory.
// The streamed tiles (K, V in the forward and the dQ pass; Q, dO, lse, delta in the dK/dV pass)
// are double-buffered with cp.async: tile j+1 loads while tile j computes, one __syncthreads
// per tile.
//
// f32 storage runs a SIMT path with the same tiling and fp32 FMA throughout (TF32 would miss the
// 1e-4 parity the CPU reference is held to): 256 threads as a 16 x 16 grid, each owning 4 rows
// of the resident tile, scores staged through shared memory.
//
// Backward: delta = rowsum(dout * out) first (one warp per row); then one kernel per (key tile,
// kv head) accumulating dK and dV over the group's query heads in order, each over the query
// tiles from the diagonal down, and one kernel per (query tile, query head) accumulating dQ over
// the key tiles up to the diagonal (recomputing P and dS). No atomics: every sum has a fixed
// order, so the same inputs give bit-identical gradients; with G = H the grouping changes
// nothing (R = 1: the same arithmetic as multi-head attention).
//
// Packed sequences (positions, i32 [B*T]): query t sees only keys t - positions[t] .. t. Each
// kernel has a PACKED instantiation (a template bool: the plain causal one compiles to the same
// code as before): masking is elementwise against lo(t) = t - positions[t]; the forward and dQ
// blocks start at the key tile of their rows' smallest lo, the dK/dV blocks stop at the first
// query tile that starts its sequences past their keys, and the bf16 warps also skip the tiles
// wholly outside their own rows' sequences. A row may then meet whole key tiles before its
// sequence: the online softmax takes 0 as the reference while the row's max is still -inf
// (no -inf - -inf = NaN), and the backward's P is set to exactly 0 wherever masked.
//
// Everything is queued on the caller's stream: no allocation, no host synchronisation.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels.h"

namespace jumbo::cuda {
namespace {

using hbf16 = __nv_bfloat16;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

#include "attention_mma.cuh"
#include "attention_bf16.cuh"
#include "attention_f32.cuh"

// ---------------------------------------------------------------------------------------------
// delta[b, h, t] = sum_d dout[b, t, h*D + d] * out[b, t, h*D + d]: one warp per (b, t, h) row,
// 16-byte loads, a fixed shuffle tree (deterministic).
// ---------------------------------------------------------------------------------------------

constexpr int kDeltaThreads = 256;

template <class TS>
__global__ void __launch_bounds__(kDeltaThreads)
    attention_delta(const TS* __restrict__ dout, const TS* __restrict__ out,
                    float* __restrict__ delta, int64_t rows, int T, int H, int D) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (kDeltaThreads / 32) + (threadIdx.x >> 5);
  if (r >= rows) return;  // warp-uniform
  const int lane = threadIdx.x & 31;
  float acc = 0.f;
  if constexpr (sizeof(TS) == 2) {
    const uint4* a = reinterpret_cast<const uint4*>(dout + r * D);
    const uint4* o = reinterpret_cast<const uint4*>(out + r * D);
    for (int c = lane; c < D / 8; c += 32) {
      const uint4 x = a[c], y = o[c];
      const __nv_bfloat162* xa = reinterpret_cast<const __nv_bfloat162*>(&x);
      const __nv_bfloat162* ya = reinterpret_cast<const __nv_bfloat162*>(&y);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 fx = __bfloat1622float2(xa[k]), fy = __bfloat1622float2(ya[k]);
        acc = fmaf(fx.x, fy.x, acc);
        acc = fmaf(fx.y, fy.y, acc);
      }
    }
  } else {
    const float4* a = reinterpret_cast<const float4*>(dout + r * D);
    const float4* o = reinterpret_cast<const float4*>(out + r * D);
    for (int c = lane; c < D / 4; c += 32) {
      const float4 x = a[c], y = o[c];
      acc = fmaf(x.x, y.x, acc);
      acc = fmaf(x.y, y.y, acc);
      acc = fmaf(x.z, y.z, acc);
      acc = fmaf(x.w, y.w, acc);
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) {
    const int64_t h = r % H, t = (r / H) % T, b = r / (static_cast<int64_t>(H) * T);
    delta[(b * H + h) * T + t] = acc;
  }
}

// ---------------------------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------------------------

struct Dims {
  int b, t, h, d;
  int g, r;  // kv heads (groups) and query heads per group: h = g * r
};

std::string op_prefix(const char* op) { return std::string(op) + ": "; }

void require_cuda(const char* op, const char* name, const Tensor& t) {
  if (t.device != Device::cuda) {
    throw std::invalid_argument(op_prefix(op) + name + " must be CUDA device memory, got " +
                                t.describe());
  }
}

void require_aligned(const char* op, const char* name, const Tensor& t, size_t bytes) {
  if (reinterpret_cast<uintptr_t>(t.data) % bytes != 0) {
    throw std::invalid_argument(op_prefix(op) + name + " must be " + std::to_string(bytes) +
                                "-byte aligned, got " + t.describe());
  }
}

void require_dtype(const char* op, const char* name, const Tensor& t, DType want) {
  if (t.dtype != want) {
    throw std::invalid_argument(op_prefix(op) + name + " must be " + to_string(want) + ", got " +
                                t.describe());
  }
}

// B, T, H, D, G, R from qkv [B, T, G*(R+2)*D], a per-row statistic [B, H, T, 1] and the kv
// head count G; checks what every attention launcher needs (D instantiated, grid limits).
Dims attention_dims(const char* op, const Tensor& qkv, const Tensor& stats,
                    const char* stats_name, int64_t kv_heads) {
  if (qkv.ndim != 3) {
    throw std::invalid_argument(op_prefix(op) + "qkv must be [B, T, G*(R+2)*D], got " +
                                qkv.describe());
  }
  if (qkv.dtype != DType::f32 && qkv.dtype != DType::bf16) {
    throw std::invalid_argument(op_prefix(op) + "qkv must be f32 or bf16, got " + qkv.describe());
  }
  if (stats.ndim != 4 || stats.dim(0) != qkv.dim(0) || stats.dim(2) != qkv.dim(1) ||
      stats.dim(3) != 1 || stats.dim(1) < 1) {
    throw std::invalid_argument(op_prefix(op) + stats_name + " must be f32 [B, H, T, 1] for qkv " +
                                qkv.describe() + ", got " + stats.describe());
  }
  require_dtype(op, stats_name, stats, DType::f32);
  const int64_t b = qkv.dim(0), t = qkv.dim(1), h = stats.dim(1), g = kv_heads;
  if (g < 1 || h % g != 0) {
    throw std::invalid_argument(op_prefix(op) + "kv_heads=" + std::to_string(g) +
                                " does not divide the " + std::to_string(h) + " query heads of " +
                                stats_name + " " + stats.describe());
  }
  const int64_t r = h / g;
  if (qkv.dim(2) % (g * (r + 2)) != 0) {
    throw std::invalid_argument(op_prefix(op) + "qkv's last dim " + std::to_string(qkv.dim(2)) +
                                " is not G*(R+2)*D for G=" + std::to_string(g) +
                                ", R=" + std::to_string(r));
  }
  const int64_t d = qkv.dim(2) / (g * (r + 2));
  if (!flash_attention_supports(d)) {
    throw std::invalid_argument(op_prefix(op) + "head size D=" + std::to_string(d) +
                                " is not instantiated (flash attention supports D = 64, 128, 144)");
  }
  if (b > 65535 || h > 65535 || t > (int64_t{1} << 30)) {
    throw std::invalid_argument(op_prefix(op) + "B=" + std::to_string(b) +
                                ", H=" + std::to_string(h) + ", T=" + std::to_string(t) +
                                " exceed the launch grid (B, H <= 65535, T <= 2^30)");
  }
  return {static_cast<int>(b), static_cast<int>(t), static_cast<int>(h), static_cast<int>(d),
          static_cast<int>(g), static_cast<int>(r)};
}

void check_launch(const char* kernel, int d) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("flash attention: launching ") + kernel +
                             "<D=" + std::to_string(d) + "> failed: " + cudaGetErrorString(e));
  }
}

// Raises one kernel's dynamic shared memory limit, once per device (the attribute is per device).
class SmemOptIn {
 public:
  void ensure(const void* kernel, size_t bytes, const char* name, int d) {
    if (bytes <= 48u * 1024u) return;
    int device = 0;
    cudaError_t e = cudaGetDevice(&device);
    const uint64_t bit = device >= 0 && device < 64 ? uint64_t{1} << device : 0;
    if (e == cudaSuccess && bit != 0 && (done_.load(std::memory_order_acquire) & bit) != 0) return;
    if (e == cudaSuccess) {
      e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(bytes));
    }
    if (e != cudaSuccess) {
      throw std::runtime_error(std::string("flash attention: ") + name + "<D=" + std::to_string(d) +
                               "> needs " + std::to_string(bytes) +
                               " bytes of shared memory per block: " + cudaGetErrorString(e));
    }
    done_.fetch_or(bit, std::memory_order_release);
  }

 private:
  std::atomic<uint64_t> done_{0};
};

// Blocks of rows_per_block rows for each of `heads` heads (query heads, or kv heads for dK/dV).
dim3 tile_grid(const Dims& s, int rows_per_block, int heads) {
  return dim3(static_cast<unsigned>((s.t + rows_per_block - 1) / rows_per_block),
              static_cast<unsigned>(heads), static_cast<unsigned>(s.b));
}

// PACKED: `positions` (i32 [B*T] device memory) masks each query to its own sequence; else it
// is nullptr.
template <int D, bool PACKED>
void launch_fwd(cudaStream_t stream, const Dims& s, Tensor out, Tensor lse, Tensor qkv,
                const int32_t* positions) {
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(D));
  if (qkv.dtype == DType::bf16) {
    constexpr int BC = streamed_rows<D>();
    constexpr size_t smem = fwd_bf16_smem<D>();
    static SmemOptIn opt_in;
    opt_in.ensure(reinterpret_cast<const void*>(&flash_fwd_bf16<D, BC, PACKED>), smem,
                  "flash_fwd_bf16", D);
    flash_fwd_bf16<D, BC, PACKED>
        <<<tile_grid(s, kRowsPerBlock, s.h), kMmaThreads, smem, stream>>>(
            qkv.as<hbf16>(), out.as<hbf16>(), lse.as<float>(), s.t, s.h, s.r, scale_log2,
            positions);
    check_launch("flash_fwd_bf16", D);
  } else {
    constexpr size_t smem = fwd_f32_smem<D>();
    static SmemOptIn opt_in;
    opt_in.ensure(reinterpret_cast<const void*>(&flash_fwd_f32<D, PACKED>), smem, "flash_fwd_f32",
                  D);
    flash_fwd_f32<D, PACKED><<<tile_grid(s, kSimtRows, s.h), kSimtThreads, smem, stream>>>(
        qkv.as<float>(), out.as<float>(), lse.as<float>(), s.t, s.h, s.r, scale_log2, positions);
    check_launch("flash_fwd_f32", D);
  }
}

template <int D, bool PACKED>
void launch_bwd(cudaStream_t stream, const Dims& s, Tensor dqkv, Tensor delta, Tensor dout,
                Tensor qkv, Tensor out, Tensor lse, const int32_t* positions) {
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const float scale_log2 = kLog2e * scale;
  const int64_t rows = static_cast<int64_t>(s.b) * s.t * s.h;
  const unsigned delta_blocks =
      static_cast<unsigned>((rows + kDeltaThreads / 32 - 1) / (kDeltaThreads / 32));
  if (qkv.dtype == DType::bf16) {
    attention_delta<hbf16><<<delta_blocks, kDeltaThreads, 0, stream>>>(
        dout.as<hbf16>(), out.as<hbf16>(), delta.as<float>(), rows, s.t, s.h, D);
    check_launch("attention_delta_bf16", D);

    constexpr int BQ = dkdv_query_rows<D>();
    constexpr size_t smem_kv = dkdv_bf16_smem<D, PACKED>();
    static SmemOptIn opt_kv;
    opt_kv.ensure(reinterpret_cast<const void*>(&flash_bwd_dkdv_bf16<D, BQ, PACKED>), smem_kv,
                  "flash_bwd_dkdv_bf16", D);
    flash_bwd_dkdv_bf16<D, BQ, PACKED>
        <<<tile_grid(s, kRowsPerBlock, s.g), kMmaThreads, smem_kv, stream>>>(
            qkv.as<hbf16>(), dout.as<hbf16>(), lse.as<float>(), delta.as<float>(),
            dqkv.as<hbf16>(), s.t, s.h, s.r, scale, scale_log2, positions);
    check_launch("flash_bwd_dkdv_bf16", D);

    constexpr int BS = streamed_rows<D>();
    constexpr size_t smem_q = dq_bf16_smem<D>();
    static SmemOptIn opt_q;
    opt_q.ensure(reinterpret_cast<const void*>(&flash_bwd_dq_bf16<D, BS, PACKED>), smem_q,
                 "flash_bwd_dq_bf16", D);
    flash_bwd_dq_bf16<D, BS, PACKED>
        <<<tile_grid(s, kRowsPerBlock, s.h), kMmaThreads, smem_q, stream>>>(
            qkv.as<hbf16>(), dout.as<hbf16>(), lse.as<float>(), delta.as<float>(),
            dqkv.as<hbf16>(), s.t, s.h, s.r, scale, scale_log2, positions);
    check_launch("flash_bwd_dq_bf16", D);
  } else {
    attention_delta<float><<<delta_blocks, kDeltaThreads, 0, stream>>>(
        dout.as<float>(), out.as<float>(), delta.as<float>(), rows, s.t, s.h, D);
    check_launch("attention_delta_f32", D);

    constexpr size_t smem_kv = dkdv_f32_smem<D, PACKED>();
    static SmemOptIn opt_kv;
    opt_kv.ensure(reinterpret_cast<const void*>(&flash_bwd_dkdv_f32<D, PACKED>), smem_kv,
                  "flash_bwd_dkdv_f32", D);
    flash_bwd_dkdv_f32<D, PACKED><<<tile_grid(s, kSimtRows, s.g), kSimtThreads, smem_kv, stream>>>(
        qkv.as<float>(), dout.as<float>(), lse.as<float>(), delta.as<float>(), dqkv.as<float>(),
        s.t, s.h, s.r, scale, scale_log2, positions);
    check_launch("flash_bwd_dkdv_f32", D);

    constexpr size_t smem_q = dq_f32_smem<D>();
    static SmemOptIn opt_q;
    opt_q.ensure(reinterpret_cast<const void*>(&flash_bwd_dq_f32<D, PACKED>), smem_q,
                 "flash_bwd_dq_f32", D);
    flash_bwd_dq_f32<D, PACKED><<<tile_grid(s, kSimtRows, s.h), kSimtThreads, smem_q, stream>>>(
        qkv.as<float>(), dout.as<float>(), lse.as<float>(), delta.as<float>(), dqkv.as<float>(),
        s.t, s.h, s.r, scale, scale_log2, positions);
    check_launch("flash_bwd_dq_f32", D);
  }
}

// positions: empty (plain causal) or i32 [B*T] CUDA memory; nullptr for the former.
const int32_t* packed_positions(const char* op, const Tensor& positions, const Dims& s) {
  if (positions.empty()) return nullptr;
  require_cuda(op, "positions", positions);
  require_dtype(op, "positions", positions, DType::i32);
  if (positions.numel() != static_cast<int64_t>(s.b) * s.t) {
    throw std::invalid_argument(op_prefix(op) + "positions must hold B*T = " +
                                std::to_string(static_cast<int64_t>(s.b) * s.t) +
                                " elements, got " + positions.describe());
  }
  require_aligned(op, "positions", positions, 4);
  return positions.as<int32_t>();
}

template <int D>
void dispatch_fwd(cudaStream_t stream, const Dims& s, Tensor out, Tensor lse, Tensor qkv,
                  const int32_t* positions) {
  if (positions != nullptr) {
    launch_fwd<D, true>(stream, s, out, lse, qkv, positions);
  } else {
    launch_fwd<D, false>(stream, s, out, lse, qkv, nullptr);
  }
}

template <int D>
void dispatch_bwd(cudaStream_t stream, const Dims& s, Tensor dqkv, Tensor delta, Tensor dout,
                  Tensor qkv, Tensor out, Tensor lse, const int32_t* positions) {
  if (positions != nullptr) {
    launch_bwd<D, true>(stream, s, dqkv, delta, dout, qkv, out, lse, positions);
  } else {
    launch_bwd<D, false>(stream, s, dqkv, delta, dout, qkv, out, lse, nullptr);
  }
}

}  // namespace

bool flash_attention_supports(int64_t head_dim) {
  return head_dim == 64 || head_dim == 128 || head_dim == 144;
}

void flash_attention_fwd(cudaStream_t stream, Tensor out, Tensor lse, Tensor qkv,
                         int64_t kv_heads, Tensor positions) {
  const char* op = "flash_attention_fwd";
  require_cuda(op, "qkv", qkv);
  require_cuda(op, "out", out);
  require_cuda(op, "lse", lse);
  const Dims s = attention_dims(op, qkv, lse, "lse", kv_heads);
  require_dtype(op, "out", out, qkv.dtype);
  if (out.numel() != static_cast<int64_t>(s.b) * s.t * s.h * s.d) {
    throw std::invalid_argument(op_prefix(op) + "out must hold B*T*H*D elements for qkv " +
                                qkv.describe() + ", got " + out.describe());
  }
  require_aligned(op, "qkv", qkv, 16);
  require_aligned(op, "out", out, 16);
  require_aligned(op, "lse", lse, 4);
  const int32_t* pos = packed_positions(op, positions, s);
  if (s.b == 0 || s.t == 0) return;
  switch (s.d) {
    case 64:
      dispatch_fwd<64>(stream, s, out, lse, qkv, pos);
      break;
    case 128:
      dispatch_fwd<128>(stream, s, out, lse, qkv, pos);
      break;
    case 144:
      dispatch_fwd<144>(stream, s, out, lse, qkv, pos);
      break;
    default:
      break;  // attention_dims admits only the sizes above
  }
}

void flash_attention_bwd(cudaStream_t stream, Tensor dqkv, Tensor delta, Tensor dout, Tensor qkv,
                         Tensor out, Tensor lse, int64_t kv_heads, Tensor positions) {
  const char* op = "flash_attention_bwd";
  require_cuda(op, "dqkv", dqkv);
  require_cuda(op, "delta", delta);
  require_cuda(op, "dout", dout);
  require_cuda(op, "qkv", qkv);
  require_cuda(op, "out", out);
  require_cuda(op, "lse", lse);
  const Dims s = attention_dims(op, qkv, lse, "lse", kv_heads);
  require_dtype(op, "delta", delta, DType::f32);
  if (delta.ndim != 4 || delta.shape != lse.shape) {
    throw std::invalid_argument(op_prefix(op) + "delta must have lse's shape " + lse.describe() +
                                ", got " + delta.describe());
  }
  require_dtype(op, "dqkv", dqkv, qkv.dtype);
  require_dtype(op, "dout", dout, qkv.dtype);
  require_dtype(op, "out", out, qkv.dtype);
  const int64_t n_out = static_cast<int64_t>(s.b) * s.t * s.h * s.d;
  if (dqkv.numel() != qkv.numel() || dout.numel() != n_out || out.numel() != n_out) {
    throw std::invalid_argument(op_prefix(op) + "dqkv must match qkv " + qkv.describe() +
                                " and dout, out hold B*T*H*D elements; got dqkv " +
                                dqkv.describe() + ", dout " + dout.describe() + ", out " +
                                out.describe());
  }
  require_aligned(op, "dqkv", dqkv, 16);
  require_aligned(op, "dout", dout, 16);
  require_aligned(op, "qkv", qkv, 16);
  require_aligned(op, "out", out, 16);
  require_aligned(op, "lse", lse, 4);
  require_aligned(op, "delta", delta, 4);
  const int32_t* pos = packed_positions(op, positions, s);
  if (s.b == 0 || s.t == 0) return;
  switch (s.d) {
    case 64:
      dispatch_bwd<64>(stream, s, dqkv, delta, dout, qkv, out, lse, pos);
      break;
    case 128:
      dispatch_bwd<128>(stream, s, dqkv, delta, dout, qkv, out, lse, pos);
      break;
    case 144:
      dispatch_bwd<144>(stream, s, dqkv, delta, dout, qkv, out, lse, pos);
      break;
    default:
      break;
  }
}

}  // namespace jumbo::cuda
