#include "meshtrain/autograd/checkpoint.h"

#include <utility>

#include "meshtrain/autograd/autocast.h"
#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/function.h"
#include "meshtrain/autograd/grad_mode.h"

namespace meshtrain::autograd {
namespace {

using RngState = std::pair<uint64_t, uint64_t>;  // (seed, counter)

std::vector<RngState> rng_states(const std::vector<Generator*>& gens) {
  std::vector<RngState> s;
  for (const Generator* g : gens) s.emplace_back(g->seed(), g->counter());
  return s;
}

void set_rng_states(const std::vector<Generator*>& gens, const std::vector<RngState>& s) {
  for (size_t i = 0; i < gens.size(); ++i) gens[i]->set_state(s[i].first, s[i].second);
}

// The node's inputs are the segment inputs followed by the parameters.
class Checkpoint final : public Function {
 public:
  Checkpoint(CheckpointFn fn, size_t num_inputs, CheckpointOptions options)
      : fn_(std::move(fn)), num_inputs_(num_inputs), options_(std::move(options)) {}

  std::vector<Tensor> forward(const std::vector<Tensor>& all) override {
    autocast_ = autocast_dtype();
    rng_before_ = rng_states(options_.generators);
    std::vector<Tensor> inputs(all.begin(), all.begin() + static_cast<int64_t>(num_inputs_));
    for (const Tensor& t : inputs) {
      saved_inputs_.push_back(t.defined() ? t.detach() : Tensor());
      input_requires_grad_.push_back(t.defined() && t.requires_grad());
    }
    params_.assign(all.begin() + static_cast<int64_t>(num_inputs_), all.end());
    return fn_(inputs);
  }

  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs) override {
    // Fresh leaves stand in for the inputs, so the recomputed graph ends at them.
    std::vector<Tensor> leaves;
    for (size_t i = 0; i < num_inputs_; ++i) {
      Tensor t = saved_inputs_[i].defined() ? saved_inputs_[i].detach() : Tensor();
      if (input_requires_grad_[i]) t.set_requires_grad(true);
      leaves.push_back(std::move(t));
    }
    const std::vector<RngState> rng_after = rng_states(options_.generators);
    set_rng_states(options_.generators, rng_before_);
    std::vector<Tensor> outputs;
    {
      GradModeGuard record(true);
      AutocastGuard cast(autocast_);
      outputs = fn_(leaves);
    }
    set_rng_states(options_.generators, rng_after);
    MT_CHECK(outputs.size() == grad_outputs.size(), "checkpoint: the recomputation returned ",
             outputs.size(), " outputs, the forward ", grad_outputs.size());

    std::vector<Tensor> roots, root_grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].defined() && outputs[i].requires_grad()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grad_outputs[i]);
      }
    }
    std::vector<Tensor> wrt;
    std::vector<size_t> slot;  // where each of wrt's gradients goes among the node's inputs
    for (size_t i = 0; i < num_inputs_; ++i) {
      if (input_requires_grad_[i]) {
        wrt.push_back(leaves[i]);
        slot.push_back(i);
      }
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      wrt.push_back(params_[i]);
      slot.push_back(num_inputs_ + i);
    }
    std::vector<Tensor> result(num_inputs_ + params_.size());
    if (roots.empty()) return result;
    std::vector<Tensor> g = grad(roots, root_grads, wrt);
    for (size_t k = 0; k < g.size(); ++k) result[slot[k]] = std::move(g[k]);
    return result;
  }

  std::string name() const override { return "Checkpoint"; }

 private:
  CheckpointFn fn_;
  size_t num_inputs_;
  CheckpointOptions options_;
  DType autocast_ = DType::f32;
  std::vector<RngState> rng_before_;
  std::vector<Tensor> saved_inputs_;
  std::vector<bool> input_requires_grad_;
  std::vector<Tensor> params_;
};

}  // namespace

std::vector<Tensor> checkpoint(CheckpointFn fn, const std::vector<Tensor>& inputs,
                               const std::vector<Tensor>& params, CheckpointOptions options) {
  std::vector<Tensor> all = inputs;
  all.insert(all.end(), params.begin(), params.end());
  auto node = std::make_shared<Checkpoint>(std::move(fn), inputs.size(), std::move(options));
  return Function::apply(std::move(node), all);
}

}  // namespace meshtrain::autograd
