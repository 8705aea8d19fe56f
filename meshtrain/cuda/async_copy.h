// Host <-> device copies queued on a stream. With pinned host memory they return at once and run
// on the copy engines beside kernels; the caller keeps both buffers alive and unchanged until the
// stream (or an event recorded after the copy) says it is done. HostStager moves pageable host
// memory (a std::vector, a memory-mapped shard) through two pinned chunks, so that filling one
// chunk on the CPU overlaps the DMA of the other.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "meshtrain/cuda/pinned_buffer.h"
#include "meshtrain/cuda/stream.h"

namespace meshtrain::cuda {

void copy_to_device_async(void* dst, const void* host_src, size_t nbytes, cudaStream_t stream);
void copy_to_host_async(void* host_dst, const void* src, size_t nbytes, cudaStream_t stream);
void copy_device_async(void* dst, const void* src, size_t nbytes, cudaStream_t stream);

// Its events belong to the device current at construction: use it with that device's streams.
class HostStager {
 public:
  // Two pinned chunks of chunk_bytes each.
  explicit HostStager(size_t chunk_bytes = size_t{4} << 20);

  // Copies pageable host memory to the device on `stream`. Returns once the host memory may be
  // reused (its last chunk is in flight); the device copy is ordered on the stream.
  void to_device(void* dst, const void* host_src, size_t nbytes, cudaStream_t stream);
  // Copies device memory into pageable host memory; complete on return.
  void to_host(void* host_dst, const void* src, size_t nbytes, cudaStream_t stream);

 private:
  size_t chunk_;
  PinnedBuffer buffers_[2];
  Event done_[2];  // recorded after the copy that last used each buffer
};

}  // namespace meshtrain::cuda
