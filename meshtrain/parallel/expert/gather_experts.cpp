#include "meshtrain/parallel/expert/gather_experts.h"

#include <map>
#include <string>

#include "meshtrain/util/error.h"

namespace meshtrain::parallel {

nn::NamedTensors gather_experts(const nn::NamedTensors& mine,
                                const std::vector<nn::ParamInfo>& whole_infos,
                                const ExpertGroups& groups) {
  std::map<std::string, Tensor> held(mine.begin(), mine.end());
  // Experts per block rank, from the number of experts a layer's names show.
  int64_t experts = 0;
  for (const nn::ParamInfo& info : whole_infos) {
    if (!info.expert) continue;
    const size_t at = info.name.find(".experts.");
    MT_CHECK(at != std::string::npos, "expert parameter '", info.name,
             "' is not named <layer>.experts.<index>.<name>");
    experts = std::max<int64_t>(experts, std::stoll(info.name.substr(at + 9)) + 1);
  }
  const int64_t share = std::max<int64_t>(1, experts / groups.ep);
  nn::NamedTensors out;
  for (const nn::ParamInfo& info : whole_infos) {
    if (!info.expert) {
      const auto it = held.find(info.name);
      MT_CHECK(it != held.end(), "parameter '", info.name, "' is not on this rank");
      out.emplace_back(info.name, it->second);
      continue;
    }
    // Every block rank walks the same names in the same order: one broadcast per expert tensor
    // from the rank holding it.
    const int64_t e = std::stoll(info.name.substr(info.name.find(".experts.") + 9));
    const int owner = static_cast<int>(e / share);
    Tensor t;
    if (owner == groups.coord) {
      const auto it = held.find(info.name);
      MT_CHECK(it != held.end(), "expert parameter '", info.name, "' is not on its rank ", owner);
      t = it->second.clone();
    } else {
      t = Tensor::empty(info.shape);
    }
    groups.block
        ->broadcast(t.data<float>(), static_cast<size_t>(t.numel()), DType::f32, {.root = owner})
        ->wait();
    out.emplace_back(info.name, std::move(t));
  }
  return out;
}

}  // namespace meshtrain::parallel
