// Gradients under expert parallelism: everything but the experts is averaged over the whole
// data-parallel group (DDP's reducer); each expert's gradient already sums its block's tokens
// (they came to it by all-to-all), so it is summed over the expert's copies in the other blocks
// only and divided by the data-parallel size, which makes it the gradient a plain data-parallel
// run computes. Both reducers overlap backward through their gradient-ready hooks.
#pragma once

#include <memory>

#include "meshtrain/parallel/ddp/reducer.h"
#include "meshtrain/parallel/expert/expert_groups.h"
#include "meshtrain/parallel/parts/grad_sync.h"

namespace meshtrain::parallel {

class ExpertGradSync : public GradSync {
 public:
  // `params`: the runner's, split by `is_expert` (one flag per parameter, in order). `dense_group`
  // reduces the others.
  ExpertGradSync(const nn::NamedTensors& params, const std::vector<bool>& is_expert,
                 const comm::ProcessGroupPtr& dense_group, const ExpertGroups& groups,
                 const ReducerOptions& options);

  void before_backward(bool last) override;
  void after_backward(bool last) override;
  void finish() override;
  size_t in_flight_bytes() const override;
  std::string describe() const override;
  Reducer* reducer() override { return dense_.get(); }

 private:
  std::unique_ptr<Reducer> dense_;
  std::unique_ptr<Reducer> experts_;  // null: one copy of each expert
  nn::NamedTensors expert_params_;
  float expert_scale_ = 1.0f;  // without copies: 1 / data-parallel size
  int ep_ = 1;
};

}  // namespace meshtrain::parallel
