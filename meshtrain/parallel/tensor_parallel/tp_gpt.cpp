#include "meshtrain/parallel/tensor_parallel/tp_gpt.h"

#include "meshtrain/autograd/checkpoint.h"
#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/grad_mode.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/nn/embedding.h"
#include "meshtrain/parallel/tensor_parallel/region_mappings.h"
#include "meshtrain/parallel/tensor_parallel/sequence_dropout.h"
#include "meshtrain/parallel/tensor_parallel/vocab_parallel_cross_entropy.h"

namespace meshtrain::parallel::tp {

void validate_tensor_parallel(const nn::GPTConfig& config, int tp, bool sequence_parallel) {
  if (tp < 1) MT_THROW(ValueError, "parallel.tp must be at least 1, got ", tp);
  if (sequence_parallel && tp == 1)
    MT_THROW(ValueError,
             "parallel.sequence_parallel = true needs tensor parallelism: set parallel.tp > 1 "
             "or turn sequence_parallel off");
  if (config.n_embd % tp != 0)
    MT_THROW(ValueError, "model.n_embd (", config.n_embd, ") is not divisible by parallel.tp (", tp,
             "): choose a width that splits evenly over the tensor-parallel ranks");
  if (config.n_head % tp != 0)
    MT_THROW(ValueError, "model.n_head (", config.n_head, ") is not divisible by parallel.tp (", tp,
             "): each tensor-parallel rank needs whole attention heads");
}

TpGPT::TpGPT(const nn::GPTConfig& config, const TpContext& tp) : config_(config), tp_(tp) {
  config.validate();
  validate_tensor_parallel(config, tp.size(), tp.sequence_parallel);
  Generator unused(0);  // every value is drawn again, by name, in init_parameters
  wte_ = register_module(
      "wte", std::make_shared<VocabParallelEmbedding>(config.vocab_size, config.n_embd, tp));
  wpe_ = register_module("wpe",
                         std::make_shared<nn::Embedding>(config.block_size, config.n_embd, unused))
             ->weight();
  const nn::BlockOptions bo = nn::gpt_parts::block_options(config);
  for (int64_t i = 0; i < config.n_layer; ++i)
    blocks_.push_back(register_module("h." + std::to_string(i), std::make_shared<TpBlock>(bo, tp)));
  ln_f_ = register_module("ln_f", std::make_shared<nn::LayerNorm>(config.n_embd, config.bias));
  checkpointed_ = config.checkpointed_per_block();
  if (!config.tie_embeddings)
    lm_head_ = register_module(
        "lm_head", std::make_shared<VocabParallelEmbedding>(config.vocab_size, config.n_embd, tp));
  init_parameters(config.seed);
}

std::vector<nn::ParamInfo> TpGPT::param_infos() const {
  std::vector<nn::ParamInfo> infos = Module::param_infos();
  if (config_.tie_embeddings)
    for (nn::ParamInfo& info : infos)
      if (info.name == "wte.weight") info.tie_group = "wte";
  return infos;
}

namespace tp_gpt_parts {

Tensor embed(const nn::GPTConfig& config, const TpContext& tp, const VocabParallelEmbedding& wte,
             const Tensor& wpe, const Tensor& idx, uint64_t dropout_seed, bool training) {
  MT_CHECK(idx.dim() == 2, "GPT input must be [B, T] token ids, got ", shape_str(idx.shape()));
  const int64_t T = idx.size(1);
  MT_CHECK(T <= config.block_size, "sequence of ", T,
           " tokens is longer than the model's context of ", config.block_size);
  if (tp.sequence_parallel && T % tp.size() != 0)
    MT_THROW(ValueError, "sequence length ", T, " is not divisible by parallel.tp (", tp.size(),
             "), which parallel.sequence_parallel needs");
  Tensor x = wte.forward(idx);  // whole, or this rank's time steps
  const int64_t Tl = x.size(1), t0 = tp.sequence_parallel ? tp.rank() * Tl : 0;
  x = autograd::add(x, autograd::narrow(wpe, 0, t0, Tl));
  // nn::gpt_parts::embed's dropout seed.
  return sequence_dropout(x, config.dropout, dropout_seed ^ 0x5eedull, 0, training, t0, T);
}

Tensor block(const std::shared_ptr<TpBlock>& block, size_t index, const Tensor& x,
             bool checkpointed, uint64_t dropout_seed, int64_t T) {
  const uint64_t seed = dropout_seed + 0x9e37ull * (index + 1);  // nn::gpt_parts::block's
  if (checkpointed && autograd::grad_enabled()) {
    // The recomputation repeats the block's collectives, in the same order on every rank.
    return autograd::checkpoint(
        [block, seed, T](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{block->forward(in[0], seed, T)};
        },
        {x}, block->parameters())[0];
  }
  return block->forward(x, seed, T);
}

Tensor local_logits(const TpContext& tp, const Tensor& h, const VocabParallelEmbedding& head) {
  const Tensor in = tp.sequence_parallel ? gather_from_sequence_parallel(h, tp.group)
                                         : copy_to_tp_region(h, tp.group);
  return autograd::linear(in, head.weight(), Tensor());
}

Tensor loss(const TpContext& tp, const Tensor& h, const VocabParallelEmbedding& head,
            const Tensor& targets) {
  const Tensor logits = local_logits(tp, h, head);
  MT_CHECK(logits.dim() == 3 && targets.dim() == 2 && logits.size(0) == targets.size(0) &&
               logits.size(1) == targets.size(1),
           "targets ", shape_str(targets.shape()), " do not match logits ",
           shape_str(logits.shape()));
  const int64_t N = targets.numel();
  return vocab_parallel_cross_entropy(autograd::reshape(logits, {N, logits.size(2)}),
                                      targets.view({N}), head.vocab_begin(), head.vocab_valid(),
                                      tp.group, -1);
}

void reduce_sequence_parallel_grads(const TpContext& tp, const nn::NamedTensors& params,
                                    const std::vector<nn::ParamInfo>& infos) {
  if (!tp.sequence_parallel || tp.size() == 1) return;
  MT_CHECK(params.size() == infos.size(), "one ParamInfo per parameter");
  std::vector<Tensor> grads;
  int64_t total = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (infos[i].placement("tp").kind != nn::Placement::Kind::replicate) continue;
    Tensor g = params[i].second.grad();
    if (!g.defined()) continue;
    grads.push_back(g);
    total += g.numel();
  }
  if (total == 0) return;
  Tensor flat = Tensor::empty({total});
  int64_t at = 0;
  for (const Tensor& g : grads) {
    flat.slice(at, at + g.numel()).copy_(g.view({g.numel()}));
    at += g.numel();
  }
  comm::AllReduceOptions opts;
  opts.async_op = false;
  tp.group->all_reduce(flat.data_ptr(), static_cast<size_t>(total), DType::f32, opts)->wait();
  at = 0;
  for (Tensor g : grads) {
    g.copy_(flat.slice(at, at + g.numel()).view(g.shape()));
    at += g.numel();
  }
}

}  // namespace tp_gpt_parts

Tensor TpGPT::hidden(const Tensor& idx, uint64_t dropout_seed) const {
  const int64_t T = idx.dim() == 2 ? idx.size(1) : 0;
  Tensor x = tp_gpt_parts::embed(config_, tp_, *wte_, wpe_, idx, dropout_seed, is_training());
  for (size_t i = 0; i < blocks_.size(); ++i)
    x = tp_gpt_parts::block(blocks_[i], i, x, checkpointed_[i], dropout_seed, T);
  return ln_f_->forward(x);
}

Tensor TpGPT::local_logits(const Tensor& idx, uint64_t dropout_seed) const {
  return tp_gpt_parts::local_logits(tp_, hidden(idx, dropout_seed),
                                    config_.tie_embeddings ? *wte_ : *lm_head_);
}

Tensor TpGPT::loss(const Tensor& idx, const Tensor& targets, uint64_t dropout_seed) const {
  MT_CHECK(targets.shape() == idx.shape(), "targets ", shape_str(targets.shape()),
           " do not match inputs ", shape_str(idx.shape()));
  return tp_gpt_parts::loss(tp_, hidden(idx, dropout_seed),
                            config_.tie_embeddings ? *wte_ : *lm_head_, targets);
}

void TpGPT::reduce_sequence_parallel_grads() const {
  tp_gpt_parts::reduce_sequence_parallel_grads(tp_, named_parameters(), param_infos());
}

}  // namespace meshtrain::parallel::tp
