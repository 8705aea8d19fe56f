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
  checkpointed_ =
      nn::parse_activation_checkpointing(config.activation_checkpointing, config.n_layer);
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

Tensor TpGPT::hidden(const Tensor& idx, uint64_t dropout_seed) const {
  MT_CHECK(idx.dim() == 2, "GPT input must be [B, T] token ids, got ", shape_str(idx.shape()));
  const int64_t T = idx.size(1);
  MT_CHECK(T <= config_.block_size, "sequence of ", T,
           " tokens is longer than the model's context of ", config_.block_size);
  if (tp_.sequence_parallel && T % tp_.size() != 0)
    MT_THROW(ValueError, "sequence length ", T, " is not divisible by parallel.tp (", tp_.size(),
             "), which parallel.sequence_parallel needs");
  Tensor x = wte_->forward(idx);  // whole, or this rank's time steps
  const int64_t Tl = x.size(1), t0 = tp_.sequence_parallel ? tp_.rank() * Tl : 0;
  x = autograd::add(x, autograd::narrow(wpe_, 0, t0, Tl));
  // nn::gpt_parts::embed's and nn::gpt_parts::block's dropout seeds.
  x = sequence_dropout(x, config_.dropout, dropout_seed ^ 0x5eedull, 0, is_training(), t0, T);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const uint64_t seed = dropout_seed + 0x9e37ull * (i + 1);
    const std::shared_ptr<TpBlock>& block = blocks_[i];
    if (checkpointed_[i] && autograd::grad_enabled()) {
      // The recomputation repeats the block's collectives, in the same order on every rank.
      x = autograd::checkpoint(
          [block, seed, T](const std::vector<Tensor>& in) {
            return std::vector<Tensor>{block->forward(in[0], seed, T)};
          },
          {x}, block->parameters())[0];
    } else {
      x = block->forward(x, seed, T);
    }
  }
  return ln_f_->forward(x);
}

Tensor TpGPT::local_logits(const Tensor& idx, uint64_t dropout_seed) const {
  const Tensor h = hidden(idx, dropout_seed);
  const Tensor in = tp_.sequence_parallel ? gather_from_sequence_parallel(h, tp_.group)
                                          : copy_to_tp_region(h, tp_.group);
  const VocabParallelEmbedding& head = config_.tie_embeddings ? *wte_ : *lm_head_;
  return autograd::linear(in, head.weight(), Tensor());
}

Tensor TpGPT::loss(const Tensor& idx, const Tensor& targets, uint64_t dropout_seed) const {
  MT_CHECK(targets.shape() == idx.shape(), "targets ", shape_str(targets.shape()),
           " do not match inputs ", shape_str(idx.shape()));
  const Tensor logits = local_logits(idx, dropout_seed);
  const VocabParallelEmbedding& head = config_.tie_embeddings ? *wte_ : *lm_head_;
  const int64_t N = targets.numel();
  return vocab_parallel_cross_entropy(autograd::reshape(logits, {N, logits.size(2)}),
                                      targets.view({N}), head.vocab_begin(), head.vocab_valid(),
                                      tp_.group, -1);
}

void TpGPT::reduce_sequence_parallel_grads() const {
  if (!tp_.sequence_parallel || tp_.size() == 1) return;
  const nn::NamedTensors params = named_parameters();
  const std::vector<nn::ParamInfo> infos = param_infos();
  std::vector<Tensor> grads;
  int64_t total = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (infos[i].placement("tp").kind != nn::Placement::Kind::replicate) continue;
    Tensor g = params[i].second.grad();
    if (!g.defined()) continue;
    grads.push_back(g);
    total += g.numel();
  }
  // One all-reduce over all of them, every rank in named_parameters() order.
  Tensor flat = Tensor::empty({total});
  int64_t at = 0;
  for (const Tensor& g : grads) {
    flat.slice(at, at + g.numel()).copy_(g.view({g.numel()}));
    at += g.numel();
  }
  comm::AllReduceOptions opts;
  opts.async_op = false;
  tp_.group->all_reduce(flat.data_ptr(), static_cast<size_t>(total), DType::f32, opts)->wait();
  at = 0;
  for (Tensor g : grads) {
    g.copy_(flat.slice(at, at + g.numel()).view(g.shape()));
    at += g.numel();
  }
}

}  // namespace meshtrain::parallel::tp
