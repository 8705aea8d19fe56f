// A termination signal seen by the process, as the process groups need to know it. A worker that
// gets SIGTERM finishes its step and saves (runtime/preemption.h); but a collective whose peers
// are gone (a partitioned host) would block it until the launcher's SIGKILL, and the worker would
// die without saying why. So every group's watchdog abandons an operation that still runs
// `abandon_after` after the signal: the group is aborted with a reason that names the operation,
// its sequence number and the ranks it was waiting for, the operation fails with it, and the
// worker exits with that line before the grace period ends.
//
// The signal handler records the signal with note_termination_signal(), which only stores to
// lock-free atomics (async-signal-safe); the watchdogs read it about every 100 ms.
#pragma once

#include <chrono>
#include <optional>

namespace meshtrain::comm {

// From a signal handler: the first signal and the time it arrived are kept.
void note_termination_signal(int sig) noexcept;
// Forgets the signal (tests that run several trainers in one process).
void clear_termination_signal() noexcept;

struct TerminationSignal {
  int sig = 0;
  std::chrono::steady_clock::time_point at;
};
std::optional<TerminationSignal> termination_signal() noexcept;

// How long an operation may go on after the signal before it is abandoned: long enough for a
// healthy step and its preemption save to finish their collectives, short enough to exit before
// the launcher's SIGKILL. Half the launcher's grace period when it says it
// (MESHTRAIN_GRACE_PERIOD_MS, set by meshrun), else 5 s (meshrun's default grace is 10 s).
std::chrono::milliseconds abandon_after();
// Replaces it (tests); a negative value goes back to the default.
void set_abandon_after(std::chrono::milliseconds after);

}  // namespace meshtrain::comm
