// RAII handles for CUDA streams and events. A default-constructed Stream is the legacy default
// stream (not owned); created streams are non-blocking (they do not wait for the default stream)
// and are destroyed with their handle. Both are move-only.
#pragma once

#include <cuda_runtime_api.h>

namespace meshtrain::cuda {

class Event;

class Stream {
 public:
  Stream() = default;  // the default stream of the current device
  // A new stream on `device`; a lower priority number is a higher priority (communication
  // streams use the highest, highest_stream_priority, so their kernels overtake compute).
  static Stream create(int device, int priority = 0);
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }
  void synchronize() const;
  bool query() const;  // true when every queued operation has finished
  // Later work on this stream waits for `event` (without blocking the host).
  void wait(const Event& event) const;

 private:
  Stream(cudaStream_t s, int device) : stream_(s), device_(device), owned_(true) {}
  cudaStream_t stream_ = nullptr;
  int device_ = 0;
  bool owned_ = false;
};

// The highest priority a stream on `device` can have: the device's greatest (a fixed -1 need not
// be it; recent devices have more than two levels).
int highest_stream_priority(int device);

class Event {
 public:
  // Timing events cost more to record; leave them off for pure synchronisation.
  explicit Event(bool timing = false);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(cudaStream_t stream);
  void record(const Stream& stream) { record(stream.get()); }
  void synchronize() const;
  bool query() const;  // true once the recorded work has finished (or nothing was recorded)
  // Milliseconds from this event to `end`; both must be timing events that have completed.
  float elapsed_ms(const Event& end) const;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace meshtrain::cuda
