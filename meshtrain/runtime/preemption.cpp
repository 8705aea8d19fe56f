// See preemption.h. A second signal of the same kind while the guard is installed still only
// sets the flag; the launcher escalates to SIGKILL after its grace period if the step hangs.
#include "meshtrain/runtime/preemption.h"

#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "meshtrain/comm/termination.h"
#include "meshtrain/util/error.h"

namespace meshtrain::runtime {
namespace {

std::atomic<int> g_requested{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal flag must be lock-free");

// Several trainers may run in one process (one per thread in tests): the first guard installs
// the handlers, the last one restores the previous ones.
std::mutex g_mu;
int g_guards = 0;
struct sigaction g_previous_term;
struct sigaction g_previous_int;

extern "C" void on_preemption_signal(int sig) {
  g_requested.store(sig, std::memory_order_relaxed);
  // A collective blocked on peers that are gone is abandoned later (comm/termination.h).
  comm::note_termination_signal(sig);
}

}  // namespace

PreemptionGuard::PreemptionGuard() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_guards++ > 0) return;
  g_requested.store(0);
  comm::clear_termination_signal();
  struct sigaction sa {};
  sa.sa_handler = on_preemption_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGTERM, &sa, &g_previous_term);
  ::sigaction(SIGINT, &sa, &g_previous_int);
}

PreemptionGuard::~PreemptionGuard() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (--g_guards > 0) return;
  ::sigaction(SIGTERM, &g_previous_term, nullptr);
  ::sigaction(SIGINT, &g_previous_int, nullptr);
}

int PreemptionGuard::requested() {
  return g_requested.load(std::memory_order_relaxed);
}

void PreemptionGuard::reset() {
  g_requested.store(0);
  comm::clear_termination_signal();
}

std::string preemption_message(int64_t step, bool saved, std::string_view unsaved) {
  const int sig = PreemptionGuard::requested();
  const char* abbrev = sig != 0 ? ::sigabbrev_np(sig) : nullptr;
  // A rank that did not see the signal itself stops because another rank did.
  std::string what =
      abbrev != nullptr ? detail::str_cat("SIG", abbrev) : "a signal to another rank";
  if (saved)
    return detail::str_cat("preempted by ", what, " at step ", step,
                           "; checkpoint saved, run again to resume");
  return detail::str_cat("preempted by ", what, " at step ", step, "; ",
                         unsaved.empty() ? "checkpoints are off (ckpt.interval = 0)" : unsaved,
                         ", nothing saved");
}

void maybe_crash_for_test(int64_t step, int rank, int world, const FaultPlan& plan) {
  if (!plan.crash_now(step, rank, world)) return;
  MT_THROW(Error, "MESHTRAIN_TEST_CRASH_AT_STEP: simulated crash of rank ", rank, " at step ",
           step);
}

}  // namespace meshtrain::runtime
