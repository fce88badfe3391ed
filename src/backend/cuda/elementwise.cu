// Elementwise kernels of the CUDA backend: grid-stride loops over 16-byte packs (4 x f32 or
// 8 x bf16; 4 elements when f32 and bf16 mix) where every pointer is aligned for them, one
// element at a time otherwise. Values are loaded to fp32, computed there and stored with
// round-to-nearest-even (__float2bfloat16_rn), as jumbo/backend/bf16.h rounds on the CPU.
// Also SwiGLU (gate and up halves of one row) and the column sums behind the linear layers'
// bias gradient (reduce.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "cuda_check.h"
#include "kernels.h"
#include "reduce.h"

namespace jumbo::cuda {
namespace {

#include "typed_io.cuh"

template <class T, int N>
__device__ __forceinline__ Pack<T, N> load_pack(const T* p, int64_t i) {
  return reinterpret_cast<const Pack<T, N>*>(p)[i];
}
template <class T, int N>
__device__ __forceinline__ void store_pack(T* p, int64_t i, const Pack<T, N>& v) {
  reinterpret_cast<Pack<T, N>*>(p)[i] = v;
}

// ---- functors (fp32 in, fp32 out) ----
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)

struct Identity {
  __device__ float operator()(float x) const { return x; }
};
struct Constant {
  float value;
  __device__ float operator()() const { return value; }
};
struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Scale {
  float factor;
  __device__ float operator()(float v) const { return v * factor; }
};
// tanh-approximation GELU, the CPU reference's formula.
struct GeluFwd {
  __device__ float operator()(float v) const {
    const float u = kGeluC * (v + 0.044715f * v * v * v);
    return 0.5f * v * (1.0f + tanhf(u));
  }
};
// din = dout * gelu'(x), operands (dout, x).
struct GeluBwd {
  __device__ float operator()(float g, float v) const {
    const float u = kGeluC * (v + 0.044715f * v * v * v);
    const float th = tanhf(u);
    const float sech2 = 1.0f - th * th;
    const float d =
        0.5f * (1.0f + th) + 0.5f * v * sech2 * kGeluC * (1.0f + 3.0f * 0.044715f * v * v);
    return g * d;
  }
};

// ---- generic maps: out[i] = op(a[i], ...), N elements per pack (N = 1: scalar) ----
template <int N, class TO, class Op>
__global__ void map0_kernel(TO* out, int64_t n, Op op) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / N;
  for (int64_t i = tid; i < packs; i += stride) {
    Pack<TO, N> o;
#pragma unroll
    for (int j = 0; j < N; ++j) o.v[j] = from_f32<TO>(op());
    store_pack<TO, N>(out, i, o);
  }
  for (int64_t i = packs * N + tid; i < n; i += stride) out[i] = from_f32<TO>(op());
}

template <int N, class TO, class TA, class Op>
__global__ void map1_kernel(TO* out, const TA* a, int64_t n, Op op) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / N;
  for (int64_t i = tid; i < packs; i += stride) {
    const Pack<TA, N> pa = load_pack<TA, N>(a, i);
    Pack<TO, N> o;
#pragma unroll
    for (int j = 0; j < N; ++j) o.v[j] = from_f32<TO>(op(to_f32(pa.v[j])));
    store_pack<TO, N>(out, i, o);
  }
  for (int64_t i = packs * N + tid; i < n; i += stride) out[i] = from_f32<TO>(op(to_f32(a[i])));
}

template <int N, class TO, class TA, class TB, class Op>
__global__ void map2_kernel(TO* out, const TA* a, const TB* b, int64_t n, Op op) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / N;
  for (int64_t i = tid; i < packs; i += stride) {
    const Pack<TA, N> pa = load_pack<TA, N>(a, i);
    const Pack<TB, N> pb = load_pack<TB, N>(b, i);
    Pack<TO, N> o;
#pragma unroll
    for (int j = 0; j < N; ++j) o.v[j] = from_f32<TO>(op(to_f32(pa.v[j]), to_f32(pb.v[j])));
    store_pack<TO, N>(out, i, o);
  }
  for (int64_t i = packs * N + tid; i < n; i += stride) {
    out[i] = from_f32<TO>(op(to_f32(a[i]), to_f32(b[i])));
  }
}

// SwiGLU over rows of gate_up [rows, 2F] = (gate, up) side by side, N elements per pack (N
// divides F; N = 1: scalar). silu(g) = g * sigmoid(g) = g / (1 + exp(-g)), the CPU's forms.
__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

template <int N, class T>
__global__ void swiglu_fwd_kernel(T* out, const T* gate_up, int64_t rows, int64_t f) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t row_packs = f / N, packs = rows * row_packs;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < packs;
       i += stride) {
    const int64_t r = i / row_packs, k = i - r * row_packs;
    const T* gate = gate_up + r * 2 * f;
    const Pack<T, N> pg = load_pack<T, N>(gate, k), pu = load_pack<T, N>(gate + f, k);
    Pack<T, N> o;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float g = to_f32(pg.v[j]);
      o.v[j] = from_f32<T>(g / (1.0f + expf(-g)) * to_f32(pu.v[j]));
    }
    store_pack<T, N>(out + r * f, k, o);
  }
}

// dgate = dout * up * silu'(gate), silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g)));
// dup = dout * silu(gate).
template <int N, class T>
__global__ void swiglu_bwd_kernel(T* dgate_up, const T* dout, const T* gate_up, int64_t rows,
                                  int64_t f) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t row_packs = f / N, packs = rows * row_packs;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < packs;
       i += stride) {
    const int64_t r = i / row_packs, k = i - r * row_packs;
    const T* gate = gate_up + r * 2 * f;
    const Pack<T, N> pg = load_pack<T, N>(gate, k), pu = load_pack<T, N>(gate + f, k);
    const Pack<T, N> pd = load_pack<T, N>(dout + r * f, k);
    Pack<T, N> dg, du;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float g = to_f32(pg.v[j]), u = to_f32(pu.v[j]), d = to_f32(pd.v[j]);
      const float sg = sigmoid(g);
      dg.v[j] = from_f32<T>(d * u * sg * (1.0f + g * (1.0f - sg)));
      du.v[j] = from_f32<T>(d * g * sg);
    }
    T* dgate = dgate_up + r * 2 * f;
    store_pack<T, N>(dgate, k, dg);
    store_pack<T, N>(dgate + f, k, du);
  }
}

__global__ void fill_i32_kernel(int32_t* out, int64_t n, int32_t value) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    out[i] = value;
  }
}

template <class T>
__global__ void fill_columns_kernel(T* p, int64_t rows, int64_t cols, int64_t first_col,
                                    float value) {
  const int64_t width = cols - first_col;
  const int64_t total = rows * width;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const T v = from_f32<T>(value);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t r = i / width;
    const int64_t c = first_col + (i - r * width);
    p[r * cols + c] = v;
  }
}

// sums[c] += sum_r x[r, c]: a block owns 32 columns; its 32 thread rows each sum a fixed
// stride of rows (coalesced across the warp's 32 columns), then one thread row adds the 32
// partials in a fixed order. No atomics: the result depends only on the shape.
constexpr int kColTile = 32;
constexpr int kRowThreads = 32;

template <class T>
__global__ void column_sums_kernel(float* sums, const T* x, int64_t rows, int64_t cols) {
  __shared__ float part[kRowThreads][kColTile + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  float s = 0.0f;
  if (c < cols) {
    for (int64_t r = threadIdx.y; r < rows; r += kRowThreads) s += to_f32(x[r * cols + c]);
  }
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float t = 0.0f;
#pragma unroll
    for (int j = 0; j < kRowThreads; ++j) t += part[j][threadIdx.x];
    sums[c] += t;
  }
}

// One element per thread step: the mask needs each element's (row, column).
template <class T>
__global__ void dropout_kernel(T* out, const T* in, int64_t rows, int64_t cols, DropoutMask m,
                               int64_t total, float keep_scale) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    const auto logical = static_cast<uint64_t>(r * total + m.col_offset + c);
    out[i] = from_f32<T>(dropout_keeps(m.seed, logical, m.p) ? to_f32(in[i]) * keep_scale : 0.0f);
  }
}

// ---- host side ----
template <class T>
struct Tag {
  using type = T;
};

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument(what); }

// Calls f(Tag<float>) or f(Tag<bf16_t>) for t's dtype; anything else throws.
template <class F>
void dispatch_float(const char* what, Tensor t, F&& f) {
  if (t.dtype == DType::f32) {
    f(Tag<float>{});
  } else if (t.dtype == DType::bf16) {
    f(Tag<bf16_t>{});
  } else {
    bad(std::string(what) + ": expected f32 or bf16, got " + t.describe());
  }
}

void expect_same_numel(const char* what, Tensor a, Tensor b) {
  if (a.numel() != b.numel()) {
    bad(std::string(what) + ": element counts differ: " + a.describe() + " vs " + b.describe());
  }
}

void expect_same_dtype(const char* what, Tensor a, Tensor b) {
  if (a.dtype != b.dtype) {
    bad(std::string(what) + ": dtypes differ: " + a.describe() + " vs " + b.describe());
  }
}

bool aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

int grid_for(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<int>(std::clamp<int64_t>(blocks, 1, kMaxBlocks));
}

// Elements per 16-byte pack for the widest of the element types involved.
template <class... Ts>
constexpr int pack_width() {
  constexpr size_t widest = std::max({sizeof(Ts)...});
  return static_cast<int>(16 / widest);
}

template <class TO, class Op>
void launch_map0(cudaStream_t stream, const char* what, TO* out, int64_t n, Op op) {
  if (n == 0) return;
  constexpr int N = pack_width<TO>();
  if (aligned(out, sizeof(TO) * N)) {
    map0_kernel<N, TO><<<grid_for(n / N), kThreads, 0, stream>>>(out, n, op);
  } else {
    map0_kernel<1, TO><<<grid_for(n), kThreads, 0, stream>>>(out, n, op);
  }
  check_last(what);
}

template <class TO, class TA, class Op>
void launch_map1(cudaStream_t stream, const char* what, TO* out, const TA* a, int64_t n, Op op) {
  if (n == 0) return;
  constexpr int N = pack_width<TO, TA>();
  if (aligned(out, sizeof(TO) * N) && aligned(a, sizeof(TA) * N)) {
    map1_kernel<N, TO, TA><<<grid_for(n / N), kThreads, 0, stream>>>(out, a, n, op);
  } else {
    map1_kernel<1, TO, TA><<<grid_for(n), kThreads, 0, stream>>>(out, a, n, op);
  }
  check_last(what);
}

template <class TO, class TA, class TB, class Op>
void launch_map2(cudaStream_t stream, const char* what, TO* out, const TA* a, const TB* b,
                 int64_t n, Op op) {
  if (n == 0) return;
  constexpr int N = pack_width<TO, TA, TB>();
  if (aligned(out, sizeof(TO) * N) && aligned(a, sizeof(TA) * N) && aligned(b, sizeof(TB) * N)) {
    map2_kernel<N, TO, TA, TB><<<grid_for(n / N), kThreads, 0, stream>>>(out, a, b, n, op);
  } else {
    map2_kernel<1, TO, TA, TB><<<grid_for(n), kThreads, 0, stream>>>(out, a, b, n, op);
  }
  check_last(what);
}

// gate_up [N, 2F] and a second tensor of F columns per row (out or dout): returns F.
int64_t swiglu_cols(const char* what, Tensor gate_up, Tensor half) {
  if (gate_up.ndim < 1 || gate_up.dim(-1) % 2 != 0) {
    bad(std::string(what) + ": gate_up must be [N, 2F], got " + gate_up.describe());
  }
  const int64_t f = gate_up.dim(-1) / 2;
  if (half.numel() * 2 != gate_up.numel() || (half.ndim >= 1 && half.dim(-1) != f)) {
    bad(std::string(what) + ": " + half.describe() + " must be [N, F] for gate_up " +
        gate_up.describe());
  }
  return f;
}

// 16-byte packs when F is a multiple of the pack width and every pointer is pack-aligned.
template <class T>
bool swiglu_packs_ok(int64_t f, std::initializer_list<const void*> ptrs) {
  constexpr int N = pack_width<T>();
  if (f % N != 0) return false;
  for (const void* p : ptrs) {
    if (!aligned(p, sizeof(T) * N)) return false;
  }
  return true;
}

}  // namespace

void fill(cudaStream_t stream, Tensor t, float value) {
  const int64_t n = t.numel();
  if (t.dtype == DType::i32) {
    if (n == 0) return;
    fill_i32_kernel<<<grid_for(n), kThreads, 0, stream>>>(t.as<int32_t>(), n,
                                                          static_cast<int32_t>(value));
    check_last("fill");
    return;
  }
  dispatch_float("fill", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_map0(stream, "fill", t.as<T>(), n, Constant{value});
  });
}

void convert_copy(cudaStream_t stream, Tensor dst, Tensor src) {
  expect_same_numel("convert_copy", dst, src);
  if (dst.dtype == src.dtype) {  // same dtype (i32 included): a plain device-to-device copy
    if (dst.numel() == 0 || dst.data == src.data) return;
    check(cudaMemcpyAsync(dst.data, src.data, dst.bytes(), cudaMemcpyDeviceToDevice, stream),
          "convert_copy: cudaMemcpyAsync");
    return;
  }
  if (dst.dtype == DType::i32 || src.dtype == DType::i32) {
    bad("convert_copy: i32 converts to nothing: " + dst.describe() + " <- " + src.describe());
  }
  const int64_t n = dst.numel();
  dispatch_float("convert_copy", dst, [&](auto dtag) {
    using D = typename decltype(dtag)::type;
    dispatch_float("convert_copy", src, [&](auto stag) {
      using S = typename decltype(stag)::type;
      launch_map1(stream, "convert_copy", dst.as<D>(), src.as<S>(), n, Identity{});
    });
  });
}

void gelu_fwd(cudaStream_t stream, Tensor out, Tensor in) {
  expect_same_numel("gelu_fwd", out, in);
  expect_same_dtype("gelu_fwd", out, in);
  dispatch_float("gelu_fwd", in, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_map1(stream, "gelu_fwd", out.as<T>(), in.as<T>(), in.numel(), GeluFwd{});
  });
}

void gelu_bwd(cudaStream_t stream, Tensor din, Tensor dout, Tensor in) {
  expect_same_numel("gelu_bwd", din, in);
  expect_same_numel("gelu_bwd", dout, in);
  expect_same_dtype("gelu_bwd", din, in);
  expect_same_dtype("gelu_bwd", dout, in);
  dispatch_float("gelu_bwd", in, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_map2(stream, "gelu_bwd", din.as<T>(), dout.as<T>(), in.as<T>(), in.numel(),
                GeluBwd{});
  });
}

void scale(cudaStream_t stream, Tensor t, float factor) {
  dispatch_float("scale", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_map1(stream, "scale", t.as<T>(), t.as<T>(), t.numel(), Scale{factor});
  });
}

void dropout(cudaStream_t stream, Tensor out, Tensor in, const DropoutMask& m) {
  expect_same_numel("dropout", out, in);
  expect_same_dtype("dropout", out, in);
  if (in.ndim < 1 || !(m.p >= 0 && m.p < 1)) bad("dropout: p outside [0, 1) or a 0-d tensor");
  const int64_t cols = in.dim(-1), rows = cols > 0 ? in.numel() / cols : 0;
  if (rows * cols == 0) return;
  const int64_t total = m.cols_total > 0 ? m.cols_total : cols;
  dispatch_float("dropout", in, [&](auto tag) {
    using T = typename decltype(tag)::type;
    dropout_kernel<T><<<grid_for(rows * cols), kThreads, 0, stream>>>(
        out.as<T>(), in.as<T>(), rows, cols, m, total, 1.0f / (1.0f - m.p));
  });
  check_last("dropout");
}

void add(cudaStream_t stream, Tensor out, Tensor a, Tensor b) {
  expect_same_numel("add", out, a);
  expect_same_numel("add", a, b);
  expect_same_dtype("add", out, a);
  expect_same_dtype("add", a, b);
  dispatch_float("add", out, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_map2(stream, "add", out.as<T>(), a.as<T>(), b.as<T>(), out.numel(), Add{});
  });
}

void fill_columns(cudaStream_t stream, Tensor t, int64_t first_col, float value) {
  if (t.ndim < 1) bad("fill_columns: expected a [rows, cols] tensor, got " + t.describe());
  if (first_col < 0) {
    bad("fill_columns: first_col " + std::to_string(first_col) + " < 0 for " + t.describe());
  }
  const int64_t cols = t.dim(-1);
  if (cols == 0 || first_col >= cols) return;
  const int64_t rows = t.numel() / cols;
  if (rows == 0) return;
  dispatch_float("fill_columns", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    fill_columns_kernel<T><<<grid_for(rows * (cols - first_col)), kThreads, 0, stream>>>(
        t.as<T>(), rows, cols, first_col, value);
    check_last("fill_columns");
  });
}

void swiglu_fwd(cudaStream_t stream, Tensor out, Tensor gate_up) {
  const int64_t f = swiglu_cols("swiglu_fwd", gate_up, out);
  expect_same_dtype("swiglu_fwd", out, gate_up);
  const int64_t rows = f > 0 ? gate_up.numel() / (2 * f) : 0;
  if (rows * f == 0) return;
  dispatch_float("swiglu_fwd", gate_up, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int N = pack_width<T>();
    if (swiglu_packs_ok<T>(f, {out.data, gate_up.data})) {
      swiglu_fwd_kernel<N, T><<<grid_for(rows * f / N), kThreads, 0, stream>>>(
          out.as<T>(), gate_up.as<T>(), rows, f);
    } else {
      swiglu_fwd_kernel<1, T><<<grid_for(rows * f), kThreads, 0, stream>>>(
          out.as<T>(), gate_up.as<T>(), rows, f);
    }
    check_last("swiglu_fwd");
  });
}

void swiglu_bwd(cudaStream_t stream, Tensor dgate_up, Tensor dout, Tensor gate_up) {
  const int64_t f = swiglu_cols("swiglu_bwd", gate_up, dout);
  expect_same_numel("swiglu_bwd", dgate_up, gate_up);
  expect_same_dtype("swiglu_bwd", dgate_up, gate_up);
  expect_same_dtype("swiglu_bwd", dout, gate_up);
  const int64_t rows = f > 0 ? gate_up.numel() / (2 * f) : 0;
  if (rows * f == 0) return;
  dispatch_float("swiglu_bwd", gate_up, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int N = pack_width<T>();
    if (swiglu_packs_ok<T>(f, {dgate_up.data, dout.data, gate_up.data})) {
      swiglu_bwd_kernel<N, T><<<grid_for(rows * f / N), kThreads, 0, stream>>>(
          dgate_up.as<T>(), dout.as<T>(), gate_up.as<T>(), rows, f);
    } else {
      swiglu_bwd_kernel<1, T><<<grid_for(rows * f), kThreads, 0, stream>>>(
          dgate_up.as<T>(), dout.as<T>(), gate_up.as<T>(), rows, f);
    }
    check_last("swiglu_bwd");
  });
}

void add_column_sums(cudaStream_t stream, Tensor sums, Tensor x) {
  if (sums.dtype != DType::f32) bad("add_column_sums: sums must be f32, got " + sums.describe());
  const int64_t cols = sums.numel();
  if (cols == 0) return;
  if (x.numel() % cols != 0) {
    bad("add_column_sums: " + x.describe() + " is not [rows, " + std::to_string(cols) + "]");
  }
  const int64_t rows = x.numel() / cols;
  dispatch_float("add_column_sums", x, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const dim3 block(kColTile, kRowThreads);
    const auto grid = static_cast<unsigned>((cols + kColTile - 1) / kColTile);
    column_sums_kernel<T><<<grid, block, 0, stream>>>(sums.as<float>(), x.as<T>(), rows, cols);
    check_last("add_column_sums");
  });
}

}  // namespace jumbo::cuda
