// Where the ranks meet after writing a checkpoint's files, before rank 0 commits it. It runs
// on the checkpoint writer's thread, through the rendezvous store rather than the training
// process group, so it must ride out what a store can do that a collective cannot: an etcd
// leader change stalls requests for several seconds (etcd's request timeout is 5 s plus two
// election timeouts), so the wait is longer than a collective's deadline. A job that is
// stopping must not sit out that wait in the writer's destructor, so abandon() ends it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>

#include "meshtrain/comm/store.h"

namespace meshtrain::runtime {

class CheckpointBarrier {
 public:
  // Room for a store failover on top of the collective deadline.
  static constexpr comm::Duration kStoreFailover = std::chrono::seconds(60);

  // `collective_timeout`: dist.timeout_s; the barrier waits that plus `store_failover`.
  CheckpointBarrier(std::shared_ptr<comm::Store> store, int world,
                    comm::Duration collective_timeout,
                    comm::Duration store_failover = kStoreFailover);

  // Every rank calls it once per save of `step`. Returns once all `world` ranks have arrived;
  // TimeoutError when they have not within timeout(); CommError when abandon() is called while
  // it waits. Keyed by the step (and how often this rank saved it: a rollback saves a step
  // again), not by a count of saves, so that a process that replaced a rank mid-run (an
  // asynchronous parameter-server worker, which saved nothing before) meets the others at the
  // same keys.
  void arrive(int64_t step);

  // Arrives at the barrier of `step` for a rank that died after it was told to save it, without
  // waiting: the others go on, and rank 0 finds that rank's part missing and keeps the previous
  // checkpoint. Called by the process that replaced it (an asynchronous parameter-server worker).
  void arrive_for_predecessor(int64_t step);

  // Ends a wait in progress (and every later one) with CommError; any thread may call it.
  void abandon();

  comm::Duration timeout() const { return timeout_; }

 private:
  std::shared_ptr<comm::Store> store_;
  int world_;
  comm::Duration timeout_;
  // Counts this rank in at the barrier of `step` (the last one in marks it done); its key.
  std::string count_arrival(int64_t step);

  std::map<int64_t, int64_t> saves_;  // per step, this rank's saves of it so far
  std::atomic<bool> abandoned_{false};
};

}  // namespace meshtrain::runtime
