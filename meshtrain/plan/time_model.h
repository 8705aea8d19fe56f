// Step time of a layout, analytically: compute at the cluster's calibrated efficiency, each
// collective's volume over the link its group spans (ring formulas), the pipeline bubble, and
// how much of the data-parallel traffic hides behind backward.
//
//   compute   = FLOPs per rank / (peak * efficiency); FLOPs per token = 6 * matmul params +
//               6 * L * T * C (attention), and recomputed blocks add their forward (1/3); each
//               GEMM at its shape's rate when the cluster has a gemm_half_dim (rows: the
//               micro-batch's tokens; columns: the width per TP rank; attention: T and the
//               head size), so a thin micro-batch costs what it costs
//   element-wise = bytes the element-wise kernels read and write / the cluster's
//               elementwise_bandwidth, part of compute (and so of the bubble): per token and
//               block, forward and backward (a recomputed block's forward again), the head's
//               LayerNorm and cross-entropy, the embedding; see elementwise_per_token()
//   optimizer = per step, bytes of the update over the parameters the rank updates (its ZeRO
//               shard) plus zeroing the gradients it holds / elementwise_bandwidth
//   bubble    = compute * (pp - 1) / (micro_batches * virtual_stages), i.e. (p-1)/(m+p-1) of
//               the pipelined part, (p-1)/(vm+p-1) interleaved
//   TP        = per block and micro-batch, 4 all-reduces of B*T*C activations (6 with
//               recomputation) over the TP group, not overlapped; with sequence parallelism
//               each is an all-gather plus a reduce-scatter, the same ring volume and steps
//   PP        = per micro-batch and chunk, one activation sent and one gradient received
//   DP        = all-reduce of the gradients (ZeRO-0), reduce-scatter + all-gather (ZeRO-1/2),
//               all-gather in forward and backward + reduce-scatter per micro-batch (ZeRO-3);
//               without a pipeline the reduction overlaps the last micro-batch's backward
//               (ZeRO-3: every backward) except the last bucket, ZeRO-1/2's all-gather of the
//               updated weights does not; with a pipeline it all runs after the flush
//   ring all-reduce of S bytes on n ranks: 2 (n-1)/n S / bandwidth + 2 (n-1) latency
// A group spans one node when the ranks between its first and last fit in one node.
#pragma once

#include "meshtrain/plan/cluster.h"
#include "meshtrain/plan/layout.h"

namespace meshtrain::plan {

struct StepTime {
  double compute = 0;      // gemm + elementwise
  double gemm = 0;         // the GEMMs at their shapes' rates
  double elementwise = 0;  // the memory-bound per-token work
  double optimizer = 0;    // the update and the gradients' zeroing, once per step
  double bubble = 0, tp_comm = 0, pp_comm = 0;
  double dp_comm = 0;     // the whole data-parallel traffic
  double dp_exposed = 0;  // the part that does not overlap
  double total = 0;
  double hardware_flops = 0;  // per rank per step, recomputation included
  double model_flops = 0;     // per rank per step, without recomputation
  bool tp_cross_node = false, dp_cross_node = false, pp_cross_node = false;

  // Achieved FLOP/s per device counting recomputation (as Megatron-LM reports).
  double hardware_flops_per_s() const { return total > 0 ? hardware_flops / total : 0; }
  double tokens_per_s(int64_t tokens_per_step) const {
    return total > 0 ? static_cast<double>(tokens_per_step) / total : 0;
  }
};

// Seconds of a ring all-reduce / reduce-scatter / all-gather of `bytes` (the full buffer) on n
// ranks over `link`.
double all_reduce_time(double bytes, int64_t n, const Link& link);
double reduce_scatter_time(double bytes, int64_t n, const Link& link);

// The fraction of peak * efficiency an m x n x k GEMM reaches on `c` (1 when shape-blind).
double gemm_shape_factor(double m, double n, double k, const ClusterSpec& c);

// FLOPs of forward + backward of one token, without recomputation.
double flops_per_token(const ModelShape& m, int64_t T);

// Elements (of the activation type) the element-wise kernels of meshtrain's layers read plus
// write per token on one rank of a TP group of `tp` (sequence_parallel: the replicated part split
// too). Each kernel pass reads each input and writes each output once:
//   block forward   ln_1 2C, ln_2 2C, two residual adds 3C each, the row-parallel biases 2C
//                   each (replicated: 14C); the column-parallel biases of c_attn 6C and c_fc 8C,
//                   GELU 8C, the attention's softmax over its scores 3 NH T (the product's
//                   output, then read and written by the softmax) (split over tp: 22C + 3 NH T)
//   block backward  ln_1 and ln_2 3C each, the residual gradients' adds 3C each, the
//                   row-parallel bias gradients C each (14C); GELU 12C, the column-parallel bias
//                   gradients 3C and 4C, the softmax backward 4 NH T (19C + 4 NH T)
//   head            ln_f 2C + 3C; the cross-entropy 3V forward (max, exp-sum, the picked
//                   logit) and 2V backward (read the logits, write their gradient), V over tp
//   embedding       the two lookups and their sum 3C forward, the scatter-add 3C backward
// Without biases their terms are left out.
struct ElementwisePerToken {
  double block_forward = 0, block_backward = 0, head = 0, embedding = 0;
};
ElementwisePerToken elementwise_per_token(const ModelShape& m, int64_t T, int64_t tp,
                                          bool sequence_parallel);

// Bytes the optimizer's update moves per parameter it updates: AdamW reads the weight, gradient
// and both moments and writes the weight and moments (7 x 4), SGD with momentum 5 x 4, plain
// SGD 3 x 4; mixed precision also writes the 2-byte weight copy. Zeroing a gradient adds 4 per
// gradient held (gradient_zeroing_bytes).
double optimizer_bytes_per_param(Optimizer o, Precision p);
inline constexpr double kGradientZeroingBytes = 4;

StepTime estimate_step_time(const TrainSetup& job, const Layout& layout, const ClusterSpec& c);

// Bytes one rank sends per step over its TP, DP and PP groups (what placement weighs).
struct TrafficPerStep {
  double tp = 0, dp = 0, pp = 0;
};
TrafficPerStep traffic_per_step(const TrainSetup& job, const Layout& layout, Precision precision);

}  // namespace meshtrain::plan
