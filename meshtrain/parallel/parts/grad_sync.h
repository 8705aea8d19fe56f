// GradSync: how the step's gradients reach what the update reads. One implementation per way of
// synchronising them: none (one replica), the bucketed Reducer (all-reduce for DDP and ZeRO-1,
// reduce-scatter into shards for ZeRO-2; overlapped with backward through the gradient-ready
// hooks, or at once after backward passes no hook may see, as a pipeline's), and ZeRO-3's
// per-unit reduce-scatter (zero/fsdp_parts.h). The engine calls it the same way for all.
#pragma once

#include <cstddef>
#include <string>

#include "meshtrain/nn/module.h"

namespace meshtrain::parallel {

class Reducer;
class CommHook;
struct StepRecord;
struct StepOutcome;

class GradSync {
 public:
  virtual ~GradSync() = default;
  // Before the step's first backward: the gradients start from nothing (or zeros in place, where
  // they are views of the buffers the reduction works in).
  virtual void zero_grad(const nn::NamedTensors& params);
  // Around each micro-batch's backward; `last`: the step's last, after which the gradients are
  // synchronised (the others only accumulate).
  virtual void before_backward(bool /*last*/) {}
  virtual void after_backward(bool /*last*/) {}
  // The step's gradients are final in the parameters' .grad after backward passes that no hook
  // saw (a pipeline's program and its tied sum): reduces them now.
  virtual void reduce_held() {}
  // Waits for every reduction of the step.
  virtual void finish() {}
  // True where the step's record (step_record.h) travels with the gradients instead of the
  // engine's all-gather over the job (a parameter server's replies carry every worker's record,
  // so the workers never wait for each other); the engine then calls finish_with_record
  // instead of finish().
  virtual bool carries_records() const { return false; }
  // Finishes the step's synchronisation, fills out's rank_step_s, stop and save as
  // StepRecord::combine does, and returns the mean loss.
  virtual float finish_with_record(const StepRecord& mine, StepOutcome& out);
  // False where replicas step on their own (a parameter server's async, ssp or backup
  // workers): nothing may then make every replica wait for the others outside a checkpoint.
  virtual bool lockstep() const { return true; }
  // The start-up line's words for this way of synchronising ("" for the all-reduce).
  virtual std::string describe() const { return ""; }
  // Bytes of the buffers gradients pass through beyond the gradients themselves.
  virtual size_t in_flight_bytes() const { return 0; }
  // True where every replica updates with the same gradients, reduced over the data-parallel
  // group (or where there is one replica); false where each replica steps on its own (gossip):
  // then each replica clips by its own gradient norm, which no other replica's gradients enter.
  virtual bool reduces_over_replicas() const { return true; }
  // The bucketed reducer, where there is one (its statistics and comm hook).
  virtual Reducer* reducer() { return nullptr; }
};

}  // namespace meshtrain::parallel
