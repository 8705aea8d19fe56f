// See kernel_clock.h.
#include "meshtrain/tensor/cpu/kernel_clock.h"

#include <omp.h>

namespace meshtrain::cpu {
namespace {

struct ThreadSums {
  KernelSeconds seconds{};
  int depth = 0;
};

ThreadSums& sums() {
  thread_local ThreadSums s;
  return s;
}

}  // namespace

const char* kernel_kind_name(KernelKind kind) {
  switch (kind) {
    case KernelKind::gemm:
      return "gemm";
    case KernelKind::attention:
      return "attention";
    case KernelKind::elementwise:
      return "elementwise";
    case KernelKind::optimizer:
      return "optimizer";
  }
  return "?";
}

void set_kernel_timing(bool on) {
  kernel_timing_flag().store(on, std::memory_order_relaxed);
}

KernelSeconds take_kernel_seconds() {
  ThreadSums& s = sums();
  KernelSeconds out = s.seconds;
  s.seconds = {};
  return out;
}

void KernelTimer::start(KernelKind kind) {
  if (omp_in_parallel()) return;
  ThreadSums& s = sums();
  if (s.depth > 0) return;  // nested: the outer timer covers it
  s.depth = 1;
  active_ = true;
  kind_ = kind;
  begin_ = std::chrono::steady_clock::now();
}

void KernelTimer::stop() {
  ThreadSums& s = sums();
  s.seconds[static_cast<size_t>(kind_)] +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin_).count();
  s.depth = 0;
}

}  // namespace meshtrain::cpu
