// What the mixture-of-experts layers of one model share: the gradient the backward starts the
// model's loss from (their auxiliary losses join the objective at that scale, autograd
// attach_loss) and the routing counters of the current step, which the engine sums over the
// data-parallel replicas and turns into the step's expert-load metrics.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/nn/expert_exchange.h"
#include "meshtrain/nn/moe_routing.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::nn {

class MoEContext {
 public:
  // One entry per MoE layer, by its name ("h.1"). `experts`: the expert-parallel ranks that share
  // out every layer's experts (null: each layer holds all of them).
  MoEContext(std::vector<std::string> layers, int64_t num_experts,
             std::shared_ptr<ExpertExchange> experts = nullptr);

  const std::shared_ptr<ExpertExchange>& experts() const { return experts_exchange_; }
  // The data-parallel replicas whose counters are summed (for per-rank means).
  void set_replicas(int replicas) { replicas_ = replicas; }

  void set_loss_grad(float grad) { loss_grad_ = grad; }
  float loss_grad() const { return loss_grad_; }

  // Adds one training forward of layer `layer` (its index in the constructor's list). A forward
  // with the seed recorded last for the layer is the recomputation of a checkpointed block and
  // is not counted again.
  void record(size_t layer, uint64_t seed, const MoERouting& routing, double balance_loss,
              double z_loss);
  // The counters since the last call, then zeroed: a fixed number of additive values (the same
  // on every rank of the model), so that a sum over ranks is the whole step's.
  std::vector<float> take_counters();
  // The step's metrics from counters summed over the replicas: per layer the assignments routed
  // to each expert ("routed") and those it kept under its capacity ("load"), the busiest
  // expert's routed assignments over the mean ("max_mean_load": the balance the router reached,
  // which a capacity cut would hide), dropped assignments; over all layers the mean auxiliary
  // losses, the largest max/mean load and the dropped fraction.
  nlohmann::json summarize(const std::vector<float>& counters) const;

  // Auxiliary-loss-free balancing: `bias` [E] (the layer's buffer, added to the scores its
  // experts are chosen by) moves by `rate` in adapt().
  void balance_with(size_t layer, Tensor bias, float rate);
  // After every training step, with the step's counters summed over the replicas (the same on
  // every rank, so every replica's biases stay equal): each balanced layer's bias of an expert
  // routed fewer assignments than the mean rises by the rate, of one routed more falls by it.
  void adapt(const std::vector<float>& counters);

 private:
  static constexpr size_t kPerLayer = 5;  // chosen, dropped, balance sum, z sum, forwards
  // Then per expert its kept load, then per expert the assignments routed to it.
  size_t stride() const { return kPerLayer + 2 * static_cast<size_t>(experts_); }

  std::vector<std::string> layers_;
  int64_t experts_;
  std::shared_ptr<ExpertExchange> experts_exchange_;
  int replicas_ = 1;
  float loss_grad_ = 1.0f;
  std::vector<float> counters_;
  std::vector<std::optional<uint64_t>> last_seed_;  // per layer, this step
  std::vector<Tensor> bias_;                        // per layer; undefined: not balanced
  std::vector<float> bias_rate_;
};

}  // namespace meshtrain::nn
