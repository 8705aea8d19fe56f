// TrainEngine's checkpoints: which tensors each rank writes, with their placements, and how a
// rank of any layout reads its part back. The step code knows nothing of them.
//   - DDP: rank 0 writes the model and the optimizer state, replicated.
//   - ZeRO-1/2: rank 0 writes the model; each rank its flat piece of the optimizer state (with
//     tensor-parallel stages: gathered over dp, written by placement as below).
//   - ZeRO-3: each rank its flat pieces of parameters and state (FsdpUnits).
//   - Tensor parallelism and pipeline stages (placed_state.h): dp-replica 0 writes, per tp rank,
//     its part of every split parameter and of its optimizer state as a piece of the whole
//     tensor, and (tp rank 0 only) the replicated ones whole; pipeline stages each write the
//     parameters they own. Every layout so writes the plain model's tensors under their global
//     names, which every other layout reads.
#include <algorithm>
#include <map>

#include "meshtrain/ckpt/train_state.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/parallel/placed_state.h"
#include "meshtrain/parallel/tensor_parallel/tp_gpt.h"
#include "meshtrain/parallel/zero/fsdp_units.h"
#include "meshtrain/parallel/zero/zero_shards.h"

namespace meshtrain::parallel {

namespace {

// Only the first data-parallel replica writes parameter parts; the others hold the same bits.
bool first_replica(const comm::ProcessGroupPtr& dp_group) {
  return !dp_group || dp_group->rank() == 0;
}

// One holder of each replicated tensor writes it: the first tp rank.
bool first_tp_rank(const comm::ProcessGroupPtr& tp_group) {
  return !tp_group || tp_group->rank() == 0;
}

}  // namespace

nlohmann::json TrainEngine::checkpoint_state(ckpt::RankShards& shards, int rank) const {
  if (pipe_) return pipeline_checkpoint_state(shards);
  if (tp_model_) {
    // Every rank computes the scalars (the trainer keeps rank 0's); the other replicas' tensors
    // go nowhere.
    ckpt::RankShards unused;
    return add_placed_state(first_replica(group_) ? shards : unused, params_,
                            tp_model_->param_infos(), *optimizer_, first_tp_rank(tp_group_));
  }
  nlohmann::json scalars;
  if (fsdp_) {
    scalars = fsdp_->add_to_checkpoint(shards);
  } else if (zero_) {
    // The parameters are replicated; the optimizer state is written by its owners, a flat piece
    // each, so that no rank gathers it.
    if (rank == 0) shards.add_replicated("model", model_->state_dict());
    scalars = zero_->optimizer().add_to_checkpoint(shards, "optim");
  } else if (rank == 0) {
    // The live tensors, not copies: the writer copies them while the next step computes.
    shards.add_replicated("model", model_->state_dict());
    scalars = ckpt::add_optimizer_state(shards, optimizer_->state_view());
  }
  return scalars;
}

void TrainEngine::restore(const ckpt::Checkpoint& checkpoint,
                          const nlohmann::json& optimizer_scalars) {
  if (pipe_) {
    pipeline_restore(checkpoint, optimizer_scalars);
    return;
  }
  if (tp_model_) {
    restore_placed_state(checkpoint, optimizer_scalars, params_, tp_model_->param_infos(),
                         *optimizer_);
    return;
  }
  if (fsdp_) {
    fsdp_->restore(checkpoint, optimizer_scalars);
    return;
  }
  const ckpt::NamedTensors model_state = checkpoint.load_group("model");
  model_->load_state_dict(std::map<std::string, Tensor>(model_state.begin(), model_state.end()));
  if (zero_)
    zero_->optimizer().restore(checkpoint, optimizer_scalars);
  else
    optimizer_->load_state_dict(ckpt::load_optimizer_state(checkpoint, optimizer_scalars));
}

// A pipeline checkpoint is the whole model's: replica 0 of each stage writes the parameters it
// owns (the tied embedding once, from stage 0) and their optimizer state under the whole
// model's names, each by its placement, so that any pp (1 included), tp and dp loads it by name.
// The per-parameter step counts travel in the train state's scalars, which rank 0 writes: each
// stage's are gathered there.
// Under ZeRO (no tensor parallelism) every replica writes the flat pieces of the optimizer state
// it owns instead (the tied copy's left to stage 0), as the data-parallel ZeRO path does. Under
// ZeRO with tensor-parallel stages a flat piece of a part is no piece of the whole tensor: the
// replicas put their stage's state together and replica 0 writes it by placement.
nlohmann::json TrainEngine::pipeline_checkpoint_state(ckpt::RankShards& shards) const {
  nlohmann::json scalars;
  if (zero_ && tp_group_) {
    // A tp rank's flat ZeRO pieces are ranges of its part, which no manifest entry describes:
    // the stage's state is put together over the replicas (for the moment of the save, every
    // replica holds the unsharded state of its tp part, the memory ZeRO-0 holds), and replica 0
    // writes it by placement, as without ZeRO.
    const ShardedOptimizer& opt = zero_->optimizer();
    const optim::OptimizerState whole = opt.gather_state(group_);
    ckpt::RankShards unused;
    scalars =
        add_placed_state(first_replica(group_) ? shards : unused, pipe_->owned_parameters(),
                         pipe_->param_infos(), whole, opt.slot_names(), first_tp_rank(tp_group_));
  } else if (zero_) {
    if (first_replica(group_)) shards.add_replicated("model", pipe_->owned_parameters());
    scalars = zero_->optimizer().add_to_checkpoint(shards, "optim", pipe_->copy_names());
  } else {
    ckpt::RankShards unused;
    scalars = add_placed_state(first_replica(group_) ? shards : unused, pipe_->owned_parameters(),
                               pipe_->param_infos(), *optimizer_, first_tp_rank(tp_group_));
  }
  const comm::ProcessGroupPtr& pp = pipe_->pp_group();
  if (!pp) return scalars;
  // Padded to the longest text, one equal-count all-gather.
  std::string mine = scalars.dump();
  const int64_t n = static_cast<int64_t>(mine.size());
  std::vector<int64_t> sizes(static_cast<size_t>(pp->size()));
  pp->all_gather(&n, sizes.data(), 1, DType::i64)->wait();
  const size_t width = static_cast<size_t>(*std::max_element(sizes.begin(), sizes.end()));
  mine.resize(width, ' ');
  std::string all(width * sizes.size(), ' ');
  pp->all_gather(mine.data(), all.data(), width, DType::u8)->wait();
  for (size_t r = 0; r < sizes.size(); ++r) {
    const nlohmann::json theirs = nlohmann::json::parse(all.substr(r * width, width));
    for (const auto& [k, v] : theirs.items()) scalars[k] = v;
  }
  return scalars;
}

// Both tied copies take the embedding's value and state: they are the same parameter.
void TrainEngine::pipeline_restore(const ckpt::Checkpoint& checkpoint,
                                   const nlohmann::json& scalars) {
  if (!zero_) {
    restore_placed_state(checkpoint, scalars, params_, pipe_->param_infos(), *optimizer_);
    return;
  }
  if (tp_group_) {
    // Each rank reads its tp part's whole state and keeps its replica's segments of it.
    ShardedOptimizer& opt = zero_->optimizer();
    const PlacedState read =
        read_placed_state(checkpoint, scalars, params_, pipe_->param_infos(), opt.slot_names());
    opt.load_whole_state(read.optimizer);
    for (size_t i = 0; i < params_.size(); ++i) {
      Tensor p = params_[i].second;
      p.copy_(read.values[i]);
    }
    return;
  }
  const ckpt::NamedTensors saved = checkpoint.load_group("model");
  const std::map<std::string, Tensor> by_name(saved.begin(), saved.end());
  for (auto& [name, p] : params_) {
    const auto it = by_name.find(name);
    if (it == by_name.end())
      MT_THROW(ValueError, "checkpoint of step ", checkpoint.step(), " has no parameter '", name,
               "' for pipeline stage ", pipe_->stage());
    MT_CHECK(it->second.shape() == p.shape(), "checkpoint parameter '", name, "' has shape ",
             shape_str(it->second.shape()), ", the model's is ", shape_str(p.shape()));
    p.copy_(it->second);
  }
  zero_->optimizer().restore(checkpoint, scalars);
}

}  // namespace meshtrain::parallel
