#include "meshtrain/tensor/storage.h"

#include <malloc.h>

#include <array>
#include <atomic>
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
    const size_t now = in_use_.fetch_add(nbytes, std::memory_order_relaxed) + nbytes;
    size_t peak = peak_.load(std::memory_order_relaxed);
    while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
    return p;
  }
  void deallocate(void* p, size_t nbytes, Device) override {
    if (p == nullptr) return;
    std::free(p);
    in_use_.fetch_sub(nbytes, std::memory_order_relaxed);
  }
  size_t in_use() const { return in_use_.load(std::memory_order_relaxed); }
  size_t peak() const { return peak_.load(std::memory_order_relaxed); }
  void reset_peak() { peak_.store(in_use(), std::memory_order_relaxed); }
  void copy(void* dst, Device, const void* src, Device, size_t nbytes) override {
    if (nbytes > 0) std::memcpy(dst, src, nbytes);
  }
  void zero(void* p, size_t nbytes, Device) override {
    if (nbytes > 0) std::memset(p, 0, nbytes);
  }

 private:
  // The bytes the process's tensors hold now and at most since the last reset_peak: what the
  // memory guard's estimates are checked against.
  std::atomic<size_t> in_use_{0};
  std::atomic<size_t> peak_{0};
};

CpuAllocator& cpu_allocator() {
  static CpuAllocator cpu;
  return cpu;
}

Allocator* default_allocator(DeviceType type) {
  return type == DeviceType::cpu ? static_cast<Allocator*>(&cpu_allocator())
                                 : cuda::storage_allocator();
}

std::array<Allocator*, 2>& allocators() {
  static std::array<Allocator*, 2> table{default_allocator(DeviceType::cpu),
                                         default_allocator(DeviceType::cuda)};
  return table;
}

}  // namespace

void Allocator::copy_2d(void* dst, size_t dst_pitch, Device dst_device, const void* src,
                        size_t src_pitch, Device src_device, size_t width, size_t rows) {
  if (width == 0) return;
  for (size_t r = 0; r < rows; ++r)
    copy(static_cast<char*>(dst) + r * dst_pitch, dst_device,
         static_cast<const char*>(src) + r * src_pitch, src_device, width);
}

size_t host_tensor_bytes() {
  return cpu_allocator().in_use();
}

size_t host_tensor_peak_bytes() {
  return cpu_allocator().peak();
}

void reset_host_tensor_peak_bytes() {
  cpu_allocator().reset_peak();
}

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
    : data_(data), nbytes_(nbytes), device_(device), owner_(std::move(owner)), borrowed_(true) {
  MT_CHECK(owner_ != nullptr, "borrowed storage needs an owner that keeps its memory alive");
}

void Storage::rebind(void* data, std::shared_ptr<const void> owner) {
  MT_CHECK(owner_ != nullptr || data_ == nullptr,
           "only borrowed storage can be pointed at other memory");
  MT_CHECK((data == nullptr) == (owner == nullptr),
           "rebinding storage needs memory and its owner together, or neither");
  data_ = data;
  owner_ = std::move(owner);
}

Storage::~Storage() {
  if (data_ != nullptr && owner_ == nullptr) {
    allocator_for(device_.type).deallocate(data_, nbytes_, device_);
  }
}

}  // namespace meshtrain
