#include "meshtrain/runtime/checkpoint_policy.h"

#include "meshtrain/runtime/preemption.h"
#include "meshtrain/util/log.h"

namespace meshtrain::runtime {

CheckpointPolicy::CheckpointPolicy(RunState& run)
    // Only rank 0's clock decides; the other ranks never read theirs.
    : timed_(run.rank == 0 && run.checkpoints ? run.config.config.ckpt.interval_minutes : 0.0,
             checkpoint_clock()),
      best_(run.config.config.ckpt.keep_best && run.checkpoints != nullptr) {
  // A run that resumed nothing starts its own record, whatever an earlier run left in the root.
  if (best_.enabled() && run.start_step > 0)
    best_.restore(run.checkpoints->root(), run.start_step, run.checkpoints->resumed_state(),
                  run.rank, run.group, [&run](const std::string& line) { run.log(line, nullptr); });
}

void CheckpointPolicy::before_step(RunState& run, StepContext& step) {
  step.options.save_request = timed_.due();
  // The previous step's checkpoint may still be copying the parameters and the optimizer state
  // (it overlaps this step's forward and backward); the update must not start before that.
  if (TrainerCheckpoints* checkpoints = run.checkpoints)
    step.options.before_update = [checkpoints]() { checkpoints->wait_snapshot(); };
}

void CheckpointPolicy::after_step(RunState&, StepContext& step) {
  // The same on every rank: the validation loss is rank 0's value everywhere.
  step.new_best = best_.enabled() && step.val_loss && best_.improves(*step.val_loss);
  if (step.new_best) step.record["best"] = true;
}

void CheckpointPolicy::on_step_end(RunState& run, StepContext& step) {
  const CkptConfig& c = run.config.config.ckpt;
  const parallel::StepOutcome& out = step.outcome;
  const bool on_interval = c.interval > 0 && step.step % c.interval == 0;
  // Ranks that are not in lock step (asynchronous parameter-server workers) are each at a step of
  // their own: the engine says which steps every rank reached (out.save), and only those are
  // checkpoints; an interval step that another rank stopped short of is none.
  const bool agreed = run.engine.lockstep();
  const bool due = agreed ? on_interval || step.last || out.stop || step.new_best || out.save ||
                                step.checkpoint_now
                          : out.save;
  if (run.checkpoints && due) {
    if (agreed && out.save && !on_interval)
      run.log(detail::str_cat("checkpoint at step ", step.step, ": ckpt.interval_minutes = ",
                              c.interval_minutes, " passed since the last one"),
              nullptr);
    save(run, step.step, step.val_loss, step.new_best);
    timed_.saved();
  }
  if (step.new_best) {
    best_.accept(step.step, *step.val_loss);
    run.log(detail::str_cat("new best val_loss ", *step.val_loss, " at step ", step.step, "; ",
                            run.checkpoints->root(), "/best will name it"),
            nullptr);
  }
  if (out.stop && !step.last) {
    if (run.checkpoints) wait(run);
    run.result.preempted = true;
    run.result.preemption_saved = run.checkpoints != nullptr && due;
    run.log(preemption_message(step.step, run.result.preemption_saved,
                               run.checkpoints ? "the workers are not in lock step (asynchronous, "
                                                 "or with backup workers); a rerun resumes "
                                                 "from the last ckpt.interval step"
                                               : ""),
            nullptr);
    step.stop = true;
  }
}

void CheckpointPolicy::on_end(RunState& run) {
  if (run.checkpoints) wait(run);
}

void CheckpointPolicy::save(RunState& run, int64_t step, std::optional<float> val_loss, bool best) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      run.checkpoints->save(step, run.engine, run.loader, val_loss, best);
      return;
    } catch (const IoError& e) {
      if (run.config.choice.on_error != OnSaveError::continue_training) throw;
      failed(run, e);
    }
  }
}

void CheckpointPolicy::wait(RunState& run) {
  try {
    run.checkpoints->wait();
  } catch (const IoError& e) {
    if (run.config.choice.on_error != OnSaveError::continue_training) throw;
    failed(run, e);
  }
}

void CheckpointPolicy::failed(RunState& run, const IoError& e) {
  const std::string line =
      std::string(e.what()) + "; training continues (ckpt.on_error = continue)";
  if (run.rank == 0)
    run.log(line, nullptr);
  else
    MT_LOG_WARN("ckpt", "rank ", run.rank, ": ", line);
}

}  // namespace meshtrain::runtime
