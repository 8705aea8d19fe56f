// Asks the CUDA runtime once whether this process has a device, turning "no driver", "driver too
// old" and "no device" into device_count() == 0 with a reason instead of an exception; and the
// tensor core's Allocator for cuda tensors (the caching allocator plus stream-ordered copies).
#include "meshtrain/cuda/availability.h"

#include <cuda_runtime_api.h>

#include <mutex>

#include "meshtrain/cuda/caching_allocator.h"
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/device.h"
#include "meshtrain/util/error.h"

namespace meshtrain::cuda {
namespace {

struct Probe {
  int count = 0;
  std::string reason;
};

const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      r.reason =
          ::meshtrain::detail::str_cat("no CUDA device: cudaGetDeviceCount failed with ",
                                       cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
    } else if (n == 0) {
      r.reason = "no CUDA device: the driver reports none";
    } else {
      r.count = n;
    }
    return r;
  }();
  return p;
}

// Work on cuda tensors goes to the current stream of the device (caching_allocator.h). Copies
// that end on the host synchronise that stream before returning; copies and zero-fills that end on
// the device are only ordered on it, which is all later device work and later reads need.
class CudaStorageAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes, Device device) override {
    return CachingAllocator::for_device(device.index)
        .allocate(nbytes, current_stream(device.index));
  }
  void deallocate(void* p, size_t, Device device) override {
    CachingAllocator::for_device(device.index).free(p);
  }
  void copy(void* dst, Device dst_device, const void* src, Device src_device,
            size_t nbytes) override {
    if (nbytes == 0) return;
    if (dst_device.is_cpu()) {
      DeviceGuard guard(src_device.index);
      const cudaStream_t s = current_stream(src_device.index);
      MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, s));
      MT_CUDA_CHECK(cudaStreamSynchronize(s));
      return;
    }
    DeviceGuard guard(dst_device.index);
    const cudaStream_t s = current_stream(dst_device.index);
    if (src_device.is_cpu()) {
      // A pageable source is staged by the driver before the call returns, so the host buffer
      // may be reused at once.
      MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, s));
    } else if (src_device.index == dst_device.index) {
      MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, s));
    } else {
      // Across devices the source stream is not ordered with ours: wait for both.
      MT_CUDA_CHECK(cudaStreamSynchronize(current_stream(src_device.index)));
      MT_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, nbytes, s));
      MT_CUDA_CHECK(cudaStreamSynchronize(s));
    }
  }
  // One call for a block within one device's memory (a narrow, a cat, a regrouping); other
  // pairs of places take a copy a row.
  void copy_2d(void* dst, size_t dst_pitch, Device dst_device, const void* src, size_t src_pitch,
               Device src_device, size_t width, size_t rows) override {
    if (width == 0 || rows == 0) return;
    // cudaMemcpy2D takes pitches up to the device's memPitch (2^31 - 1 bytes on every GPU).
    constexpr size_t kMaxPitch = 0x7fffffff;
    if (dst_device.is_cpu() || src_device != dst_device || dst_pitch > kMaxPitch ||
        src_pitch > kMaxPitch) {
      Allocator::copy_2d(dst, dst_pitch, dst_device, src, src_pitch, src_device, width, rows);
      return;
    }
    DeviceGuard guard(dst_device.index);
    MT_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows,
                                    cudaMemcpyDeviceToDevice, current_stream(dst_device.index)));
  }
  void zero(void* p, size_t nbytes, Device device) override {
    if (nbytes == 0) return;
    DeviceGuard guard(device.index);
    MT_CUDA_CHECK(cudaMemsetAsync(p, 0, nbytes, current_stream(device.index)));
  }
};

}  // namespace

bool built_with_cuda() {
  return true;
}

int device_count() {
  return probe().count;
}

std::string unavailable_reason() {
  return probe().reason;
}

Allocator* storage_allocator() {
  static CudaStorageAllocator a;
  return &a;
}

void use_device(int index) {
  const int n = device_count();
  if (n == 0) MT_THROW(Error, "cuda:", index, " is not available: ", unavailable_reason());
  MT_CHECK(index >= 0 && index < n, "cuda:", index, " does not exist: this process sees ", n,
           " device", n == 1 ? "" : "s", " (CUDA_VISIBLE_DEVICES and LOCAL_RANK choose them)");
  set_device(index);
}

}  // namespace meshtrain::cuda
