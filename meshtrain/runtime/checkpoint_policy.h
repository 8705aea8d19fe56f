// When a run saves: every ckpt.interval steps, once ckpt.interval_minutes passed (rank 0's clock
// decides, timed_checkpoints.h), at a new best validation loss (ckpt.keep_best,
// best_checkpoint.h), at the last step, when an observer asks (StepContext::checkpoint_now: a
// straggler left out), and on a stop signal, after which the loop ends. A
// failed save stops the run or is reported, as ckpt.on_error says.
#pragma once

#include <cstdint>
#include <optional>

#include "meshtrain/runtime/best_checkpoint.h"
#include "meshtrain/runtime/step_observer.h"
#include "meshtrain/runtime/timed_checkpoints.h"

namespace meshtrain::runtime {

class CheckpointPolicy : public StepObserver {
 public:
  // After the resume: restores the best-so-far record of the run it continues.
  explicit CheckpointPolicy(RunState& run);
  void before_step(RunState& run, StepContext& step) override;
  void after_step(RunState& run, StepContext& step) override;
  void on_step_end(RunState& run, StepContext& step) override;
  void on_end(RunState& run) override;

 private:
  // A failed save (a full disk, an I/O error) ends the run, or is reported and training goes
  // on. The failure of an asynchronous save surfaces at the next save: it is reported and this
  // step's save is started in its place.
  void save(RunState& run, int64_t step, std::optional<float> val_loss, bool best);
  void wait(RunState& run);
  void failed(RunState& run, const IoError& error);

  TimedCheckpoints timed_;
  BestCheckpoint best_;
};

}  // namespace meshtrain::runtime
