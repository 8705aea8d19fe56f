// A reference-counted block of device memory. Tensors share a Storage through shared_ptr, so
// views (reshape, first-dimension slices) are free and the memory goes when the last view does.
// Allocation goes through a per-device-type Allocator, so the GPU caching allocator plugs in.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "meshtrain/tensor/device.h"

namespace meshtrain {

// Owns one device type's memory: allocation, and moving bytes in and out of it (the tensor core
// needs nothing else from a device to create, copy, fill and read tensors). A copy into host
// memory is complete when it returns; work that ends in device memory may be queued (on the
// device's current stream), ordered before anything later on that stream.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes, Device device) = 0;
  virtual void deallocate(void* p, size_t nbytes, Device device) = 0;
  // Copies nbytes from src on src_device to dst on dst_device; one of the two devices is this
  // allocator's type, the other is the same type or the CPU.
  virtual void copy(void* dst, Device dst_device, const void* src, Device src_device,
                    size_t nbytes) = 0;
  virtual void zero(void* p, size_t nbytes, Device device) = 0;
};

// Installs the allocator for a device type (the CPU one is built in; the cuda one is the caching
// allocator of meshtrain/cuda when built with CUDA). Tests install fakes; nullptr restores the
// default.
void set_allocator(DeviceType type, Allocator* allocator);
Allocator& allocator_for(DeviceType type);

class Storage {
 public:
  Storage(size_t nbytes, Device device);
  // Memory that somebody else owns (a communication buffer shared between processes): `owner`
  // keeps it alive as long as this storage, and no allocator frees it.
  Storage(void* data, size_t nbytes, Device device, std::shared_ptr<const void> owner);
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
  std::shared_ptr<const void> owner_;  // set for borrowed memory
};

}  // namespace meshtrain
