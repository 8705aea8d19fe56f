// Formats CUDA failures once, so every call site stays a one-line macro.
#include "meshtrain/cuda/check.h"

namespace meshtrain::cuda::detail {

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  // Clears the sticky "last error" of a non-fatal failure so the next launch check is not blamed.
  (void)cudaGetLastError();
  throw CudaError(::meshtrain::detail::str_cat(call, " failed: ", cudaGetErrorName(err), " (",
                                               cudaGetErrorString(err), ") at ", file, ":", line),
                  static_cast<int>(err));
}

}  // namespace meshtrain::cuda::detail
