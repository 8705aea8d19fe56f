// Where a training step's CPU time goes, by kind of kernel: each public CPU kernel opens a
// KernelTimer, and the training thread's PhaseClock takes the sums at every phase mark, so a
// step's row can say how much of forward, backward and the optimizer ran inside GEMMs, attention,
// element-wise kernels and optimizer kernels, and how much outside any kernel (allocation,
// copies, autograd bookkeeping, dispatch). Off unless a run asks for it (train.kernel_times): a
// timer is then two clock reads. Only the outermost timer of a thread counts (a kernel that calls
// another is charged to the outer one), and nothing is counted inside an OpenMP parallel region
// (the region's thread already times the kernel that opened it).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>

namespace meshtrain::cpu {

enum class KernelKind { gemm = 0, attention, elementwise, optimizer };
inline constexpr size_t kNumKernelKinds = 4;
// "gemm", "attention", "elementwise", "optimizer"
const char* kernel_kind_name(KernelKind kind);

// Seconds per kind.
using KernelSeconds = std::array<double, kNumKernelKinds>;

void set_kernel_timing(bool on);
inline std::atomic<bool>& kernel_timing_flag() {
  static std::atomic<bool> on{false};
  return on;
}
inline bool kernel_timing() {
  return kernel_timing_flag().load(std::memory_order_relaxed);
}

// Turns timing on for its lifetime when `on` (and off again at its end).
class KernelTimingScope {
 public:
  explicit KernelTimingScope(bool on) : on_(on) {
    if (on_) set_kernel_timing(true);
  }
  ~KernelTimingScope() {
    if (on_) set_kernel_timing(false);
  }
  KernelTimingScope(const KernelTimingScope&) = delete;
  KernelTimingScope& operator=(const KernelTimingScope&) = delete;

 private:
  bool on_;
};

// The calling thread's sums since its previous call (zeros when timing is off).
KernelSeconds take_kernel_seconds();

class KernelTimer {
 public:
  explicit KernelTimer(KernelKind kind) {
    if (kernel_timing()) start(kind);
  }
  ~KernelTimer() {
    if (active_) stop();
  }
  KernelTimer(const KernelTimer&) = delete;
  KernelTimer& operator=(const KernelTimer&) = delete;

 private:
  void start(KernelKind kind);
  void stop();

  bool active_ = false;
  KernelKind kind_ = KernelKind::elementwise;
  std::chrono::steady_clock::time_point begin_;
};

}  // namespace meshtrain::cpu
