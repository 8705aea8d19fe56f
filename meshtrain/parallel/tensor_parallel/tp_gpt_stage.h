// A pipeline stage of the tensor-parallel GPT is the tensor-parallel GPT over a range of its
// layers: TpGPT(config, tp, begin, end).
#pragma once

#include "meshtrain/parallel/tensor_parallel/tp_gpt.h"

namespace meshtrain::parallel::tp {

using TpGPTStage = TpGPT;

}  // namespace meshtrain::parallel::tp
