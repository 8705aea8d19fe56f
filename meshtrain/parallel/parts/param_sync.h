// ParamSync: how the parameters a forward reads are made whole. None (every rank holds them),
// ZeRO-1/2's all-gather of the updated shards after the step (zero/zero_shards.h), ZeRO-3's
// gather of each unit before its forward and backward (zero/fsdp_parts.h).
#pragma once

#include <optional>

#include "meshtrain/nn/module.h"

namespace meshtrain::parallel {

class ParamSync {
 public:
  virtual ~ParamSync() = default;
  // Before a forward (training or evaluation): what it reads first is gathered.
  virtual void gather() {}
  // After a micro-batch's backward (or an evaluation forward): what is still gathered is freed.
  virtual void release() {}
  // After the update: the parameters every rank reads again hold the updated values.
  virtual void after_update() {}
  // False where the parameters hold no memory between steps (ZeRO-3): there are no replicas to
  // compare.
  virtual bool whole_at_rest() const { return true; }
  // Every parameter's whole value where this part holds them in pieces (collective); nothing
  // where the runner's parameters are whole.
  virtual std::optional<nn::NamedTensors> whole_parameters() const { return std::nullopt; }
  // After the last step: gives the model of `root` (-1: every rank) its whole parameters again;
  // false where there is nothing to gather. Collective.
  virtual bool gather_into_model(int /*root*/) { return false; }
};

}  // namespace meshtrain::parallel
