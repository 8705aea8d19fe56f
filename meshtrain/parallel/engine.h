// TrainEngine: the one owner of a training step. The trainer hands it a step's micro-batches and
// gets back the global mean loss (the same bits on every rank), the gradient norm and whether the
// step was skipped; it never learns which parallel strategy ran. The engine is composed of parts
// rather than subclassed per strategy:
//   - a stage runner: forward and backward of the local model over the micro-batches, with
//     gradient accumulation, autocast and loss scaling;
//   - a GradSync: the bucketed Reducer, all-reducing (DDP) or reduce-scattering (ZeRO-2) each
//     bucket as its gradients become ready, overlapped with backward;
//   - a ParamSync and an optimizer: the whole-parameter optimizer (DDP), ZeroShards, which
//     updates this rank's flat shard and all-gathers the parameters after the step (ZeRO-1/2),
//     or FsdpUnits, which gathers each unit before its forward and backward and reduce-scatters
//     its gradients as its backward ends (ZeRO-3).
// Everything strategy-specific that the trainer used to do by hand (set_require_sync,
// prepare_for_backward, launch_remaining, finalize_backward, the replica checksum guard, which
// tensors a checkpoint holds) lives here.
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
#include "meshtrain/nn/gpt.h"
#include "meshtrain/obs/phase_clock.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/optim/loss_scaler.h"
#include "meshtrain/optim/optimizer.h"
#include "meshtrain/optim/sgd.h"
#include "meshtrain/parallel/batch.h"
#include "meshtrain/parallel/ddp/reducer.h"
#include "meshtrain/parallel/layer_grad_norms.h"
#include "meshtrain/parallel/mesh/device_mesh.h"
#include "meshtrain/parallel/pipeline/pipeline_stages.h"

namespace meshtrain::parallel {

class ZeroShards;
class FsdpUnits;
namespace tp {
class TpGPT;
}

struct EngineOptions {
  // 0: DDP (every rank holds everything, gradients all-reduced); 1: optimizer state sharded over
  // the dp group; 2: gradients too (reduce-scattered); 3: parameters too (FSDP).
  int zero_stage = 0;
  bool fsdp_unit_per_block = true;  // ZeRO-3: gather one block at a time (false: the model)
  ReducerOptions reducer;
  optim::OptimizerKind optimizer = optim::OptimizerKind::adamw;
  optim::AdamWOptions adamw;
  optim::SgdOptions sgd;
  float weight_decay = 0.0f;  // on matrices and embeddings (optim::decay_groups)
  DType precision = DType::f32;
  std::optional<optim::LossScalerOptions> loss_scaler;  // f16
  uint64_t seed = 0;                                    // dropout masks
  pipeline::PipelineOptions pipeline;                   // parallel.pp > 1 (the second constructor)
  // parallel.sequence_parallel, for the second constructor on a mesh with tp > 1 (the third
  // takes it in its model's TpContext).
  bool sequence_parallel = false;
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
  // Asked once the step's loss and gradient norm are known (the same on every rank) and finite:
  // true skips the update (a loss spike).
  std::function<bool(float loss, double grad_norm)> skip_update;
  obs::PhaseClock* phases = nullptr;
  // Runs once the gradients are reduced, before anything changes the parameters or the
  // optimizer state (a checkpoint still copying them finishes here).
  std::function<void()> before_update;
};

struct StepOutcome {
  float loss = 0.0f;                // mean over micro-batches and ranks, the same bits everywhere
  double grad_norm = 0.0;           // before clipping
  bool skipped = false;             // non-finite loss or gradients: no update
  bool overflow = false;            // f16: the loss scaler found non-finite gradients
  bool spike = false;               // skipped because skip_update said so
  float loss_scale = 1.0f;          // the scale this step ran with
  bool stop = false;                // some rank was asked to stop
  bool save = false;                // rank 0 asked for a checkpoint at this step
  std::vector<double> rank_step_s;  // per rank: seconds to the end of its backward
  // With StepOptions::layer_norms: (layer, gradient norm before clipping) per layer, over the
  // unique shards, the same on every rank (layer_grad_norms.h).
  std::vector<std::pair<std::string, double>> layer_grad_norms;
};

class TrainEngine {
 public:
  // `group` is the dp group (null: one process); `grad_group` reduces gradients (the same group
  // on the CPU, nccl for device parameters; null: `group`). The model starts from rank 0's
  // values everywhere. Collective over `group`.
  TrainEngine(std::shared_ptr<nn::GPT> model, comm::ProcessGroupPtr group,
              comm::ProcessGroupPtr grad_group, Device device, EngineOptions options);
  // Pipeline parallelism: this rank builds only its stage(s) of `config`'s GPT, placed by the
  // mesh's pp coordinate, and averages their gradients over the mesh's dp group (ZeRO-1/2:
  // shards them over it). Every method below works as above; model() exists only after
  // consolidate(). On the CPU; no ZeRO-3. With a tp dimension of more than one rank (the 3D
  // mesh) the stages are made of tensor-parallel layers (tp::TpGPTStage), this rank's shards of
  // them: f32, ZeRO stage 0 to 2. With pp = 1 and tp > 1 it is tensor parallelism as one stage,
  // which is how ZeRO-1/2 runs with tp alone.
  TrainEngine(const nn::GPTConfig& config, const DeviceMesh& mesh, EngineOptions options);
  // Tensor parallelism: each rank holds its tp shards (tp::TpGPT over `tp_group`); `group` is the
  // dp group, over which the shards are data-parallel replicas. CPU, ZeRO stage 0, f32 (ZeRO-1/2
  // with tp: the constructor from a mesh, as one stage).
  // model() exists after consolidate().
  TrainEngine(std::shared_ptr<tp::TpGPT> model, comm::ProcessGroupPtr group,
              comm::ProcessGroupPtr tp_group, EngineOptions options);
  ~TrainEngine();
  TrainEngine(const TrainEngine&) = delete;
  TrainEngine& operator=(const TrainEngine&) = delete;

  StepOutcome train_step(const std::vector<Batch>& micro_batches, const StepOptions& options);
  // Mean loss over the batches (no gradients, eval mode); local to this rank.
  float evaluate(const std::vector<Batch>& batches);
  // Every rank compares parameter checksums; Error naming the ranks and the first differing
  // tensor when the replicas diverged.
  void check_in_sync(int64_t step);

  // This rank's part of a checkpoint (tensors with their placements) and the optimizer's
  // scalars, returned for the train state (engine_checkpoint.cpp). Every layout writes the plain
  // model's tensors under their global names.
  nlohmann::json checkpoint_state(ckpt::RankShards& shards, int rank) const;
  // Loads model and optimizer from a checkpoint of any layout (DDP, ZeRO, pipeline stages,
  // tensor-parallel shards; any world size).
  void restore(const ckpt::Checkpoint& checkpoint, const nlohmann::json& optimizer_scalars);
  // After the last step: the model() of `root` holds the whole parameters again (ZeRO-3 gathers
  // them there; a no-op elsewhere, where every rank holds them already); root = -1: every rank.
  // Collective. No training step may follow.
  void consolidate(int root = -1);
  // Every parameter's whole value in tensors of their own, as the model would hold it without
  // sharding (ZeRO-3 gathers them; elsewhere copies). Collective.
  nn::NamedTensors gather_parameters() const;

  nn::GPT& model();
  const nn::GPT& model() const;
  // The parameters this rank holds: the whole model's, or its pipeline stages' (with the last
  // stage's copy of a tied embedding).
  const nn::NamedTensors& local_parameters() const { return params_; }
  // ParamInfo of local_parameters(), in the same order: the global name, the whole shape, the
  // placements (Shard over "tp" for a tensor-parallel shard) and the tie group.
  std::vector<nn::ParamInfo> local_param_infos() const;
  // The whole model's parameter count, whichever part of it this rank holds (pipeline stages,
  // tensor-parallel shards).
  int64_t num_parameters() const;
  // The data-parallel replicas (the ranks reading different data) and this rank's index
  // among them: the whole job without a pipeline, the dp dimension with one.
  int data_parallel_rank() const;
  int data_parallel_size() const;
  optim::LossScaler* loss_scaler() { return scaler_.get(); }
  CommHook* comm_hook() { return reducer_ ? &reducer_->comm_hook() : nullptr; }
  const Reducer* reducer() const { return reducer_.get(); }
  const FsdpUnits* fsdp() const { return fsdp_.get(); }
  int zero_stage() const { return options_.zero_stage; }
  // The strategy for the start-up line ("ZeRO-3 over 4 ranks"); empty for plain data parallelism
  // and for one process.
  std::string describe() const;
  // Bytes this rank holds beyond parameters, gradients and optimizer state between steps: the
  // buffers gradients and gathered units pass through (ZeRO-2's bucket pair, ZeRO-3's unit
  // buffers); DDP's and ZeRO-1's buckets are the gradients themselves.
  size_t in_flight_bytes() const;
  int rank() const { return rank_; }
  int world() const { return world_; }

 private:
  void zero_grad();
  StepOutcome pipeline_step(const std::vector<Batch>& micro_batches, const StepOptions& options);
  std::optional<pipeline::ShardedGradients> pipeline_zero_sync(optim::LossScaler* scaler);
  StepOutcome finish_step(StepOutcome out, float loss_v, double norm, const StepOptions& so,
                          obs::PhaseClock& phases);
  void consolidate_pipeline(int root);
  nlohmann::json pipeline_checkpoint_state(ckpt::RankShards& shards) const;
  void pipeline_restore(const ckpt::Checkpoint& checkpoint, const nlohmann::json& scalars);
  void init(Device device, comm::ProcessGroupPtr grad_group);
  nn::Module& module() const;
  Tensor loss(const Batch& b, uint64_t dropout_seed) const;
  std::unique_ptr<optim::Optimizer> make_optimizer(std::vector<optim::ParamGroup> groups) const;

  std::shared_ptr<nn::GPT> model_;       // null with tensor parallelism until consolidate()
  std::shared_ptr<tp::TpGPT> tp_model_;  // tensor parallelism
  comm::ProcessGroupPtr tp_group_;
  comm::ProcessGroupPtr group_;
  EngineOptions options_;
  int rank_ = 0;
  int world_ = 1;
  nn::NamedTensors params_;
  LayerGroups layers_;  // of params_, for per-layer gradient norms
  std::unique_ptr<Reducer> reducer_;
  std::unique_ptr<optim::Optimizer> optimizer_;  // DDP: whole parameters
  std::unique_ptr<ZeroShards> zero_;             // ZeRO-1/2
  std::unique_ptr<FsdpUnits> fsdp_;              // ZeRO-3
  std::unique_ptr<optim::LossScaler> scaler_;
  // Pipeline parallelism (engine_pipeline.cpp): this rank's stages, the whole job's group.
  std::unique_ptr<pipeline::PipelineStages> pipe_;
  comm::ProcessGroupPtr world_group_;
  nn::GPTConfig config_;
};

}  // namespace meshtrain::parallel
