// The linear layers through cuBLASLt.
//
// Layouts. Our tensors are row-major; cuBLASLt is column-major. A row-major [R, C] matrix with
// leading dimension C is, unchanged in memory, the column-major [C, R] matrix (its transpose)
// with leading dimension C. Writing X' for that column-major view:
//   forward   out[N,O] = in[N,I] @ W[O,I]^T      ->  out'[O,N] = op_T(W'[I,O]) @ in'[I,N]
//             m = O, n = N, k = I; A = W' (TRANSA = T, ld I), B = in' (N, ld I), D = out' (ld O)
//             bias[O] has one value per row of D (what CUBLASLT_EPILOGUE_BIAS broadcasts).
//   data grad din[N,I] = dout[N,O] @ W[O,I]      ->  din'[I,N] = W'[I,O] @ dout'[O,N]
//             m = I, n = N, k = O; A = W' (N, ld I), B = dout' (N, ld O), C = D = din' (ld I)
//   weight grad dW[O,I] += dout^T @ in           ->  dW'[I,O] += in'[I,N] @ op_T(dout'[O,N])
//             m = I, n = O, k = N; A = in' (N, ld I), B = dout' (TRANSB = T, ld O),
//             C = D = dW' (f32, ld I), beta = 1: accumulated straight into the main grad.
// Types: bf16 A/B with bf16 C/D (forward, din) or f32 C/D (dW), f32 everything in fp32 mode;
// always CUBLAS_COMPUTE_32F with CUDA_R_32F alpha/beta (fp32 accumulation; for f32 operands
// this is true fp32, never TF32, which the heuristic's implementation mask also excludes).
//
// GELU. cublasLt.h documents CUBLASLT_EPILOGUE_GELU_AUX_BIAS only as "apply Bias and then
// GELU transform" with the pre-activation written to the AUX buffer; it does not state the
// formula. The tanh approximation is what the ecosystem relies on (PyTorch's
// _addmm_activation applies gelu(x, "tanh") on the paths where it cannot use that epilogue),
// so the bf16 path fuses it (one GEMM writes both out and pre) and the gpu test
// LinearGeluEpilogueIsTanhGelu pins the formula on the device (should it ever fail, set
// kFuseGeluBf16 = false below: the unfused path is always exact). The f32 path, the accuracy
// reference mode, is not fused: BIAS epilogue into `pre`, then our gelu kernel, the CPU's
// formula exactly. Shapes the fused epilogue cannot serve (AUX_LD must be a multiple of 8,
// i.e. O % 8 == 0, or no algorithm) take the unfused path as well.
//
// Bias gradient. CUBLASLT_EPILOGUE_BGRADB on the weight-gradient GEMM would produce the column
// sums of dout, but it overwrites the bias vector, while dbias is a main grad that accumulates
// over microbatches; a deterministic column-sum kernel (reduce.h) adds them instead.
//
// Plans. A cuBLASLt matmul needs a descriptor, four layouts and an algorithm from the
// heuristic; building them costs tens of microseconds and the shapes repeat every step, so
// they are cached per (operation, dtypes, m, n, k, epilogue, pointer alignments) in a hash
// map filled on first use: after the first step no call allocates. The per-call pointers
// (bias, aux) are set on the cached descriptor before each matmul; their alignment is part of
// the key because the heuristic's choice depends on it. Each Gemm owns its cache.
#include "gemm.h"

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "cuda_check.h"
#include "kernels.h"
#include "reduce.h"

namespace jumbo::cuda {
namespace {

// Whether linear_gelu_fwd may use the fused GELU_AUX_BIAS epilogue, per compute dtype.
constexpr bool kFuseGeluBf16 = true;
constexpr bool kFuseGeluF32 = false;

enum class GemmOp : uint8_t { fwd, fwd_gelu, din, dweight };

const char* op_name(GemmOp op) {
  switch (op) {
    case GemmOp::fwd: return "linear_fwd";
    case GemmOp::fwd_gelu: return "linear_gelu_fwd";
    case GemmOp::din: return "linear_bwd (din)";
    case GemmOp::dweight: return "linear_bwd (dweight)";
  }
  return "?";
}

cudaDataType_t cuda_type(DType t) { return t == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F; }

// The largest power of two (up to 256) dividing the address: what cuBLASLt's
// MIN_ALIGNMENT preferences mean. Null pointers count as fully aligned.
uint32_t alignment_of(const void* p) {
  const auto u = reinterpret_cast<uintptr_t>(p);
  if (u == 0) return 256;
  const uintptr_t lowest = u & (~u + 1);
  return lowest >= 256 ? 256u : static_cast<uint32_t>(lowest);
}

// One matmul D = alpha * op(A) @ op(B) + beta * C with C = D, in cuBLASLt's column-major terms.
struct MatmulSpec {
  GemmOp op;
  DType ab, cd;  // operand dtype (A and B), output dtype (C and D)
  cublasOperation_t trans_a, trans_b;
  int64_t m, n, k;
  int64_t lda, ldb, ldd;
  cublasLtEpilogue_t epilogue;
  const void* a;
  const void* b;
  void* d;
  const void* bias = nullptr;  // epilogues with BIAS: m values of dtype cd
  void* aux = nullptr;         // GELU_AUX epilogues: the pre-activation, ld = aux_ld
  int64_t aux_ld = 0;
  float beta = 0.0f;
};

struct PlanKey {
  GemmOp op;
  DType ab, cd;
  uint32_t epilogue;
  int64_t m, n, k;
  uint32_t align_a, align_b, align_d, align_bias, align_aux;
  bool operator==(const PlanKey&) const = default;
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& key) const {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t v) {
      h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    };
    mix(static_cast<uint64_t>(key.op) | (static_cast<uint64_t>(key.ab) << 8) |
        (static_cast<uint64_t>(key.cd) << 16) | (static_cast<uint64_t>(key.epilogue) << 24));
    mix(static_cast<uint64_t>(key.m));
    mix(static_cast<uint64_t>(key.n));
    mix(static_cast<uint64_t>(key.k));
    mix(key.align_a | (static_cast<uint64_t>(key.align_b) << 16) |
        (static_cast<uint64_t>(key.align_d) << 32) |
        (static_cast<uint64_t>(key.align_bias) << 48));
    mix(key.align_aux);
    return static_cast<size_t>(h);
  }
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;  // C shares D's layout
  cublasLtMatmulAlgo_t algo{};
  bool supported = false;  // false: the heuristic had no algorithm for this configuration

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

}  // namespace

struct PlanCache {
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans;
};

namespace {


template <class T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value,
              const char* what) {
  check_cublas(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)), what);
}

template <class T>
void set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
              const T& value, const char* what) {
  check_cublas(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)), what);
}

bool has_bias(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool has_aux(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}

// Sets the per-call pointers of the epilogue on the (cached) descriptor.
void set_epilogue_pointers(cublasLtMatmulDesc_t desc, const MatmulSpec& s) {
  if (has_bias(s.epilogue)) {
    set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, s.bias, "set BIAS_POINTER");
  }
  if (has_aux(s.epilogue)) {
    set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, s.aux, "set EPILOGUE_AUX_POINTER");
  }
}

std::unique_ptr<Plan> build_plan(cublasLtHandle_t handle, const MatmulSpec& s,
                                 const PlanKey& key, size_t workspace_bytes) {
  auto plan = std::make_unique<Plan>();
  check_cublas(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
               "cublasLtMatmulDescCreate");
  const int32_t ta = s.trans_a, tb = s.trans_b;
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, ta, "set TRANSA");
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, tb, "set TRANSB");
  const uint32_t epilogue = s.epilogue;
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue, "set EPILOGUE");
  // The bias vector and the GELU aux matrix default to D's type (BIAS_DATA_TYPE and
  // EPILOGUE_AUX_DATA_TYPE unset), which is what we have: both in the compute dtype.
  if (has_aux(s.epilogue)) {
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, s.aux_ld, "set EPILOGUE_AUX_LD");
  }
  // The heuristic reads the epilogue pointers' values for their alignment.
  set_epilogue_pointers(plan->desc, s);

  const auto rows_a = static_cast<uint64_t>(s.trans_a == CUBLAS_OP_N ? s.m : s.k);
  const auto cols_a = static_cast<uint64_t>(s.trans_a == CUBLAS_OP_N ? s.k : s.m);
  const auto rows_b = static_cast<uint64_t>(s.trans_b == CUBLAS_OP_N ? s.k : s.n);
  const auto cols_b = static_cast<uint64_t>(s.trans_b == CUBLAS_OP_N ? s.n : s.k);
  check_cublas(cublasLtMatrixLayoutCreate(&plan->a, cuda_type(s.ab), rows_a, cols_a, s.lda),
               "cublasLtMatrixLayoutCreate (A)");
  check_cublas(cublasLtMatrixLayoutCreate(&plan->b, cuda_type(s.ab), rows_b, cols_b, s.ldb),
               "cublasLtMatrixLayoutCreate (B)");
  check_cublas(cublasLtMatrixLayoutCreate(&plan->d, cuda_type(s.cd), static_cast<uint64_t>(s.m),
                                          static_cast<uint64_t>(s.n), s.ldd),
               "cublasLtMatrixLayoutCreate (C/D)");

  cublasLtMatmulPreference_t pref = nullptr;
  check_cublas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  struct PrefGuard {
    cublasLtMatmulPreference_t p;
    ~PrefGuard() { cublasLtMatmulPreferenceDestroy(p); }
  } guard{pref};
  const uint64_t ws = workspace_bytes;
  set_pref(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ws, "set MAX_WORKSPACE_BYTES");
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a, "set MIN_ALIGNMENT_A");
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b, "set MIN_ALIGNMENT_B");
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_d, "set MIN_ALIGNMENT_C");
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d, "set MIN_ALIGNMENT_D");
  if (s.ab == DType::f32) {
    // fp32 operands: plain fp32 FMA kernels only (no TF32 / bf16-split tensor-core inputs).
    const uint64_t mask = ~static_cast<uint64_t>(CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_TF32 |
                                                 CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16BF |
                                                 CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16F);
    set_pref(pref, CUBLASLT_MATMUL_PREF_IMPL_MASK, mask, "set IMPL_MASK");
  }

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      handle, plan->desc, plan->a, plan->b, plan->d, plan->d, pref, 1, &result, &found);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found == 0)) {
    plan->supported = false;
    return plan;
  }
  check_cublas(st, "cublasLtMatmulAlgoGetHeuristic");
  if (result.state != CUBLAS_STATUS_SUCCESS || result.workspaceSize > workspace_bytes) {
    plan->supported = false;
    return plan;
  }
  plan->algo = result.algo;
  plan->supported = true;
  return plan;
}

std::string describe_spec(const MatmulSpec& s) {
  return std::string(op_name(s.op)) + ": " + to_string(s.ab) + " operands, " + to_string(s.cd) +
         " output, column-major m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) +
         " k=" + std::to_string(s.k) + ", pointer alignments A " +
         std::to_string(alignment_of(s.a)) + " B " + std::to_string(alignment_of(s.b)) + " D " +
         std::to_string(alignment_of(s.d)) + " bytes";
}

// Runs the matmul through its cached plan. Returns false (running nothing) when cuBLASLt has
// no algorithm for it and `may_fail`; otherwise such a configuration throws.
bool run_matmul(cublasLtHandle_t handle, PlanCache& cache, const MatmulSpec& s,
                void* workspace, size_t workspace_bytes, cudaStream_t stream, bool may_fail) {
  const PlanKey key{s.op,
                    s.ab,
                    s.cd,
                    static_cast<uint32_t>(s.epilogue),
                    s.m,
                    s.n,
                    s.k,
                    alignment_of(s.a),
                    alignment_of(s.b),
                    alignment_of(s.d),
                    has_bias(s.epilogue) ? alignment_of(s.bias) : 0u,
                    has_aux(s.epilogue) ? alignment_of(s.aux) : 0u};
  auto it = cache.plans.find(key);
  if (it == cache.plans.end()) {
    it = cache.plans.emplace(key, build_plan(handle, s, key, workspace_bytes)).first;
  }
  Plan& plan = *it->second;
  if (!plan.supported) {
    if (may_fail) return false;
    throw std::invalid_argument(describe_spec(s) +
                                ": cuBLASLt offers no algorithm for this shape/alignment");
  }
  set_epilogue_pointers(plan.desc, s);
  const float alpha = 1.0f;
  const float beta = s.beta;
  check_cublas(cublasLtMatmul(handle, plan.desc, &alpha, s.a, plan.a, s.b, plan.b, &beta, s.d,
                              plan.d, s.d, plan.d, &plan.algo, workspace, workspace_bytes, stream),
               op_name(s.op));
  return true;
}

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument(what); }

bool is_float(DType t) { return t == DType::f32 || t == DType::bf16; }

// Shapes of a linear layer: weight [O, I], in [N, I] (any leading dims), checked.
struct LinearShape {
  int64_t n, i, o;
};

LinearShape linear_shape(const char* what, Tensor in, Tensor weight) {
  if (weight.ndim != 2) bad(std::string(what) + ": weight must be 2-d [O, I], got " +
                            weight.describe());
  const int64_t o = weight.dim(0), i = weight.dim(1);
  if (o <= 0 || i <= 0) bad(std::string(what) + ": empty weight " + weight.describe());
  const int64_t numel = in.numel();
  if (numel % i != 0) {
    bad(std::string(what) + ": in " + in.describe() + " is not [N, " + std::to_string(i) + "]");
  }
  return {numel / i, i, o};
}

void expect_dtype(const char* what, const char* name, Tensor t, DType want) {
  if (t.dtype != want) {
    bad(std::string(what) + ": " + name + " is " + t.describe() + ", expected " +
        to_string(want));
  }
}

void expect_numel(const char* what, const char* name, Tensor t, int64_t want) {
  if (t.numel() != want) {
    bad(std::string(what) + ": " + name + " " + t.describe() + " should have " +
        std::to_string(want) + " elements");
  }
}

// The checks both forward GEMMs make: in, weight, out (and bias) of one float dtype and
// matching shapes.
LinearShape check_forward(const char* what, Tensor out, Tensor in, Tensor weight, Tensor bias) {
  const LinearShape sh = linear_shape(what, in, weight);
  const DType t = in.dtype;
  if (!is_float(t)) bad(std::string(what) + ": in must be f32 or bf16, got " + in.describe());
  expect_dtype(what, "weight", weight, t);
  expect_dtype(what, "out", out, t);
  expect_numel(what, "out", out, sh.n * sh.o);
  if (!bias.empty()) {
    expect_dtype(what, "bias", bias, t);
    expect_numel(what, "bias", bias, sh.o);
  }
  return sh;
}

// out[N,O] = in[N,I] @ weight[O,I]^T in cuBLASLt's column-major terms: D [O,N] (ld O) =
// op_T(weight as [I,O], ld I) x in as [I,N] (ld I); the epilogue adds bias (and GELU).
MatmulSpec forward_spec(GemmOp op, const LinearShape& sh, Tensor out, Tensor in, Tensor weight,
                        Tensor bias, cublasLtEpilogue_t epilogue) {
  MatmulSpec s{};
  s.op = op;
  s.ab = in.dtype;
  s.cd = in.dtype;
  s.trans_a = CUBLAS_OP_T;
  s.trans_b = CUBLAS_OP_N;
  s.m = sh.o;
  s.n = sh.n;
  s.k = sh.i;
  s.lda = sh.i;
  s.ldb = sh.i;
  s.ldd = sh.o;
  s.epilogue = epilogue;
  s.a = weight.data;
  s.b = in.data;
  s.d = out.data;
  s.bias = bias.data;
  s.beta = 0.0f;
  return s;
}

}  // namespace

Gemm::Gemm(void* workspace, size_t workspace_bytes)
    : workspace_(workspace), workspace_bytes_(workspace_bytes) {
  check_cublas(cublasLtCreate(&handle_), "cublasLtCreate");
  plans_ = std::make_unique<PlanCache>();
  plans_->plans.reserve(64);
}

Gemm::~Gemm() {
  plans_.reset();  // the plans (descriptors, layouts) go before the handle
  if (handle_) cublasLtDestroy(handle_);
}

void Gemm::linear_fwd(cudaStream_t stream, Tensor out, Tensor in, Tensor weight, Tensor bias) {
  const LinearShape sh = check_forward("linear_fwd", out, in, weight, bias);
  if (sh.n == 0) return;
  const MatmulSpec s = forward_spec(GemmOp::fwd, sh, out, in, weight, bias,
                                    bias.empty() ? CUBLASLT_EPILOGUE_DEFAULT : CUBLASLT_EPILOGUE_BIAS);
  run_matmul(handle_, *plans_, s, workspace_, workspace_bytes_, stream, false);
}

void Gemm::linear_gelu_fwd(cudaStream_t stream, Tensor out, Tensor pre, Tensor in, Tensor weight,
                           Tensor bias) {
  constexpr const char* what = "linear_gelu_fwd";
  const LinearShape sh = check_forward(what, out, in, weight, bias);
  expect_dtype(what, "pre", pre, in.dtype);
  expect_numel(what, "pre", pre, sh.n * sh.o);
  if (sh.n == 0) return;
  const DType t = in.dtype;
  const bool fuse = (t == DType::bf16 ? kFuseGeluBf16 : kFuseGeluF32) && sh.o % 8 == 0;
  if (fuse) {
    MatmulSpec s = forward_spec(GemmOp::fwd_gelu, sh, out, in, weight, bias,
                                bias.empty() ? CUBLASLT_EPILOGUE_GELU_AUX
                                             : CUBLASLT_EPILOGUE_GELU_AUX_BIAS);
    s.aux = pre.data;
    s.aux_ld = sh.o;  // pre is [N, O] row-major: column-major [O, N] with ld O, like D
    if (run_matmul(handle_, *plans_, s, workspace_, workspace_bytes_, stream, true)) {
      return;
    }
  }
  // Unfused: pre = in @ weight^T + bias (BIAS epilogue), out = gelu(pre) (tanh GELU kernel).
  linear_fwd(stream, pre, in, weight, bias);
  gelu_fwd(stream, out, pre);
}

void Gemm::linear_bwd(cudaStream_t stream, Tensor din, Tensor dweight, Tensor dbias, Tensor dout,
                      Tensor in, Tensor weight) {
  constexpr const char* what = "linear_bwd";
  const LinearShape sh = linear_shape(what, in, weight);
  const DType t = in.dtype;
  if (!is_float(t)) bad(std::string(what) + ": in must be f32 or bf16, got " + in.describe());
  expect_dtype(what, "weight", weight, t);
  expect_dtype(what, "dout", dout, t);
  expect_numel(what, "dout", dout, sh.n * sh.o);
  if (!dweight.empty()) {  // empty: a frozen weight (LoRA's base)
    expect_dtype(what, "dweight (main grad)", dweight, DType::f32);
    expect_numel(what, "dweight", dweight, sh.o * sh.i);
  }
  if (!din.empty()) {
    expect_dtype(what, "din", din, t);
    expect_numel(what, "din", din, sh.n * sh.i);
  }
  if (!dbias.empty()) {
    expect_dtype(what, "dbias (main grad)", dbias, DType::f32);
    expect_numel(what, "dbias", dbias, sh.o);
  }
  if (sh.n == 0) {
    if (!din.empty()) fill(stream, din, 0.0f);
    return;
  }
  PlanCache& cache = *plans_;
  if (!din.empty()) {
    MatmulSpec s{};
    s.op = GemmOp::din;
    s.ab = t;
    s.cd = t;
    s.trans_a = CUBLAS_OP_N;
    s.trans_b = CUBLAS_OP_N;
    s.m = sh.i;
    s.n = sh.n;
    s.k = sh.o;
    s.lda = sh.i;
    s.ldb = sh.o;
    s.ldd = sh.i;
    s.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    s.a = weight.data;
    s.b = dout.data;
    s.d = din.data;
    s.beta = 0.0f;
    run_matmul(handle_, cache, s, workspace_, workspace_bytes_, stream, false);
  }
  if (!dweight.empty()) {
    MatmulSpec s{};
    s.op = GemmOp::dweight;
    s.ab = t;
    s.cd = DType::f32;
    s.trans_a = CUBLAS_OP_N;
    s.trans_b = CUBLAS_OP_T;
    s.m = sh.i;
    s.n = sh.o;
    s.k = sh.n;
    s.lda = sh.i;
    s.ldb = sh.o;
    s.ldd = sh.i;
    s.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    s.a = in.data;
    s.b = dout.data;
    s.d = dweight.data;
    s.beta = 1.0f;
    run_matmul(handle_, cache, s, workspace_, workspace_bytes_, stream, false);
  }
  if (!dbias.empty()) add_column_sums(stream, dbias, dout);
}

}  // namespace jumbo::cuda
