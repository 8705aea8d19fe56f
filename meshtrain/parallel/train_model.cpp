#include "meshtrain/parallel/train_model.h"

namespace meshtrain::parallel {

nn::NamedTensors TrainModel::whole_parameters() const {
  nn::NamedTensors out;
  for (const auto& [name, p] : module().named_parameters())
    out.emplace_back(name, p.to(Device::cpu()).clone());
  return out;
}

}  // namespace meshtrain::parallel
