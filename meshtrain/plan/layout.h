// A training job the planner is asked about (model, global batch, optimizer) and one way to lay
// it out on ranks (data x tensor x pipeline degrees, ZeRO stage, micro-batching, schedule,
// activation checkpointing). Ranks are ordered pp-major, then dp, with tp varying fastest, as
// the engine's DeviceMesh orders them: a TP group is tp consecutive ranks.
#pragma once

#include <cstdint>
#include <string>

#include "meshtrain/plan/memory_model.h"

namespace meshtrain::plan {

struct TrainSetup {
  std::string model_name = "custom";
  ModelShape model;
  int64_t global_batch = 8;  // sequences per optimizer step
  int64_t seq_len = 0;       // 0 = model.block_size
  Optimizer optimizer = Optimizer::kAdamW;
  int64_t bucket_bytes = 25 << 20;

  int64_t tokens_per_sequence() const { return seq_len > 0 ? seq_len : model.block_size; }
};

struct Layout {
  int64_t dp = 1, tp = 1, pp = 1;
  int zero_stage = 0;
  int64_t micro_batch = 1;    // sequences per micro-batch per data-parallel rank
  int64_t micro_batches = 1;  // per optimizer step: global_batch = dp * micro_batch * this
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  int64_t virtual_stages = 1;
  bool sequence_parallel = false;
  int64_t checkpoint_every = 0;  // 0 none, 1 all blocks

  int64_t world() const { return dp * tp * pp; }
  // "dp4 tp2 pp2 z1 B2x8 1f1b ckpt"
  std::string str() const;
};

// The memory model's input for a layout of a job.
MemoryInput memory_input(const TrainSetup& job, const Layout& layout, Precision precision);

// The layout a memory model input describes (its inverse, for a run read from a config).
Layout layout_of(const MemoryInput& in);

}  // namespace meshtrain::plan
