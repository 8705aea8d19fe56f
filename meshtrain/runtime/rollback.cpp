// See rollback.h.
#include "meshtrain/runtime/rollback.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "meshtrain/util/error.h"

namespace meshtrain::runtime {

RollbackPolicy::RollbackPolicy(int64_t rollback_after, int64_t max_rollbacks)
    : after_(rollback_after), max_(max_rollbacks) {
  MT_CHECK(rollback_after >= 0 && max_rollbacks >= 0, "negative rollback settings ", rollback_after,
           " and ", max_rollbacks);
}

bool RollbackPolicy::on_step(int64_t step, bool bad) {
  if (!bad) {
    streak_ = 0;
    first_bad_ = -1;
    return false;
  }
  if (streak_++ == 0) first_bad_ = step;
  if (after_ == 0 || streak_ < after_) return false;
  if (rollbacks_ >= max_)
    MT_THROW(Error, "steps ", first_bad_, "..", step, ": ", streak_,
             " consecutive non-finite losses or gradient norms after ", rollbacks_,
             " rollbacks (train.max_rollbacks = ", max_, "); stopping");
  return true;
}

void RollbackPolicy::rolled_back() {
  ++rollbacks_;
  streak_ = 0;
  first_bad_ = -1;
}

bool inject_nan_for_test(int64_t step, int rank, int world, int64_t rollbacks,
                         const FaultPlan& plan) {
  return plan.nan_now(step, rank, world, rollbacks);
}

float inject_spike_for_test(int64_t step, int rank, int world, const FaultPlan& plan) {
  return plan.loss_scale_now(step, rank, world);
}

}  // namespace meshtrain::runtime
