// The whole model's parameters from an expert-parallel rank's: every rank of the block receives
// the experts the others hold, so that one rank can build the plain model (final weights, text
// samples) with every expert under its own name.
#pragma once

#include <vector>

#include "meshtrain/nn/module.h"
#include "meshtrain/nn/param_info.h"
#include "meshtrain/parallel/expert/expert_groups.h"

namespace meshtrain::parallel {

// Collective over groups.block. `mine`: this rank's parameters (its experts and everything
// else); `whole_infos`: the whole model's, in its order. Returns every parameter of whole_infos.
nn::NamedTensors gather_experts(const nn::NamedTensors& mine,
                                const std::vector<nn::ParamInfo>& whole_infos,
                                const ExpertGroups& groups);

}  // namespace meshtrain::parallel
