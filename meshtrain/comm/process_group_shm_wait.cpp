// ShmProcessGroup waiting: the spin / yield / futex policy, peers checked while waiting (a dead
// or aborted peer is named), and the meetings (barrier epochs) the staged collectives use.
#include "meshtrain/comm/process_group_shm.h"

#include <immintrin.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <utility>

#include "meshtrain/comm/process_group_shm_layout.h"
#include "meshtrain/comm/process_group_shm_tuning.h"
#include "meshtrain/comm/process_group_shm_wait.h"
#include "meshtrain/util/env_registry.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/log.h"

namespace meshtrain::comm {

using namespace shm_internal;

std::vector<int> ShmProcessGroup::waiting_for() const {
  std::vector<int> out;
  uint32_t mine = blocks_[rank()].arrived.load(std::memory_order_acquire);
  for (int q = 0; q < size(); ++q) {
    uint32_t theirs = blocks_[q].arrived.load(std::memory_order_acquire);
    if (static_cast<int32_t>(theirs - mine) < 0) out.push_back(q);
  }
  return out;
}

void ShmProcessGroup::check_peers(const OpContext& ctx, const std::vector<int>& peers,
                                  const char* what) {
  std::vector<int> dead;
  for (int q : peers) {
    if (!process_alive(blocks_[q].pid.load(std::memory_order_acquire))) dead.push_back(q);
  }
  if (!dead.empty()) {
    std::ostringstream os;
    os << "ranks " << join_ranks(dead) << " did not answer (" << what << "): ";
    for (size_t i = 0; i < dead.size(); ++i) {
      os << (i ? ", " : "") << "rank " << dead[i] << " (pid " << blocks_[dead[i]].pid.load()
         << ") has exited";
    }
    (void)ctx;
    throw CommError(os.str());
  }
}

void ShmProcessGroup::begin_op(const OpContext& ctx) {
  blocks_[rank()].seq.store(ctx.seq + 1, std::memory_order_release);
}

void ShmProcessGroup::meet(const OpContext& ctx) {
  const uint64_t e = ++epoch_;
  blocks_[rank()].arrived.store(static_cast<uint32_t>(e), std::memory_order_release);
  uint64_t total = header_->arrivals.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (total == e * static_cast<uint64_t>(size())) {
    header_->epoch.store(static_cast<uint32_t>(e), std::memory_order_seq_cst);
    if (header_->sleepers.load(std::memory_order_seq_cst) > 0) futex_wake_all(&header_->epoch);
    return;
  }
  auto done = [&] {
    return static_cast<int32_t>(header_->epoch.load(std::memory_order_acquire) -
                                static_cast<uint32_t>(e)) >= 0;
  };
  if (done()) return;
  std::vector<int> missing;
  try {
    std::vector<int> others;
    for (int q = 0; q < size(); ++q) {
      if (q != rank()) others.push_back(q);
    }
    wait_until(ctx, &header_->epoch, done, others, "barrier");
  } catch (const CommError& err) {
    for (int q = 0; q < size(); ++q) {
      uint32_t a = blocks_[q].arrived.load(std::memory_order_acquire);
      if (static_cast<int32_t>(a - static_cast<uint32_t>(e)) < 0) missing.push_back(q);
    }
    std::string msg = err.what();
    // Name the ranks that did not arrive rather than every peer.
    if (msg.rfind("timed out", 0) == 0) {
      std::ostringstream os;
      os << "timed out after " << ctx.timeout.count() << " ms; ranks " << join_ranks(missing)
         << " did not arrive";
      for (int q : missing) {
        uint64_t s = blocks_[q].seq.load(std::memory_order_acquire);
        os << "; rank " << q << (s == 0 ? " has run no operation" : " is at seq ")
           << (s == 0 ? std::string() : std::to_string(s - 1));
      }
      throw CommError(os.str());
    }
    throw;
  }
}

}  // namespace meshtrain::comm
