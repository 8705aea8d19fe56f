#include "meshtrain/nn/moe_context.h"

#include <algorithm>

#include "meshtrain/util/error.h"

namespace meshtrain::nn {

MoEContext::MoEContext(std::vector<std::string> layers, int64_t num_experts,
                       std::shared_ptr<ExpertExchange> experts)
    : layers_(std::move(layers)), experts_(num_experts), experts_exchange_(std::move(experts)) {
  MT_CHECK(!experts_exchange_ || num_experts % experts_exchange_->size() == 0, num_experts,
           " experts cannot be shared out over ", experts_exchange_ ? experts_exchange_->size() : 1,
           " expert-parallel ranks");
  // Under expert parallelism one more: the seconds spent exchanging tokens.
  counters_.assign(layers_.size() * stride() + (experts_exchange_ ? 1 : 0), 0.0f);
  last_seed_.assign(layers_.size(), std::nullopt);
  bias_.resize(layers_.size());
  bias_rate_.assign(layers_.size(), 0.0f);
}

void MoEContext::balance_with(size_t layer, Tensor bias, float rate) {
  MT_CHECK(layer < layers_.size() && bias.numel() == experts_ && bias.dtype() == DType::f32,
           "MoE layer ", layer, ": a balancing bias of ", bias.numel(), " values for ", experts_,
           " experts");
  bias_[layer] = std::move(bias);
  bias_rate_[layer] = rate;
}

void MoEContext::adapt(const std::vector<float>& counters) {
  MT_CHECK(counters.size() == counters_.size(), "MoE counters: ", counters.size(),
           " values, the model has ", counters_.size());
  const auto E = static_cast<size_t>(experts_);
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (!bias_[l].defined()) continue;
    const float* routed = counters.data() + l * stride() + kPerLayer + E;
    // Counts are whole numbers, exact in f32 and in their sum: every rank moves alike.
    double total = 0;
    for (size_t e = 0; e < E; ++e) total += routed[e];
    if (total == 0) continue;  // no training forward this step
    const double mean = total / static_cast<double>(E);
    // The buffer may live on a device: moved to the host and back (E values).
    std::vector<float> b = bias_[l].to_vector();
    for (size_t e = 0; e < E; ++e) {
      if (routed[e] < mean)
        b[e] += bias_rate_[l];
      else if (routed[e] > mean)
        b[e] -= bias_rate_[l];
    }
    bias_[l].copy_(Tensor::from_vector(b, bias_[l].shape()));
  }
}

void MoEContext::record(size_t layer, uint64_t seed, const MoERouting& r, double balance_loss,
                        double z_loss) {
  MT_CHECK(layer < layers_.size() && r.experts == experts_, "MoE layer ", layer, " with ",
           r.experts, " experts is not one of the model's");
  if (last_seed_[layer] == seed) return;
  last_seed_[layer] = seed;
  float* c = counters_.data() + layer * stride();
  c[0] += static_cast<float>(r.tokens * r.top_k);
  c[1] += static_cast<float>(r.dropped);
  c[2] += static_cast<float>(balance_loss);
  c[3] += static_cast<float>(z_loss);
  c[4] += 1.0f;
  const auto E = static_cast<size_t>(experts_);
  for (size_t e = 0; e < E; ++e) {
    c[kPerLayer + e] += static_cast<float>(r.load(static_cast<int64_t>(e)));
    c[kPerLayer + E + e] += static_cast<float>(r.chosen[e]);
  }
}

std::vector<float> MoEContext::take_counters() {
  std::vector<float> out = counters_;
  if (experts_exchange_) out.back() = static_cast<float>(experts_exchange_->take_seconds());
  std::fill(counters_.begin(), counters_.end(), 0.0f);
  // The next step's first forward counts even when it reuses a seed.
  std::fill(last_seed_.begin(), last_seed_.end(), std::nullopt);
  return out;
}

nlohmann::json MoEContext::summarize(const std::vector<float>& counters) const {
  MT_CHECK(counters.size() == counters_.size(), "MoE counters: ", counters.size(),
           " values, the model has ", counters_.size());
  nlohmann::json layers = nlohmann::json::object();
  double chosen = 0, dropped = 0, balance = 0, z = 0, forwards = 0, worst = 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const float* c = counters.data() + l * stride();
    const auto E = static_cast<size_t>(experts_);
    std::vector<double> load, routed;
    double total = 0, most = 0;
    for (size_t e = 0; e < E; ++e) {
      load.push_back(c[kPerLayer + e]);
      const double v = c[kPerLayer + E + e];
      routed.push_back(v);
      total += v;
      most = std::max(most, v);
    }
    const double mean = total / static_cast<double>(experts_);
    const double max_mean = mean > 0 ? most / mean : 0.0;
    worst = std::max(worst, max_mean);
    layers[layers_[l]] = {
        {"load", load}, {"routed", routed}, {"max_mean_load", max_mean}, {"dropped", c[1]}};
    if (bias_[l].defined()) layers[layers_[l]]["expert_bias"] = bias_[l].to_vector();
    chosen += c[0];
    dropped += c[1];
    balance += c[2];
    z += c[3];
    forwards += c[4];
  }
  nlohmann::json out = {{"balance_loss", forwards > 0 ? balance / forwards : 0.0},
                        {"z_loss", forwards > 0 ? z / forwards : 0.0},
                        {"max_mean_load", worst},
                        {"dropped", dropped},
                        {"dropped_fraction", chosen > 0 ? dropped / chosen : 0.0},
                        {"layers", layers}};
  // Per rank, forward and backward, every layer.
  if (experts_exchange_)
    out["all_to_all_s"] = static_cast<double>(counters.back()) / std::max(1, replicas_);
  return out;
}

}  // namespace meshtrain::nn
