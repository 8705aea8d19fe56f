// Per-rank memory of one training layout: parameters, gradients, optimizer state, activations and
// buffers, in bytes. The planner ranks layouts with it and the engine's memory guard checks a run
// against it before allocating, so both speak of the same number; it therefore depends on nothing
// but the standard library (no engine, no tensors) and describes what meshtrain's own layers keep.
//
// Dimension letters as in nn/gpt.h: B micro-batch, T tokens per sequence, C width, NH heads,
// V vocabulary, L layers; a = bytes of one activation element (4 for f32, 2 for mixed).
//
// Activations saved for backward by one GPT block, per token (measured against nn::GPT with a
// counting allocator in tests/plan/memory_model_test.cpp):
//   ln_1 out C, qkv 3C, attention output C, attention weights NH*T, residual h C, ln_2 out C,
//   c_fc out 4C, GELU out 4C, block output C  = 16C + NH*T elements, plus the two LayerNorms'
//   mean and rstd (4 f32); the projections' outputs go once added (an addition keeps only its
//   operands' shapes).
// With tensor parallelism of degree t the column-parallel halves (qkv, attention output and
// weights, c_fc, GELU: 12C + NH*T) are divided by t and the rest (4C) is replicated; sequence
// parallelism divides the replicated part by t as well. A checkpointed block keeps only its
// output (C). Outside the blocks: the embedding output C on the first stage; ln_f's output C, its
// statistics and the logits V/t (and their log-sum-exp) on the last. Dropout masks are not
// counted (meshtrain's dropout replaces the tensor it masks instead of adding one).
// Mixed precision is what the device engine keeps under bf16 autocast: the activations above in
// 2 bytes but the residual stream (h, the block output) in f32, no attention weights (flash
// attention, for heads of 32, 64 or 128; f32 weights otherwise), and the logits' gradient written
// over the logits (the plain head); checked against the fake device's count of a GPT-2 step in
// tests/cuda/device_memory_test.cpp.
#pragma once

#include <cstdint>
#include <string>

#include "meshtrain/nn/moe_config.h"
#include "meshtrain/plan/schedule_kind.h"

namespace meshtrain::nn {
struct GPTConfig;
}  // namespace meshtrain::nn

namespace meshtrain::plan {

// A dense GPT-2 style decoder (nn::GPT's shape).
struct ModelShape {
  int64_t n_layer = 12;
  int64_t n_embd = 768;
  int64_t n_head = 12;
  int64_t vocab_size = 50257;
  int64_t block_size = 1024;  // context T
  bool bias = true;
  bool tie_embeddings = true;
};

// Parameters of one block, of the whole model, and of the embeddings and head together
// (nn/gpt_costs.h's formulas).
int64_t block_params(const ModelShape& m);
int64_t model_params(const ModelShape& m);
int64_t embedding_params(const ModelShape& m);
// The GPT of this shape, for the cost formulas of nn/gpt_costs.h.
nn::GPTConfig gpt_config(const ModelShape& m);

enum class Precision {
  kF32,       // f32 weights, gradients and activations (train.precision = f32, and CPU autocast)
  kMixed,     // bf16 weights and activations, f32 gradients and master weights (GPU practice)
  kMixedF16,  // the same in f16 (with loss scaling)
};
// Whether activations and the products' weights are 2-byte (bf16 or f16).
inline bool is_mixed(Precision p) {
  return p != Precision::kF32;
}
enum class Optimizer { kAdamW, kSgdMomentum, kSgd };

// "f32" | "mixed" or "bf16" | "f16", "adamw" | "sgd" (momentum) | "sgd-plain"; ValueError
// naming the accepted values otherwise. Schedules: schedule_kind.h.
Precision parse_precision(const std::string& s);
Optimizer parse_optimizer(const std::string& s);

struct MemoryInput {
  ModelShape model;
  int64_t micro_batch = 1;  // sequences per micro-batch per data-parallel rank (B)
  int64_t seq_len = 0;      // tokens per sequence (0 = model.block_size)
  Precision precision = Precision::kF32;
  Optimizer optimizer = Optimizer::kAdamW;
  int zero_stage = 0;  // 0 (DDP), 1, 2, 3
  int64_t dp = 1, tp = 1, pp = 1;
  // Mixture-of-experts blocks (every = 0: a dense model) and expert parallelism (a
  // sub-dimension of dp): each rank holds num_experts / ep experts of every such block.
  nn::MoEConfig moe;
  int64_t ep = 1;
  bool sequence_parallel = false;
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  int64_t micro_batches = 1;        // per optimizer step (pipeline micro-batches or accumulation)
  int64_t virtual_stages = 1;       // model chunks per pipeline rank (interleaved schedule)
  int64_t checkpoint_every = 0;     // 0: no activation checkpointing; N: every N-th block (1 = all)
  int64_t bucket_bytes = 25 << 20;  // gradient bucket (dist.bucket_mb)
};

// Bytes on the rank that holds the most (the first or the last pipeline stage).
struct MemoryBreakdown {
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizer_state = 0;
  int64_t activations = 0;  // saved for backward at the peak of the schedule
  // Communication buckets, ZeRO-3 units gathered in flight, pipeline send/receive buffers and the
  // backward working set (the logits' gradient; a recomputed block when the last one is).
  int64_t buffers = 0;
  // The process itself: code, shared libraries, runtime and allocator state, which is host
  // memory on a CPU cluster and dominates a small model's footprint. estimate_memory leaves it 0
  // (a running process, such as the memory guard's, already holds it and the free memory it is
  // checked against already lacks it); the planner sets it from ClusterSpec::process_memory.
  int64_t process = 0;
  int64_t params_on_rank = 0;  // parameter count held in full (before ZeRO sharding)
  int pipeline_stage = 0;      // which stage this breakdown is for
  int64_t total() const {
    return parameters + gradients + optimizer_state + activations + buffers + process;
  }
};

// Activations saved by one micro-batch of one (not checkpointed) block, in bytes.
int64_t block_activation_bytes(const MemoryInput& in, int64_t block = -1);

// Checks the input (degrees positive, layers divisible by pp * virtual_stages, heads by tp, a
// known ZeRO stage) and throws ValueError naming the field that is wrong.
void validate(const MemoryInput& in);
MemoryBreakdown estimate_memory(const MemoryInput& in);

}  // namespace meshtrain::plan
