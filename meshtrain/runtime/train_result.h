// What a training run reports when it ends.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace meshtrain::runtime {

struct TrainResult {
  std::vector<float> train_losses;                    // one per step
  std::vector<std::pair<int64_t, float>> val_losses;  // (step, loss)
  int64_t skipped_steps = 0;                          // non-finite loss or gradient norm
  int64_t rollbacks = 0;                              // back to a checkpoint after bad steps
  int64_t overflow_steps = 0;  // f16: skipped by the loss scaler (non-finite gradients)
  double loss_scale = 0;       // f16: the loss scale after the last step; 0 otherwise
  // Units (the task's: tokens for a language model) per second, the median over steps after
  // the first.
  double throughput = 0;
  std::string throughput_unit;  // "tokens"
  std::string weights_path;     // empty when not saved
  std::string sample;           // the task's printout (generated text), empty when none
  // Checkpoints: the step this run resumed from (0 = a fresh start), the last step it ran, and
  // whether it stopped early on SIGTERM/SIGINT (after writing a checkpoint when enabled).
  int64_t resumed_step = 0;
  int64_t last_step = 0;
  bool preempted = false;
  bool preemption_saved = false;  // a checkpoint was written at the stop (checkpoints are on)
  // elastic.drop_stragglers: the run stopped after a checkpoint so that its elastic job meets
  // again without a straggling node (straggler_watch.h); left_out: this rank's node is it.
  bool regrouped = false;
  bool left_out = false;
  // The checkpoint resumed already reached train.steps: nothing was trained, written or logged
  // to the run's files.
  bool nothing_to_do = false;
};

}  // namespace meshtrain::runtime
