#include "meshtrain/nn/gpt.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>

#include "meshtrain/autograd/autocast.h"
#include "meshtrain/autograd/checkpoint.h"
#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/grad_mode.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/nn/embedding.h"
#include "meshtrain/nn/gpt_costs.h"

namespace meshtrain::nn {

void GPTConfig::validate() const {
  if (vocab_size < 1) MT_THROW(ValueError, "model.vocab_size must be positive, got ", vocab_size);
  if (block_size < 1) MT_THROW(ValueError, "model.block_size must be positive, got ", block_size);
  if (n_layer < 1) MT_THROW(ValueError, "model.n_layer must be positive, got ", n_layer);
  if (n_head < 1) MT_THROW(ValueError, "model.n_head must be positive, got ", n_head);
  if (n_embd < 1 || n_embd % n_head != 0)
    MT_THROW(ValueError, "model.n_embd (", n_embd,
             ") must be a positive multiple of model.n_head (", n_head, ")");
  if (!(dropout >= 0.0f && dropout < 1.0f))
    MT_THROW(ValueError, "model.dropout must be in [0, 1), got ", dropout);
  if (static_cast<int64_t>(checkpointed_blocks.size()) > n_layer)
    MT_THROW(ValueError, "model.activation_checkpointing names ", checkpointed_blocks.size(),
             " blocks; the model has ", n_layer);
  moe.validate(n_layer);
}

std::vector<bool> GPTConfig::checkpointed_per_block() const {
  std::vector<bool> out = checkpointed_blocks;
  out.resize(static_cast<size_t>(std::max<int64_t>(n_layer, 0)), false);
  return out;
}

std::vector<bool> parse_activation_checkpointing(const std::string& spec, int64_t n_layer) {
  const size_t n = static_cast<size_t>(std::max<int64_t>(n_layer, 0));
  if (spec.empty() || spec == "none") return std::vector<bool>(n, false);
  if (spec == "all") return std::vector<bool>(n, true);
  // The message is assembled by MT_THROW rather than with string operator+, which trips GCC 12's
  // -Wrestrict false positive.
  auto bad = [&](const auto&... why) {
    MT_THROW(ValueError, "model.activation_checkpointing = \"", spec, "\": ", why...,
             " (expected none, all, every:N or block indices like 0,2,3)");
  };
  auto number = [&](std::string_view text) {
    int64_t v = -1;
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || p != text.data() + text.size() || text.empty()) {
      bad("'", text, "' is not a number");
    }
    return v;
  };
  std::vector<bool> on(n, false);
  if (spec.rfind("every:", 0) == 0) {
    const int64_t every = number(std::string_view(spec).substr(6));
    if (every < 1) bad("N must be at least 1");
    for (size_t i = 0; i < n; i += static_cast<size_t>(every)) on[i] = true;
    return on;
  }
  std::string_view rest(spec);
  while (true) {
    const size_t comma = rest.find(',');
    const int64_t i = number(rest.substr(0, comma));
    if (i < 0 || i >= n_layer) bad("block ", i, " does not exist (the model has ", n_layer, ")");
    on[static_cast<size_t>(i)] = true;
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return on;
}

double GPTConfig::flops_per_token(int64_t T) const {
  return gpt_flops_per_token(*this, T);
}

namespace {

// The dropout masks are functions of (seed, element), and these keys give the embedding and each
// block its own: every way of holding the model (a stage, a tp shard, the whole) derives them
// from the step's seed and the block's global index, so all drop the same elements.
uint64_t embedding_dropout_seed(uint64_t step_seed) {
  return step_seed ^ 0x5eedull;
}
uint64_t block_dropout_seed(uint64_t step_seed, size_t block) {
  return step_seed + 0x9e37ull * (block + 1);
}

BlockOptions block_options(const GPTConfig& config) {
  BlockOptions bo;
  bo.n_embd = config.n_embd;
  bo.n_head = config.n_head;
  bo.bias = config.bias;
  bo.dropout = config.dropout;
  bo.proj_init_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  return bo;
}

}  // namespace

GPT::GPT(const GPTConfig& config)
    : GPT(config, plain_gpt_layers(), 0, static_cast<size_t>(config.n_layer) + 2) {}

GPT::GPT(const GPTConfig& config, std::shared_ptr<ExpertExchange> experts)
    : GPT(config, plain_gpt_layers(), 0, static_cast<size_t>(config.n_layer) + 2,
          std::move(experts)) {}

GPT::GPT(const GPTConfig& config, std::shared_ptr<const GPTLayers> layers, size_t begin, size_t end,
         std::shared_ptr<ExpertExchange> experts)
    : config_(config), layers_(std::move(layers)), begin_(begin), end_(end) {
  config.validate();
  layers_->validate(config);
  const size_t n_layers = num_layers();
  MT_CHECK(begin < end && end <= n_layers, "GPT layers [", begin, ", ", end,
           ") are not a non-empty range of the model's ", n_layers, " layers");
  // The draws from `gen` are replaced below by init_parameters' keyed ones; it only feeds the
  // layers' constructors. Modules are registered in the whole model's order, so that any range's
  // parameters follow it.
  Generator gen(config.seed);
  if (is_first() || (is_last() && config.tie_embeddings))
    wte_ = register_module("wte", layers_->vocab(config.vocab_size, config.n_embd, gen));
  if (is_first())
    wpe_ =
        register_module("wpe", std::make_shared<Embedding>(config.block_size, config.n_embd, gen))
            ->weight();
  BlockOptions bo = block_options(config);
  first_block_ = is_first() ? 0 : begin - 1;
  const size_t last_block = is_last() ? n_layers - 2 : end - 1;  // one past
  std::vector<std::string> moe_blocks;
  for (size_t i = first_block_; i < last_block; ++i)
    if (config.moe.is_moe_block(static_cast<int64_t>(i)))
      moe_blocks.push_back("h." + std::to_string(i));
  if (!moe_blocks.empty()) {
    if (layers_->ranks() > 1)
      MT_THROW(ValueError,
               "model.moe.every > 0 cannot be split over parallel.tp ranks yet; use "
               "parallel.tp = 1");
    moe_context_ =
        std::make_shared<MoEContext>(moe_blocks, config.moe.num_experts, std::move(experts));
  }
  bo.moe = config.moe;
  size_t moe_index = 0;
  for (size_t i = first_block_; i < last_block; ++i) {
    const bool moe = config.moe.is_moe_block(static_cast<int64_t>(i));
    bo.moe_context = moe ? moe_context_ : nullptr;
    bo.moe_layer = moe ? moe_index++ : 0;
    blocks_.push_back(
        register_module("h." + std::to_string(i), std::make_shared<Block>(bo, layers_, gen)));
  }
  checkpointed_ = config.checkpointed_per_block();
  if (is_last()) {
    ln_f_ = register_module("ln_f", std::make_shared<LayerNorm>(config.n_embd, config.bias));
    if (!config.tie_embeddings)
      lm_head_ = register_module("lm_head", layers_->vocab(config.vocab_size, config.n_embd, gen));
  }
  // Every value from its own keyed generator, so that any part of the model built alone starts
  // from the values the whole model does.
  init_parameters(config.seed);
}

std::vector<ParamInfo> GPT::param_infos() const {
  std::vector<ParamInfo> infos = Module::param_infos();
  if (config_.tie_embeddings)
    for (ParamInfo& info : infos)
      if (info.name == "wte.weight") info.tie_group = "wte";
  for (ParamInfo& info : infos)
    if (info.name.find(".mlp.experts.") != std::string::npos) info.expert = true;
  return infos;
}

Tensor GPT::embed(const Tensor& idx, uint64_t dropout_seed) const {
  MT_CHECK(idx.dim() == 2, "GPT input must be [B, T] token ids, got ", shape_str(idx.shape()));
  const int64_t T = idx.size(1);
  MT_CHECK(T <= config_.block_size, "sequence of ", T,
           " tokens is longer than the model's context of ", config_.block_size);
  hidden_shape(idx.size(0), T);  // refuses a sequence that does not split over the ranks
  return layers_->dropout(wte_->embed(idx, wpe_), config_.dropout,
                          embedding_dropout_seed(dropout_seed), 0, is_training());
}

Tensor GPT::blocks(Tensor x, uint64_t dropout_seed) const {
  for (size_t k = 0; k < blocks_.size(); ++k) {
    const size_t i = first_block_ + k;
    if (block_hooks_.before) block_hooks_.before(k);
    const std::shared_ptr<Block>& block = blocks_[k];
    const uint64_t seed = block_dropout_seed(dropout_seed, i);
    if (checkpointed_[i] && autograd::grad_enabled()) {
      // The recomputation reuses `seed`, so it draws the same masks, and repeats the block's
      // collectives in the same order on every rank.
      x = autograd::checkpoint(
          [block, seed](const std::vector<Tensor>& in) {
            return std::vector<Tensor>{block->forward(in[0], seed)};
          },
          {x}, block->parameters())[0];
    } else {
      x = block->forward(x, seed);
    }
    if (block_hooks_.after) x = block_hooks_.after(k, x);
  }
  return x;
}

Tensor GPT::forward(const Tensor& input, const Tensor& targets, uint64_t dropout_seed) const {
  Tensor x = is_first() ? embed(input, dropout_seed) : input;
  x = blocks(x, dropout_seed);
  if (!is_last()) return x;
  // Under autocast the final norm hands a head that takes half input its output rounded.
  return head().loss_of_hidden(
      ln_f_->forward(x, autograd::output_type_for(head().takes_half_hidden())), targets);
}

Tensor GPT::forward(const Tensor& idx, uint64_t dropout_seed) const {
  MT_CHECK(is_first() && is_last(),
           "only the whole model maps tokens to logits; this one holds "
           "layers [",
           begin_, ", ", end_, ")");
  return head().logits(ln_f_->forward(blocks(embed(idx, dropout_seed), dropout_seed)));
}

Tensor GPT::loss(const Tensor& idx, const Tensor& targets, uint64_t dropout_seed) const {
  MT_CHECK(is_first() && is_last(),
           "only the whole model maps tokens to a loss; this one holds "
           "layers [",
           begin_, ", ", end_, ")");
  MT_CHECK(targets.shape() == idx.shape(), "targets ", shape_str(targets.shape()),
           " do not match inputs ", shape_str(idx.shape()));
  return forward(idx, targets, dropout_seed);
}

Shape GPT::hidden_shape(int64_t B, int64_t T) const {
  const int split = layers_->sequence_ranks();
  if (T % split != 0)
    MT_THROW(ValueError, "sequence length ", T, " is not divisible by parallel.tp (", split,
             "), which parallel.sequence_parallel needs");
  return {B, T / split, config_.n_embd};
}

Shape GPT::input_shape(int64_t B, int64_t T) const {
  if (is_first()) return {B, T};
  return hidden_shape(B, T);
}

Shape GPT::output_shape(int64_t B, int64_t T) const {
  if (is_last()) return {};
  return hidden_shape(B, T);
}

NamedTensors GPT::block_parameters(size_t i) const {
  MT_CHECK(i < blocks_.size(), "block ", i, " does not exist (the model has ", blocks_.size(), ")");
  NamedTensors out;
  const std::string prefix = "h." + std::to_string(first_block_ + i) + ".";
  for (auto& [name, t] : blocks_[i]->named_parameters()) out.emplace_back(prefix + name, t);
  return out;
}

void GPT::set_activation_checkpointing(const std::vector<bool>& blocks) {
  config_.checkpointed_blocks = blocks;
  config_.validate();
  checkpointed_ = config_.checkpointed_per_block();
}

std::vector<int32_t> GPT::generate(const std::vector<int32_t>& prompt, int64_t n, float temperature,
                                   int64_t top_k, Generator& gen) {
  MT_CHECK(is_first() && is_last() && layers_->ranks() == 1,
           "only the whole plain model generates text");
  autograd::NoGradGuard no_grad;
  const bool was_training = is_training();
  eval();
  std::vector<int32_t> seq = prompt;
  if (seq.empty()) seq.push_back(0);
  for (int64_t step = 0; step < n; ++step) {
    const int64_t T = std::min<int64_t>(static_cast<int64_t>(seq.size()), config_.block_size);
    std::vector<int32_t> window(seq.end() - T, seq.end());
    Tensor idx = Tensor::from_vector(window, {1, T}).to(wte_->weight().device());
    Tensor h = ln_f_->forward(blocks(embed(idx, 0), 0));
    Tensor last = h.view({T, config_.n_embd}).slice(T - 1, T);
    std::vector<float> logits = head().logits(last).to_vector();
    const int64_t V = static_cast<int64_t>(logits.size());
    std::vector<int32_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    int64_t k = top_k > 0 ? std::min(top_k, V) : V;
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    int32_t next = order[0];
    if (temperature > 0.0f) {
      std::vector<double> p(static_cast<size_t>(k));
      const double mx = logits[order[0]];
      double total = 0;
      for (int64_t i = 0; i < k; ++i)
        total += p[i] = std::exp((logits[order[i]] - mx) / temperature);
      double u = gen.uniform() * total;
      for (int64_t i = 0; i < k; ++i) {
        u -= p[i];
        if (u <= 0) {
          next = order[i];
          break;
        }
      }
    }
    seq.push_back(next);
  }
  train(was_training);
  return std::vector<int32_t>(seq.begin() + static_cast<int64_t>(prompt.size()), seq.end());
}

}  // namespace meshtrain::nn
