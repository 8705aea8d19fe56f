// The differentiable steps of a mixture-of-experts layer around its routing (nn/moe_routing.h):
// gathering each expert's tokens, the gates that weigh the experts' outputs, the weighted sum
// back into token order, and the router's two auxiliary losses. CPU f32.
//
// Dimension letters: N tokens, C channels, E experts, M kept assignments (expert-major).
#pragma once

#include <memory>
#include <vector>

#include "meshtrain/nn/expert_route.h"
#include "meshtrain/nn/moe_routing.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::autograd {

using RoutingPtr = std::shared_ptr<const nn::MoERouting>;

// x[N, C] -> one [load(e), C] tensor per expert: the rows of its tokens, in routing order.
// Backward adds each expert's row gradients into its tokens' rows.
std::vector<Tensor> moe_dispatch(const Tensor& x, const RoutingPtr& routing);

// probs[N, E] -> gates[M]: top-1 takes the token's probability of its expert (Switch); top-2
// divides it by the sum over the token's kept choices (GShard), so a token whose other choice
// was dropped weighs its kept one 1.
Tensor moe_gates(const Tensor& probs, const RoutingPtr& routing);

// Per expert its outputs [load(e), C] (in moe_dispatch's order) and gates[M] -> out[N, C]:
// each token's sum of gate x output over its kept assignments (zero for a token all of whose
// assignments were dropped).
Tensor moe_combine(const std::vector<Tensor>& expert_out, const Tensor& gates,
                   const RoutingPtr& routing);

// Expert parallelism (nn/expert_route.h): the rows of every expert of the layer from this rank
// -> the rows of the experts held here from every rank of the route; backward sends the rows'
// gradients back. Collective over the route's exchange, in forward and in backward.
std::vector<Tensor> moe_to_experts(const std::vector<Tensor>& by_expert,
                                   const std::shared_ptr<const nn::ExpertRoute>& route);
// The experts' outputs back to the ranks their rows came from: the reverse of moe_to_experts.
std::vector<Tensor> moe_to_tokens(const std::vector<Tensor>& local,
                                  const std::shared_ptr<const nn::ExpertRoute>& route);

// One expert's GPT-2 MLP weights: c_fc [H, C] (+ [H]), c_proj [C, H] (+ [C]); biases undefined
// in a model without them.
struct ExpertMlp {
  Tensor fc_weight, fc_bias, proj_weight, proj_bias;
};

// Every expert's MLP (c_fc, GELU, c_proj) on its rows [n_e, C], as one grouped operation: with
// more than one thread the experts' products run side by side, one expert per thread, instead of
// one after another each spread over the threads (a grouped GEMM: small per-expert products
// leave threads idle when split). Each expert runs the kernels MLP::forward runs (linear, gelu,
// linear, and their backward), their products built for any row count
// (cpu::gemm_onednn::RowsVary), which may round the last bits differently from each shape's own;
// the same bits on one thread and on several. An expert without rows gets zero weight
// gradients. CPU f32, outside autocast.
std::vector<Tensor> grouped_expert_mlps(const std::vector<Tensor>& rows,
                                        const std::vector<ExpertMlp>& experts);

// The Switch Transformer's load-balancing loss E * sum_e f_e * P_e, f_e the fraction of the
// N * top_k choices made for expert e (before capacity) and P_e the mean router probability
// of e: 1 when routing is even. Its gradient reaches the probabilities (f is a count).
Tensor load_balancing_loss(const Tensor& probs, const RoutingPtr& routing);

// ST-MoE's router z-loss: the mean over tokens of logsumexp(logits[n, :])^2.
Tensor router_z_loss(const Tensor& logits);

// Returns x unchanged; in backward also sends `grad` into `loss`, as if `loss` had been added to
// the objective that backward starts from with that gradient. An auxiliary loss computed inside
// a layer joins the training objective this way wherever the layer runs (a recomputed block, a
// pipeline stage), at the scale the main loss is backpropagated with.
Tensor attach_loss(const Tensor& x, const Tensor& loss, float grad);

}  // namespace meshtrain::autograd
