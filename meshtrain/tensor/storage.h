// A reference-counted block of device memory. Tensors share a Storage through shared_ptr, so
// views (reshape, first-dimension slices) are free and the memory goes when the last view does.
// Allocation goes through a per-device Allocator so that a GPU caching allocator can plug in.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "meshtrain/tensor/device.h"

namespace meshtrain {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* p, size_t nbytes) = 0;
};

// Installs the allocator for a device type (the CPU one is built in).
void set_allocator(DeviceType type, Allocator* allocator);
Allocator& allocator_for(DeviceType type);

class Storage {
 public:
  Storage(size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
};

}  // namespace meshtrain
