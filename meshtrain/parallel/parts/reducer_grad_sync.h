// The bucketed Reducer as the engine's GradSync: all-reduce (DDP, ZeRO-1) or reduce-scatter into
// shards (ZeRO-2), per the reducer's options. Overlapped: each bucket's collective starts from the
// gradient-ready hooks as backward produces it. Held: for a runner whose backward passes no hook
// may follow (a pipeline program, whose gradients are final only after its last micro-batch and
// the tied copies' sum), the hooks stay idle and reduce_held() reduces every bucket at once.
#pragma once

#include <memory>

#include "meshtrain/parallel/ddp/reducer.h"
#include "meshtrain/parallel/parts/grad_sync.h"

namespace meshtrain::parallel {

class ReducerGradSync : public GradSync {
 public:
  ReducerGradSync(std::unique_ptr<Reducer> reducer, bool held);

  void zero_grad(const nn::NamedTensors& params) override;
  void before_backward(bool last) override;
  void after_backward(bool last) override;
  void reduce_held() override;
  void finish() override;
  size_t in_flight_bytes() const override { return reducer_->pool_bytes(); }
  Reducer* reducer() override { return reducer_.get(); }

 private:
  std::unique_ptr<Reducer> reducer_;
  bool held_;
};

}  // namespace meshtrain::parallel
