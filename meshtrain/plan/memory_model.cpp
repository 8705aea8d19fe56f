// See memory_model.h for the activation count; the ZeRO rules, for P parameters held by a rank,
// w/g bytes of a weight/gradient and K bytes of optimizer state per parameter, N data ranks:
//   stage 0 (DDP)  (w + g + K) P          stage 2  w P + (g + K) P / N
//   stage 1        (w + g) P + K P / N    stage 3  (w + g + K) P / N + the units in flight
// With f32 AdamW (w = g = 4, K = 8) these are 16P, 8P + 8P/N, 4P + 12P/N and 16P/N.
#include "meshtrain/plan/memory_model.h"

#include <algorithm>

#include "meshtrain/nn/gpt.h"
#include "meshtrain/nn/gpt_costs.h"
#include "meshtrain/plan/pipeline_split.h"
#include "meshtrain/tensor/device_kernels.h"
#include "meshtrain/util/error.h"

namespace meshtrain::plan {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

int64_t ln_params(const ModelShape& m) {
  return nn::gpt_norm_params(gpt_config(m));
}

int64_t block_params_tp(const ModelShape& m, int64_t tp) {
  return nn::gpt_block_params(gpt_config(m), tp);
}

// Block `block`'s parameters on one rank: a mixture-of-experts block holds num_experts / ep of
// its experts (and the whole router).
int64_t block_params_on_rank(const MemoryInput& in, int64_t block) {
  nn::GPTConfig c = gpt_config(in.model);
  c.moe = in.moe;
  int64_t p = nn::gpt_block_params(c, in.tp, block);
  if (in.moe.is_moe_block(block))
    p -= (in.moe.num_experts - in.moe.num_experts / in.ep) * nn::gpt_expert_params(c);
  return p;
}

struct Bytes {
  int64_t weight, grad, state;  // per parameter
};

Bytes bytes_per_param(const MemoryInput& in) {
  Bytes b{4, 4, 0};
  if (is_mixed(in.precision)) b = {2, 4, 4};  // the f32 master copy is state
  switch (in.optimizer) {
    case Optimizer::kAdamW:
      b.state += 8;
      break;
    case Optimizer::kSgdMomentum:
      b.state += 4;
      break;
    case Optimizer::kSgd:
      break;
  }
  return b;
}

int64_t act_elem_bytes(const MemoryInput& in) {
  return is_mixed(in.precision) ? 2 : 4;
}

int64_t tokens(const MemoryInput& in) {
  return in.micro_batch * (in.seq_len > 0 ? in.seq_len : in.model.block_size);
}

// Block-equivalents of activations the stage holds at its peak: micro-batches in flight times
// the stage's layers, for the first stage (which holds the most in every schedule).
struct InFlight {
  int64_t micro_batches;  // in flight on the first stage
  int64_t chunks;         // model chunks (of layers_per_chunk layers) in flight, interleaved
};

InFlight in_flight_first_stage(const MemoryInput& in) {
  const int64_t m = in.micro_batches, p = in.pp, v = in.virtual_stages;
  if (p == 1) return {1, 1};
  switch (in.schedule) {
    case ScheduleKind::gpipe:
      return {m, m};
    case ScheduleKind::one_f_one_b:
      return {std::min(m, p), std::min(m, p)};
    case ScheduleKind::interleaved:
      // Megatron's interleaved warm-up on rank 0: 2(p-1) + (v-1)p chunks, then one more.
      return {std::min(m, p), std::min(m * v, 2 * (p - 1) + (v - 1) * p + 1)};
  }
  return {1, 1};
}

}  // namespace

int64_t block_params(const ModelShape& m) {
  return block_params_tp(m, 1);
}

int64_t embedding_params(const ModelShape& m) {
  return model_params(m) - m.n_layer * block_params(m);
}

int64_t model_params(const ModelShape& m) {
  return nn::gpt_params(gpt_config(m));
}

nn::GPTConfig gpt_config(const ModelShape& m) {
  nn::GPTConfig c;
  c.n_layer = m.n_layer;
  c.n_embd = m.n_embd;
  c.n_head = m.n_head;
  c.vocab_size = m.vocab_size;
  c.block_size = m.block_size;
  c.bias = m.bias;
  c.tie_embeddings = m.tie_embeddings;
  return c;
}

Precision parse_precision(const std::string& s) {
  if (s == "f32") return Precision::kF32;
  if (s == "mixed" || s == "bf16") return Precision::kMixed;
  if (s == "f16") return Precision::kMixedF16;
  MT_THROW(ValueError, "precision \"", s, "\" is not one of f32, mixed, bf16, f16");
}

Optimizer parse_optimizer(const std::string& s) {
  if (s == "adamw") return Optimizer::kAdamW;
  if (s == "sgd") return Optimizer::kSgdMomentum;
  if (s == "sgd-plain") return Optimizer::kSgd;
  MT_THROW(ValueError, "optimizer \"", s, "\" is not one of adamw, sgd, sgd-plain");
}

void validate(const MemoryInput& in) {
  const ModelShape& m = in.model;
  if (m.n_layer <= 0 || m.n_embd <= 0 || m.n_head <= 0 || m.vocab_size <= 0 || m.block_size <= 0)
    MT_THROW(ValueError, "model shape: layers, width, heads, vocabulary and context must be > 0");
  if (m.n_embd % m.n_head != 0)
    MT_THROW(ValueError, "model width ", m.n_embd, " is not divisible by its ", m.n_head, " heads");
  if (in.micro_batch <= 0 || in.micro_batches <= 0 || in.virtual_stages <= 0)
    MT_THROW(ValueError, "micro_batch, micro_batches and virtual_stages must be > 0");
  if (in.ep <= 0 || (in.moe.enabled() && in.moe.num_experts % in.ep != 0))
    MT_THROW(ValueError, "parallel.ep = ", in.ep, " does not divide the ", in.moe.num_experts,
             " experts");
  if (in.dp <= 0 || in.tp <= 0 || in.pp <= 0)
    MT_THROW(ValueError, "parallel degrees must be > 0, got dp ", in.dp, " tp ", in.tp, " pp ",
             in.pp);
  if (in.zero_stage < 0 || in.zero_stage > 3)
    MT_THROW(ValueError, "parallel.zero_stage must be 0, 1, 2 or 3, got ", in.zero_stage);
  if (m.n_head % in.tp != 0)
    MT_THROW(ValueError, "parallel.tp = ", in.tp, " does not divide the ", m.n_head, " heads");
  // The plan check's rule (one rule, one message); a plain pipeline of layers that pp does not
  // divide is estimated for its largest stage (the trainer balances the blocks, the embedding
  // and the head over the stages, so no stage holds more blocks than that).
  check_pipeline_split(in.pp, in.virtual_stages, gpt_pipeline_pieces(m.n_layer));
  if (in.virtual_stages > 1 && in.schedule != ScheduleKind::interleaved)
    MT_THROW(ValueError, "parallel.virtual_stages > 1 needs parallel.schedule = \"interleaved\"");
  if (in.checkpoint_every < 0) MT_THROW(ValueError, "checkpoint_every must be >= 0");
  if (in.sequence_parallel && in.tp == 1)
    MT_THROW(ValueError, "parallel.sequence_parallel needs parallel.tp > 1");
}

int64_t block_activation_bytes(const MemoryInput& in, int64_t block) {
  const ModelShape& m = in.model;
  const int64_t a = act_elem_bytes(in), C = m.n_embd, t = in.tp;
  const int64_t T = in.seq_len > 0 ? in.seq_len : m.block_size;
  // Mixed precision is GPU practice: in bf16 or f16 flash attention keeps each row's logsumexp,
  // not the NH x T weights, for the head sizes meshtrain's kernels run (32, 64 and 128); other
  // heads take the GEMM attention, whose weights are f32 under mixed precision too.
  const bool mixed = is_mixed(in.precision);
  const bool flash = mixed && flash_attention_head_size(C / m.n_head);
  int64_t split = ceil_div(12 * C + (flash ? 0 : m.n_head * T), t);
  const int64_t weights_extra = mixed && !flash ? ceil_div(m.n_head * T, t) * (4 - a) : 0;
  if (block >= 0 && in.moe.is_moe_block(block)) {
    // The MLP's hidden activations (c_fc's output and GELU's, 8C) become, per assignment of the
    // token's top_k, a gathered input row, the expert's two hidden rows and its output row, plus
    // the router's f32 logits and probabilities and the gates.
    const int64_t H = in.moe.expert_hidden > 0 ? in.moe.expert_hidden : 4 * C;
    split += in.moe.top_k * (2 * H + 2 * C) - 8 * C;
    return tokens(in) *
           ((split + 4 * C) * a + weights_extra + 16 + (2 * in.moe.num_experts + in.moe.top_k) * 4);
  }
  const int64_t replicated = in.sequence_parallel ? ceil_div(4 * C, t) : 4 * C;
  // LayerNorm statistics are f32 and follow the replicated activations; under mixed precision
  // so does the residual stream (h and the block's output, half of the replicated part), as
  // under PyTorch's autocast.
  const int64_t stats = in.sequence_parallel ? ceil_div(4, t) * 4 : 16;
  const int64_t residual_extra = mixed ? replicated / 2 * (4 - a) : 0;
  return tokens(in) * ((split + replicated) * a + residual_extra + weights_extra + stats);
}

MemoryBreakdown estimate_memory(const MemoryInput& in) {
  validate(in);
  const ModelShape& m = in.model;
  const Bytes per = bytes_per_param(in);
  const int64_t a = act_elem_bytes(in), C = m.n_embd, N = in.dp, t = in.tp;
  const int64_t layers = ceil_div(m.n_layer, in.pp);    // per stage (the largest)
  const int64_t wte_p = ceil_div(m.vocab_size * C, t);  // vocab-parallel
  const int64_t first_p = wte_p + m.block_size * C;
  const int64_t last_p =
      ln_params(m) + (m.tie_embeddings ? (in.pp > 1 ? wte_p : 0) : wte_p);  // head copy
  const int64_t tok = tokens(in);
  const InFlight flight = in_flight_first_stage(in);
  const int64_t ckpt = in.checkpoint_every == 0 ? 0 : ceil_div(layers, in.checkpoint_every);
  const int64_t kept_block = tok * C * a;  // a checkpointed block's output

  // A stage's `layers` blocks (the largest stage's count; the blocks differ only where some
  // are mixtures of experts): their parameters on this rank, the activations of one
  // micro-batch (checkpointed blocks, every:N selecting 0, N, 2N, ..., keep their output), the
  // largest block and the last block's activations.
  struct Blocks {
    int64_t params = 0, act = 0, largest = 0, last_act = 0;
  };
  auto blocks_of = [&](int s) {
    Blocks out;
    const int64_t begin = std::min<int64_t>(s * layers, m.n_layer - layers);
    for (int64_t j = 0; j < layers; ++j) {
      const int64_t block = begin + j;
      const int64_t p = block_params_on_rank(in, block);
      const int64_t act = block_activation_bytes(in, block);
      out.params += p;
      out.largest = std::max(out.largest, p);
      const bool kept = in.checkpoint_every > 0 && j % in.checkpoint_every == 0;
      out.act += kept ? kept_block : act;
      out.last_act = act;
    }
    return out;
  };

  auto stage = [&](int s) {
    const bool first = s == 0, last = s == in.pp - 1;
    MemoryBreakdown b;
    b.pipeline_stage = s;
    const Blocks blocks = blocks_of(s);
    const int64_t stage_act_one_mb = blocks.act;
    const int64_t P = blocks.params + (first ? first_p : 0) + (last ? last_p : 0);
    b.params_on_rank = P;
    switch (in.zero_stage) {
      case 0:
        b.parameters = per.weight * P;
        b.gradients = per.grad * P;
        b.optimizer_state = per.state * P;
        break;
      case 1:
        b.parameters = per.weight * P;
        b.gradients = per.grad * P;
        b.optimizer_state = ceil_div(per.state * P, N);
        break;
      case 2:
        b.parameters = per.weight * P;
        b.gradients = ceil_div(per.grad * P, N);
        b.optimizer_state = ceil_div(per.state * P, N);
        break;
      default:
        b.parameters = ceil_div(per.weight * P, N);
        b.gradients = ceil_div(per.grad * P, N);
        b.optimizer_state = ceil_div(per.state * P, N);
        break;
    }
    // Activations: micro-batches in flight on this stage (the first holds the most; stage s of
    // a 1F1B pipeline holds p - s), each with the stage's blocks plus its end pieces.
    int64_t mbs = 1;
    if (in.pp > 1) {
      mbs = in.schedule == ScheduleKind::gpipe ? in.micro_batches
                                               : std::max<int64_t>(1, flight.micro_batches - s);
    }
    int64_t act = mbs * stage_act_one_mb;
    if (in.schedule == ScheduleKind::interleaved && in.pp > 1 && s == 0) {
      // Chunks of layers / v layers in flight instead of whole stages.
      act = flight.chunks * stage_act_one_mb / in.virtual_stages;
    }
    // The embedding output: the residual stream, f32 under mixed precision too.
    if (first) act += mbs * tok * C * (is_mixed(in.precision) ? 4 : a);
    const int64_t head_act = tok * (C * a + 8 + ceil_div(m.vocab_size, t) * a + 4);
    if (last) act += head_act;
    b.activations = act;

    // Buffers.
    int64_t buf = 0;
    if (N > 1) buf += in.zero_stage == 0 ? 0 : in.bucket_bytes;  // reduce-scatter staging
    if (N > 1 && in.zero_stage == 0) buf += in.bucket_bytes;     // one bucket in flight
    if (in.zero_stage == 3 && N > 1) {
      // The unit being computed and the one prefetched, gathered in full, and the unit's
      // gradient before it is reduce-scattered.
      const int64_t unit = std::max(blocks.largest, first ? first_p : blocks.largest);
      buf += 2 * unit * per.weight + unit * per.grad;
    }
    if (t > 1) buf += tok * C * a;          // the all-reduce's output
    if (in.pp > 1) buf += 2 * tok * C * a;  // activation and gradient in transit
    // d logits; under mixed precision the plain head writes them over its half logits.
    if (last && !(is_mixed(in.precision) && t == 1)) buf += tok * ceil_div(m.vocab_size, t) * a;
    // A recomputed block needs its activations again; that raises the peak only when it is the
    // stage's last block (before any other, backward has freed a whole block's worth).
    if (ckpt > 0 && (layers - 1) % in.checkpoint_every == 0) buf += blocks.last_act;
    b.buffers = buf;
    return b;
  };

  MemoryBreakdown worst = stage(0);
  if (in.pp > 1) {
    MemoryBreakdown last = stage(static_cast<int>(in.pp - 1));
    if (last.total() > worst.total()) worst = last;
  }
  return worst;
}

}  // namespace meshtrain::plan
