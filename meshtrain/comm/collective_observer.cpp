// See collective_observer.h. The callback runs under a mutex so that removing it waits for a call
// in flight; collectives finish a few dozen times per step, so the lock is not contended.
#include "meshtrain/comm/collective_observer.h"

#include <atomic>
#include <mutex>

namespace meshtrain::comm {

namespace {

std::mutex& observer_mutex() {
  static std::mutex mu;
  return mu;
}

CollectiveObserver& observer() {
  static CollectiveObserver fn;
  return fn;
}

std::atomic<bool> g_installed{false};

}  // namespace

void set_collective_observer(CollectiveObserver fn) {
  std::lock_guard lock(observer_mutex());
  g_installed.store(static_cast<bool>(fn), std::memory_order_release);
  observer() = std::move(fn);
}

bool has_collective_observer() {
  return g_installed.load(std::memory_order_acquire);
}

void notify_collective(const CollectiveEvent& event) {
  if (!has_collective_observer()) return;
  std::lock_guard lock(observer_mutex());
  if (!observer()) return;
  try {
    observer()(event);
  } catch (...) {
    // An observer must never fail a collective.
  }
}

}  // namespace meshtrain::comm
