#include "meshtrain/tensor/storage.h"

#include <malloc.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "meshtrain/cuda/availability.h"
#include "meshtrain/util/error.h"

namespace meshtrain {
namespace {

// 64-byte aligned host memory. The first use raises glibc's mmap threshold so that activation
// buffers freed and re-allocated every step are recycled from the heap instead of being mapped
// and page-faulted again each time.
class CpuAllocator final : public Allocator {
 public:
  CpuAllocator() {
    // 32 MiB is glibc's largest accepted threshold (larger values are rejected outright).
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
  }
  void* allocate(size_t nbytes, Device) override {
    if (nbytes == 0) return nullptr;
    const size_t rounded = (nbytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) MT_THROW(Error, "out of host memory allocating ", nbytes, " bytes");
    return p;
  }
  void deallocate(void* p, size_t, Device) override { std::free(p); }
  void copy(void* dst, Device, const void* src, Device, size_t nbytes) override {
    if (nbytes > 0) std::memcpy(dst, src, nbytes);
  }
  void zero(void* p, size_t nbytes, Device) override {
    if (nbytes > 0) std::memset(p, 0, nbytes);
  }
};

Allocator* default_allocator(DeviceType type) {
  static CpuAllocator cpu;
  return type == DeviceType::cpu ? static_cast<Allocator*>(&cpu) : cuda::storage_allocator();
}

std::array<Allocator*, 2>& allocators() {
  static std::array<Allocator*, 2> table{default_allocator(DeviceType::cpu),
                                         default_allocator(DeviceType::cuda)};
  return table;
}

}  // namespace

void set_allocator(DeviceType type, Allocator* allocator) {
  allocators()[static_cast<size_t>(type)] =
      allocator != nullptr ? allocator : default_allocator(type);
}

Allocator& allocator_for(DeviceType type) {
  Allocator* a = allocators()[static_cast<size_t>(type)];
  if (a == nullptr) MT_THROW(Error, "cuda tensors are not available: ", cuda::unavailable_reason());
  return *a;
}

Storage::Storage(size_t nbytes, Device device)
    : data_(allocator_for(device.type).allocate(nbytes, device)),
      nbytes_(nbytes),
      device_(device) {}

Storage::Storage(void* data, size_t nbytes, Device device, std::shared_ptr<const void> owner)
    : data_(data), nbytes_(nbytes), device_(device), owner_(std::move(owner)) {
  MT_CHECK(owner_ != nullptr, "borrowed storage needs an owner that keeps its memory alive");
}

Storage::~Storage() {
  if (data_ != nullptr && owner_ == nullptr) {
    allocator_for(device_.type).deallocate(data_, nbytes_, device_);
  }
}

}  // namespace meshtrain
