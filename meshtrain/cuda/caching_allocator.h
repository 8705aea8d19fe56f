// The caching allocator of each CUDA device: CachingAllocatorCore (the bookkeeping, tested on the
// CPU) over cudaMalloc/cudaFree, plus what only the GPU side knows about: the current stream of
// each thread, and blocks used on more than one stream, whose reuse must wait until every stream
// that touched them has passed the point of the free.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "meshtrain/cuda/caching_allocator_core.h"
#include "meshtrain/cuda/stream.h"

namespace meshtrain::cuda {

class CachingAllocator {
 public:
  // The allocator of device `index`, created on first use and kept for the process's lifetime.
  static CachingAllocator& for_device(int index);

  explicit CachingAllocator(int device);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Memory for use on `stream` (stream-ordered: it may still be in use by earlier work on that
  // stream, which runs first). Throws meshtrain::Error when the device is out of memory.
  void* allocate(size_t nbytes, cudaStream_t stream);
  void free(void* p);
  // Declares that p is also used on `stream`: its free then waits (with events, never blocking
  // the host) until the work queued on `stream` so far has finished.
  void record_stream(void* p, cudaStream_t stream);
  // Returns every wholly free segment to the driver (after waiting for deferred frees).
  void empty_cache();
  AllocatorStats stats() const;
  void reset_peaks();
  int device() const { return device_; }

 private:
  struct DeferredFree {
    void* p;
    std::vector<Event> events;
  };
  void process_deferred(bool wait);  // requires mu_

  int device_;
  std::unique_ptr<MemorySource> source_;
  std::unique_ptr<CachingAllocatorCore> core_;
  std::mutex mu_;
  std::unordered_map<void*, std::vector<cudaStream_t>> other_streams_;
  std::vector<DeferredFree> deferred_;
};

// Device memory for the work one call queues on `stream`: allocated for that stream and freed when
// the scope ends, right after the launches (stream-ordered: later work on the stream, the only
// work that can reuse it, runs after them).
class StreamScratch {
 public:
  StreamScratch(size_t nbytes, cudaStream_t stream);  // on the current device
  StreamScratch(int device, size_t nbytes, cudaStream_t stream);
  ~StreamScratch();
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  void* get() const { return p_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t size() const { return n_; }

 private:
  CachingAllocator& alloc_;
  void* p_;
  size_t n_;
};

// The stream that this thread's work on `device` goes to: new tensors are allocated for it and the
// tensor core's copies run on it. The default stream unless a StreamGuard says otherwise.
cudaStream_t current_stream(int device);

// Makes `stream` the current stream of its device on this thread for the guard's lifetime.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  cudaStream_t previous_;
};

}  // namespace meshtrain::cuda
