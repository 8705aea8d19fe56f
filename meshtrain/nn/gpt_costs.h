// The GPT's parameter and FLOP counts, written once: the model's layer list (models::GPTStack,
// which pipeline partitioning balances), the MFU reports (GPTConfig::flops_per_token) and the
// planner's memory and time models (plan/) all read them here.
//
// Dimension letters: L layers, C channels, V vocabulary, T tokens of a sequence.
#pragma once

#include <cstdint>

namespace meshtrain::nn {

struct GPTConfig;

// Parameters of one block held by one of `tp` tensor-parallel ranks: c_attn and c_fc are
// column-parallel (weights and biases split), both c_proj row-parallel (weights split, biases
// replicated), the LayerNorms replicated. tp = 1: the whole block. `block` (its index; -1 for
// any dense block) counts a mixture-of-experts block's router and experts instead of its MLP.
int64_t gpt_block_params(const GPTConfig& c, int64_t tp = 1, int64_t block = -1);
// One expert of a mixture-of-experts block: a GPT-2 MLP of model.moe.expert_hidden features.
int64_t gpt_expert_params(const GPTConfig& c);
// One LayerNorm: its weight, and its bias when the model has biases.
int64_t gpt_norm_params(const GPTConfig& c);
// The embedding layer: wte [V, C] and wpe [T, C].
int64_t gpt_embedding_layer_params(const GPTConfig& c);
// The head layer: ln_f and the [V, C] projection, counted even when it is the tied embedding (a
// last pipeline stage holds a copy of it).
int64_t gpt_head_layer_params(const GPTConfig& c);
// The whole model, a tied projection counted once.
int64_t gpt_params(const GPTConfig& c);

// Forward plus backward FLOPs per token of each layer, as pipeline partitioning weighs them
// (gpt_costs.cpp says what is counted); a checkpointed block runs its forward once more.
int64_t gpt_embedding_layer_flops(const GPTConfig& c);
// A mixture-of-experts block (`block` as above) counts top_k experts' MLPs and its router.
int64_t gpt_block_flops(const GPTConfig& c, bool checkpointed, int64_t block = -1);
int64_t gpt_head_layer_flops(const GPTConfig& c);

// Forward+backward FLOPs per token of a sequence of T tokens, the usual 6N + attention (N the
// matmul parameters: embeddings left out, the head's projection counted), for MFU and
// throughput reports and the planner's step time: a block's share, the head's, and the whole.
double gpt_block_flops_per_token(const GPTConfig& c, int64_t T, int64_t block = -1);
double gpt_head_flops_per_token(const GPTConfig& c);
double gpt_flops_per_token(const GPTConfig& c, int64_t T);

}  // namespace meshtrain::nn
