// cudaMalloc-backed segments for the caching allocator, deferred cross-stream frees, the current
// stream of each thread, and the tensor core's Allocator for cuda tensors.
#include "meshtrain/cuda/caching_allocator.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <unordered_map>

#include "meshtrain/cuda/availability.h"
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/device.h"

namespace meshtrain::cuda {
namespace {

class CudaMemorySource final : public MemorySource {
 public:
  explicit CudaMemorySource(int device) : device_(device) {}
  void* allocate_segment(size_t nbytes) override {
    DeviceGuard guard(device_);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, nbytes);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // not sticky; clear it so later launch checks pass
      return nullptr;
    }
    MT_CUDA_CHECK(e);
    return p;
  }
  // Also runs at process exit, when the runtime may already be unloading: failures are dropped
  // here because the driver reclaims the memory with the context anyway.
  void free_segment(void* p, size_t) override {
    int previous = 0;
    if (cudaGetDevice(&previous) != cudaSuccess) return;
    (void)cudaSetDevice(device_);
    (void)cudaFree(p);
    (void)cudaGetLastError();
    (void)cudaSetDevice(previous);
  }

 private:
  int device_;
};

constexpr int kMaxDevices = 64;

thread_local std::unordered_map<int, cudaStream_t> t_current_streams;

}  // namespace

CachingAllocator& CachingAllocator::for_device(int index) {
  MT_CHECK(index >= 0 && index < kMaxDevices, "cuda:", index, " out of range");
  static std::array<std::unique_ptr<CachingAllocator>, kMaxDevices> allocators;
  static std::mutex mu;
  std::lock_guard lock(mu);
  auto& a = allocators[static_cast<size_t>(index)];
  if (!a) {
    const int n = device_count();
    if (n == 0) MT_THROW(Error, "cuda:", index, " is not available: ", unavailable_reason());
    MT_CHECK(index < n, "cuda:", index, " does not exist (", n, " device(s))");
    a = std::make_unique<CachingAllocator>(index);
  }
  return *a;
}

CachingAllocator::CachingAllocator(int device)
    : device_(device),
      source_(std::make_unique<CudaMemorySource>(device)),
      core_(std::make_unique<CachingAllocatorCore>(*source_, "cuda:" + std::to_string(device))) {}

CachingAllocator::~CachingAllocator() = default;

void CachingAllocator::process_deferred(bool wait) {
  for (auto it = deferred_.begin(); it != deferred_.end();) {
    bool done = true;
    for (Event& e : it->events) {
      if (wait) e.synchronize();
      if (!e.query()) {
        done = false;
        break;
      }
    }
    if (done) {
      core_->free(it->p);
      it = deferred_.erase(it);
    } else {
      ++it;
    }
  }
}

void* CachingAllocator::allocate(size_t nbytes, cudaStream_t stream) {
  std::lock_guard lock(mu_);
  if (!deferred_.empty()) process_deferred(false);
  try {
    return core_->allocate(nbytes, reinterpret_cast<StreamId>(stream));
  } catch (const Error&) {
    if (deferred_.empty()) throw;
    // Memory held back by cross-stream frees may be enough: wait for it and try once more.
    process_deferred(true);
    return core_->allocate(nbytes, reinterpret_cast<StreamId>(stream));
  }
}

void CachingAllocator::free(void* p) {
  if (p == nullptr) return;
  std::lock_guard lock(mu_);
  auto it = other_streams_.find(p);
  if (it == other_streams_.end()) {
    core_->free(p);
    return;
  }
  DeferredFree d{p, {}};
  DeviceGuard guard(device_);
  for (cudaStream_t s : it->second) {
    d.events.emplace_back(false);
    d.events.back().record(s);
  }
  other_streams_.erase(it);
  deferred_.push_back(std::move(d));
}

void CachingAllocator::record_stream(void* p, cudaStream_t stream) {
  std::lock_guard lock(mu_);
  if (reinterpret_cast<StreamId>(stream) == core_->block_stream(p)) return;
  auto& streams = other_streams_[p];
  if (std::find(streams.begin(), streams.end(), stream) == streams.end()) streams.push_back(stream);
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mu_);
  process_deferred(true);
  core_->release_cached();
}

AllocatorStats CachingAllocator::stats() const {
  return core_->stats();
}

void CachingAllocator::reset_peaks() {
  core_->reset_peaks();
}

cudaStream_t current_stream(int device) {
  auto it = t_current_streams.find(device);
  return it == t_current_streams.end() ? nullptr : it->second;
}

StreamGuard::StreamGuard(const Stream& stream)
    : device_(stream.device()), previous_(current_stream(stream.device())) {
  t_current_streams[device_] = stream.get();
}

StreamGuard::~StreamGuard() {
  t_current_streams[device_] = previous_;
}

StreamScratch::StreamScratch(size_t nbytes, cudaStream_t stream)
    : StreamScratch(current_device(), nbytes, stream) {}

StreamScratch::StreamScratch(int device, size_t nbytes, cudaStream_t stream)
    : alloc_(CachingAllocator::for_device(device)),
      p_(nbytes > 0 ? alloc_.allocate(nbytes, stream) : nullptr),
      n_(nbytes) {}

StreamScratch::~StreamScratch() {
  if (p_ != nullptr) alloc_.free(p_);
}

}  // namespace meshtrain::cuda
