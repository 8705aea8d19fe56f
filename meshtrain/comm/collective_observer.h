// A process-wide hook that sees every collective when it finishes: its name, the bytes this rank
// contributed, how long it ran and whether it succeeded. The comm layer sits below metrics and
// must not depend on them, so whoever wants collective metrics (the runtime, through obs)
// installs a callback here. With no callback installed, issuing a collective costs one atomic
// load more.
#pragma once

#include <cstdint>
#include <functional>

namespace meshtrain::comm {

struct CollectiveEvent {
  const char* op = "";  // "all_reduce", "all_gather", ... (static storage)
  uint64_t bytes = 0;   // payload this rank contributed
  double seconds = 0;   // time the operation ran on the group's thread (queueing excluded)
  bool ok = true;
};

using CollectiveObserver = std::function<void(const CollectiveEvent&)>;

// Installs `fn` (an empty function removes it). Returns once no call to the previous observer is
// still running, so whatever it captured may be destroyed afterwards.
void set_collective_observer(CollectiveObserver fn);
bool has_collective_observer();
// Called by the process groups; does nothing without an observer. Never throws.
void notify_collective(const CollectiveEvent& event);

// Installs an observer for the lifetime of the object and removes it on destruction.
class ScopedCollectiveObserver {
 public:
  explicit ScopedCollectiveObserver(CollectiveObserver fn) {
    set_collective_observer(std::move(fn));
  }
  ~ScopedCollectiveObserver() { set_collective_observer({}); }
  ScopedCollectiveObserver(const ScopedCollectiveObserver&) = delete;
  ScopedCollectiveObserver& operator=(const ScopedCollectiveObserver&) = delete;
};

}  // namespace meshtrain::comm
