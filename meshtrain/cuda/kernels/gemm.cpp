// cuBLASLt calls: one handle per device, descriptors per call, the chosen algorithm cached per
// problem (the heuristic query costs more than a small product).
#include "meshtrain/cuda/kernels/gemm.h"

#include <cublasLt.h>

#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>

#include "meshtrain/cuda/caching_allocator.h"
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/device.h"
#include "meshtrain/cuda/kernels/cast.h"
#include "meshtrain/cuda/kernels/elementwise.h"
#include "meshtrain/cuda/kernels/gelu.h"

namespace meshtrain::cuda {
namespace {

[[noreturn]] void throw_cublas_error(cublasStatus_t st, const char* call, int line) {
  throw CudaError(
      ::meshtrain::detail::str_cat(call, " failed: ", cublasLtGetStatusName(st), " (",
                                   cublasLtGetStatusString(st), ") at ", __FILE__, ":", line),
      static_cast<int>(st));
}

#define MT_CUBLAS_CHECK(call)                                \
  do {                                                       \
    const cublasStatus_t mt_cublas_st_ = (call);             \
    if (mt_cublas_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]] \
      throw_cublas_error(mt_cublas_st_, #call, __LINE__);    \
  } while (0)

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // what Hopper kernels ask for at most
constexpr int kMaxDevices = 64;

std::atomic<bool> g_allow_tf32{false};
std::atomic<bool> g_fused_epilogues{true};

struct HandleDeleter {
  void operator()(cublasLtContext* h) const { (void)cublasLtDestroy(h); }
};
struct OpDescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const { (void)cublasLtMatmulDescDestroy(d); }
};
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayoutOpaque_t* d) const { (void)cublasLtMatrixLayoutDestroy(d); }
};
struct PrefDeleter {
  void operator()(cublasLtMatmulPreferenceOpaque_t* d) const {
    (void)cublasLtMatmulPreferenceDestroy(d);
  }
};
using OpDesc = std::unique_ptr<cublasLtMatmulDescOpaque_t, OpDescDeleter>;
using Layout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LayoutDeleter>;
using Pref = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, PrefDeleter>;

cublasLtHandle_t handle_for(int device) {
  static std::array<std::unique_ptr<cublasLtContext, HandleDeleter>, kMaxDevices> handles;
  static std::mutex mu;
  MT_CHECK(device >= 0 && device < kMaxDevices, "cuda:", device, " out of range");
  std::lock_guard lock(mu);
  auto& h = handles[static_cast<size_t>(device)];
  if (!h) {
    cublasLtHandle_t raw = nullptr;
    MT_CUBLAS_CHECK(cublasLtCreate(&raw));
    h.reset(raw);
  }
  return h.get();
}

cudaDataType_t data_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    default:
      MT_THROW(ValueError, "cuda matmul supports f32, bf16 and f16, not ", dtype_name(t));
  }
}

// The largest power of two (up to 256) dividing the address: cuBLASLt assumes 256-byte aligned
// operands unless told otherwise, and views into storage (slices, packed qkv) are often not.
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

template <typename T>
void set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v) {
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
}

template <typename T>
void set_layout_attr(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, const T& v) {
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, attr, &v, sizeof(v)));
}

Layout make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                   int64_t stride) {
  cublasLtMatrixLayout_t raw = nullptr;
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&raw, type, static_cast<uint64_t>(rows),
                                             static_cast<uint64_t>(cols), ld));
  Layout l(raw);
  if (batch > 1) {
    set_layout_attr(raw, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, static_cast<int32_t>(batch));
    set_layout_attr(raw, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, stride);
  }
  return l;
}

// What the product does where it writes its output (cuBLASLt's epilogue).
enum class EpilogueKind : int {
  kNone,
  kBias,         // + bias[N] on every row
  kBiasGrad,     // bias_grad[M] = the sums over K of op(a) (BGRADB: op(a) is cuBLAS's B)
  kGeluAuxBias,  // aux = product + bias, out = gelu(product + bias)
  kDGelu,        // out = gelu'(aux) * product (+ bias_grad[N] = out's column sums)
};

struct Epilogue {
  EpilogueKind kind = EpilogueKind::kNone;
  const void* bias = nullptr;
  void* bias_grad = nullptr;
  void* aux = nullptr;  // the GELU input, [M, N] in the output's type, ld N
};

cublasLtEpilogue_t cublas_epilogue(const Epilogue& e) {
  switch (e.kind) {
    case EpilogueKind::kNone:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case EpilogueKind::kBias:
      return CUBLASLT_EPILOGUE_BIAS;
    case EpilogueKind::kBiasGrad:
      return CUBLASLT_EPILOGUE_BGRADB;
    case EpilogueKind::kGeluAuxBias:
      return e.bias != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    case EpilogueKind::kDGelu:
      return e.bias_grad != nullptr ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// No epilogue, or a bias of the output's type, must have a kernel; the rest have a way round.
bool has_way_round(const Epilogue& e, DType dtype, const GemmShape& s) {
  if (e.kind == EpilogueKind::kBias) return s.f32_bias && !s.f32_out && dtype != DType::f32;
  return e.kind != EpilogueKind::kNone;
}

std::mutex g_fallback_mu;
std::set<std::string> g_fallbacks;

// Which fused forms took their way round, for a benchmark to report.
void note_fallback(const Epilogue& e, DType dtype, const GemmShape& s) {
  const char* name = "bias";
  switch (e.kind) {
    case EpilogueKind::kBiasGrad:
      name = "bias gradient";
      break;
    case EpilogueKind::kGeluAuxBias:
      name = e.bias != nullptr ? "gelu with bias" : "gelu";
      break;
    case EpilogueKind::kDGelu:
      name = e.bias_grad != nullptr ? "gelu gradient with bias gradient" : "gelu gradient";
      break;
    default:
      break;
  }
  std::string what = ::meshtrain::detail::str_cat(
      name,
      s.f32_bias && e.kind != EpilogueKind::kDGelu && e.kind != EpilogueKind::kNone ? " (f32)" : "",
      " on ", dtype_name(dtype), s.f32_out ? " with f32 output" : "",
      s.trans_a ? ", a transposed" : "", s.trans_b ? ", b transposed" : "");
  std::lock_guard lock(g_fallback_mu);
  g_fallbacks.insert(std::move(what));
}

// Everything the heuristic's choice depends on.
using AlgoKey =
    std::tuple<int, int, int64_t, int64_t, int64_t, bool, bool, int64_t, int64_t, int64_t, int64_t,
               int, bool, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, bool, bool>;

// One cuBLASLt call with the epilogue `e`. Returns false, having run nothing, where the heuristic
// has no algorithm for an epilogue other than a plain bias on an output of the operands' type
// (the callers of those have a way round); throws for the rest.
bool try_matmul(void* out, const void* a, const void* b, const Epilogue& e, DType dtype,
                const GemmShape& s, float alpha, float beta, cudaStream_t stream, const void* c) {
  const cudaDataType_t type = data_type(dtype);
  MT_CHECK(!s.f32_out || dtype != DType::f32, "cuda matmul: f32_out is for bf16/f16 operands");
  const cudaDataType_t out_type = s.f32_out ? CUDA_R_32F : type;
  const int device = current_device();
  const cublasLtHandle_t handle = handle_for(device);
  const bool tf32 = dtype == DType::f32 && allow_tf32();

  cublasLtMatmulDesc_t op_raw = nullptr;
  MT_CUBLAS_CHECK(cublasLtMatmulDescCreate(
      &op_raw, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F));
  OpDesc op(op_raw);
  // cuBLAS's A is our b, its B our a (see gemm.h).
  const cublasOperation_t ta = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_attr(op_raw, CUBLASLT_MATMUL_DESC_TRANSA, ta);
  set_attr(op_raw, CUBLASLT_MATMUL_DESC_TRANSB, tb);
  const bool f32_bias = s.f32_bias && e.kind != EpilogueKind::kNone;
  // The bias, or the bias gradient written: one pointer attribute for both.
  const void* vector = e.bias_grad != nullptr ? e.bias_grad : e.bias;
  if (e.kind != EpilogueKind::kNone) {
    set_attr(op_raw, CUBLASLT_MATMUL_DESC_EPILOGUE, cublas_epilogue(e));
    if (vector != nullptr) {
      set_attr(op_raw, CUBLASLT_MATMUL_DESC_BIAS_POINTER, vector);
      set_attr(op_raw, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, f32_bias ? CUDA_R_32F : out_type);
    }
    if (e.aux != nullptr) {
      set_attr(op_raw, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, e.aux);
      set_attr(op_raw, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, s.N);
    }
  }
  // Stored (pre-op) shapes in column-major terms: b is [N, K] col-major with ld N (or [K, N]
  // with ld K when transposed); a is [K, M] with ld K (or [M, K] with ld M); out is [N, M].
  const Layout la = s.trans_b ? make_layout(type, s.K, s.N, s.K, s.batch, s.stride_b)
                              : make_layout(type, s.N, s.K, s.N, s.batch, s.stride_b);
  const Layout lb = s.trans_a ? make_layout(type, s.M, s.K, s.M, s.batch, s.stride_a)
                              : make_layout(type, s.K, s.M, s.K, s.batch, s.stride_a);
  const Layout lc = make_layout(out_type, s.N, s.M, s.N, s.batch, s.stride_out);

  const void* cin = c != nullptr ? c : out;
  const uint32_t al_a = alignment(b), al_b = alignment(a), al_c = alignment(cin),
                 al_d = alignment(out), al_bias = vector != nullptr ? alignment(vector) : 256,
                 al_aux = e.aux != nullptr ? alignment(e.aux) : 256;
  const AlgoKey key{device,       static_cast<int>(dtype),
                    s.M,          s.N,
                    s.K,          s.trans_a,
                    s.trans_b,    s.batch,
                    s.stride_a,   s.stride_b,
                    s.stride_out, static_cast<int>(cublas_epilogue(e)),
                    tf32,         al_a,
                    al_b,         al_c,
                    al_d,         al_bias,
                    al_aux,       s.f32_out,
                    f32_bias};
  static std::mutex cache_mu;
  // nullopt: no algorithm (only kept for the epilogues with a way round).
  static std::map<AlgoKey, std::optional<cublasLtMatmulAlgo_t>> cache;
  std::optional<cublasLtMatmulAlgo_t> algo;
  bool cached = false;
  {
    std::lock_guard lock(cache_mu);
    auto it = cache.find(key);
    if (it != cache.end()) {
      algo = it->second;
      cached = true;
    }
  }
  if (!cached) {
    cublasLtMatmulPreference_t pref_raw = nullptr;
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref_raw));
    Pref pref(pref_raw);
    const uint64_t ws = kWorkspaceBytes;
    auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, auto v) {
      MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref_raw, attr, &v, sizeof(v)));
    };
    set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ws);
    set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al_a);
    set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al_b);
    set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al_c);
    set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al_d);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
        handle, op_raw, la.get(), lb.get(), lc.get(), lc.get(), pref_raw, 1, &result, &found);
    // The preferences state no alignment for the epilogue's vector or aux array, so nothing keeps
    // the search from a kernel that assumes 16 bytes for them (a misaligned-address fault loses
    // the context): an epilogue with a way round takes it for under-aligned ones (views; fresh
    // tensors are 256-byte aligned).
    const bool epilogue_aligned = al_bias >= 16 && al_aux >= 16;
    if (!has_way_round(e, dtype, s) ||
        (epilogue_aligned && st == CUBLAS_STATUS_SUCCESS && found > 0)) {
      MT_CUBLAS_CHECK(st);
      MT_CHECK(found > 0, "cuBLASLt has no algorithm for ", dtype_name(dtype), " M=", s.M,
               " N=", s.N, " K=", s.K, " batch=", s.batch,
               e.kind == EpilogueKind::kBias ? " with bias" : "");
      algo = result.algo;
    }
    std::lock_guard lock(cache_mu);
    cache.emplace(key, algo);
  }
  if (!algo) {
    note_fallback(e, dtype, s);
    return false;
  }

  const StreamScratch workspace(device, kWorkspaceBytes, stream);
  const cublasStatus_t st =
      cublasLtMatmul(handle, op_raw, &alpha, b, la.get(), a, lb.get(), &beta, cin, lc.get(), out,
                     lc.get(), &*algo, workspace.get(), kWorkspaceBytes, stream);
  // An epilogue the heuristic offered but the call refuses (an unsupported combination of types
  // it did not check) takes its way round from now on; nothing was written.
  if ((st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) &&
      has_way_round(e, dtype, s)) {
    std::lock_guard lock(cache_mu);
    cache[key] = std::nullopt;
    note_fallback(e, dtype, s);
    return false;
  }
  MT_CUBLAS_CHECK(st);
  return true;
}

void check_shape(const GemmShape& s) {
  MT_CHECK(s.M >= 0 && s.N >= 0 && s.K >= 0 && s.batch >= 1, "cuda matmul: bad shape M=", s.M,
           " N=", s.N, " K=", s.K, " batch=", s.batch);
}

// An f32 bias on a half output where cuBLASLt has no kernel for it: the f32 product with its
// bias, then one rounding, the values the fused epilogue gives.
void half_output_through_f32(void* out, const void* a, const void* b, const void* bias, DType dtype,
                             const GemmShape& s, float alpha, float beta, cudaStream_t stream) {
  MT_CHECK(s.batch == 1 && beta == 0.0f,
           "cuda matmul: an f32 bias on a half output is for single products written afresh");
  GemmShape f = s;
  f.f32_out = true;
  f.f32_bias = false;
  const int64_t n = s.M * s.N;
  const StreamScratch tmp(static_cast<size_t>(n) * sizeof(float), stream);
  matmul(tmp.get(), a, b, bias, dtype, f, alpha, 0.0f, stream);
  cast(out, dtype, tmp.get(), DType::f32, n, stream);
}

}  // namespace

void set_allow_tf32(bool allow) {
  g_allow_tf32 = allow;
}

bool allow_tf32() {
  return g_allow_tf32;
}

void set_fused_epilogues(bool fused) {
  g_fused_epilogues = fused;
}

bool fused_epilogues() {
  return g_fused_epilogues;
}

void matmul(void* out, const void* a, const void* b, const void* bias, DType dtype,
            const GemmShape& s, float alpha, float beta, cudaStream_t stream, const void* c) {
  check_shape(s);
  if (s.M == 0 || s.N == 0) return;
  if (s.K == 0) {
    // An empty sum: cuBLAS may leave the output unwritten (and a leading dimension of 0 is not
    // a valid layout), where the CPU's gemm writes beta * C. The same product over one zero row
    // and column gives 0 plus what the epilogue adds: beta * C and the bias.
    GemmShape z = s;
    z.K = 1;
    z.stride_a = s.stride_a != 0 ? s.M : 0;
    z.stride_b = s.stride_b != 0 ? s.N : 0;
    const size_t elem = dtype_size(dtype);
    const size_t a_bytes = static_cast<size_t>((z.stride_a != 0 ? s.batch : 1) * s.M) * elem;
    const size_t b_bytes = static_cast<size_t>((z.stride_b != 0 ? s.batch : 1) * s.N) * elem;
    const size_t b_at = (a_bytes + 255) / 256 * 256;
    const StreamScratch zeros(b_at + b_bytes, stream);
    MT_CUDA_CHECK(cudaMemsetAsync(zeros.get(), 0, zeros.size(), stream));
    return matmul(out, zeros.get(), zeros.as<unsigned char>() + b_at, bias, dtype, z, alpha, beta,
                  stream, c);
  }
  Epilogue e;
  if (bias != nullptr) {
    e.kind = EpilogueKind::kBias;
    e.bias = bias;
  }
  if (!try_matmul(out, a, b, e, dtype, s, alpha, beta, stream, c))
    half_output_through_f32(out, a, b, bias, dtype, s, alpha, beta, stream);
}

void matmul_bias_grad(void* out, float* dbias, const void* a, const void* b, DType dtype,
                      const GemmShape& s, cudaStream_t stream) {
  check_shape(s);
  MT_CHECK(s.trans_a && s.batch == 1 && (dtype == DType::f32 || s.f32_out),
           "cuda matmul_bias_grad: one f32-output product of a transposed a (a weight gradient)");
  if (s.M == 0) return;
  if (dbias == nullptr) return matmul(out, a, b, nullptr, dtype, s, 1.0f, 0.0f, stream);
  Epilogue e;
  e.kind = EpilogueKind::kBiasGrad;
  e.bias_grad = dbias;
  GemmShape f = s;
  f.f32_bias = true;
  if (s.N > 0 && s.K > 0 && fused_epilogues() &&
      try_matmul(out, a, b, e, dtype, f, 1.0f, 0.0f, stream, nullptr))
    return;
  matmul(out, a, b, nullptr, dtype, s, 1.0f, 0.0f, stream);
  column_sums(dbias, a, dtype, s.K, s.M, stream);
}

std::vector<std::string> epilogue_fallbacks() {
  std::lock_guard lock(g_fallback_mu);
  return {g_fallbacks.begin(), g_fallbacks.end()};
}

void matmul_gelu(void* out, void* pre, const void* a, const void* b, const float* bias, DType dtype,
                 const GemmShape& s, cudaStream_t stream) {
  check_shape(s);
  MT_CHECK(s.batch == 1 && !s.f32_out && dtype != DType::f32,
           "cuda matmul_gelu: one product of half operands into half outputs");
  if (s.M == 0 || s.N == 0) return;
  Epilogue e;
  e.kind = EpilogueKind::kGeluAuxBias;
  e.bias = bias;
  e.aux = pre;
  GemmShape f = s;
  f.f32_bias = true;
  if (s.K > 0 && fused_epilogues() &&
      try_matmul(out, a, b, e, dtype, f, 1.0f, 0.0f, stream, nullptr))
    return;
  // The f32 sum with its bias, then GELU of it and its rounded copy in one pass.
  f.f32_out = true;
  const int64_t n = s.M * s.N;
  const StreamScratch tmp(static_cast<size_t>(n) * sizeof(float), stream);
  matmul(tmp.get(), a, b, bias, dtype, f, 1.0f, 0.0f, stream);
  gelu_forward_keep(out, dtype, pre, tmp.as<float>(), dtype, n, stream);
}

void matmul_dgelu(void* out, float* dbias, const void* a, const void* b, const void* pre,
                  DType dtype, const GemmShape& s, cudaStream_t stream) {
  check_shape(s);
  MT_CHECK(s.batch == 1 && !s.f32_out && dtype != DType::f32,
           "cuda matmul_dgelu: one product of half operands into a half output");
  if (s.M == 0 || s.N == 0) return;
  const int64_t n = s.M * s.N;
  auto bias_from_out = [&] { column_sums(dbias, out, dtype, s.M, s.N, stream); };
  if (s.K > 0 && fused_epilogues()) {
    Epilogue e;
    e.kind = EpilogueKind::kDGelu;
    e.aux = const_cast<void*>(pre);  // read: the pointer attribute is one for both directions
    GemmShape f = s;
    f.f32_bias = true;
    if (dbias != nullptr) {
      e.bias_grad = dbias;
      if (try_matmul(out, a, b, e, dtype, f, 1.0f, 0.0f, stream, nullptr)) return;
      e.bias_grad = nullptr;
    }
    if (try_matmul(out, a, b, e, dtype, f, 1.0f, 0.0f, stream, nullptr)) {
      if (dbias != nullptr) bias_from_out();
      return;
    }
  }
  GemmShape f = s;
  f.f32_out = true;
  const StreamScratch tmp(static_cast<size_t>(n) * sizeof(float), stream);
  matmul(tmp.get(), a, b, nullptr, dtype, f, 1.0f, 0.0f, stream);
  gelu_backward(out, dtype, pre, dtype, tmp.get(), DType::f32, n, stream);
  if (dbias != nullptr) bias_from_out();
}

void linear_forward(void* out, const void* inp, const void* weight, const void* bias, DType dtype,
                    int64_t BT, int64_t C_in, int64_t C_out, cudaStream_t stream,
                    const void* residual) {
  matmul(out, inp, weight, bias, dtype, gemm_shape(BT, C_out, C_in, false, true), 1.0f,
         residual != nullptr ? 1.0f : 0.0f, stream, residual);
}

void linear_backward(void* dinp, void* dweight, float* dbias, const void* dout, const void* inp,
                     const void* weight, DType dtype, int64_t BT, int64_t C_in, int64_t C_out,
                     cudaStream_t stream) {
  if (dinp != nullptr) {
    // dinp[BT, C_in] += dout[BT, C_out] @ weight[C_out, C_in]
    matmul(dinp, dout, weight, nullptr, dtype, gemm_shape(BT, C_in, C_out), 1.0f, 1.0f, stream);
  }
  if (dweight != nullptr) {
    // dweight[C_out, C_in] += dout^T[C_out, BT] @ inp[BT, C_in]
    matmul(dweight, dout, inp, nullptr, dtype, gemm_shape(C_out, C_in, BT, true), 1.0f, 1.0f,
           stream);
  }
  if (dbias != nullptr) {
    MT_CHECK(dtype == DType::f32, "cuda linear_backward: dbias needs f32 dout, got ",
             dtype_name(dtype));
    column_sum_accumulate(dbias, static_cast<const float*>(dout), BT, C_out, stream);
  }
}

}  // namespace meshtrain::cuda
