#include "meshtrain/parallel/parts/reducer_grad_sync.h"

namespace meshtrain::parallel {

ReducerGradSync::ReducerGradSync(std::unique_ptr<Reducer> reducer, bool held)
    : reducer_(std::move(reducer)), held_(held) {
  if (held_) reducer_->set_require_sync(false);
}

void ReducerGradSync::zero_grad(const nn::NamedTensors& params) {
  if (!held_) {
    GradSync::zero_grad(params);
    return;
  }
  // Held: from the second step on the gradients are views of the buckets (where the options keep
  // them so). Zeroed in place, the program's backwards accumulate straight into the buckets, with
  // no second copy of the gradients held until the reduction.
  for (const auto& [name, p] : params)
    if (Tensor g = p.grad(); g.defined()) g.zero_();
}

void ReducerGradSync::before_backward(bool last) {
  if (held_) return;
  reducer_->set_require_sync(last);
  reducer_->prepare_for_backward();
}

void ReducerGradSync::after_backward(bool /*last*/) {
  // The last micro-batch's buckets are waited for in finish(), behind the step's own collective.
  if (!held_) reducer_->launch_remaining();
}

void ReducerGradSync::reduce_held() {
  if (held_) reducer_->reduce_held_gradients();
}

void ReducerGradSync::finish() {
  if (!held_) reducer_->finalize_backward();  // exposed: what overlap did not hide
}

}  // namespace meshtrain::parallel
