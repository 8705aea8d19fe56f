// The mixture-of-experts shape of a GPT (the config's model.moe.* keys): which blocks replace
// their MLP by experts, how tokens are routed and what the router is trained with.
#pragma once

#include <cstdint>
#include <string>

namespace meshtrain::nn {

// How the router's choice is perturbed in training (never in evaluation).
enum class RouterNoise {
  none,
  jitter,   // the router's input times U(1 - eps, 1 + eps) (Switch Transformer)
  rsample,  // Gumbel noise added to the scores the top-k choice is made on, not to the gates
};

struct MoEConfig {
  int64_t every = 0;  // every N-th block (N-1, 2N-1, ...) is a mixture of experts; 0: none
  int64_t num_experts = 8;
  int64_t top_k = 1;
  int64_t expert_hidden = 0;      // an expert MLP's hidden features; 0: the dense MLP's 4 * n_embd
  double capacity_factor = 1.25;  // training; tokens an expert takes per even share
  double eval_capacity_factor = 2.0;
  int64_t min_capacity = 4;
  bool drop_tokens = true;  // false: dropless, every expert takes what it is sent
  double aux_loss_weight = 0.01;
  double z_loss_weight = 0.001;
  // Auxiliary-loss-free balancing (DeepSeek-V3): a per-expert bias added to the scores the top-k
  // choice is made on (never to the gates), moved after every step by this much toward the mean
  // load, by the sign of each expert's distance from it. 0: no bias.
  double bias_update_rate = 0.0;
  // Training: each micro-batch's choice is balanced by offsets found for it (balance_batch), so
  // the experts get nearly even shares of it; the gates stay the router's probabilities.
  bool balance_batch = false;
  // The experts' MLPs as one grouped operation (autograd::grouped_expert_mlps) in f32, products
  // built for any row count; false: each expert's MLP in turn, the dense MLP's kernels.
  bool grouped_experts = true;
  RouterNoise router_noise = RouterNoise::none;
  double jitter_eps = 0.01;

  bool enabled() const { return every > 0; }
  bool is_moe_block(int64_t block) const { return every > 0 && block % every == every - 1; }
  // An expert's capacity for `tokens` routed tokens (-1: unbounded, dropless).
  int64_t capacity(int64_t tokens, bool training) const;
  // ValueError naming the key when a value is out of range.
  void validate(int64_t n_layer) const;
};

// "none", "jitter", "rsample"; ValueError naming model.moe.router_noise otherwise.
RouterNoise parse_router_noise(const std::string& text);
// "none" (false), "batch" (true); ValueError naming model.moe.router_balance otherwise.
bool parse_router_balance(const std::string& text);

}  // namespace meshtrain::nn
