// Pinned host allocations through the CUDA runtime.
#include "meshtrain/cuda/pinned_buffer.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "meshtrain/cuda/check.h"

namespace meshtrain::cuda {

PinnedBuffer::PinnedBuffer(size_t nbytes) : size_(nbytes) {
  if (nbytes > 0) MT_CUDA_CHECK(cudaHostAlloc(&data_, nbytes, cudaHostAllocDefault));
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) (void)cudaFreeHost(data_);
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) (void)cudaFreeHost(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

}  // namespace meshtrain::cuda
