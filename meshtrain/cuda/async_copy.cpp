// Stream-ordered copies and the double-buffered pageable stager.
#include "meshtrain/cuda/async_copy.h"

#include <algorithm>
#include <cstring>

#include "meshtrain/cuda/check.h"

namespace meshtrain::cuda {

void copy_to_device_async(void* dst, const void* host_src, size_t nbytes, cudaStream_t stream) {
  if (nbytes > 0)
    MT_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, nbytes, cudaMemcpyHostToDevice, stream));
}

void copy_to_host_async(void* host_dst, const void* src, size_t nbytes, cudaStream_t stream) {
  if (nbytes > 0)
    MT_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, nbytes, cudaMemcpyDeviceToHost, stream));
}

void copy_device_async(void* dst, const void* src, size_t nbytes, cudaStream_t stream) {
  if (nbytes > 0)
    MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, stream));
}

HostStager::HostStager(size_t chunk_bytes)
    : chunk_(chunk_bytes), buffers_{PinnedBuffer(chunk_bytes), PinnedBuffer(chunk_bytes)} {
  MT_CHECK(chunk_bytes > 0, "HostStager needs a non-empty chunk");
}

void HostStager::to_device(void* dst, const void* host_src, size_t nbytes, cudaStream_t stream) {
  const char* src = static_cast<const char*>(host_src);
  char* out = static_cast<char*>(dst);
  for (size_t off = 0, i = 0; off < nbytes; off += chunk_, i ^= 1) {
    const size_t n = std::min(chunk_, nbytes - off);
    done_[i].synchronize();  // the DMA that last read this buffer has finished
    std::memcpy(buffers_[i].data(), src + off, n);
    copy_to_device_async(out + off, buffers_[i].data(), n, stream);
    done_[i].record(stream);
  }
}

void HostStager::to_host(void* host_dst, const void* src, size_t nbytes, cudaStream_t stream) {
  char* dst = static_cast<char*>(host_dst);
  const char* in = static_cast<const char*>(src);
  // Chunk k is copied out of its pinned buffer while chunk k+1 is in flight into the other.
  size_t pending_off = 0, pending_n = 0;
  int pending = -1;
  for (size_t off = 0, i = 0; off < nbytes; off += chunk_, i ^= 1) {
    const size_t n = std::min(chunk_, nbytes - off);
    done_[i].synchronize();
    copy_to_host_async(buffers_[i].data(), in + off, n, stream);
    done_[i].record(stream);
    if (pending >= 0) {
      done_[pending].synchronize();
      std::memcpy(dst + pending_off, buffers_[pending].data(), pending_n);
    }
    pending = static_cast<int>(i);
    pending_off = off;
    pending_n = n;
  }
  if (pending >= 0) {
    done_[pending].synchronize();
    std::memcpy(dst + pending_off, buffers_[pending].data(), pending_n);
  }
}

}  // namespace meshtrain::cuda
