// AdamW over every range of the flat buffers in one launch (master, grad, m, v and the compute
// copy in one pass) and the deterministic sum of squares of the gradient norm's ranges, in two
// launches whatever their number. Semantics are the CPU reference's
// (src/backend/cpu/kernels_optim.cpp) exactly: the gradient is scaled first, bias corrections
// are computed on the host in double and rounded to float, and the decoupled weight decay
// (Loshchilov & Hutter) is applied to the weight before the step.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "cuda_check.h"
#include "kernels.h"

namespace jumbo::cuda {
namespace {

#include "typed_io.cuh"

// Elements of a range one block handles: a range is cut into chunks of at most this many.
constexpr int64_t kChunkElems = 32768;

// ---- AdamW ----
struct AdamParams {
  float beta1, beta2, eps, grad_scale;
  float step_size;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  float decay;         // lr * weight_decay, for the ranges that decay
};

__device__ __forceinline__ void adamw_one(float& p, float g, float& m, float& v, float decay,
                                          const AdamParams& a) {
  const float gi = g * a.grad_scale;
  const float mi = a.beta1 * m + (1.0f - a.beta1) * gi;
  const float vi = a.beta2 * v + (1.0f - a.beta2) * gi * gi;
  m = mi;
  v = vi;
  p -= decay * p + a.step_size * mi / (sqrtf(vi) * a.inv_sqrt_bc2 + a.eps);
}

// One block per chunk of every range (llm.c's one launch per step): grad and copy at
// chunk.flat, moments at chunk.local, master at chunk.master. TC is the compute copy's element type;
// kCopy false: there is none.
template <class TC, bool kCopy>
__global__ void adamw_chunks_kernel(float* __restrict__ p, const float* __restrict__ g,
                                    float* __restrict__ m, float* __restrict__ v,
                                    TC* __restrict__ copy, const RangeChunk* __restrict__ chunks,
                                    AdamParams a) {
  const RangeChunk c = chunks[blockIdx.x];
  const float decay = c.flag ? a.decay : 0.0f;
  for (int64_t i = threadIdx.x; i < c.count; i += blockDim.x) {
    const int64_t f = c.flat + i, l = c.local + i, w = c.master + i;
    float pi = p[w], mi = m[l], vi = v[l];
    adamw_one(pi, g[f], mi, vi, decay, a);
    p[w] = pi;
    m[l] = mi;
    v[l] = vi;
    if constexpr (kCopy) copy[f] = from_f32<TC>(pi);
  }
}

// ---- sum of squares ----
// Block-wide sum in double: warp shuffles, then the first warp over the warps' sums. The
// combining order is fixed, so the result is too.
__device__ double block_sum(double x) {
  __shared__ double warp_sums[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x += __shfl_down_sync(0xffffffffu, x, off);
  if (lane == 0) warp_sums[warp] = x;
  __syncthreads();
  double total = 0.0;
  if (warp == 0) {
    total = lane < warps ? warp_sums[lane] : 0.0;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) total += __shfl_down_sync(0xffffffffu, total, off);
  }
  return total;  // valid in thread 0
}

// Pass 1: one block per chunk of every span writes the chunk's sum (each square in fp32,
// added in double) to partials[chunk].
__global__ void sum_squares_chunks_kernel(const float* __restrict__ x,
                                          const RangeChunk* __restrict__ chunks,
                                          double* __restrict__ partials) {
  const RangeChunk c = chunks[blockIdx.x];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < c.count; i += blockDim.x) {
    const float f = x[c.flat + i];
    acc += static_cast<double>(f * f);
  }
  const double total = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// Pass 2: one thread per span adds its chunks' partials in order.
__global__ void sum_squares_spans_kernel(const double* __restrict__ partials,
                                         const int32_t* __restrict__ first_chunk, int spans,
                                         double* __restrict__ sums) {
  const int k = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (k >= spans) return;
  double total = 0.0;
  for (int32_t c = first_chunk[k]; c < first_chunk[k + 1]; ++c) total += partials[c];
  sums[k] = total;
}

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument(what); }

// FNV-1a over the bytes of the ranges: the key of the uploaded chunk table.
uint64_t fingerprint(const void* data, size_t bytes, uint64_t kind) {
  uint64_t h = 1469598103934665603ull ^ kind;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

template <class T>
void grow(T** device, size_t* capacity, size_t count, const char* what) {
  if (count <= *capacity) return;
  cudaFree(*device);
  *device = nullptr;
  check(cudaMalloc(reinterpret_cast<void**>(device), count * sizeof(T)), what);
  *capacity = count;
}

}  // namespace

RangeTable::~RangeTable() {
  cudaFree(chunks_);  // cudaFree waits for the device, so no copy still reads the stage
  cudaFree(first_chunk_);
  cudaFree(partials_);
  cudaFreeHost(stage_);
}

// The host's chunk list (and, for spans, where each span's chunks start), uploaded when the
// ranges differ from the last call's. The stream is drained first: kernels of the previous
// call may still read the old table, and its copies may still read the stage. The copies
// then go on `stream` itself (the compute stream is non-blocking, so a copy on the legacy
// default stream would not be ordered before the kernels that read the table), from pinned
// memory the table owns: it stays unchanged until the next upload's drain.
template <class Range, class Split>
void RangeTable::upload(cudaStream_t stream, std::span<const Range> ranges, uint64_t kind,
                        Split&& split) {
  const uint64_t key = fingerprint(ranges.data(), ranges.size_bytes(), kind) ^ ranges.size();
  if (key == key_ && kind_ == kind) return;
  host_chunks_.clear();
  host_first_.clear();
  for (size_t k = 0; k < ranges.size(); ++k) {
    host_first_.push_back(static_cast<int32_t>(host_chunks_.size()));
    split(ranges[k], static_cast<int32_t>(k), host_chunks_);
  }
  host_first_.push_back(static_cast<int32_t>(host_chunks_.size()));
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (range table)");
  grow(&chunks_, &chunk_capacity_, std::max<size_t>(host_chunks_.size(), 1), "cudaMalloc (range chunks)");
  grow(&first_chunk_, &first_capacity_, host_first_.size(), "cudaMalloc (range starts)");
  grow(&partials_, &partial_capacity_, std::max<size_t>(host_chunks_.size(), 1),
       "cudaMalloc (range partials)");
  const size_t chunk_bytes = host_chunks_.size() * sizeof(RangeChunk);
  const size_t first_bytes = host_first_.size() * sizeof(int32_t);
  if (chunk_bytes + first_bytes > stage_capacity_) {
    cudaFreeHost(stage_);
    stage_ = nullptr;
    stage_capacity_ = 0;
    check(cudaMallocHost(reinterpret_cast<void**>(&stage_), chunk_bytes + first_bytes),
          "cudaMallocHost (range table stage)");
    stage_capacity_ = chunk_bytes + first_bytes;
  }
  static_assert(sizeof(RangeChunk) % alignof(int32_t) == 0, "the starts follow the chunks");
  std::memcpy(stage_, host_chunks_.data(), chunk_bytes);
  std::memcpy(stage_ + chunk_bytes, host_first_.data(), first_bytes);
  if (chunk_bytes > 0) {
    check(cudaMemcpyAsync(chunks_, stage_, chunk_bytes, cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync (range chunks)");
  }
  check(cudaMemcpyAsync(first_chunk_, stage_ + chunk_bytes, first_bytes, cudaMemcpyHostToDevice,
                        stream),
        "cudaMemcpyAsync (range starts)");
  key_ = key;
  kind_ = kind;
}

void adamw(cudaStream_t stream, Tensor master, Tensor grad, Tensor m, Tensor v,
           Tensor compute_copy, std::span<const AdamWRange> ranges, const AdamWStep& s,
           RangeTable& table) {
  auto expect_f32 = [&](const char* name, Tensor t) {
    if (t.dtype != DType::f32 || t.device != Device::cuda) {
      bad(std::string("adamw: ") + name + " is " + t.describe() + ", expected f32 device memory");
    }
  };
  expect_f32("master", master);
  expect_f32("grad", grad);
  expect_f32("m", m);
  expect_f32("v", v);
  if (m.numel() != v.numel()) bad("adamw: m " + m.describe() + " and v " + v.describe() + " differ");
  if (!compute_copy.empty() && compute_copy.dtype != DType::f32 && compute_copy.dtype != DType::bf16) {
    bad("adamw: compute copy is " + compute_copy.describe() + ", expected f32 or bf16");
  }
  for (const AdamWRange& r : ranges) {
    if (r.count < 0 || r.master + r.count > master.numel() || r.local + r.count > m.numel() ||
        r.flat + r.count > grad.numel() ||
        (!compute_copy.empty() && r.flat + r.count > compute_copy.numel())) {
      bad("adamw: range [" + std::to_string(r.flat) + ", +" + std::to_string(r.count) + ") local " +
          std::to_string(r.local) + " outside the buffers (master " + master.describe() + ", m " +
          m.describe() + ")");
    }
  }
  table.upload(stream, ranges, 1, [](const AdamWRange& r, int32_t item, std::vector<RangeChunk>& out) {
    for (int64_t at = 0; at < r.count; at += kChunkElems) {
      out.push_back({r.flat + at, r.local + at, std::min(kChunkElems, r.count - at),
                     r.master + at, item, r.weight_decay ? 1 : 0});
    }
  });
  const int64_t chunks = table.chunks();
  if (chunks == 0) return;
  // The host-side constants exactly as the CPU computes them.
  const float bc1 = 1.0f - static_cast<float>(std::pow(s.beta1, static_cast<double>(s.step)));
  const float bc2 = 1.0f - static_cast<float>(std::pow(s.beta2, static_cast<double>(s.step)));
  AdamParams a{};
  a.beta1 = s.beta1;
  a.beta2 = s.beta2;
  a.eps = s.eps;
  a.grad_scale = s.grad_scale;
  a.step_size = s.lr / bc1;
  a.inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
  a.decay = s.lr * s.weight_decay;
  float* p = master.as<float>();
  const float* g = grad.as<float>();
  float* pm = m.as<float>();
  float* pv = v.as<float>();
  const auto grid = static_cast<unsigned>(chunks);
  if (compute_copy.empty()) {
    adamw_chunks_kernel<float, false><<<grid, kThreads, 0, stream>>>(p, g, pm, pv, nullptr,
                                                                     table.device_chunks(), a);
  } else if (compute_copy.dtype == DType::bf16) {
    adamw_chunks_kernel<bf16_t, true><<<grid, kThreads, 0, stream>>>(
        p, g, pm, pv, compute_copy.as<bf16_t>(), table.device_chunks(), a);
  } else {
    adamw_chunks_kernel<float, true><<<grid, kThreads, 0, stream>>>(
        p, g, pm, pv, compute_copy.as<float>(), table.device_chunks(), a);
  }
  check_last("adamw");
}

void sum_squares(cudaStream_t stream, Tensor flat, std::span<const FlatSpan> spans, double* sums,
                 RangeTable& table) {
  if (flat.dtype != DType::f32 || flat.device != Device::cuda) {
    bad("sum_squares: expected f32 device memory, got " + flat.describe());
  }
  for (const FlatSpan& sp : spans) {
    if (sp.count < 0 || sp.offset + sp.count > flat.numel()) {
      bad("sum_squares: span [" + std::to_string(sp.offset) + ", +" + std::to_string(sp.count) +
          ") outside " + flat.describe());
    }
  }
  table.upload(stream, spans, 2, [](const FlatSpan& sp, int32_t item, std::vector<RangeChunk>& out) {
    for (int64_t at = 0; at < sp.count; at += kChunkElems) {
      out.push_back({sp.offset + at, 0, std::min(kChunkElems, sp.count - at), 0, item, 0});
    }
  });
  if (spans.empty()) return;
  if (table.chunks() > 0) {
    sum_squares_chunks_kernel<<<static_cast<unsigned>(table.chunks()), kThreads, 0, stream>>>(
        flat.as<float>(), table.device_chunks(), table.device_partials());
    check_last("sum_squares (chunks)");
  }
  const int n = static_cast<int>(spans.size());
  sum_squares_spans_kernel<<<(n + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      table.device_partials(), table.device_first_chunk(), n, sums);
  check_last("sum_squares (spans)");
}

}  // namespace jumbo::cuda
