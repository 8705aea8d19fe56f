#include "meshtrain/nn/mlp.h"

#include "meshtrain/autograd/autocast.h"
#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/gelu_mlp.h"
#include "meshtrain/nn/linear.h"

namespace meshtrain::nn {

MLP::MLP(int64_t n_embd, bool bias, const GPTLayers& layers, Generator& gen, double proj_init_std,
         int64_t hidden) {
  const int64_t H = hidden > 0 ? hidden : 4 * n_embd;
  c_fc_ = register_module("c_fc", layers.column(n_embd, H, bias, 0.02, 1, gen));
  c_proj_ = register_module("c_proj", layers.row(H, n_embd, bias, proj_init_std, gen));
}

Tensor MLP::hidden(const Tensor& x) const {
  // Under autocast GELU reads its input rounded, so a first projection that can round its output
  // hands it over in the half type; a second that takes half inputs gets GELU's output rounded by
  // GELU itself.
  using autograd::output_type_for;
  return autograd::gelu(c_fc_->forward_as(x, output_type_for(c_fc_->gives_half_output())),
                        output_type_for(c_proj_->takes_half_input()));
}

// Under autocast, two plain linears run as one op with GELU in their products' epilogues
// (autograd/gelu_mlp.h); tensor-parallel halves keep their own products and collectives.
Tensor MLP::fused(const Tensor& x, const Tensor& residual) const {
  if (!autograd::autocast_enabled()) return Tensor();
  const auto* fc = dynamic_cast<const Linear*>(c_fc_.get());
  const auto* proj = dynamic_cast<const Linear*>(c_proj_.get());
  if (fc == nullptr || proj == nullptr) return Tensor();
  return autograd::gelu_mlp(x, fc->weight(), fc->bias(), proj->weight(), proj->bias(), residual);
}

Tensor MLP::forward(const Tensor& x) const {
  if (Tensor y = fused(x, Tensor()); y.defined()) return y;
  return c_proj_->forward(hidden(x));
}

Tensor MLP::forward_residual(const Tensor& residual, const Tensor& x) const {
  if (Tensor y = fused(x, residual); y.defined()) return y;
  return c_proj_->forward_residual(residual, hidden(x));
}

}  // namespace meshtrain::nn
