// The trainer's side of checkpoints: what a training step's state is (model, optimizer, data
// position, comm-hook state, step) and how it maps onto the checkpoint writer and loader. Kept
// out of trainer.cpp so that the loop itself only says when to save and where it resumed.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "meshtrain/ckpt/checkpoint_loader.h"
#include "meshtrain/ckpt/checkpoint_writer.h"
#include "meshtrain/ckpt/remote_checkpoints.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/comm/store.h"
#include "meshtrain/data/prefetch_loader.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/optim/loss_scaler.h"
#include "meshtrain/optim/optimizer.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/runtime/checkpoint_barrier.h"
#include "meshtrain/runtime/resolved_config.h"

namespace meshtrain::runtime {

// The local checkpoint root: ckpt.dir, or <train.out_dir>/checkpoints when it is empty or an
// s3:// URI (then the local staging root every checkpoint is written to before its upload).
std::string checkpoint_root(const TrainConfig& config);
// ckpt.dir when it is an s3://bucket/prefix URI, else empty.
std::string checkpoint_remote(const TrainConfig& config);

// Every rank must have resumed from the same step (a checkpoint visible to some ranks only, or
// one that failed verification on some ranks, would silently split the replicas); Error naming
// both steps otherwise. No-op without a group.
void check_same_resume_step(int64_t step, comm::ProcessGroup* group);

// How a job resumed at another world size keeps training the same problem.
struct ElasticBatch {
  int64_t grad_accum_steps = 1;  // the accumulation to train with from now on
  std::string message;           // one line saying what was done; empty when nothing changed
};

// dist.elastic_batch = keep: the global batch of the checkpoint (`saved_global_batch`, written
// by `saved_replicas` data-parallel replicas) is kept by scaling the accumulation, so that
// replicas x accumulation x micro-batch stays the same; ValueError, one line, when the new
// data-parallel size and micro-batch do not divide it. rescale_lr: the configured accumulation
// stays, the global batch changes and the learning rate follows optim.lr_scale_rule (the trainer
// computes it from the new batch).
ElasticBatch plan_elastic_batch(const ResolvedConfig& config, int64_t saved_replicas,
                                int64_t saved_global_batch, int64_t replicas);

class TrainerCheckpoints {
 public:
  using LogFn = std::function<void(const std::string&)>;
  // Called when a save is over (on the writer's thread): see ckpt::WriterOptions::on_done.
  using SavedFn = std::function<void(int64_t step, double seconds, uint64_t bytes, bool ok)>;

  // `store` (null for one process) carries the writer's barrier: it runs on the writer's
  // background thread, so it must not share the training process group. `restart_count`: the
  // launcher's TORCHELASTIC_RESTART_COUNT (DistEnv::restart_count).
  TrainerCheckpoints(const ResolvedConfig& config, int rank, int world, int restart_count,
                     std::shared_ptr<comm::Store> store, LogFn log, SavedFn on_saved = {},
                     FaultPlan faults = {});
  ~TrainerCheckpoints();

  // Loads the checkpoint ckpt.resume_from names into the training objects and returns its
  // step, or 0 when there is none: latest, the newest good one (falling back past bad ones);
  // best, the one `ROOT/best` names; else a path (a step directory, or a root or pointer file
  // resolved like `meshtrain ckpt`). A named checkpoint is never replaced by another: one that
  // is missing or fails verification is an error. A restart of the job
  // (TORCHELASTIC_RESTART_COUNT > 0) always continues from latest. Logs "resumed from DIR (step
  // N of M)".
  int64_t resume(parallel::TrainEngine& engine, data::PrefetchingLoader& loader);
  // Waits for the save in flight (a failure is logged, not thrown), meets the other ranks, then
  // loads the newest good checkpoint of step <= before_step like resume() (model, optimizer,
  // data position, comm-hook state) and returns its step. Every rank calls it at the same step
  // (group: all ranks, null for one process). Error when there is none.
  int64_t rollback(int64_t before_step, comm::ProcessGroup* group, parallel::TrainEngine& engine,
                   data::PrefetchingLoader& loader);
  // Every rank calls this at the same steps; a step already saved is skipped. Returns before
  // the model and optimizer tensors are copied (with ckpt.async): wait_snapshot() must come
  // before anything changes them, i.e. before the next optimizer step. val_loss: the loss of
  // an evaluation at this step, recorded in the train state; best (the same on every rank):
  // this step is the new best, `ROOT/best` follows once it is committed.
  void save(int64_t step, parallel::TrainEngine& engine, const data::PrefetchingLoader& loader,
            std::optional<float> val_loss = std::nullopt, bool best = false);
  // Waits until the last save's copy of the state is taken (at once when it is); returns the
  // seconds waited.
  double wait_snapshot();
  // Waits for the save in flight; throws its failure.
  void wait();
  // This process replaces a rank that died (an asynchronous parameter-server worker) and resumed
  // `resumed`; its predecessor reached `joined`. The predecessor may have been told to save an
  // interval step between them and died before arriving at its barrier: arriving there in its
  // place lets the others go on (that checkpoint is then incomplete and not committed).
  void arrive_for_predecessor(int64_t resumed, int64_t joined);
  const std::string& root() const { return root_; }
  // The world size and global batch (sequences per optimizer step) of the checkpoint that
  // resume() loaded; 0 when it loaded none.
  int64_t resumed_world() const { return resumed_world_; }
  // Its data-parallel replicas (the world size without a pipeline).
  int64_t resumed_replicas() const { return resumed_replicas_; }
  int64_t resumed_global_batch() const { return resumed_global_batch_; }
  // The train state of the checkpoint resume() loaded (null when none).
  const nlohmann::json& resumed_state() const { return resumed_state_; }
  // True when resume() found checkpoints but could load none (it started from step 0).
  bool resume_failed() const { return resume_failed_; }
  // The accumulation that later saves record (after plan_elastic_batch changed it).
  void set_grad_accum_steps(int64_t steps) { config_.train.grad_accum_steps = steps; }

 private:
  void restore(const ckpt::Checkpoint& checkpoint, parallel::TrainEngine& engine,
               data::PrefetchingLoader& loader);
  // ckpt.dir = s3://...: brings the remote newest (and best) checkpoint into root_ when the local
  // root lacks it, and queues the local newest for upload when the remote lacks it. A server
  // that cannot be reached is logged (the run goes on from the local checkpoints); refused
  // credentials are an error.
  void sync_remote();

  TrainConfig config_;
  ResumeFrom resume_from_ = ResumeFrom::latest;
  int restart_count_ = 0;
  int rank_ = 0;
  int world_ = 1;
  std::string root_;
  LogFn log_;
  int64_t last_saved_ = -1;
  int64_t resumed_world_ = 0;
  int64_t resumed_replicas_ = 0;
  int64_t resumed_global_batch_ = 0;
  nlohmann::json resumed_state_;
  bool resume_failed_ = false;
  int replicas_ = 1;                            // data-parallel replicas: world / parallel.pp
  std::shared_ptr<CheckpointBarrier> barrier_;  // null for one process
  // ckpt.dir = s3://...: the bucket and prefix, the client, and (rank 0) the uploader. Declared
  // before writer_, whose completion callback feeds the mirror, so that the writer goes first.
  std::optional<ckpt::ObjectUri> remote_;
  std::shared_ptr<ckpt::ObjectStore> remote_store_;
  std::unique_ptr<ckpt::CheckpointMirror> mirror_;
  std::unique_ptr<ckpt::CheckpointWriter> writer_;
};

}  // namespace meshtrain::runtime
