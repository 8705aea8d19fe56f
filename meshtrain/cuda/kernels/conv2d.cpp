// See conv2d.h. One cuDNN handle per device and host thread (a handle must not be used by two
// threads at once), descriptors per call (cheap next to a convolution), the algorithms of each
// shape and direction ranked once from cuDNN's heuristics and remembered with the one that ran.
// libcudnn is loaded when the first convolution runs on a device, not linked: our programs start on
// a GPU host without it, and only a convolution there says it is missing.
#include "meshtrain/cuda/kernels/conv2d.h"

#include <cudnn.h>
#include <dlfcn.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "meshtrain/cuda/caching_allocator.h"
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/device.h"
#include "meshtrain/cuda/kernels/algorithm_rank.h"
#include "meshtrain/cuda/kernels/gemm.h"
#include "meshtrain/util/error.h"

namespace meshtrain::cuda {
namespace {

// clang-format off
#define MT_CUDNN_FNS(X) \
  X(cudnnAddTensor) \
  X(cudnnConvolutionBackwardBias) \
  X(cudnnConvolutionBackwardData) \
  X(cudnnConvolutionBackwardFilter) \
  X(cudnnConvolutionForward) \
  X(cudnnCreate) \
  X(cudnnCreateConvolutionDescriptor) \
  X(cudnnCreateFilterDescriptor) \
  X(cudnnCreateTensorDescriptor) \
  X(cudnnDestroy) \
  X(cudnnDestroyConvolutionDescriptor) \
  X(cudnnDestroyFilterDescriptor) \
  X(cudnnDestroyTensorDescriptor) \
  X(cudnnGetConvolutionBackwardDataAlgorithm_v7) \
  X(cudnnGetConvolutionBackwardDataWorkspaceSize) \
  X(cudnnGetConvolutionBackwardFilterAlgorithm_v7) \
  X(cudnnGetConvolutionBackwardFilterWorkspaceSize) \
  X(cudnnGetConvolutionForwardAlgorithm_v7) \
  X(cudnnGetConvolutionForwardWorkspaceSize) \
  X(cudnnGetErrorString) \
  X(cudnnGetVersion) \
  X(cudnnSetConvolution2dDescriptor) \
  X(cudnnSetConvolutionGroupCount) \
  X(cudnnSetConvolutionMathType) \
  X(cudnnSetFilter4dDescriptor) \
  X(cudnnSetStream) \
  X(cudnnSetTensor4dDescriptor)
// clang-format on

// cuDNN's entry points, looked up in libcudnn.so.9 on first use.
struct CudnnLib {
#define MT_CUDNN_FN(f) decltype(&::f) f = nullptr;
  MT_CUDNN_FNS(MT_CUDNN_FN)
#undef MT_CUDNN_FN
};

const CudnnLib& lib() {
  static const CudnnLib loaded = [] {
    // Kept open for the process once every entry point is found (the pointers live in it); closed
    // again when one is missing, so that a retry does not stack references.
    void* h = ::dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
    if (h == nullptr)
      MT_THROW(Error,
               "conv2d on a cuda tensor needs cuDNN 9 (libcudnn.so.9), which this host's "
               "loader cannot find (",
               ::dlerror(),
               "); install it, or add its folder (e.g. PyTorch's "
               "nvidia/cudnn/lib) to LD_LIBRARY_PATH");
    std::unique_ptr<void, int (*)(void*)> open(h, ::dlclose);
    CudnnLib l;
#define MT_CUDNN_FN(f)                                    \
  l.f = reinterpret_cast<decltype(&::f)>(::dlsym(h, #f)); \
  if (l.f == nullptr)                                     \
    MT_THROW(Error, "libcudnn.so.9 has no ", #f,          \
             "; this program needs cuDNN 9 with its "     \
             "legacy convolution API");
    MT_CUDNN_FNS(MT_CUDNN_FN)
#undef MT_CUDNN_FN
    (void)open.release();
    return l;
  }();
  return loaded;
}

[[noreturn]] void throw_cudnn_error(cudnnStatus_t st, const char* call, int line) {
  MT_THROW(Error, "cuDNN error ", lib().cudnnGetErrorString(st), " (", static_cast<int>(st),
           ") in ", call, " at conv2d.cpp:", line);
}

#define MT_CUDNN_CHECK(call)                               \
  do {                                                     \
    const cudnnStatus_t mt_cudnn_st_ = (call);             \
    if (mt_cudnn_st_ != CUDNN_STATUS_SUCCESS) [[unlikely]] \
      throw_cudnn_error(mt_cudnn_st_, #call, __LINE__);    \
  } while (0)

struct HandleDeleter {
  void operator()(cudnnContext* h) const { (void)lib().cudnnDestroy(h); }
};

cudnnHandle_t handle_for(int device, cudaStream_t stream) {
  thread_local std::map<int, std::unique_ptr<cudnnContext, HandleDeleter>> handles;
  auto& h = handles[device];
  if (!h) {
    cudnnHandle_t raw = nullptr;
    MT_CUDNN_CHECK(lib().cudnnCreate(&raw));
    h.reset(raw);
  }
  MT_CUDNN_CHECK(lib().cudnnSetStream(h.get(), stream));
  return h.get();
}

struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc(int64_t n, int64_t c, int64_t h, int64_t w) {
    MT_CUDNN_CHECK(lib().cudnnCreateTensorDescriptor(&d));
    MT_CUDNN_CHECK(lib().cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
                                                    static_cast<int>(n), static_cast<int>(c),
                                                    static_cast<int>(h), static_cast<int>(w)));
  }
  ~TensorDesc() { (void)lib().cudnnDestroyTensorDescriptor(d); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
};

struct FilterDesc {
  cudnnFilterDescriptor_t d = nullptr;
  explicit FilterDesc(const cpu::Conv2dShape& s) {
    MT_CUDNN_CHECK(lib().cudnnCreateFilterDescriptor(&d));
    MT_CUDNN_CHECK(lib().cudnnSetFilter4dDescriptor(
        d, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, static_cast<int>(s.C_out),
        static_cast<int>(s.C_in / s.groups), static_cast<int>(s.KH), static_cast<int>(s.KW)));
  }
  ~FilterDesc() { (void)lib().cudnnDestroyFilterDescriptor(d); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
};

struct ConvDesc {
  cudnnConvolutionDescriptor_t d = nullptr;
  explicit ConvDesc(const cpu::Conv2dShape& s) {
    MT_CUDNN_CHECK(lib().cudnnCreateConvolutionDescriptor(&d));
    // PyTorch's convolution is cuDNN's cross-correlation.
    MT_CUDNN_CHECK(lib().cudnnSetConvolution2dDescriptor(
        d, static_cast<int>(s.pad_h), static_cast<int>(s.pad_w), static_cast<int>(s.stride_h),
        static_cast<int>(s.stride_w), static_cast<int>(s.dil_h), static_cast<int>(s.dil_w),
        CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    MT_CUDNN_CHECK(lib().cudnnSetConvolutionGroupCount(d, static_cast<int>(s.groups)));
    MT_CUDNN_CHECK(
        lib().cudnnSetConvolutionMathType(d, allow_tf32() ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
  }
  ~ConvDesc() { (void)lib().cudnnDestroyConvolutionDescriptor(d); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
};

// The descriptors of one call.
struct Descs {
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
  explicit Descs(const cpu::Conv2dShape& s)
      : x(s.N, s.C_in, s.H, s.W), y(s.N, s.C_out, s.out_h(), s.out_w()), w(s), conv(s) {}
};

enum class Direction { forward, backward_data, backward_filter };

// What cuDNN's heuristics say of each algorithm, for algorithm_rank.h.
template <typename Perf>
std::vector<AlgorithmTraits> traits_of(const std::vector<Perf>& perf, int found) {
  std::vector<AlgorithmTraits> t;
  for (int i = 0; i < found; ++i) {
    const Perf& p = perf[static_cast<size_t>(i)];
    t.push_back({static_cast<int>(p.algo), p.status == CUDNN_STATUS_SUCCESS,
                 p.determinism == CUDNN_DETERMINISTIC,
                 p.mathType == CUDNN_FMA_MATH || p.mathType == CUDNN_DEFAULT_MATH});
  }
  return t;
}

// The algorithms a shape may run in one direction and math mode, best first
// (algorithm_rank.h), each with the workspace it asks; `first` is the one that ran last time
// (earlier ones that could not run are not tried again).
struct Candidate {
  int algo = 0;
  size_t workspace = 0;
};
struct Choice {
  std::vector<Candidate> ranked;
  size_t first = 0;
};
using ChoiceKey = std::tuple<int, cpu::Conv2dShape, int, bool>;

std::mutex g_choice_mu;
std::map<ChoiceKey, Choice> g_choices;

Choice choose(cudnnHandle_t h, const Descs& d, const ChoiceKey& key, Direction dir) {
  {
    const std::lock_guard<std::mutex> lock(g_choice_mu);
    if (auto it = g_choices.find(key); it != g_choices.end()) return it->second;
  }
  // Per direction: what the heuristics say, and how to ask the workspace of one algorithm.
  std::vector<AlgorithmTraits> traits;
  std::function<cudnnStatus_t(int, size_t*)> workspace_of;
  int found = 0;
  if (dir == Direction::forward) {
    std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
    MT_CUDNN_CHECK(lib().cudnnGetConvolutionForwardAlgorithm_v7(
        h, d.x.d, d.w.d, d.conv.d, d.y.d, static_cast<int>(perf.size()), &found, perf.data()));
    traits = traits_of(perf, found);
    workspace_of = [&](int algo, size_t* bytes) {
      return lib().cudnnGetConvolutionForwardWorkspaceSize(
          h, d.x.d, d.w.d, d.conv.d, d.y.d, static_cast<cudnnConvolutionFwdAlgo_t>(algo), bytes);
    };
  } else if (dir == Direction::backward_data) {
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT);
    MT_CUDNN_CHECK(lib().cudnnGetConvolutionBackwardDataAlgorithm_v7(
        h, d.w.d, d.y.d, d.conv.d, d.x.d, static_cast<int>(perf.size()), &found, perf.data()));
    traits = traits_of(perf, found);
    workspace_of = [&](int algo, size_t* bytes) {
      return lib().cudnnGetConvolutionBackwardDataWorkspaceSize(
          h, d.w.d, d.y.d, d.conv.d, d.x.d, static_cast<cudnnConvolutionBwdDataAlgo_t>(algo),
          bytes);
    };
  } else {
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT);
    MT_CUDNN_CHECK(lib().cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        h, d.x.d, d.y.d, d.conv.d, d.w.d, static_cast<int>(perf.size()), &found, perf.data()));
    traits = traits_of(perf, found);
    workspace_of = [&](int algo, size_t* bytes) {
      return lib().cudnnGetConvolutionBackwardFilterWorkspaceSize(
          h, d.x.d, d.y.d, d.conv.d, d.w.d, static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo),
          bytes);
    };
  }
  Choice c;
  for (const int algo : rank_algorithms(traits, allow_tf32())) {
    Candidate k{algo, 0};
    // An algorithm the heuristics list may still refuse to size its workspace: not a candidate.
    if (workspace_of(algo, &k.workspace) == CUDNN_STATUS_SUCCESS) c.ranked.push_back(k);
  }
  MT_CHECK(!c.ranked.empty(), "cuDNN offers no convolution algorithm for this shape");
  const std::lock_guard<std::mutex> lock(g_choice_mu);
  return g_choices.emplace(key, std::move(c)).first->second;
}

// Runs `call(algo, workspace, bytes)` (a cuDNN status) with the best candidate that runs, as
// PyTorch does: one whose workspace the device cannot hold, or that cuDNN refuses at run time (a
// status of the not-supported category), gives way to the next, which the shape keeps from then
// on. Any other failure, or the last candidate's, is thrown, naming what was tried before it.
template <typename Call>
void run_ranked(cudnnHandle_t h, const Descs& d, const cpu::Conv2dShape& s, Direction dir,
                cudaStream_t stream, const char* what, Call call) {
  const ChoiceKey key{current_device(), s, static_cast<int>(dir), allow_tf32()};
  const Choice c = choose(h, d, key, dir);
  std::string tried;
  for (size_t i = c.first; i < c.ranked.size(); ++i) {
    const Candidate& k = c.ranked[i];
    const bool last = i + 1 == c.ranked.size();
    std::optional<StreamScratch> ws;
    try {
      ws.emplace(k.workspace, stream);
    } catch (const Error& e) {
      if (last) MT_THROW(Error, what, ": no cuDNN algorithm could run (", tried, e.what(), ")");
      tried += ::meshtrain::detail::str_cat("algorithm ", k.algo, ": a workspace of ", k.workspace,
                                            " bytes did not fit; ");
      continue;
    }
    const cudnnStatus_t st = call(k.algo, ws->get(), ws->size());
    if (st == CUDNN_STATUS_SUCCESS) {
      if (i != c.first) {
        const std::lock_guard<std::mutex> lock(g_choice_mu);
        g_choices[key].first = i;
      }
      return;
    }
    if (last || CUDNN_STATUS_CATEGORY(st) != CUDNN_STATUS_NOT_SUPPORTED)
      MT_THROW(Error, what, ": cuDNN error ", lib().cudnnGetErrorString(st), " (",
               static_cast<int>(st), ") with algorithm ", k.algo,
               tried.empty() ? "" : " (before it: ", tried, tried.empty() ? "" : ")");
    tried += ::meshtrain::detail::str_cat("algorithm ", k.algo, ": ", lib().cudnnGetErrorString(st),
                                          "; ");
  }
}

void zero(float* p, int64_t n, cudaStream_t stream) {
  if (p != nullptr && n > 0)
    MT_CUDA_CHECK(cudaMemsetAsync(p, 0, static_cast<size_t>(n) * sizeof(float), stream));
}

}  // namespace

void conv2d_forward(float* out, const float* inp, const float* weight, const float* bias,
                    const cpu::Conv2dShape& s, cudaStream_t stream) {
  if (s.empty_output()) return;
  const cudnnHandle_t h = handle_for(current_device(), stream);
  const Descs d(s);
  const float one = 1.0f, zero = 0.0f;
  run_ranked(h, d, s, Direction::forward, stream, "conv2d forward",
             [&](int algo, void* ws, size_t ws_bytes) {
               return lib().cudnnConvolutionForward(h, &one, d.x.d, inp, d.w.d, weight, d.conv.d,
                                                    static_cast<cudnnConvolutionFwdAlgo_t>(algo),
                                                    ws, ws_bytes, &zero, d.y.d, out);
             });
  if (bias != nullptr) {
    const TensorDesc b(1, s.C_out, 1, 1);
    MT_CUDNN_CHECK(lib().cudnnAddTensor(h, &one, b.d, bias, &one, d.y.d, out));
  }
}

void conv2d_backward_data(float* dinp, const float* dout, const float* weight,
                          const cpu::Conv2dShape& s, cudaStream_t stream) {
  if (s.empty_output()) {
    zero(dinp, s.N * s.C_in * s.H * s.W, stream);
    return;
  }
  const cudnnHandle_t h = handle_for(current_device(), stream);
  const Descs d(s);
  const float one = 1.0f, zero = 0.0f;
  run_ranked(h, d, s, Direction::backward_data, stream, "conv2d backward (input)",
             [&](int algo, void* ws, size_t ws_bytes) {
               return lib().cudnnConvolutionBackwardData(
                   h, &one, d.w.d, weight, d.y.d, dout, d.conv.d,
                   static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), ws, ws_bytes, &zero, d.x.d,
                   dinp);
             });
}

void conv2d_backward_weights(float* dweight, float* dbias, const float* dout, const float* inp,
                             const cpu::Conv2dShape& s, cudaStream_t stream) {
  if (s.empty_output()) {
    // The CPU's answer: the gradient of a sum over nothing.
    zero(dweight, s.weight_numel(), stream);
    zero(dbias, s.C_out, stream);
    return;
  }
  const cudnnHandle_t h = handle_for(current_device(), stream);
  const Descs d(s);
  const float one = 1.0f, zero = 0.0f;
  if (dweight != nullptr) {
    run_ranked(h, d, s, Direction::backward_filter, stream, "conv2d backward (weights)",
               [&](int algo, void* ws, size_t ws_bytes) {
                 return lib().cudnnConvolutionBackwardFilter(
                     h, &one, d.x.d, inp, d.y.d, dout, d.conv.d,
                     static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), ws, ws_bytes, &zero, d.w.d,
                     dweight);
               });
  }
  if (dbias != nullptr) {
    const TensorDesc b(1, s.C_out, 1, 1);
    MT_CUDNN_CHECK(lib().cudnnConvolutionBackwardBias(h, &one, d.y.d, dout, &zero, b.d, dbias));
  }
}

std::string cudnn_version() {
  try {
    const size_t v = lib().cudnnGetVersion();
    return ::meshtrain::detail::str_cat("cuDNN ", v / 10000, ".", (v % 10000) / 100, ".", v % 100);
  } catch (const Error& e) {
    return std::string("no cuDNN: ") + e.what();
  }
}

}  // namespace meshtrain::cuda
