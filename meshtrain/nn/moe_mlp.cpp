#include "meshtrain/nn/moe_mlp.h"

#include <cmath>

#include "meshtrain/autograd/autocast.h"
#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/grad_mode.h"
#include "meshtrain/autograd/moe_ops.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/nn/linear.h"

namespace meshtrain::nn {

autograd::ExpertMlp expert_mlp_weights(const MLP& mlp) {
  autograd::ExpertMlp w;
  for (const auto& [name, t] : mlp.named_parameters()) {
    if (name == "c_fc.weight") w.fc_weight = t;
    if (name == "c_fc.bias") w.fc_bias = t;
    if (name == "c_proj.weight") w.proj_weight = t;
    if (name == "c_proj.bias") w.proj_bias = t;
  }
  return w;
}

MoEMLP::MoEMLP(int64_t n_embd, bool bias, const MoEConfig& config,
               std::shared_ptr<MoEContext> context, size_t layer, Generator& gen,
               double proj_init_std)
    : config_(config), context_(std::move(context)), layer_(layer) {
  router_ = register_module("router", std::make_shared<Linear>(n_embd, config.num_experts,
                                                               /*bias=*/false, gen, 0.02));
  if (config.bias_update_rate > 0) {
    // A buffer: checkpointed and restored with the model, the same on every replica.
    expert_bias_ = register_buffer("expert_bias", Tensor::zeros({config.num_experts}));
    context_->balance_with(layer_, expert_bias_, static_cast<float>(config.bias_update_rate));
  }
  const GPTLayers& plain = *plain_gpt_layers();
  // Under expert parallelism this rank holds its share, under the whole layer's names.
  const std::shared_ptr<ExpertExchange>& ex = context_->experts();
  const int64_t share = ex ? config.num_experts / ex->size() : config.num_experts;
  const int64_t first = ex ? share * ex->rank() : 0;
  for (int64_t e = first; e < first + share; ++e)
    experts_.push_back(register_module(
        "experts." + std::to_string(e),
        std::make_shared<MLP>(n_embd, bias, plain, gen, proj_init_std, config.expert_hidden)));
  for (const auto& expert : experts_) expert_weights_.push_back(expert_mlp_weights(*expert));
}

std::vector<Tensor> MoEMLP::run_experts(const std::vector<Tensor>& rows) const {
  // Grouped in f32 on the CPU; under autocast, and on a device, each expert's layers take their
  // own path (the device's products and GELU).
  const bool on_cpu = rows.empty() || rows.front().device().is_cpu();
  if (config_.grouped_experts && !autograd::autocast_enabled() && on_cpu)
    return autograd::grouped_expert_mlps(rows, expert_weights_);
  std::vector<Tensor> out;
  for (size_t e = 0; e < rows.size(); ++e) out.push_back(experts_[e]->forward(rows[e]));
  return out;
}

Tensor MoEMLP::forward(const Tensor& x, uint64_t seed) const {
  const int64_t C = x.size(-1), N = rows_of(x.shape()), E = config_.num_experts;
  const bool train = is_training();
  const Device dev = x.device();
  Tensor x2 = autograd::reshape(x, {N, C});
  Generator gen(splitmix64(seed ^ 0x6d6f65ull));
  Tensor router_in = x2;
  if (train && config_.router_noise == RouterNoise::jitter && config_.jitter_eps > 0) {
    Tensor noise = Tensor::empty({N, C});
    uniform_(noise, gen, 1.0 - config_.jitter_eps, 1.0 + config_.jitter_eps);
    router_in = autograd::mul(x2, noise.to(dev));
  }
  Tensor logits, probs;
  {
    // The router decides in f32 whatever the blocks' precision (Switch's selective precision).
    // Its product runs where the tokens are; its [N, E] logits decide on the host, which reads
    // them for the choice anyway, and the gates go back (one copy each way a layer).
    autograd::AutocastGuard f32(DType::f32);
    logits = autograd::to_device(router_->forward(router_in), Device::cpu());
    probs = autograd::softmax(logits);
  }
  // The choice is made on the probabilities, perturbed (rsample), steered by the balancing
  // biases and, last, evened out over this batch; the gates below stay the probabilities.
  std::vector<float> scores = probs.to_vector();
  if (train && config_.router_noise == RouterNoise::rsample)
    for (float& s : scores) {
      // Gumbel(0, 1).
      const double u = std::max(static_cast<double>(gen.uniform()), 1e-20);
      s += static_cast<float>(-std::log(-std::log(u) + 1e-20));
    }
  if (expert_bias_.defined()) {
    const std::vector<float> bias = expert_bias_.to_vector();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t e = 0; e < E; ++e)
        scores[static_cast<size_t>(n * E + e)] += bias[static_cast<size_t>(e)];
  }
  if (train && config_.balance_batch) balance_batch(scores.data(), N, E, config_.top_k);
  auto routing = std::make_shared<const MoERouting>(
      route_tokens(scores.data(), N, E, config_.top_k, config_.capacity(N, train)));
  std::vector<Tensor> rows = autograd::moe_dispatch(x2, routing);
  std::vector<Tensor> outs;
  if (const std::shared_ptr<ExpertExchange>& ex = context_->experts()) {
    // Each expert's rows to the rank holding it; its outputs back in the same order.
    std::vector<int64_t> loads;
    for (int64_t e = 0; e < E; ++e) loads.push_back(routing->load(e));
    auto route = std::make_shared<const ExpertRoute>(ex, loads, C, dev);
    outs = autograd::moe_to_tokens(run_experts(autograd::moe_to_experts(rows, route)), route);
  } else {
    outs = run_experts(rows);
  }
  Tensor out = autograd::moe_combine(
      outs, autograd::to_device(autograd::moe_gates(probs, routing), dev), routing);
  if (train) {
    Tensor balance = autograd::load_balancing_loss(probs, routing);
    Tensor z = autograd::router_z_loss(logits);
    context_->record(layer_, seed, *routing, balance.item(), z.item());
    if (autograd::grad_enabled()) {
      Tensor aux;
      if (config_.aux_loss_weight > 0)
        aux = autograd::scale(balance, static_cast<float>(config_.aux_loss_weight));
      if (config_.z_loss_weight > 0) {
        Tensor zw = autograd::scale(z, static_cast<float>(config_.z_loss_weight));
        aux = aux.defined() ? autograd::add(aux, zw) : zw;
      }
      if (aux.defined()) out = autograd::attach_loss(out, aux, context_->loss_grad());
    }
  }
  return autograd::reshape(out, x.shape());
}

}  // namespace meshtrain::nn
