// The optimizer base: named parameters split into groups (each with its own weight decay), a
// learning rate, per-parameter state slots, and the state as named tensors plus scalars so that a
// checkpoint can store it next to the model and reshard it like any other tensor.
//
// Concrete optimizers (SGD, AdamW) only say which state slots they keep and how one parameter is
// updated; walking the groups, skipping parameters without a gradient, creating state on first
// use, counting steps and (de)serialising the state is done once here.
//
// Step counts are kept per parameter, as torch.optim does: a parameter that had no gradient in a
// step is not updated and its count does not advance (AdamW's bias corrections and SGD's
// momentum initialisation depend on it).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/tensor/cpu/step_gate.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::optim {

using NamedParams = std::vector<std::pair<std::string, Tensor>>;

// The optimizers a run can choose (optim.name).
enum class OptimizerKind { adamw, sgd };

struct ParamGroup {
  NamedParams params;
  float weight_decay = 0.0f;
};

// The GPT convention (nanoGPT): weight decay on matrices and embeddings (dim() >= 2), none on
// biases and LayerNorm gains. Returns {decayed group, undecayed group}; either may be empty.
std::vector<ParamGroup> decay_groups(const NamedParams& params, float weight_decay);

// Optimizer state in checkpoint form. Tensor names are "<slot>.<param name>", for example
// "exp_avg.h.0.attn.c_attn.weight"; scalars are "step" (calls to step()), "lr", and
// "step.<param name>" (updates applied to that parameter).
struct OptimizerState {
  NamedParams tensors;
  std::map<std::string, double> scalars;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Updates every parameter that has a gradient; parameters without one are left alone. Each
  // gradient is taken times grad_scale (a clipping coefficient: optim::clip_coefficient), with
  // the bits of scaling the gradients in memory first. An optimizer that reads the scale with
  // each gradient (AdamW) spares that pass and leaves the gradients as they were; for the others
  // the gradients are scaled in memory.
  void step(float grad_scale = 1.0f);
  // step() decided on the device (optim/step_gate.h): `gate` holds a cpu::StepGate there, whose
  // skip leaves parameters and state as they were and whose coef is the gradient scale. The
  // host cannot know which yet, so the step is counted as taken; revert_step() takes the counts
  // back once it learns that the gate skipped it (once, and only the last step, if gated). For
  // optimizers that read a gate (reads_step_gate()) over device parameters.
  void step_gated(const Tensor& gate);
  void revert_step();
  virtual bool reads_step_gate() const { return false; }
  // Drops every gradient (set_to_none, the default) or zeroes it in place.
  void zero_grad(bool set_to_none = true);

  float lr() const { return lr_; }
  void set_lr(float lr);
  int64_t step_count() const { return step_count_; }

  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // State slot names kept per parameter, e.g. {"exp_avg", "exp_avg_sq"}.
  const std::vector<std::string>& slot_names() const { return slot_names_; }

  // A snapshot (the tensors are copies). Parameters that were never updated have no entries.
  OptimizerState state_dict() const;
  // The same without copies: the tensors are this optimizer's own and change with the next
  // step(). For a checkpoint writer that copies them in the background before that step.
  OptimizerState state_view() const;
  // Replaces the state. Every tensor must name a known slot and parameter with the parameter's
  // shape, and every parameter with a nonzero step count must have all its slots; otherwise
  // throws ValueError and leaves the current state unchanged.
  void load_state_dict(const OptimizerState& state);

  // The state tensor of one slot of one parameter; undefined before its first update.
  Tensor state_tensor(const std::string& slot, const std::string& param_name) const;

 protected:
  struct ParamState {
    int64_t step = 0;           // updates applied to this parameter
    std::vector<Tensor> slots;  // one per slot name, created as zeros on first update
  };

  Optimizer(std::vector<ParamGroup> groups, float lr, std::vector<std::string> slot_names);

  // Applies one update to `param` (f32, contiguous, on any device) from `grad` (same shape and
  // device). `state.step`
  // has already been advanced, so it is 1 on the parameter's first update.
  virtual void update(Tensor& param, const Tensor& grad, ParamState& state,
                      const ParamGroup& group) = 0;
  // Called once after every update() of a step (and before an exception leaves step()): an
  // optimizer that queues its device updates to apply them together issues them here.
  virtual void flush_updates() {}
  // Whether update() and flush_updates() read each gradient times grad_scale() themselves; if
  // not, step() scales the gradients in memory first.
  virtual bool reads_grad_scale() const { return false; }
  // The scale of the step in progress.
  float grad_scale() const { return grad_scale_; }
  // The gate of the step in progress (device memory; null: the host decided).
  const cpu::StepGate* step_gate() const { return gate_; }

 private:
  struct ParamIndex {
    size_t group;
    size_t index;
  };
  const ParamIndex& find_param(const std::string& name) const;
  void update_all();

  std::vector<ParamGroup> groups_;
  std::vector<std::vector<ParamState>> state_;  // [group][param]
  std::map<std::string, ParamIndex> by_name_;
  std::vector<std::string> slot_names_;
  float lr_;
  float grad_scale_ = 1.0f;
  int64_t step_count_ = 0;
  const cpu::StepGate* gate_ = nullptr;
  std::vector<ParamIndex> last_updated_;  // whose counts the last step advanced
  bool revertible_ = false;               // the last step was gated and not taken back yet
};

}  // namespace meshtrain::optim
