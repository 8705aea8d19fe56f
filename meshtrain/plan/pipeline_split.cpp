#include "meshtrain/plan/pipeline_split.h"

#include "meshtrain/util/error.h"

namespace meshtrain::plan {

PipelinePieces gpt_pipeline_pieces(int64_t n_layer) {
  const std::string layers = "model.n_layer = " + std::to_string(n_layer);
  return {n_layer + 2, n_layer, "layers (" + layers + ", the embedding and the head)", layers};
}

void check_pipeline_split(int64_t pp, int64_t virtual_stages, const PipelinePieces& pieces) {
  const int64_t stages = pp * virtual_stages;
  if (stages > pieces.total)
    MT_THROW(ValueError, "config: parallel.pp x parallel.virtual_stages = ", stages,
             " pipeline stages is more than the model's ", pieces.total, " ", pieces.what,
             "; lower parallel.pp or add layers");
  if (virtual_stages > 1 && pieces.even % stages != 0)
    MT_THROW(ValueError, "config: parallel.virtual_stages = ", virtual_stages,
             ": the interleaved schedule's ", stages,
             " chunks (parallel.pp x parallel.virtual_stages) do not divide ", pieces.even_what,
             " evenly; choose values whose product divides it");
}

}  // namespace meshtrain::plan
