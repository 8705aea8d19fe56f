// Module: a tree of layers with named parameters. Names are stable and hierarchical
// ("h.3.attn.c_attn.weight"), in registration order, so checkpoints, the data-parallel reducer's
// buckets and the PyTorch export all agree on them across runs and ranks.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/nn/param_info.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  NamedTensors named_parameters() const;
  std::vector<Tensor> parameters() const;
  NamedTensors named_buffers() const;
  // Parameters and buffers, the contents of a weights file.
  NamedTensors state_dict() const;
  // Copies values in by name. strict: every name must match both ways and shapes must agree;
  // errors name the tensor.
  void load_state_dict(const std::map<std::string, Tensor>& state, bool strict = true);

  // Moves every parameter, buffer and gradient to `device` in place: the tensors keep their
  // identity (set_data), so handles held by submodules and optimizers follow. Call before
  // creating an optimizer or a data-parallel reducer, whose state lives on the parameters' device.
  void to(Device device);
  Device device() const;  // the device of the first parameter (cpu when there is none)

  int64_t num_parameters() const;
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  void zero_grad();

  // Every parameter's ParamInfo, in named_parameters() order: replicated on every mesh
  // dimension, weight decay on matrices and embeddings, and the init its module registered.
  // Models add what only they know (tie groups) by overriding it.
  virtual std::vector<ParamInfo> param_infos() const;
  // Redraws every parameter from the generator keyed by (seed, its global name), so that the
  // values do not depend on which other parameters were built (ParamInfo).
  void init_parameters(uint64_t seed);

 protected:
  Tensor& register_parameter(const std::string& name, Tensor t, ParamInit init = {});
  Tensor& register_buffer(const std::string& name, Tensor t);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    children_.emplace_back(name, m);
    return m;
  }

 private:
  void collect(const std::string& prefix, NamedTensors& out, bool params) const;
  void collect_inits(std::vector<ParamInit>& out) const;

  bool training_ = true;
  NamedTensors params_;
  NamedTensors buffers_;
  std::vector<ParamInit> inits_;  // per entry of params_
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

}  // namespace meshtrain::nn
