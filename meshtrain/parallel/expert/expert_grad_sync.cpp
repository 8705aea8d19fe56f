#include "meshtrain/parallel/expert/expert_grad_sync.h"

#include "meshtrain/tensor/ops.h"
#include "meshtrain/util/error.h"

namespace meshtrain::parallel {

ExpertGradSync::ExpertGradSync(const nn::NamedTensors& params, const std::vector<bool>& is_expert,
                               const comm::ProcessGroupPtr& dense_group, const ExpertGroups& groups,
                               const ReducerOptions& options)
    : ep_(groups.ep) {
  MT_CHECK(is_expert.size() == params.size(), "one expert flag per parameter: ", is_expert.size(),
           " for ", params.size());
  nn::NamedTensors dense;
  for (size_t i = 0; i < params.size(); ++i)
    (is_expert[i] ? expert_params_ : dense).push_back(params[i]);
  MT_CHECK(!expert_params_.empty(), "expert parallelism without experts on this rank");
  dense_ = std::make_unique<Reducer>(dense, dense_group, options);
  if (groups.replica_group) {
    ReducerOptions eo = options;
    eo.divide_by = groups.data_parallel;
    experts_ = std::make_unique<Reducer>(expert_params_, groups.replica_group, eo);
  } else {
    expert_scale_ = 1.0f / static_cast<float>(groups.data_parallel);
  }
}

void ExpertGradSync::before_backward(bool last) {
  for (Reducer* r : {dense_.get(), experts_.get()}) {
    if (!r) continue;
    r->set_require_sync(last);
    r->prepare_for_backward();
  }
}

void ExpertGradSync::after_backward(bool /*last*/) {
  dense_->launch_remaining();
  if (experts_) experts_->launch_remaining();
}

void ExpertGradSync::finish() {
  dense_->finalize_backward();
  if (experts_) {
    experts_->finalize_backward();
    return;
  }
  for (auto& [name, p] : expert_params_)
    if (Tensor g = p.grad(); g.defined()) ops::scale_(g, expert_scale_);
}

size_t ExpertGradSync::in_flight_bytes() const {
  return dense_->pool_bytes() + (experts_ ? experts_->pool_bytes() : 0);
}

std::string ExpertGradSync::describe() const {
  return "experts shared out over " + std::to_string(ep_) + " expert-parallel ranks";
}

}  // namespace meshtrain::parallel
