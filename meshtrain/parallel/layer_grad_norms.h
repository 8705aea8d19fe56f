// Per-layer gradient norms (train.log_layer_norms), for telling which layer a loss spike or an
// exploding gradient comes from. A layer is a transformer block ("h.3": every parameter under
// it) or a top-level module of its own ("wte", "wpe", "ln_f", "lm_head"). The engine sums each
// layer's squared gradient elements over the unique shards (whole gradients under DDP and
// ZeRO-1, each rank's flat shard under ZeRO-2/3, added up across ranks in rank order), so the
// values equal DDP's whatever the stage, and their squares add up to the global norm's square.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/nn/module.h"

namespace meshtrain::parallel {

// "h.3.attn.c_attn.weight" -> "h.3"; "wte.weight" -> "wte"; "bias" -> "bias".
std::string layer_of(const std::string& param_name);

// The layers of a model, in the order their first parameter comes.
class LayerGroups {
 public:
  LayerGroups() = default;
  explicit LayerGroups(const std::vector<std::string>& param_names);

  size_t size() const { return names_.size(); }
  const std::vector<std::string>& names() const { return names_; }
  // The layer index of a parameter of the model; MT_CHECK that it is one.
  size_t index_of(const std::string& param_name) const;

  // Sum of squared gradient elements per layer over whole parameters (those with a gradient).
  std::vector<double> grad_squares(const nn::NamedTensors& params) const;
  // (layer, sqrt(squares)) in layer order.
  std::vector<std::pair<std::string, double>> norms(const std::vector<double>& squares) const;

 private:
  std::vector<std::string> names_;
  std::map<std::string, size_t> by_param_;
};

}  // namespace meshtrain::parallel
