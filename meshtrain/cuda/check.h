// Turns CUDA runtime status codes into meshtrain::Error exceptions that name the failed call, the
// error and where it happened. (cuBLASLt's are checked in kernels/gemm.cpp, so that programs that
// never multiply on the GPU do not load the 500 MB library at start-up.) Kernel launches are
// checked with MT_CUDA_CHECK_LAUNCH(), which reads the launch error without synchronising.
#pragma once

#include <cuda_runtime_api.h>

#include "meshtrain/util/error.h"

namespace meshtrain::cuda {

// A CUDA runtime or library call failed. Derived from Error so that callers need not know it.
class CudaError : public Error {
 public:
  CudaError(const std::string& msg, int code) : Error(msg), code_(code) {}
  int code() const { return code_; }  // the cudaError_t (or cublasStatus_t) value

 private:
  int code_;
};

namespace detail {
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);
}  // namespace detail

}  // namespace meshtrain::cuda

#define MT_CUDA_CHECK(call)                                                                 \
  do {                                                                                      \
    const cudaError_t mt_cuda_err_ = (call);                                                \
    if (mt_cuda_err_ != cudaSuccess) [[unlikely]]                                           \
      ::meshtrain::cuda::detail::throw_cuda_error(mt_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

#define MT_CUDA_CHECK_LAUNCH() MT_CUDA_CHECK(cudaGetLastError())
