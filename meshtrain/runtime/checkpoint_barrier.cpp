// See checkpoint_barrier.h.
#include "meshtrain/runtime/checkpoint_barrier.h"

#include <algorithm>

#include "meshtrain/util/error.h"

namespace meshtrain::runtime {
namespace {

// How often a waiting barrier looks at abandon(): the stop it delays is at most this long.
constexpr comm::Duration kSlice = std::chrono::milliseconds(250);

}  // namespace

CheckpointBarrier::CheckpointBarrier(std::shared_ptr<comm::Store> store, int world,
                                     comm::Duration collective_timeout,
                                     comm::Duration store_failover)
    : store_(std::move(store)), world_(world), timeout_(collective_timeout + store_failover) {
  MT_CHECK(store_ != nullptr, "a checkpoint barrier needs the rendezvous store");
  MT_CHECK(world_ >= 1, "checkpoint barrier world size ", world_);
}

std::string CheckpointBarrier::count_arrival(int64_t step) {
  // The store given to the trainer is private to this attempt of the job, so the step and its
  // save count tell saves apart.
  const std::string key = detail::str_cat("ckpt/barrier/", step, "/", saves_[step]++);
  if (store_->add(key, 1) == world_) store_->set_string(key + "/done", "1");
  return key;
}

void CheckpointBarrier::arrive(int64_t step) {
  const std::string key = count_arrival(step);
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (true) {
    if (abandoned_.load())
      MT_THROW(CommError, "checkpoint barrier ", key, " abandoned: the job is stopping");
    const auto left =
        std::chrono::duration_cast<comm::Duration>(deadline - std::chrono::steady_clock::now());
    if (left <= comm::Duration(0)) {
      MT_THROW(TimeoutError, "checkpoint barrier ", key, ": not every one of the ", world_,
               " ranks arrived within ", timeout_.count(),
               " ms (dist.timeout_s plus room for a store failover); a rank may have died "
               "while saving: see its log");
    }
    try {
      store_->wait({key + "/done"}, std::min(left, kSlice));
      return;
    } catch (const TimeoutError&) {
      // the slice ended: look at abandon() and the deadline again
    }
  }
}

void CheckpointBarrier::arrive_for_predecessor(int64_t step) {
  (void)count_arrival(step);
}

void CheckpointBarrier::abandon() {
  abandoned_.store(true);
}

}  // namespace meshtrain::runtime
