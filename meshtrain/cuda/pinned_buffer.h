// Page-locked host memory. The DMA engines copy between a pinned buffer and device memory
// asynchronously for the host (and beside kernels of other streams); from ordinary pageable
// memory the driver must stage every copy itself and the call blocks. Data loaders fill a pinned
// buffer and upload it with copy_to_device_async (async_copy.h).
#pragma once

#include <cstddef>

namespace meshtrain::cuda {

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t nbytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace meshtrain::cuda
