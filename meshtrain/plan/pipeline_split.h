// The one rule for cutting a model into pipeline stages, for the plan check (a config, before
// any rank starts) and the planner's memory model (a candidate layout) alike, with one message
// each: pp x virtual_stages stages need at least one piece each of the model's pieces (a GPT's
// blocks, its embedding and its head: the stages balance all of them), and the interleaved
// schedule's chunks must divide the evenly cut pieces (a GPT's blocks) evenly.
#pragma once

#include <cstdint>
#include <string>

namespace meshtrain::plan {

struct PipelinePieces {
  int64_t total = 0;      // pieces a stage can hold
  int64_t even = 0;       // pieces the interleaved chunks must divide
  std::string what;       // "layers (model.n_layer = 2, the embedding and the head)"
  std::string even_what;  // "model.n_layer = 2"
};

PipelinePieces gpt_pipeline_pieces(int64_t n_layer);

// Throws ValueError ("config: ...") naming the keys and the way out.
void check_pipeline_split(int64_t pp, int64_t virtual_stages, const PipelinePieces& pieces);

}  // namespace meshtrain::plan
