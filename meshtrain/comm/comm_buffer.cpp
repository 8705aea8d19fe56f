// Private CommBuffer: aligned heap memory.
#include "meshtrain/comm/comm_buffer.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

namespace meshtrain::comm {
namespace {

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};

class PrivateCommBuffer final : public CommBuffer {
 public:
  explicit PrivateCommBuffer(std::unique_ptr<uint8_t, FreeDeleter> mem, size_t bytes)
      : CommBuffer(mem.get(), bytes), mem_(std::move(mem)) {}
  bool shared() const override { return false; }

 private:
  std::unique_ptr<uint8_t, FreeDeleter> mem_;
};

}  // namespace

namespace {
std::atomic<size_t> g_live_bytes{0};
}  // namespace

CommBuffer::CommBuffer(uint8_t* data, size_t size) : data_(data), size_(size) {
  g_live_bytes.fetch_add(size_, std::memory_order_relaxed);
}

CommBuffer::~CommBuffer() {
  g_live_bytes.fetch_sub(size_, std::memory_order_relaxed);
}

size_t CommBuffer::live_bytes() {
  return g_live_bytes.load(std::memory_order_relaxed);
}

std::unique_ptr<CommBuffer> CommBuffer::allocate_private(size_t bytes) {
  constexpr size_t kAlign = 64;
  const size_t rounded = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  std::unique_ptr<uint8_t, FreeDeleter> mem(
      static_cast<uint8_t*>(std::aligned_alloc(kAlign, rounded)));
  if (!mem) throw std::bad_alloc();
  std::memset(mem.get(), 0, rounded);
  return std::make_unique<PrivateCommBuffer>(std::move(mem), bytes);
}

}  // namespace meshtrain::comm
