#include "meshtrain/tensor/storage.h"

#include <malloc.h>

#include <array>
#include <cstdlib>
#include <mutex>

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
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const size_t rounded = (nbytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) MT_THROW(Error, "out of host memory allocating ", nbytes, " bytes");
    return p;
  }
  void deallocate(void* p, size_t) override { std::free(p); }
};

std::array<Allocator*, 2>& allocators() {
  static CpuAllocator cpu;
  static std::array<Allocator*, 2> table{&cpu, nullptr};
  return table;
}

}  // namespace

void set_allocator(DeviceType type, Allocator* allocator) {
  allocators()[static_cast<size_t>(type)] = allocator;
}

Allocator& allocator_for(DeviceType type) {
  Allocator* a = allocators()[static_cast<size_t>(type)];
  MT_CHECK(a != nullptr, "no allocator for device type ", static_cast<int>(type),
           " (was meshtrain built with CUDA support?)");
  return *a;
}

Storage::Storage(size_t nbytes, Device device)
    : data_(allocator_for(device.type).allocate(nbytes)), nbytes_(nbytes), device_(device) {}

Storage::~Storage() {
  if (data_ != nullptr) allocator_for(device_.type).deallocate(data_, nbytes_);
}

}  // namespace meshtrain
