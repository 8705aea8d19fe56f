// The faults a test injects into a training run, as one plan read once from the MESHTRAIN_TEST_*
// variables (env_registry.h) by the program's entry point (meshtrain train) and passed down
// explicitly (runtime::TrainerOptions::faults, ckpt::WriterOptions::faults): no library code
// reads a process-wide plan, and a run built in a test without one injects nothing. Not a feature:
// the fault-tolerance tests set these to make a crash, a half-written checkpoint, a NaN or a loss
// spike happen at a step they choose. The crash and the stalled checkpoint fire on a job's first
// attempt only (TORCHELASTIC_RESTART_COUNT 0), so that the restart the test expects runs clean.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace meshtrain {

struct FaultPlan {
  // MESHTRAIN_TEST_CRASH_AT_STEP=N: rank 1 (rank 0 of a single process) throws at step N.
  std::optional<int64_t> crash_at_step;
  // MESHTRAIN_TEST_NAN_STEPS=A[-B][,always]: the last rank's loss is NaN at steps A..B, before the
  // first rollback only unless `always`.
  std::optional<int64_t> nan_first, nan_last;
  bool nan_always = false;
  // MESHTRAIN_TEST_SPIKE_STEP=N: the last rank's loss is 1000x at step N.
  std::optional<int64_t> spike_step;
  // MESHTRAIN_TEST_CKPT_STALL_AT_STEP=N: the checkpoint writer stops for good halfway through
  // step N's checkpoint (after the shards, before the rank record).
  std::optional<int64_t> ckpt_stall_at_step;
  // MESHTRAIN_TEST_CKPT_SNAPSHOT_DELAY_MS=N: every snapshot copy is held back N ms.
  std::chrono::milliseconds ckpt_snapshot_delay{0};
  // MESHTRAIN_TEST_SLOWDOWN=F[@R][~P]: rank R (without @R: every rank that sees the variable, as
  // the workers of one node do) idles (F - 1) x its forward and backward inside each step, before
  // it reports the step to the others: a node whose compute is F times slower than theirs. With
  // ~P only a step in P of them on average (drawn per rank and step, the same in every run): a
  // node with passing stalls, which is what bounded staleness absorbs.
  double slowdown = 1.0;
  std::optional<int64_t> slowdown_rank;
  double slowdown_probability = 1.0;
  // TORCHELASTIC_RESTART_COUNT is set and not 0.
  bool restarted = false;

  // Reads the variables; a malformed value is a ValueError naming the variable.
  static FaultPlan from_env();
  // Parses one "NAME=VALUE" set, for tests of the plan itself.
  static FaultPlan parse(const std::function<std::optional<std::string>(const std::string&)>& get);

  bool crash_now(int64_t step, int rank, int world) const;
  bool nan_now(int64_t step, int rank, int world, int64_t rollbacks) const;
  float loss_scale_now(int64_t step, int rank, int world) const;  // 1 or the spike's 1000
  bool ckpt_stall_now(int64_t step) const;
  // How long this rank waits in step `step`, whose compute took `step_s` seconds.
  std::chrono::duration<double> slowdown_after(double step_s, int rank, int64_t step = 0) const;
};

}  // namespace meshtrain
