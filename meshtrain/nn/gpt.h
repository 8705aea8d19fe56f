// A GPT-2 style decoder: token + position embeddings, n_layer pre-norm blocks, a final LayerNorm
// and a language-model head tied to the token embedding. Parameter names follow GPT-2's
// (wte, wpe, h.N.ln_1, h.N.attn.c_attn, h.N.attn.c_proj, h.N.ln_2, h.N.mlp.c_fc, h.N.mlp.c_proj,
// ln_f) with PyTorch nn.Linear layouts ([out, in]).
//
// Dimension letters: B batch, T time (tokens), C channels (n_embd), V vocabulary, NH heads.
#pragma once

#include <functional>

#include <memory>
#include <string>
#include <vector>

#include "meshtrain/nn/block.h"
#include "meshtrain/nn/layer_norm.h"

namespace meshtrain::nn {

struct GPTConfig {
  int64_t vocab_size = 257;
  int64_t block_size = 128;  // maximum context
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  float dropout = 0.0f;
  bool bias = true;
  bool tie_embeddings = true;
  uint64_t seed = 1337;  // initialisation
  // Per block: its activations are recomputed in backward instead of kept (the config's
  // model.activation_checkpointing, resolved once by parse_activation_checkpointing). Empty: none;
  // blocks past its end are not checkpointed.
  std::vector<bool> checkpointed_blocks;

  // Validates the shape of the model; throws ValueError naming the field.
  void validate() const;
  // checkpointed_blocks as n_layer flags.
  std::vector<bool> checkpointed_per_block() const;
  // Forward+backward FLOPs per token (6N + attention), for MFU and throughput reports.
  double flops_per_token(int64_t T) const;
};

// Which of n_layer blocks a checkpointing spec selects: "none" (or ""), "all", "every:N" (blocks
// 0, N, 2N, ...) or a comma-separated list of block indices. ValueError naming the spec when it
// is malformed or an index is out of range.
std::vector<bool> parse_activation_checkpointing(const std::string& spec, int64_t n_layer);

// The pieces GPT's forward is made of, shared with the pipeline stages built from a part of it
// (models/gpt_stack.h), so that a stage computes exactly what the same layers of GPT do.
namespace gpt_parts {
BlockOptions block_options(const GPTConfig& config);
// Token + position embedding of idx[B, T] with the embedding dropout.
Tensor embed(const GPTConfig& config, const Tensor& idx, const Tensor& wte, const Tensor& wpe,
             uint64_t dropout_seed, bool training);
// Block `index` of the model (its global index: it picks the dropout masks), recomputed in
// backward when `checkpointed`.
Tensor block(const std::shared_ptr<Block>& block, size_t index, const Tensor& x, bool checkpointed,
             uint64_t dropout_seed);
// Mean cross-entropy of logits[B, T, V] against targets[B, T] (i32; -1 ignored).
Tensor loss(const Tensor& logits, const Tensor& targets);
}  // namespace gpt_parts

class GPT : public Module {
 public:
  explicit GPT(const GPTConfig& config);

  // idx[B, T] i32 -> logits[B, T, V].
  Tensor forward(const Tensor& idx, uint64_t dropout_seed = 0) const;
  // Mean cross-entropy against targets[B, T] (i32; -1 ignored).
  Tensor loss(const Tensor& idx, const Tensor& targets, uint64_t dropout_seed = 0) const;
  // Samples `n` tokens after the prompt (temperature; top_k 0 = all), without recording a graph.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int64_t n, float temperature,
                                int64_t top_k, Generator& gen);

  const GPTConfig& config() const { return config_; }
  // The token embedding is also the head's weight when they are tied: tie group "wte".
  std::vector<ParamInfo> param_infos() const override;
  // Chooses the checkpointed blocks (as GPTConfig::checkpointed_blocks) from the next forward on.
  void set_activation_checkpointing(const std::vector<bool>& blocks);
  const std::vector<bool>& checkpointed_blocks() const { return checkpointed_; }

  // Called around each block's forward: ZeRO-3 gathers a block's parameters in `before` and
  // frees them in `after`, which may return its input wrapped in an autograd Function whose
  // backward gathers them again. Empty functions: nothing is called.
  struct BlockHooks {
    std::function<void(size_t)> before;
    std::function<Tensor(size_t, const Tensor&)> after;
  };
  void set_block_hooks(BlockHooks hooks) { block_hooks_ = std::move(hooks); }
  size_t num_blocks() const { return blocks_.size(); }
  // The parameters of block i, named as in named_parameters() ("h.<i>.…").
  NamedTensors block_parameters(size_t i) const;

 private:
  Tensor hidden(const Tensor& idx, uint64_t dropout_seed) const;
  Tensor logits_from_hidden(const Tensor& h) const;

  GPTConfig config_;
  Tensor wte_;
  Tensor wpe_;
  Tensor lm_head_;  // only when embeddings are not tied
  std::vector<std::shared_ptr<Block>> blocks_;
  std::vector<bool> checkpointed_;  // per block
  std::shared_ptr<LayerNorm> ln_f_;
  BlockHooks block_hooks_;
};

}  // namespace meshtrain::nn
