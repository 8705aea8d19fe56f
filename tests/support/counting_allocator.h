// An Allocator that counts the bytes of storage alive and their peak since the last reset, in
// front of another one: tests install it with set_allocator to measure what a piece of code
// keeps (activations saved for backward, a model's state) apart from everything else.
#pragma once

#include <atomic>
#include <cstdint>

#include "meshtrain/tensor/storage.h"

namespace meshtrain::testing {

class CountingAllocator final : public Allocator {
 public:
  explicit CountingAllocator(Allocator& base) : base_(base) {}
  void* allocate(size_t nbytes, Device device) override {
    const int64_t now = live_ += static_cast<int64_t>(nbytes);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return base_.allocate(nbytes, device);
  }
  void deallocate(void* p, size_t nbytes, Device device) override {
    live_ -= static_cast<int64_t>(nbytes);
    base_.deallocate(p, nbytes, device);
  }
  void copy(void* dst, Device dd, const void* src, Device sd, size_t nbytes) override {
    base_.copy(dst, dd, src, sd, nbytes);
  }
  void zero(void* p, size_t nbytes, Device device) override { base_.zero(p, nbytes, device); }
  int64_t live() const { return live_; }
  int64_t peak() const { return peak_; }
  void reset_peak() { peak_ = live_.load(); }

 private:
  Allocator& base_;
  std::atomic<int64_t> live_{0};
  std::atomic<int64_t> peak_{0};
};

}  // namespace meshtrain::testing
