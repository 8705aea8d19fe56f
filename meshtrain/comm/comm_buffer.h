// CommBuffer: memory for collective buffers that the group's backend may share between ranks.
// The shm backend maps every rank's allocation into every peer, so that an all-reduce whose
// buffers lie in one such allocation on every rank reads its peers' data where it is instead of
// staging a copy first (what NCCL's registered buffers and nccl-tests' -R do). Backends without
// shared memory hand out private memory: the same code runs everywhere and is only faster where
// sharing exists.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace meshtrain::comm {

class CommBuffer {
 public:
  virtual ~CommBuffer();
  CommBuffer(const CommBuffer&) = delete;
  CommBuffer& operator=(const CommBuffer&) = delete;

  // 64-byte aligned, zero-filled at allocation.
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(data_);
  }
  // True when peers read this memory in place (the allocation is mapped into every rank).
  virtual bool shared() const = 0;

  // Private heap memory, for backends that do not share.
  static std::unique_ptr<CommBuffer> allocate_private(size_t bytes);
  // Bytes of the buffers this process holds now (its own part of shared ones), for memory
  // accounting beside the tensor allocator's.
  static size_t live_bytes();

 protected:
  CommBuffer(uint8_t* data, size_t size);

 private:
  uint8_t* data_;
  size_t size_;
};

using CommBufferPtr = std::unique_ptr<CommBuffer>;

}  // namespace meshtrain::comm
