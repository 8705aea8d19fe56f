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

  // Every rank calls it once per save, in the same order. Returns once all `world` ranks have
  // arrived; TimeoutError when they have not within timeout(); CommError when abandon() is
  // called while it waits.
  void arrive();

  // Ends a wait in progress (and every later one) with CommError; any thread may call it.
  void abandon();

  comm::Duration timeout() const { return timeout_; }

 private:
  std::shared_ptr<comm::Store> store_;
  int world_;
  comm::Duration timeout_;
  int64_t seq_ = 0;  // saves repeat: every barrier has keys of its own
  std::atomic<bool> abandoned_{false};
};

}  // namespace meshtrain::runtime
