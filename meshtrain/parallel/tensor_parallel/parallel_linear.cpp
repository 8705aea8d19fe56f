#include "meshtrain/parallel/tensor_parallel/parallel_linear.h"

#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/parallel/tensor_parallel/region_mappings.h"

namespace meshtrain::parallel::tp {

ColumnParallelLinear::ColumnParallelLinear(int64_t in, int64_t out, bool bias, const TpContext& tp,
                                           double init_std, int64_t blocks)
    : tp_(tp) {
  MT_CHECK(out % (blocks * tp.size()) == 0, "column-parallel linear: ", out,
           " output features do not split into ", blocks, " blocks over ", tp.size(), " ranks");
  nn::ParamInit winit = nn::ParamInit::normal(init_std);
  winit.shard = tp.shard({out, in}, 0, blocks);
  weight_ = register_parameter("weight", Tensor::zeros(winit.shard.local_shape()), winit);
  if (bias) {
    nn::ParamInit binit = nn::ParamInit::zeros();
    binit.shard = tp.shard({out}, 0, blocks);
    bias_ = register_parameter("bias", Tensor::zeros(binit.shard.local_shape()), binit);
  }
}

Tensor ColumnParallelLinear::forward(const Tensor& x) const {
  const Tensor in = tp_.sequence_parallel ? gather_from_sequence_parallel(x, tp_.group)
                                          : copy_to_tp_region(x, tp_.group);
  return autograd::linear(in, weight_, bias_);
}

RowParallelLinear::RowParallelLinear(int64_t in, int64_t out, bool bias, const TpContext& tp,
                                     double init_std)
    : tp_(tp) {
  MT_CHECK(in % tp.size() == 0, "row-parallel linear: ", in, " input features do not split over ",
           tp.size(), " ranks");
  nn::ParamInit winit = nn::ParamInit::normal(init_std);
  winit.shard = tp.shard({out, in}, 1);
  weight_ = register_parameter("weight", Tensor::zeros(winit.shard.local_shape()), winit);
  if (bias) bias_ = register_parameter("bias", Tensor::zeros({out}), nn::ParamInit::zeros());
}

Tensor RowParallelLinear::forward(const Tensor& x) const {
  const Tensor partial = autograd::linear(x, weight_, Tensor());
  Tensor y = tp_.sequence_parallel ? reduce_scatter_to_sequence_parallel(partial, tp_.group)
                                   : reduce_from_tp_region(partial, tp_.group);
  return bias_.defined() ? autograd::add(y, bias_) : y;
}

}  // namespace meshtrain::parallel::tp
