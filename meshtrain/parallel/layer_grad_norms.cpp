// See layer_grad_norms.h.
#include "meshtrain/parallel/layer_grad_norms.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "meshtrain/tensor/ops.h"
#include "meshtrain/util/error.h"

namespace meshtrain::parallel {

std::string layer_of(const std::string& param_name) {
  const size_t first = param_name.find('.');
  if (first == std::string::npos) return param_name;
  const size_t second = param_name.find('.', first + 1);
  const std::string index = param_name.substr(
      first + 1, second == std::string::npos ? std::string::npos : second - first - 1);
  const bool numbered = !index.empty() && second != std::string::npos &&
                        std::all_of(index.begin(), index.end(), [](char c) {
                          return std::isdigit(static_cast<unsigned char>(c));
                        });
  return numbered ? param_name.substr(0, second) : param_name.substr(0, first);
}

LayerGroups::LayerGroups(const std::vector<std::string>& param_names) {
  std::map<std::string, size_t> layer_index;
  for (const std::string& p : param_names) {
    const std::string layer = layer_of(p);
    auto [it, added] = layer_index.emplace(layer, names_.size());
    if (added) names_.push_back(layer);
    by_param_[p] = it->second;
  }
}

size_t LayerGroups::index_of(const std::string& param_name) const {
  auto it = by_param_.find(param_name);
  MT_CHECK(it != by_param_.end(), "parameter '", param_name, "' is not one of the model's");
  return it->second;
}

std::vector<double> LayerGroups::grad_squares(const nn::NamedTensors& params) const {
  std::vector<double> out(names_.size(), 0.0);
  for (const auto& [name, p] : params) {
    const Tensor g = p.grad();
    if (g.defined()) out[index_of(name)] += ops::sum_squares(g);
  }
  return out;
}

std::vector<std::pair<std::string, double>> LayerGroups::norms(
    const std::vector<double>& squares) const {
  MT_CHECK(squares.size() == names_.size(), "per-layer sums for ", squares.size(), " layers, not ",
           names_.size());
  std::vector<std::pair<std::string, double>> out;
  for (size_t l = 0; l < names_.size(); ++l) out.emplace_back(names_[l], std::sqrt(squares[l]));
  return out;
}

}  // namespace meshtrain::parallel
