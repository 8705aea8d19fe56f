#include "meshtrain/nn/moe_config.h"

#include <algorithm>
#include <cmath>

#include "meshtrain/util/error.h"

namespace meshtrain::nn {

int64_t MoEConfig::capacity(int64_t tokens, bool training) const {
  if (!drop_tokens) return -1;
  const double factor = training ? capacity_factor : eval_capacity_factor;
  const double even = static_cast<double>(tokens * top_k) / static_cast<double>(num_experts);
  return std::max<int64_t>(min_capacity, static_cast<int64_t>(std::ceil(even * factor)));
}

void MoEConfig::validate(int64_t n_layer) const {
  if (every < 0)
    MT_THROW(ValueError, "model.moe.every must be 0 (no experts) or positive, got ", every);
  if (every == 0) return;
  if (every > n_layer)
    MT_THROW(ValueError, "model.moe.every = ", every, " selects no block of the model's ", n_layer,
             " (model.n_layer); use a value from 1 to ", n_layer);
  if (num_experts < 1)
    MT_THROW(ValueError, "model.moe.num_experts must be positive, got ", num_experts);
  if (expert_hidden < 0)
    MT_THROW(ValueError, "model.moe.expert_hidden must be 0 (4 x model.n_embd) or positive, got ",
             expert_hidden);
  if (top_k != 1 && top_k != 2) MT_THROW(ValueError, "model.moe.top_k must be 1 or 2, got ", top_k);
  if (top_k > num_experts)
    MT_THROW(ValueError, "model.moe.top_k = ", top_k,
             " is more than model.moe.num_experts = ", num_experts);
  if (!(capacity_factor > 0))
    MT_THROW(ValueError, "model.moe.capacity_factor must be positive, got ", capacity_factor);
  if (!(eval_capacity_factor > 0))
    MT_THROW(ValueError, "model.moe.eval_capacity_factor must be positive, got ",
             eval_capacity_factor);
  if (min_capacity < 0)
    MT_THROW(ValueError, "model.moe.min_capacity must be at least 0, got ", min_capacity);
  if (!(aux_loss_weight >= 0))
    MT_THROW(ValueError, "model.moe.aux_loss_weight must be at least 0, got ", aux_loss_weight);
  if (!(z_loss_weight >= 0))
    MT_THROW(ValueError, "model.moe.z_loss_weight must be at least 0, got ", z_loss_weight);
  if (!(bias_update_rate >= 0))
    MT_THROW(ValueError, "model.moe.bias_update_rate must be at least 0, got ", bias_update_rate);
  if (!(jitter_eps >= 0 && jitter_eps < 1))
    MT_THROW(ValueError, "model.moe.jitter_eps must be in [0, 1), got ", jitter_eps);
}

bool parse_router_balance(const std::string& text) {
  if (text == "none") return false;
  if (text == "batch") return true;
  MT_THROW(ValueError, "model.moe.router_balance = \"", text, "\" is not one of none, batch");
}

RouterNoise parse_router_noise(const std::string& text) {
  if (text == "none") return RouterNoise::none;
  if (text == "jitter") return RouterNoise::jitter;
  if (text == "rsample") return RouterNoise::rsample;
  MT_THROW(ValueError, "model.moe.router_noise = \"", text,
           "\" is not one of none, jitter, rsample");
}

}  // namespace meshtrain::nn
