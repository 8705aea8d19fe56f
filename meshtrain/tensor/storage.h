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
  // Copies `rows` rows of `width` bytes, row i from src + i * src_pitch to dst + i * dst_pitch:
  // a block of a larger tensor (narrow, cat, a regrouping before a collective). The default is
  // one copy() a row; a device may do it in one call.
  virtual void copy_2d(void* dst, size_t dst_pitch, Device dst_device, const void* src,
                       size_t src_pitch, Device src_device, size_t width, size_t rows);
  virtual void zero(void* p, size_t nbytes, Device device) = 0;
};

// Installs the allocator for a device type (the CPU one is built in; the cuda one is the caching
// allocator of meshtrain/cuda when built with CUDA). Tests install fakes; nullptr restores the
// default.
void set_allocator(DeviceType type, Allocator* allocator);
Allocator& allocator_for(DeviceType type);

// Bytes of host tensor memory the built-in CPU allocator has handed out and not taken back:
// now, and at most since the last reset (process-wide; other allocators are not counted).
size_t host_tensor_bytes();
size_t host_tensor_peak_bytes();
void reset_host_tensor_peak_bytes();

class Storage {
 public:
  Storage(size_t nbytes, Device device);
  // Memory that somebody else owns (a communication buffer shared between processes): `owner`
  // keeps it alive as long as this storage, and no allocator frees it.
  Storage(void* data, size_t nbytes, Device device, std::shared_ptr<const void> owner);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  // Borrowed storage only: points this storage, and so every tensor that shares it (views and
  // detached copies that autograd saved for backward), at other memory of the same size, or at
  // none (nullptr, with no owner). Sharded parameters use it to come and go between a step's
  // forward and backward without the tensors that refer to them noticing (PyTorch FSDP's
  // storage resize). Nothing may read the storage while it points at none.
  void rebind(void* data, std::shared_ptr<const void> owner);
  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  // Made by the second constructor: somebody else's memory, never ours to overwrite at will.
  bool borrowed() const { return borrowed_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  std::shared_ptr<const void> owner_;  // set for borrowed memory
  bool borrowed_ = false;
};

}  // namespace meshtrain
