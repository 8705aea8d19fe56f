// Whether this build's kernels run on a device, asked before training starts: a binary built for
// sm_90 otherwise fails at its first launch on an A100 with "no kernel image", and bf16 products
// on a pre-Ampere device with cuBLASLt's "no algorithm", neither naming the fix.
#include <cuda_runtime.h>

#include <string>

#include "meshtrain/cuda/device.h"
#include "meshtrain/cuda/device_support.h"

namespace meshtrain::cuda {
namespace {

// Compiled for exactly the architectures every other kernel is: its image is theirs.
__global__ void probe_kernel() {}

#define MT_STRINGIZE2(x) #x
#define MT_STRINGIZE(x) MT_STRINGIZE2(x)

}  // namespace

std::string compiled_architectures() {
#ifdef __CUDA_ARCH_LIST__
  return architectures_named(MT_STRINGIZE(__CUDA_ARCH_LIST__));
#else
  return "the toolkit's default";
#endif
}

std::string unsupported_reason(int index, DType precision) {
  const DeviceProperties p = device_properties(index);
  const DeviceGuard guard(index);
  cudaFuncAttributes attr{};
  const cudaError_t e = cudaFuncGetAttributes(&attr, probe_kernel);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // a failed query leaves nothing behind for the next call
    return support_problem(p.str(), p.major, p.minor, precision, compiled_architectures(),
                           cudaGetErrorName(e));
  }
  return support_problem(p.str(), p.major, p.minor, precision, compiled_architectures(), "");
}

}  // namespace meshtrain::cuda
