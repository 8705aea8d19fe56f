#include "meshtrain/nn/gpt.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>

#include "meshtrain/autograd/checkpoint.h"
#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/grad_mode.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/nn/embedding.h"

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
  // Matmul parameters (embeddings excluded except the tied head, which is a real matmul).
  const double C = static_cast<double>(n_embd), L = static_cast<double>(n_layer);
  const double n_matmul = L * 12.0 * C * C + static_cast<double>(vocab_size) * C;
  // 6 FLOPs per parameter per token, plus attention scores and values: 6 * L * T * C (fwd+bwd,
  // causal halves the 12).
  return 6.0 * n_matmul + 6.0 * L * static_cast<double>(T) * C;
}

namespace gpt_parts {

BlockOptions block_options(const GPTConfig& config) {
  BlockOptions bo;
  bo.n_embd = config.n_embd;
  bo.n_head = config.n_head;
  bo.bias = config.bias;
  bo.dropout = config.dropout;
  bo.proj_init_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  return bo;
}

Tensor embed(const GPTConfig& config, const Tensor& idx, const Tensor& wte, const Tensor& wpe,
             uint64_t dropout_seed, bool training) {
  MT_CHECK(idx.dim() == 2, "GPT input must be [B, T] token ids, got ", shape_str(idx.shape()));
  MT_CHECK(idx.size(1) <= config.block_size, "sequence of ", idx.size(1),
           " tokens is longer than the model's context of ", config.block_size);
  Tensor x = autograd::gpt_embedding(idx, wte, wpe);
  return autograd::dropout(x, config.dropout, dropout_seed ^ 0x5eedull, 0, training);
}

Tensor block(const std::shared_ptr<Block>& block, size_t index, const Tensor& x, bool checkpointed,
             uint64_t dropout_seed) {
  const uint64_t seed = dropout_seed + 0x9e37ull * (index + 1);
  if (checkpointed && autograd::grad_enabled()) {
    // The block's dropout masks come from `seed`, which the recomputation reuses.
    return autograd::checkpoint(
        [block, seed](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{block->forward(in[0], seed)};
        },
        {x}, block->parameters())[0];
  }
  return block->forward(x, seed);
}

Tensor loss(const Tensor& logits, const Tensor& targets) {
  MT_CHECK(logits.dim() == 3 && targets.dim() == 2 && logits.size(0) == targets.size(0) &&
               logits.size(1) == targets.size(1),
           "targets ", shape_str(targets.shape()), " do not match logits ",
           shape_str(logits.shape()));
  const int64_t N = targets.numel();
  return autograd::cross_entropy(autograd::reshape(logits, {N, logits.size(2)}), targets.view({N}),
                                 -1);
}

}  // namespace gpt_parts

GPT::GPT(const GPTConfig& config) : config_(config) {
  config.validate();
  Generator gen(config.seed);
  wte_ = register_module("wte", std::make_shared<Embedding>(config.vocab_size, config.n_embd, gen))
             ->weight();
  wpe_ = register_module("wpe", std::make_shared<Embedding>(config.block_size, config.n_embd, gen))
             ->weight();
  const BlockOptions bo = gpt_parts::block_options(config);
  for (int64_t i = 0; i < config.n_layer; ++i)
    blocks_.push_back(register_module("h." + std::to_string(i), std::make_shared<Block>(bo, gen)));
  ln_f_ = register_module("ln_f", std::make_shared<LayerNorm>(config.n_embd, config.bias));
  checkpointed_ = config.checkpointed_per_block();
  if (!config.tie_embeddings) {
    lm_head_ = register_module("lm_head",
                               std::make_shared<Embedding>(config.vocab_size, config.n_embd, gen))
                   ->weight();
  }
  // Every value from its own keyed generator, so that any part of the model built alone
  // (a pipeline stage, an FSDP unit) starts from the values the whole model does.
  init_parameters(config.seed);
}

std::vector<ParamInfo> GPT::param_infos() const {
  std::vector<ParamInfo> infos = Module::param_infos();
  if (config_.tie_embeddings)
    for (ParamInfo& info : infos)
      if (info.name == "wte.weight") info.tie_group = "wte";
  return infos;
}

Tensor GPT::hidden(const Tensor& idx, uint64_t dropout_seed) const {
  Tensor x = gpt_parts::embed(config_, idx, wte_, wpe_, dropout_seed, is_training());
  for (size_t i = 0; i < blocks_.size(); ++i) {
    if (block_hooks_.before) block_hooks_.before(i);
    x = gpt_parts::block(blocks_[i], i, x, checkpointed_[i], dropout_seed);
    if (block_hooks_.after) x = block_hooks_.after(i, x);
  }
  return ln_f_->forward(x);
}

NamedTensors GPT::block_parameters(size_t i) const {
  MT_CHECK(i < blocks_.size(), "block ", i, " does not exist (the model has ", blocks_.size(), ")");
  NamedTensors out;
  const std::string prefix = "h." + std::to_string(i) + ".";
  for (auto& [name, t] : blocks_[i]->named_parameters()) out.emplace_back(prefix + name, t);
  return out;
}

void GPT::set_activation_checkpointing(const std::vector<bool>& blocks) {
  config_.checkpointed_blocks = blocks;
  config_.validate();
  checkpointed_ = config_.checkpointed_per_block();
}

Tensor GPT::logits_from_hidden(const Tensor& h) const {
  return autograd::linear(h, config_.tie_embeddings ? wte_ : lm_head_, Tensor());
}

Tensor GPT::forward(const Tensor& idx, uint64_t dropout_seed) const {
  return logits_from_hidden(hidden(idx, dropout_seed));
}

Tensor GPT::loss(const Tensor& idx, const Tensor& targets, uint64_t dropout_seed) const {
  MT_CHECK(targets.shape() == idx.shape(), "targets ", shape_str(targets.shape()),
           " do not match inputs ", shape_str(idx.shape()));
  return gpt_parts::loss(forward(idx, dropout_seed), targets);
}

std::vector<int32_t> GPT::generate(const std::vector<int32_t>& prompt, int64_t n, float temperature,
                                   int64_t top_k, Generator& gen) {
  autograd::NoGradGuard no_grad;
  const bool was_training = is_training();
  eval();
  std::vector<int32_t> seq = prompt;
  if (seq.empty()) seq.push_back(0);
  for (int64_t step = 0; step < n; ++step) {
    const int64_t T = std::min<int64_t>(static_cast<int64_t>(seq.size()), config_.block_size);
    std::vector<int32_t> window(seq.end() - T, seq.end());
    Tensor idx = Tensor::from_vector(window, {1, T}).to(wte_.device());
    Tensor h = hidden(idx, 0);
    Tensor last = h.view({T, config_.n_embd}).slice(T - 1, T);
    std::vector<float> logits = logits_from_hidden(last).to_vector();
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
