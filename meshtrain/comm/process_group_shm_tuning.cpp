// ShmProcessGroup::tune: step, whole-reduce, inline and in-place thresholds and the waiting
// slices, from the group size, the cores it may use and the MESHTRAIN_SHM_* overrides.
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
#include "meshtrain/util/env_registry.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/log.h"

namespace meshtrain::comm {

using namespace shm_internal;

namespace {

// A MESHTRAIN_SHM_* override; 0 means the default where `allow_zero` is false. A value that is
// not a number stops the group with one line naming the variable.
size_t env_bytes(Env id, size_t fallback, bool allow_zero = false) {
  const auto x = env_count(id);
  return x && (*x > 0 || allow_zero) ? static_cast<size_t>(*x) : fallback;
}

}  // namespace

void shm_internal::check_shm_overrides() {
  for (Env id : {Env::shm_step_bytes, Env::shm_whole_bytes, Env::shm_inline_bytes, Env::shm_spin_us,
                 Env::shm_yield_us, Env::shm_shared_min_bytes, Env::shm_shared_chunk_bytes,
                 Env::shm_in_place_leave_us})
    (void)env_count(id);
}

void ShmProcessGroup::tune(int n, int cpus) {
  oversubscribed_ = n > cpus;
  // With more ranks than cores every meeting costs context switches, which outweigh keeping a
  // step in cache: take steps as large as the staging buffers.
  step_bytes_ = std::min(
      chunk_bytes_,
      round_up(env_bytes(Env::shm_step_bytes, oversubscribed_ ? chunk_bytes_ : kDefaultStepBytes),
               kLine));
  whole_bytes_ = env_bytes(Env::shm_whole_bytes,
                           oversubscribed_ ? kOversubscribedWholeReduceBytes : kWholeReduceBytes);
  inline_bytes_ = env_bytes(Env::shm_inline_bytes, kDefaultInlineBytes, true);
  spin_for_ = std::chrono::microseconds(
      env_bytes(Env::shm_spin_us, static_cast<size_t>(kSpinFor.count()), true));
  yield_for_ = std::chrono::microseconds(env_bytes(
      Env::shm_yield_us,
      static_cast<size_t>((oversubscribed_ ? kOversubscribedYieldFor : kYieldFor).count()), true));
  shared_min_bytes_ = env_bytes(Env::shm_shared_min_bytes,
                                oversubscribed_ ? kOversubscribedSharedMinBytes : kSharedMinBytes);
  shared_chunk_bytes_ = round_up(env_bytes(Env::shm_shared_chunk_bytes, kSharedChunkBytes), kLine);
  in_place_leave_.reset();
  if (const size_t us = env_bytes(Env::shm_in_place_leave_us, 0); us > 0) {
    in_place_leave_ = std::chrono::microseconds(us);
  } else if (cpus < 2 * n) {
    in_place_leave_ = kInPlaceLeaveToIssuer;
  }
}

}  // namespace meshtrain::comm
