// A GPT-2 style decoder: token + position embeddings, n_layer pre-norm blocks, a final LayerNorm
// and a language-model head tied to the token embedding. Parameter names follow GPT-2's
// (wte, wpe, h.N.ln_1, h.N.attn.c_attn, h.N.attn.c_proj, h.N.ln_2, h.N.mlp.c_fc, h.N.mlp.c_proj,
// ln_f) with PyTorch nn.Linear layouts ([out, in]).
//
// There is one GPT. It is built through a layer factory (gpt_layers.h: plain, or split over
// tensor-parallel ranks) over a range [begin, end) of its layers as models::GPTStack lists them
// (0 the embedding, 1..n_layer the blocks h.0..h.{n_layer-1}, n_layer + 1 the head), so the
// whole model, a pipeline stage, a tensor-parallel shard and a shard of a stage are this class
// built with different arguments. Whatever the arguments, a parameter has the whole model's name,
// whole shape and initial value (drawn by name, nn/param_info.h), and a layer computes what the
// same layer of the whole plain model computes, dropout masks included.
//
// With tied embeddings a range holding the head but not the embedding keeps its own copy of
// wte.weight in tie group "wte": whoever runs the stages keeps the copies equal.
//
// Dimension letters: B batch, T time (tokens), C channels (n_embd), V vocabulary, NH heads.
#pragma once

#include <functional>

#include <memory>
#include <string>
#include <vector>

#include "meshtrain/models/model_stack.h"
#include "meshtrain/nn/block.h"
#include "meshtrain/nn/gpt_layers.h"
#include "meshtrain/nn/layer_norm.h"
#include "meshtrain/nn/moe_config.h"
#include "meshtrain/nn/moe_context.h"

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
  // Mixture-of-experts blocks (none by default).
  MoEConfig moe;

  // Validates the shape of the model; throws ValueError naming the field.
  void validate() const;
  // checkpointed_blocks as n_layer flags.
  std::vector<bool> checkpointed_per_block() const;
  // Forward+backward FLOPs per token (6N + attention), for MFU and throughput reports
  // (gpt_costs.h).
  double flops_per_token(int64_t T) const;
};

// Which of n_layer blocks a checkpointing spec selects: "none" (or ""), "all", "every:N" (blocks
// 0, N, 2N, ...) or a comma-separated list of block indices. ValueError naming the spec when it
// is malformed or an index is out of range.
std::vector<bool> parse_activation_checkpointing(const std::string& spec, int64_t n_layer);

class GPT : public models::StageModule {
 public:
  // The whole plain model.
  explicit GPT(const GPTConfig& config);
  // The whole model whose mixture-of-experts blocks hold this rank's share of the experts.
  GPT(const GPTConfig& config, std::shared_ptr<ExpertExchange> experts);
  // Layers [begin, end) of models::GPTStack(config).layers(), built through `layers`.
  // ValueError naming the config keys when `layers` cannot hold this model.
  GPT(const GPTConfig& config, std::shared_ptr<const GPTLayers> layers, size_t begin, size_t end,
      std::shared_ptr<ExpertExchange> experts = nullptr);

  // The whole model: idx[B, T] i32 -> the logits this rank holds ([B, T, V] plain).
  Tensor forward(const Tensor& idx, uint64_t dropout_seed = 0) const;
  // The whole model: mean cross-entropy against targets[B, T] (i32; -1 ignored), the same value
  // on every rank.
  Tensor loss(const Tensor& idx, const Tensor& targets, uint64_t dropout_seed = 0) const;
  // The whole plain model: samples `n` tokens after the prompt (temperature; top_k 0 = all),
  // without recording a graph.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int64_t n, float temperature,
                                int64_t top_k, Generator& gen);

  // As a pipeline stage: the first range reads token ids [B, T] (i32), the others the hidden
  // state as this rank holds it ([B, T, C], or [B, T / tp, C] with sequence parallelism); the
  // last returns the mean loss against targets[B, T], the others the hidden state.
  Tensor forward(const Tensor& input, const Tensor& targets, uint64_t dropout_seed) const override;
  bool is_first() const override { return begin_ == 0; }
  bool is_last() const override { return end_ == num_layers(); }
  Shape input_shape(int64_t B, int64_t T) const override;
  Shape output_shape(int64_t B, int64_t T) const override;

  const GPTConfig& config() const { return config_; }
  const GPTLayers& layers() const { return *layers_; }
  // The token embedding is also the head's weight when they are tied: tie group "wte".
  std::vector<ParamInfo> param_infos() const override;
  // Chooses the checkpointed blocks (a spec as in GPTConfig) from the next forward on.
  void set_activation_checkpointing(const std::vector<bool>& blocks);
  // Per block of the whole model.
  const std::vector<bool>& checkpointed_blocks() const { return checkpointed_; }
  // What this range's mixture-of-experts blocks share (null when it has none).
  const std::shared_ptr<MoEContext>& moe_context() const { return moe_context_; }

  // Called around each block's forward: ZeRO-3 gathers a block's parameters in `before` and
  // frees them in `after`, which may return its input wrapped in an autograd Function whose
  // backward gathers them again. Empty functions: nothing is called. The index is the block's
  // place in this range.
  struct BlockHooks {
    std::function<void(size_t)> before;
    std::function<Tensor(size_t, const Tensor&)> after;
  };
  void set_block_hooks(BlockHooks hooks) { block_hooks_ = std::move(hooks); }
  size_t num_blocks() const { return blocks_.size(); }
  // The parameters of block i of this range, named as in named_parameters() ("h.<n>.…").
  NamedTensors block_parameters(size_t i) const;

 protected:
  // The token table that holds the embedding, or the tied head's copy of it.
  const VocabTable& token_table() const { return *wte_; }

 private:
  size_t num_layers() const { return static_cast<size_t>(config_.n_layer) + 2; }
  // The hidden state between stages: [B, T, C], or this rank's [B, T / tp, C].
  Shape hidden_shape(int64_t B, int64_t T) const;
  Tensor embed(const Tensor& idx, uint64_t dropout_seed) const;
  Tensor blocks(Tensor x, uint64_t dropout_seed) const;
  const VocabTable& head() const { return config_.tie_embeddings ? *wte_ : *lm_head_; }

  GPTConfig config_;
  std::shared_ptr<const GPTLayers> layers_;
  size_t begin_ = 0;
  size_t end_ = 0;
  std::shared_ptr<VocabTable> wte_;  // the embedding, or the tied head's copy of it
  Tensor wpe_;
  size_t first_block_ = 0;  // global index of blocks_[0]
  std::vector<std::shared_ptr<Block>> blocks_;
  std::vector<bool> checkpointed_;  // per global block index
  std::shared_ptr<LayerNorm> ln_f_;
  std::shared_ptr<VocabTable> lm_head_;  // untied head
  BlockHooks block_hooks_;
  std::shared_ptr<MoEContext> moe_context_;
};

}  // namespace meshtrain::nn
