// The waiting policy of a ShmProcessGroup, a template every process_group_shm*.cpp file that
// waits instantiates: spin while every rank has a core of its own, then yield, then sleep on the
// futex, checking the peers (a dead or aborted one is named) and the deadline on the way.
// Private to those files.
#pragma once

#include <immintrin.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <string>
#include <vector>

#include "meshtrain/comm/process_group_shm.h"
#include "meshtrain/comm/process_group_shm_layout.h"
#include "meshtrain/comm/process_group_shm_tuning.h"
#include "meshtrain/util/error.h"

namespace meshtrain::comm {
namespace shm_internal {

inline std::string join_ranks(const std::vector<int>& ranks) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  os << ']';
  return os.str();
}

}  // namespace shm_internal

template <typename Ready>
void ShmProcessGroup::wait_until(const OpContext& ctx, std::atomic<uint32_t>* word, Ready ready,
                                 const std::vector<int>& peers, const char* what) {
  if (oversubscribed_) {
    for (int i = 0; i < shm_internal::kOversubscribedSpins; ++i) {
      if (ready()) return;
      _mm_pause();
    }
  } else {
    // A core each, as far as this group knows: spin a little, then yield (other processes on the
    // machine may hold the other core, leaving this group's ranks to share one).
    const auto spin_until = std::chrono::steady_clock::now() + spin_for_;
    for (int i = 0; spin_for_.count() > 0; ++i) {
      if (ready()) return;
      _mm_pause();
      if ((i & 255) == 255 && std::chrono::steady_clock::now() >= spin_until) break;
    }
  }
  auto last_check = std::chrono::steady_clock::now();
  const auto yield_until = last_check + yield_for_;
  for (;;) {
    uint32_t seen = word->load(std::memory_order_acquire);
    if (ready()) return;
    // This rank's own abort first: its reason names the operation already.
    throw_if_aborted();
    if (header_->aborted.load(std::memory_order_acquire) == 1) {
      MT_THROW(CommError, "rank ", header_->abort_rank,
               " aborted the group: ", std::string(header_->abort_reason));
    }
    auto now = std::chrono::steady_clock::now();
    if (now - last_check >= std::chrono::milliseconds(50)) {
      check_peers(ctx, peers, what);
      last_check = now;
    }
    if (now >= ctx.deadline) {
      std::ostringstream os;
      os << "timed out after " << ctx.timeout.count() << " ms; ranks "
         << shm_internal::join_ranks(peers) << " did not answer (" << what << ")";
      for (int q : peers) {
        uint64_t s = blocks_[q].seq.load(std::memory_order_acquire);
        if (s == 0) {
          os << "; rank " << q << " has run no operation";
        } else {
          os << "; rank " << q << " is at seq " << s - 1;
        }
      }
      throw CommError(os.str());
    }
    if (now < yield_until) {
      ::sched_yield();
      continue;
    }
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(ctx.deadline - now);
    // Announce the sleep so that the waker makes the system call; the futex re-checks the word,
    // so a wake-up between the check above and the sleep is not lost.
    header_->sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (!ready())
      futex_wait(word, seen, std::min<std::chrono::microseconds>(left, shm_internal::kSleepSlice));
    header_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

}  // namespace meshtrain::comm
