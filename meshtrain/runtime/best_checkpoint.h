// ckpt.keep_best: which step holds the best validation loss so far. The decision must be the
// same on every rank (a save is collective), so it is made from values every rank holds with the
// same bits: the validation loss as rank 0 computed it (the trainer broadcasts it, since ranks
// on hosts with other thread counts may round differently) and, after a resume, rank 0's reading
// of the checkpoint root, broadcast once.
//
// A save that becomes the best records `"val_loss"` and `"best": true` in its train state and
// moves `ROOT/best` after `latest`. A crash between the two leaves `best` at the previous best
// step (still kept by retention); the next resume sees the newest checkpoint's flag, finds it
// better than what `best` names and points `best` at it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "meshtrain/comm/process_group.h"

namespace meshtrain::runtime {

class BestCheckpoint {
 public:
  using LogFn = std::function<void(const std::string&)>;

  explicit BestCheckpoint(bool enabled) : enabled_(enabled) {}
  bool enabled() const { return enabled_; }

  // Whether a validation loss would be the new best: finite and strictly below the best so far.
  bool improves(float val_loss) const;
  void accept(int64_t step, float val_loss);
  // -1 and no loss before any.
  int64_t step() const { return step_; }
  std::optional<float> loss() const { return loss_; }

  // After a resume (rank 0 reads, every rank ends with its result; group null for one
  // process): the best so far is what `ROOT/best` names, with the loss recorded in its train
  // state, unless the resumed checkpoint (`resumed_state`, step `resumed_step`) was saved as a
  // new best and is better, in which case rank 0 points `best` at it and says so.
  void restore(const std::string& root, int64_t resumed_step, const nlohmann::json& resumed_state,
               int rank, comm::ProcessGroup* group, const LogFn& log);

 private:
  bool enabled_ = false;
  int64_t step_ = -1;
  std::optional<float> loss_;
};

}  // namespace meshtrain::runtime
