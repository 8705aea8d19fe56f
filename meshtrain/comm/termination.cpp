// See termination.h.
#include "meshtrain/comm/termination.h"

#include <time.h>

#include <atomic>
#include <cstdint>

#include "meshtrain/util/env_registry.h"

namespace meshtrain::comm {
namespace {

std::atomic<int> g_signal{0};
std::atomic<int64_t> g_at_ns{0};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<int64_t>::is_always_lock_free,
              "a signal handler may only touch lock-free atomics");

std::atomic<int64_t> g_abandon_after_ms{-1};

}  // namespace

void note_termination_signal(int sig) noexcept {
  // clock_gettime is async-signal-safe; steady_clock is CLOCK_MONOTONIC on Linux.
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  int expected = 0;
  if (g_signal.compare_exchange_strong(expected, sig))
    g_at_ns.store(int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec);
}

void clear_termination_signal() noexcept {
  g_signal.store(0);
}

std::optional<TerminationSignal> termination_signal() noexcept {
  const int sig = g_signal.load();
  if (sig == 0) return std::nullopt;
  // The time is stored after the signal: a reader in between sees a moment that is too early
  // only for that instant, and the watchdog looks again 100 ms later.
  const int64_t ns = g_at_ns.load();
  return TerminationSignal{sig, std::chrono::steady_clock::time_point(
                                    std::chrono::nanoseconds(ns == 0 ? INT64_MAX / 2 : ns))};
}

std::chrono::milliseconds abandon_after() {
  int64_t ms = g_abandon_after_ms.load();
  if (ms < 0) {
    const std::optional<uint64_t> grace = env_count(Env::grace_period_ms);
    ms = grace ? static_cast<int64_t>(*grace / 2) : 5000;
    g_abandon_after_ms.store(ms);
  }
  return std::chrono::milliseconds(ms);
}

void set_abandon_after(std::chrono::milliseconds after) {
  g_abandon_after_ms.store(after.count());
}

}  // namespace meshtrain::comm
