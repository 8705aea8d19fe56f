// Streams and events over the CUDA runtime.
#include "meshtrain/cuda/stream.h"

#include <utility>

#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/device.h"

namespace meshtrain::cuda {

Stream Stream::create(int device, int priority) {
  DeviceGuard guard(device);
  cudaStream_t s = nullptr;
  MT_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority));
  return Stream(s, device);
}

int highest_stream_priority(int device) {
  DeviceGuard guard(device);
  int least = 0, greatest = 0;
  MT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  return greatest;
}

Stream::~Stream() {
  if (owned_ && stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

Stream::Stream(Stream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)),
      device_(other.device_),
      owned_(std::exchange(other.owned_, false)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (owned_ && stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    stream_ = std::exchange(other.stream_, nullptr);
    device_ = other.device_;
    owned_ = std::exchange(other.owned_, false);
  }
  return *this;
}

void Stream::synchronize() const {
  MT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

bool Stream::query() const {
  const cudaError_t e = cudaStreamQuery(stream_);
  if (e == cudaErrorNotReady) return false;
  MT_CUDA_CHECK(e);
  return true;
}

void Stream::wait(const Event& event) const {
  MT_CUDA_CHECK(cudaStreamWaitEvent(stream_, event.get(), 0));
}

Event::Event(bool timing) {
  MT_CUDA_CHECK(
      cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
}

Event::~Event() {
  if (event_ != nullptr) (void)cudaEventDestroy(event_);
}

Event::Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

void Event::record(cudaStream_t stream) {
  MT_CUDA_CHECK(cudaEventRecord(event_, stream));
}

void Event::synchronize() const {
  MT_CUDA_CHECK(cudaEventSynchronize(event_));
}

bool Event::query() const {
  const cudaError_t e = cudaEventQuery(event_);
  if (e == cudaErrorNotReady) return false;
  MT_CUDA_CHECK(e);
  return true;
}

float Event::elapsed_ms(const Event& end) const {
  float ms = 0;
  MT_CUDA_CHECK(cudaEventElapsedTime(&ms, event_, end.event_));
  return ms;
}

}  // namespace meshtrain::cuda
