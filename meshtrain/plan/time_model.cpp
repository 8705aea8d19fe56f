#include "meshtrain/plan/time_model.h"

#include <algorithm>
#include <cmath>

#include "meshtrain/nn/gpt.h"
#include "meshtrain/nn/gpt_costs.h"

namespace meshtrain::plan {
namespace {

bool spans_one_node(int64_t ranks_spanned, const ClusterSpec& c) {
  return ranks_spanned <= c.devices_per_node;
}

double act_bytes(Precision p) {
  return is_mixed(p) ? 2.0 : 4.0;
}

struct Volumes {
  double tp_bytes_per_collective = 0;  // one all-reduce's buffer
  double tp_collectives = 0;           // per step per rank
  double pp_bytes_per_message = 0;
  double pp_messages = 0;
  double dp_bytes = 0;             // bytes each rank sends over the DP group per step
  double dp_collective_bytes = 0;  // the buffers' total (for the time formula)
  int dp_kind = 0;                 // 0 all-reduce, 1 rs+ag, 3 zero-3
  double grad_bytes = 0, weight_bytes = 0;
};

Volumes volumes(const TrainSetup& job, const Layout& l, Precision precision) {
  Volumes v;
  const MemoryInput in = memory_input(job, l, precision);
  const MemoryBreakdown mem = estimate_memory(in);
  const double T = static_cast<double>(job.tokens_per_sequence());
  const double a = act_bytes(precision);
  const double layers = static_cast<double>(job.model.n_layer / l.pp);
  const double m = static_cast<double>(l.micro_batches);
  const double ckpt_frac =
      l.checkpoint_every == 0
          ? 0.0
          : std::ceil(layers / static_cast<double>(l.checkpoint_every)) / layers;
  v.tp_bytes_per_collective =
      static_cast<double>(l.micro_batch) * T * static_cast<double>(job.model.n_embd) * a;
  if (l.tp > 1) v.tp_collectives = layers * m * (4.0 + 2.0 * ckpt_frac);
  v.pp_bytes_per_message = v.tp_bytes_per_collective / (l.sequence_parallel ? l.tp : 1);
  if (l.pp > 1) v.pp_messages = 2.0 * m * static_cast<double>(l.virtual_stages);
  const double P = static_cast<double>(mem.params_on_rank);
  v.grad_bytes = 4.0 * P;
  v.weight_bytes = (is_mixed(precision) ? 2.0 : 4.0) * P;
  if (l.dp > 1) {
    const double n = static_cast<double>(l.dp), f = (n - 1) / n;
    switch (l.zero_stage) {
      case 0:
        v.dp_kind = 0;
        v.dp_collective_bytes = v.grad_bytes;
        v.dp_bytes = 2 * f * v.grad_bytes;
        break;
      case 1:
      case 2:
        v.dp_kind = 1;
        v.dp_collective_bytes = v.grad_bytes + v.weight_bytes;
        v.dp_bytes = f * (v.grad_bytes + v.weight_bytes);
        break;
      default:
        v.dp_kind = 3;
        v.dp_collective_bytes = m * ((2.0 + ckpt_frac) * v.weight_bytes + v.grad_bytes);
        v.dp_bytes = f * v.dp_collective_bytes;
        break;
    }
  }
  return v;
}

}  // namespace

double all_reduce_time(double bytes, int64_t n, const Link& link) {
  if (n <= 1) return 0;
  const double f = static_cast<double>(n - 1) / static_cast<double>(n);
  return 2 * f * bytes / link.bandwidth + 2 * static_cast<double>(n - 1) * link.latency;
}

double reduce_scatter_time(double bytes, int64_t n, const Link& link) {
  if (n <= 1) return 0;
  const double f = static_cast<double>(n - 1) / static_cast<double>(n);
  return f * bytes / link.bandwidth + static_cast<double>(n - 1) * link.latency;
}

double gemm_shape_factor(double m, double n, double k, const ClusterSpec& c) {
  if (c.gemm_half_dim <= 0) return 1.0;
  const auto s = [&](double d) { return d / (d + c.gemm_half_dim); };
  return s(m) * s(n) * s(k);
}

double flops_per_token(const ModelShape& m, int64_t T) {
  return nn::gpt_flops_per_token(gpt_config(m), T);
}

ElementwisePerToken elementwise_per_token(const ModelShape& m, int64_t T, int64_t tp,
                                          bool sequence_parallel) {
  const double C = static_cast<double>(m.n_embd), t = static_cast<double>(tp);
  const double scores = static_cast<double>(m.n_head) * static_cast<double>(T);
  const double bias = m.bias ? 1.0 : 0.0;
  const double rep = sequence_parallel ? t : 1.0;  // the replicated part's divisor
  ElementwisePerToken e;
  e.block_forward = (2 * C + 2 * C + 3 * C + 3 * C + bias * (2 * C + 2 * C)) / rep +
                    (bias * (6 * C + 8 * C) + 8 * C + 3 * scores) / t;
  e.block_backward = (3 * C + 3 * C + 3 * C + 3 * C + bias * (C + C)) / rep +
                     (12 * C + bias * (3 * C + 4 * C) + 4 * scores) / t;
  e.head = (2 * C + 3 * C) / rep + 5 * static_cast<double>(m.vocab_size) / t;
  e.embedding = (3 * C + 3 * C) / rep;
  return e;
}

double optimizer_bytes_per_param(Optimizer o, Precision p) {
  double b = 0;
  switch (o) {
    case Optimizer::kAdamW:
      b = 7 * 4;
      break;
    case Optimizer::kSgdMomentum:
      b = 5 * 4;
      break;
    case Optimizer::kSgd:
      b = 3 * 4;
      break;
  }
  return b + (is_mixed(p) ? 2 : 0);
}

StepTime estimate_step_time(const TrainSetup& job, const Layout& l, const ClusterSpec& c) {
  const Precision precision = parse_precision(c.precision);
  StepTime s;
  const int64_t T = job.tokens_per_sequence();
  const double tokens_per_rank =
      static_cast<double>(job.global_batch) * static_cast<double>(T) / static_cast<double>(l.dp);
  const ModelShape& m = job.model;
  const double C = static_cast<double>(m.n_embd), L = static_cast<double>(m.n_layer);
  const double block_flops = nn::gpt_block_flops_per_token(gpt_config(m), T);  // per token
  const double head_flops = nn::gpt_head_flops_per_token(gpt_config(m));
  const double layers = L / static_cast<double>(l.pp);
  const double ckpt_layers =
      l.checkpoint_every == 0
          ? 0.0
          : std::ceil(layers / static_cast<double>(l.checkpoint_every)) * static_cast<double>(l.pp);
  s.model_flops =
      tokens_per_rank * (L * block_flops + head_flops) / static_cast<double>(l.tp * l.pp);
  s.hardware_flops = tokens_per_rank *
                     (L * block_flops + ckpt_layers * block_flops / 3.0 + head_flops) /
                     static_cast<double>(l.tp * l.pp);
  // Seconds per token of each kind of GEMM at its shape's rate: the four linear layers of a
  // block, the attention products (per head: T x T x hd and T x hd x T) and the head.
  const double rate = c.peak_flops * c.efficiency;
  const double rows = static_cast<double>(l.micro_batch) * static_cast<double>(T);
  const double t = static_cast<double>(l.tp), Td = static_cast<double>(T);
  const double hd = C / static_cast<double>(m.n_head);
  // (Whole-model FLOPs here; the division by tp * pp below splits them.)
  const double linear = 6.0 * 3.0 * C * C / gemm_shape_factor(rows, 3.0 * C / t, C, c) +
                        6.0 * C * C / gemm_shape_factor(rows, C, C / t, c) +
                        6.0 * 4.0 * C * C / gemm_shape_factor(rows, 4.0 * C / t, C, c) +
                        6.0 * 4.0 * C * C / gemm_shape_factor(rows, C, 4.0 * C / t, c);
  const double attention = 6.0 * Td * C / gemm_shape_factor(Td, Td, hd, c);
  const double block_s = (linear + attention) / rate;  // per token, forward + backward
  const double head_s =
      head_flops / rate / gemm_shape_factor(rows, static_cast<double>(m.vocab_size) / t, C, c);
  s.gemm = tokens_per_rank * (L * block_s + ckpt_layers * block_s / 3.0 + head_s) /
           static_cast<double>(l.tp * l.pp);
  if (c.elementwise_bandwidth > 0) {
    // The element-wise elements of the whole model per token (tp already divided in), then
    // split over the stages as the GEMMs are.
    const ElementwisePerToken e = elementwise_per_token(m, T, l.tp, l.sequence_parallel);
    const double elems = L * (e.block_forward + e.block_backward) + ckpt_layers * e.block_forward +
                         e.head + e.embedding;
    s.elementwise = tokens_per_rank * elems * act_bytes(precision) / static_cast<double>(l.pp) /
                    c.elementwise_bandwidth;
    const MemoryBreakdown mem = estimate_memory(memory_input(job, l, precision));
    const double P = static_cast<double>(mem.params_on_rank);
    const double n = static_cast<double>(l.dp);
    const double updated = l.zero_stage >= 1 ? P / n : P;
    const double grads = l.zero_stage >= 2 ? P / n : P;
    s.optimizer = (updated * optimizer_bytes_per_param(job.optimizer, precision) +
                   grads * kGradientZeroingBytes) /
                  c.elementwise_bandwidth;
  }
  s.compute = s.gemm + s.elementwise;
  if (l.pp > 1)
    s.bubble = s.compute * static_cast<double>(l.pp - 1) /
               static_cast<double>(l.micro_batches * l.virtual_stages);

  const Volumes v = volumes(job, l, precision);
  s.tp_cross_node = !spans_one_node(l.tp, c);
  s.dp_cross_node = !spans_one_node(l.tp * l.dp, c);
  s.pp_cross_node = !spans_one_node(l.tp * l.dp * l.pp, c);
  if (l.tp > 1)
    s.tp_comm = v.tp_collectives * all_reduce_time(v.tp_bytes_per_collective, l.tp,
                                                   s.tp_cross_node ? c.inter : c.intra);
  if (l.pp > 1) {
    // Stage neighbours are tp*dp ranks apart: on one node only if the whole mesh is.
    const Link& link = s.pp_cross_node ? c.inter : c.intra;
    s.pp_comm = v.pp_messages * (v.pp_bytes_per_message / link.bandwidth + link.latency);
  }
  if (l.dp > 1) {
    const Link& link = s.dp_cross_node ? c.inter : c.intra;
    const double buckets =
        std::max(1.0, std::ceil(v.grad_bytes / static_cast<double>(job.bucket_bytes)));
    const double lat = static_cast<double>(l.dp - 1) * link.latency * buckets;
    const double f = static_cast<double>(l.dp - 1) / static_cast<double>(l.dp);
    s.dp_comm =
        f * (v.dp_kind == 0 ? 2 * v.dp_collective_bytes : v.dp_collective_bytes) / link.bandwidth +
        (v.dp_kind == 0 ? 2 : 1) * lat;
    if (l.pp > 1) {
      s.dp_exposed = s.dp_comm;
    } else {
      // Backward is 2/3 of compute. DDP and ZeRO-1/2 reduce during the last micro-batch's
      // backward; ZeRO-1/2 gather the updated weights after the step, in the open. ZeRO-3
      // gathers and reduces during every micro-batch's forward and backward.
      const double per_mb = s.compute / static_cast<double>(l.micro_batches);
      if (v.dp_kind == 1) {
        const double ag = f * v.weight_bytes / link.bandwidth + lat;
        const double rs = s.dp_comm - ag;
        s.dp_exposed = std::max(rs - per_mb * 2.0 / 3.0, rs / buckets) + ag;
      } else {
        const double hide = (v.dp_kind == 3 ? s.compute : per_mb) * 2.0 / 3.0;
        s.dp_exposed = std::max(s.dp_comm - hide, s.dp_comm / buckets);
      }
    }
  }
  s.total = s.compute + s.optimizer + s.bubble + s.tp_comm + s.pp_comm + s.dp_exposed;
  return s;
}

TrafficPerStep traffic_per_step(const TrainSetup& job, const Layout& l, Precision precision) {
  const Volumes v = volumes(job, l, precision);
  TrafficPerStep t;
  if (l.tp > 1) {
    const double f = static_cast<double>(l.tp - 1) / static_cast<double>(l.tp);
    t.tp = v.tp_collectives * 2 * f * v.tp_bytes_per_collective;
  }
  t.dp = v.dp_bytes;
  t.pp = v.pp_messages * v.pp_bytes_per_message;  // activations forward, gradients back
  return t;
}

}  // namespace meshtrain::plan
