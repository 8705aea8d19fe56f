// The GradSync of replicas that each step on their own gradients (gossip): nothing is reduced,
// and the engine learns so, to take each replica's gradient norm on its own.
#pragma once

#include "meshtrain/parallel/parts/grad_sync.h"

namespace meshtrain::parallel {

class LocalGradSync final : public GradSync {
 public:
  bool reduces_over_replicas() const override { return false; }
};

}  // namespace meshtrain::parallel
