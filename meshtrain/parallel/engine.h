// TrainEngine: the one owner of a training step. The trainer hands it a step's micro-batches and
// gets back the global mean loss (the same bits on every rank), the gradient norm and whether the
// step was skipped; it never learns which parallel strategy ran. There is one implementation,
// composed of parts chosen once by make_engine from the layout (engine_parts.cpp):
//   - a StepRunner: the local model micro-batch after micro-batch, or this rank's pipeline
//     stages through a schedule (parts/step_runner.h);
//   - a GradSync: none, the bucketed Reducer (all-reduce = DDP and ZeRO-1, reduce-scatter =
//     ZeRO-2; overlapped with backward, or held for a pipeline), or ZeRO-3's per-unit
//     reduce-scatter (parts/grad_sync.h);
//   - a ParamSync: none, the all-gather after the step (ZeRO-1/2), the gather of each unit
//     around its forward and backward (ZeRO-3), or gossip averaging with neighbouring replicas
//     after each replica's own update (parts/param_sync.h);
//   - an Update: the optimizer over whole tensors or over flat shards (parts/update.h).
// The step's loss record, the one gradient norm (parts/grad_norm.h), the clip/skip/update path
// and the checkpoint path (parameters and state by their ParamInfo placements) are the engine's
// own, the same for every composition. No part tests which other parts are present.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/ckpt/checkpoint_loader.h"
#include "meshtrain/ckpt/rank_shards.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/obs/phase_clock.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/optim/loss_scaler.h"
#include "meshtrain/optim/optimizer.h"
#include "meshtrain/optim/sgd.h"
#include "meshtrain/parallel/batch.h"
#include "meshtrain/parallel/ddp/reducer.h"
#include "meshtrain/parallel/expert/expert_groups.h"
#include "meshtrain/parallel/gossip/gossip_graph.h"
#include "meshtrain/parallel/layer_grad_norms.h"
#include "meshtrain/parallel/mesh/device_mesh.h"
#include "meshtrain/parallel/param_server/ps_links.h"
#include "meshtrain/parallel/parts/update.h"
#include "meshtrain/parallel/pipeline/pipeline_stages.h"
#include "meshtrain/parallel/train_model.h"

namespace meshtrain::parallel {

class ModelSource;
class StepRunner;
class GradSync;
class ParamSync;
class Update;
struct StepRecord;
class FsdpUnits;
class ZeroShards;

struct EngineOptions {
  // 0: DDP (every rank holds everything, gradients all-reduced); 1: optimizer state sharded over
  // the dp group; 2: gradients too (reduce-scattered); 3: parameters too (FSDP).
  int zero_stage = 0;
  bool fsdp_unit_per_block = true;  // ZeRO-3: gather one layer at a time (false: the model)
  ReducerOptions reducer;
  optim::OptimizerKind optimizer = optim::OptimizerKind::adamw;
  optim::AdamWOptions adamw;
  optim::SgdOptions sgd;
  float weight_decay = 0.0f;  // on matrices and embeddings (optim::decay_groups)
  DType precision = DType::f32;
  std::optional<optim::LossScalerOptions> loss_scaler;  // f16
  uint64_t seed = 0;                                    // dropout masks
  pipeline::PipelineOptions pipeline;                   // the mesh's pp > 1
  bool sequence_parallel = false;                       // the mesh's tp > 1
  // Every training step starts from the first replica's buffers (BatchNorm's running statistics),
  // as PyTorch's DistributedDataParallel(broadcast_buffers=True) does, so that the replicas'
  // evaluations and checkpoints agree. SyncBatchNorm keeps them equal without it.
  bool broadcast_buffers = true;
  // Set: no gradient all-reduce; each replica steps on its own gradients, then averages its
  // parameters with its neighbours in this graph (parallel.mode = "gossip"; data parallelism
  // only, zero_stage 0).
  std::optional<GossipGraph> gossip;
};

// A parameter-server job as a worker sees it: its channel to each server (param_server/
// ps_links.h) and how the servers are set up.
struct ParamServerSpec {
  std::vector<PsPeer> links;  // per server
  int servers = 1;
  int consistency = 0;  // PsConsistency: 0 sync, 1 async, 2 ssp
  int staleness = 3;
  int backup_workers = 0;
  // This process replaces a worker that failed, in a job that went on: it joins before its
  // first step (TrainEngine::join_running_job).
  bool replacement = false;
};

// What make_engine builds an engine from: the model, the ranks arranged on the mesh {pp, dp, tp}
// (a mesh of one process without a group), the device, and the options.
struct EngineSpec {
  std::shared_ptr<const ModelSource> model;
  DeviceMesh mesh{nullptr, {{"pp", 1}, {"dp", 1}, {"tp", 1}}};
  Device device = Device::cpu();
  // Reduces device gradients (nccl) where the parameters live on a device; null: the dp group.
  comm::ProcessGroupPtr grad_group;
  EngineOptions options;
  // Set on the workers of a parameter-server job: the dp group is the workers', and the
  // gradients go to the servers instead of an all-reduce.
  std::optional<ParamServerSpec> param_server;
  // Set under expert parallelism (parallel.ep > 1): the mixture-of-experts blocks' experts are
  // shared out over blocks of the dp group (expert/expert_groups.h).
  std::optional<ExpertGroups> experts;
};

struct StepOptions {
  int64_t step = 0;  // 1-based: the dropout masks depend on it
  float lr = 0.0f;
  double grad_clip = 0.0;     // max global gradient norm; 0: off
  bool stop_request = false;  // this rank was asked to stop (every rank learns of it)
  // Rank 0's decision that this step ends with a checkpoint (ckpt.interval_minutes); the other
  // ranks' values are ignored and every rank learns rank 0's in StepOutcome::save.
  bool save_request = false;
  bool layer_norms = false;  // fill StepOutcome::layer_grad_norms (train.log_layer_norms)
  bool poison_loss = false;  // fault injection: this rank's loss is NaN
  float scale_loss = 1.0f;   // fault injection: this rank's reported loss is multiplied
  // Fault injection, a slow node: this rank idles this many times its forward and backward
  // before it reports its step, so that its compute time (rank_step_s) and the others' wait
  // for it both grow as on a node that is that much slower.
  double stall_compute = 0.0;
  // Asked once the step's loss and gradient norm are known (the same on every rank) and finite:
  // true skips the update (a loss spike).
  std::function<bool(float loss, double grad_norm)> skip_update;
  obs::PhaseClock* phases = nullptr;
  // Runs once the gradients are reduced, before anything changes the parameters or the
  // optimizer state (a checkpoint still copying them finishes here).
  std::function<void()> before_update;
};

struct StepOutcome {
  float loss = 0.0f;  // mean over micro-batches and ranks, the same bits everywhere
  // Before clipping. Where each replica clips by its own gradients' norm (gossip): the mean of
  // the replicas' norms, so that every rank takes the same skip decision.
  double grad_norm = 0.0;
  bool skipped = false;             // non-finite loss or gradients: no update
  bool overflow = false;            // f16: the loss scaler found non-finite gradients
  bool spike = false;               // skipped because skip_update said so
  float loss_scale = 1.0f;          // the scale this step ran with
  bool stop = false;                // some rank was asked to stop
  bool save = false;                // rank 0 asked for a checkpoint at this step
  std::vector<double> rank_step_s;  // per rank: seconds to the end of its backward
  // With StepOptions::layer_norms: (layer, gradient norm before clipping) per layer, over the
  // unique shards, the same on every rank (layer_grad_norms.h; under gossip, this replica's).
  std::vector<std::pair<std::string, double>> layer_grad_norms;
  // What the model counts of its step, over every replica (the experts' loads; null: nothing).
  nlohmann::json model_metrics;
  // This rank's gradient was not applied (a parameter server's backup workers left it out):
  // the trainer trains the same micro-batches again, so no sample is lost.
  bool requeue = false;
  // What the gradient synchronisation measured of the step ("ps": a parameter server's
  // staleness, version, bytes and latency; null: nothing).
  nlohmann::json sync_metrics;
};

// The data-parallel mesh of a job whose every rank is a replica: {pp 1, dp world, tp 1}.
// Collective over `world` (null: one process).
DeviceMesh data_parallel_mesh(comm::ProcessGroupPtr world);

// The optimizer of the options over the given groups (AdamW or SGD with the run's settings).
std::unique_ptr<optim::Optimizer> make_engine_optimizer(const EngineOptions& options,
                                                        std::vector<optim::ParamGroup> groups);

class TrainEngine;
// The one way to build an engine: chooses the parts from the layout and the options. The model
// starts from the same values on every rank. Collective over the mesh.
std::unique_ptr<TrainEngine> make_engine(EngineSpec spec);

class TrainEngine {
 public:
  struct Parts {
    // Destroyed in reverse: the update (which may refer to the shards a ParamSync owns) first,
    // the runner (which owns the model the others refer to) last. One object may be two parts
    // (ZeRO-3's units are the GradSync and the ParamSync).
    std::shared_ptr<StepRunner> runner;
    std::shared_ptr<GradSync> grads;
    std::shared_ptr<ParamSync> params;
    std::shared_ptr<Update> update;
  };
  // Use make_engine.
  TrainEngine(EngineSpec spec, Parts parts);
  ~TrainEngine();
  TrainEngine(const TrainEngine&) = delete;
  TrainEngine& operator=(const TrainEngine&) = delete;

  StepOutcome train_step(const std::vector<Batch>& micro_batches, const StepOptions& options);
  // Mean loss over the batches (no gradients, eval mode); local to this rank's replica.
  // `accuracy` (not null): the fraction of samples a classifier labels right (-1: it does not
  // classify, or runs as a pipeline).
  float evaluate(const std::vector<Batch>& batches, double* accuracy = nullptr);
  // Every rank compares parameter checksums; Error naming the ranks and the first differing
  // tensor when the replicas diverged.
  void check_in_sync(int64_t step);

  // This rank's part of a checkpoint (tensors with their placements); returns the optimizer's
  // scalars for the train state. Every layout writes the plain model's tensors under their
  // global names.
  nlohmann::json checkpoint_state(ckpt::RankShards& shards, int rank) const;
  // Loads model and optimizer from a checkpoint of any layout (DDP, ZeRO, pipeline stages,
  // tensor-parallel parts; any world size).
  void restore(const ckpt::Checkpoint& checkpoint, const nlohmann::json& optimizer_scalars);
  // After the last step: model() of `root` holds the whole parameters (-1: every rank).
  // Collective. No training step may follow.
  void consolidate(int root = -1);
  // Every parameter's whole value in tensors of their own, as the model would hold it without
  // sharding. Collective.
  nn::NamedTensors gather_parameters() const;

  // The whole model: on every rank when each holds it whole, elsewhere after consolidate().
  nn::Module& model();
  const nn::Module& model() const;
  TrainModel& train_model();
  // The parameters this rank holds: the whole model's, its tp parts, or its pipeline stages'
  // (with the last stage's copy of a tied parameter), and their ParamInfo in the same order.
  const nn::NamedTensors& local_parameters() const;
  std::vector<nn::ParamInfo> local_param_infos() const;
  // The whole model's parameter count, whichever part of it this rank holds.
  int64_t num_parameters() const;
  // The data-parallel replicas (the ranks reading different data) and this rank's index.
  int data_parallel_rank() const;
  int data_parallel_size() const;
  optim::LossScaler* loss_scaler() { return scaler_.get(); }
  // The bucketed reducer where gradients go through one, and its comm hook.
  CommHook* comm_hook();
  const Reducer* reducer() const;
  const FsdpUnits* fsdp() const;
  int zero_stage() const { return spec_.options.zero_stage; }
  // False where the replicas step on their own (parameter-server async, ssp, backup workers):
  // the trainer then evaluates each replica alone instead of sharing rank 0's result.
  bool lockstep() const;
  // A replacement for a process that failed, in a job that went on (ParamSync::join_running_job):
  // the step to continue after, its parameters taken; nullopt where a job cannot be joined.
  std::optional<int64_t> join_running_job();
  // The strategy for the start-up line ("ZeRO-3 over 4 ranks"); empty for plain data
  // parallelism and for one process.
  std::string describe() const;
  // Bytes this rank holds beyond parameters, gradients and optimizer state between steps: the
  // buffers gradients and gathered units pass through.
  size_t in_flight_bytes() const;
  int rank() const { return spec_.mesh.rank(); }
  int world() const { return spec_.mesh.size(); }

 private:
  StepOutcome finish_step(StepOutcome out, float loss_v, double norm, double clip_norm,
                          const StepOptions& so, obs::PhaseClock& phases);
  struct Norm;
  Norm step_norm(const StepOptions& so);
  // Whether this step's update may be decided on the device (optim/step_gate.h).
  bool gate_on_device(const StepOptions& so) const;
  StepOutcome finish_gated_step(StepOutcome out, DeviceGatedUpdate& gated, const Tensor& losses,
                                const StepRecord& record, const StepOptions& so,
                                obs::PhaseClock& phases);
  StatePlace state_place() const;

  EngineSpec spec_;
  Parts parts_;
  std::unique_ptr<optim::LossScaler> scaler_;
  comm::ProcessGroupPtr dp_;
  comm::ProcessGroupPtr norm_group_;  // null: every rank holds the same whole gradients
  // Each replica steps on its own gradients (GradSync::reduces_over_replicas): its norm is its
  // own, and the replicas agree on their mean for the decisions every rank takes alike.
  bool own_gradients_ = false;
  LayerGroups layers_;  // of the whole model, for per-layer gradient norms
  NormShare share_;
  std::shared_ptr<TrainModel> whole_;  // the whole model, where this rank holds it
};

}  // namespace meshtrain::parallel
