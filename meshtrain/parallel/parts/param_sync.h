// ParamSync: how the parameters a forward reads are made whole. None (every rank holds them),
// ZeRO-1/2's all-gather of the updated shards after the step (zero/zero_shards.h), ZeRO-3's
// gather of each unit before its forward and backward (zero/fsdp_parts.h), gossip averaging with
// neighbouring replicas after each replica's own update (gossip/gossip_average.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

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
  // False where the replicas hold different parameters between steps by design (gossip: each
  // steps on its own gradients and only averages with its neighbours): comparing them would
  // report a divergence that is the strategy itself.
  virtual bool replicas_equal() const { return true; }
  // The strategy for the engine's start-up line where this part is what defines it ("gossip
  // averaging over a ring of 4 replicas"); empty where the engine names it.
  virtual std::string describe() const { return {}; }
  // Bytes of the buffers parameters are exchanged through, beyond the parameters themselves and
  // what the GradSync's in_flight_bytes counts.
  virtual size_t exchange_bytes() const { return 0; }
  // Every parameter's whole value where this part holds them in pieces (collective); nothing
  // where the runner's parameters are whole.
  virtual std::optional<nn::NamedTensors> whole_parameters() const { return std::nullopt; }
  // After the last step: gives the model of `root` (-1: every rank) its whole parameters again;
  // false where there is nothing to gather. Collective.
  virtual bool gather_into_model(int /*root*/) { return false; }
  // A process that replaces one that failed, in a job that went on without it (asynchronous
  // parameter-server workers): takes the running job's parameters and returns the step to
  // continue after; nullopt where a job cannot be joined.
  virtual std::optional<int64_t> join_running_job() { return std::nullopt; }
};

}  // namespace meshtrain::parallel
