// See checkpointing.h. Model and optimizer state are replicated under data parallelism, so rank
// 0 alone writes them; a comm hook's error-feedback state differs per rank, so each rank writes
// its own under a rank-named group and gets it back only when the world size is unchanged.
// A resume at another world size needs nothing else resharded: the sampler position is global
// (see data/sampler.h) and the global batch is kept or the learning rate rescaled by
// plan_elastic_batch().
#include "meshtrain/runtime/checkpointing.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>

#include "meshtrain/ckpt/checkpoint_dir.h"
#include "meshtrain/ckpt/checkpoint_loader.h"
#include "meshtrain/ckpt/train_state.h"
#include "meshtrain/obs/metrics.h"
#include "meshtrain/tensor/cpu/gemm.h"
#include "meshtrain/util/env_registry.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/file_lock.h"

namespace meshtrain::runtime {
namespace {

std::string hook_group(int rank) {
  return detail::str_cat("hook_rank", rank);
}

}  // namespace

std::string checkpoint_root(const TrainConfig& config) {
  if (!config.ckpt.dir.empty() && !ckpt::is_object_uri(config.ckpt.dir)) return config.ckpt.dir;
  return (std::filesystem::path(config.train.out_dir) / "checkpoints").string();
}

std::string checkpoint_remote(const TrainConfig& config) {
  return ckpt::is_object_uri(config.ckpt.dir) ? config.ckpt.dir : std::string();
}

namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The object-storage metrics (rank 0): how old the newest remote checkpoint is, and what waits.
void publish_remote_status(const ckpt::MirrorStatus& s, double started_unix_s) {
  obs::Registry& r = obs::default_registry();
  static obs::Gauge& stamp = r.gauge("meshtrain_remote_checkpoint_timestamp_seconds",
                                     "Unix time the newest checkpoint on object storage was saved "
                                     "(0: none there yet).");
  static obs::Gauge& age = r.gauge("meshtrain_remote_checkpoint_age_seconds",
                                   "Seconds since the newest checkpoint on object storage was "
                                   "saved (since the process started when there is none).");
  static obs::Gauge& step = r.gauge("meshtrain_remote_checkpoint_step",
                                    "Step of the newest checkpoint on object storage (-1: none).");
  static obs::Gauge& pending = r.gauge("meshtrain_remote_checkpoint_pending",
                                       "Checkpoints saved locally and waiting for their upload.");
  static obs::Gauge& failures = r.gauge("meshtrain_remote_checkpoint_upload_failures",
                                        "Failed checkpoint upload attempts of this process.");
  const double now = unix_now();
  stamp.set(s.newest_step >= 0 ? s.newest_unix_s : 0);
  age.set(now - (s.newest_step >= 0 && s.newest_unix_s > 0 ? s.newest_unix_s : started_unix_s));
  step.set(static_cast<double>(s.newest_step));
  pending.set(static_cast<double>(s.pending));
  failures.set(static_cast<double>(s.failures));
}

ckpt::TransferOptions s3_transfer_options() {
  ckpt::TransferOptions t;
  t.parallel = static_cast<int>(env_count(Env::s3_parallel).value_or(4));
  t.part_size = env_count(Env::s3_part_mb).value_or(64) * 1048576;
  t.multipart_threshold = 8 * t.part_size;
  return t;
}

}  // namespace

void check_same_resume_step(int64_t step, comm::ProcessGroup* group) {
  // Ranks that never meet (asynchronous parameter-server workers) each resume the newest
  // checkpoint their servers cut: the same one, and none can ask the others.
  if (group == nullptr || group->detached()) return;
  int64_t range[2] = {step, -step};  // max of both: the largest step and minus the smallest
  group->all_reduce(range, 2, DType::i64, {.op = comm::ReduceOp::max})->wait();
  if (range[0] != -range[1])
    MT_THROW(Error, "ranks resumed from different checkpoints (steps ", -range[1], " and ",
             range[0], "); every rank must see the same checkpoint directory");
}

ElasticBatch plan_elastic_batch(const ResolvedConfig& resolved, int64_t saved_replicas,
                                int64_t saved_global_batch, int64_t replicas) {
  const TrainConfig& config = resolved.config;
  ElasticBatch out;
  out.grad_accum_steps = config.train.grad_accum_steps;
  const int64_t micro = config.data.batch_size;
  const int64_t configured = micro * out.grad_accum_steps * replicas;
  if (saved_replicas == replicas && saved_global_batch == configured) return out;
  // The batch is split among the data-parallel replicas, not the ranks: with tensor or pipeline
  // parallelism the world size is not what changed the accumulation.
  if (resolved.choice.elastic_batch == ElasticBatchChoice::keep) {
    if (saved_global_batch % (micro * replicas) != 0)
      MT_THROW(ValueError, "cannot keep the global batch of ", saved_global_batch,
               " sequences at data-parallel size ", replicas,
               ": it is not a multiple of micro-batch ", micro, " x ", replicas,
               " data-parallel replicas; set dist.elastic_batch=rescale_lr or a data.batch_size "
               "that divides it");
    out.grad_accum_steps = saved_global_batch / (micro * replicas);
    out.message = detail::str_cat("data-parallel size ", saved_replicas, " -> ", replicas,
                                  ": keeping the global batch of ", saved_global_batch,
                                  " sequences with gradient accumulation ", out.grad_accum_steps,
                                  " (micro-batch ", micro, " x accumulation ", out.grad_accum_steps,
                                  " x data-parallel replicas ", replicas, ")");
  } else {
    out.message = detail::str_cat(
        "data-parallel size ", saved_replicas, " -> ", replicas, ": global batch ",
        saved_global_batch, " -> ", configured, " sequences (accumulation ", out.grad_accum_steps,
        "); learning rate per optim.lr_scale_rule=", config.optim.lr_scale_rule);
  }
  return out;
}

TrainerCheckpoints::TrainerCheckpoints(const ResolvedConfig& resolved, int rank, int world,
                                       int restart_count, std::shared_ptr<comm::Store> store,
                                       LogFn log, SavedFn on_saved, FaultPlan faults)
    : config_(resolved.config),
      resume_from_(resolved.choice.resume_from),
      restart_count_(restart_count),
      rank_(rank),
      world_(world),
      root_(checkpoint_root(resolved.config)),
      log_(std::move(log)) {
  const TrainConfig& config = resolved.config;
  replicas_ = std::max(1, world / static_cast<int>(config.parallel.pp * config.parallel.tp));
  ckpt::WriterOptions wo;
  wo.root = root_;
  wo.rank = rank;
  wo.layout.world_size = world;
  wo.layout.dp = replicas_;
  wo.layout.tp = config.parallel.tp;
  wo.layout.pp = config.parallel.pp;
  wo.layout.zero_stage = static_cast<int>(config.parallel.zero_stage);
  if (world > 1) {
    MT_CHECK(store != nullptr, "checkpoints with several ranks need the rendezvous store");
    barrier_ = std::make_shared<CheckpointBarrier>(
        std::move(store), world,
        std::chrono::milliseconds(static_cast<int64_t>(config.dist.timeout_s * 1000)));
    wo.barrier = [barrier = barrier_](int64_t step) { barrier->arrive(step); };
  }
  wo.max_snapshot_bytes = static_cast<uint64_t>(config.ckpt.max_snapshot_mb * 1048576.0);
  wo.async = config.ckpt.async;
  wo.faults = std::move(faults);
  // The trainer calls wait_snapshot() before each optimizer step, so the copy overlaps the
  // next step's forward and backward instead of blocking the training thread.
  wo.deferred_snapshot = true;
  wo.retention.keep_last = config.ckpt.keep_last;
  wo.retention.keep_every = config.ckpt.keep_every;
  wo.on_done = std::move(on_saved);
  const std::string remote = checkpoint_remote(config);
  if (!remote.empty()) {
    remote_ = ckpt::parse_object_uri(remote);
    remote_store_ = ckpt::open_object_store(*remote_, s3_transfer_options());
    // Rank 0 commits every checkpoint, so it uploads them: once committed locally, in the
    // background.
    if (rank == 0) {
      ckpt::MirrorOptions mo;
      mo.uri = *remote_;
      mo.local_root = root_;
      mo.retention = wo.retention;
      mo.max_queue = static_cast<size_t>(env_count(Env::s3_queue).value_or(4));
      mo.retry_max_s = env_real(Env::s3_retry_max_s).value_or(60);
      mo.retry_min_s = std::min(1.0, mo.retry_max_s);
      mo.parallel = static_cast<int>(env_count(Env::s3_parallel).value_or(4));
      mo.log = log_;
      mirror_ = std::make_unique<ckpt::CheckpointMirror>(remote_store_, mo);
      const double started = unix_now();
      mirror_->on_status(
          [started](const ckpt::MirrorStatus& st) { publish_remote_status(st, started); });
      auto saved = std::move(wo.on_done);
      wo.on_done = [mirror = mirror_.get(), saved](int64_t step, double seconds, uint64_t bytes,
                                                   bool ok) {
        if (ok) mirror->enqueue(step, unix_now());
        if (saved) saved(step, seconds, bytes, ok);
      };
    }
  }
  writer_ = std::make_unique<ckpt::CheckpointWriter>(wo);
}

void TrainerCheckpoints::sync_remote() {
  if (!remote_) return;
  try {
    // The ranks of a host that share the local root take turns while one fetches.
    std::filesystem::create_directories(root_);
    const FileLock lock((std::filesystem::path(root_) / ".remote.lock").string());
    const ckpt::FetchResult fetched = ckpt::fetch_newest(*remote_store_, *remote_, root_);
    for (const std::string& line : fetched.rejections) log_("checkpoint rejected: " + line);
    if (fetched.step)
      log_(detail::str_cat("fetched ", remote_->str(), "/", ckpt::step_dir_name(*fetched.step),
                           " into ", root_));
    if (mirror_) {
      const std::vector<ckpt::RemoteStep> remote =
          ckpt::remote_complete_steps(*remote_store_, *remote_);
      if (!remote.empty()) mirror_->set_remote_newest(remote.back().step, remote.back().unix_s);
      // A local checkpoint the remote lacks (an upload cut short by a crash): upload it now.
      const std::vector<int64_t> local = ckpt::list_complete_steps(root_);
      if (!local.empty() && (remote.empty() || remote.back().step < local.back()))
        mirror_->enqueue(local.back());
    }
  } catch (const ckpt::ObjectStoreAuthError&) {
    throw;
  } catch (const ckpt::ObjectStoreError& e) {
    log_(detail::str_cat("object storage unreachable (", e.what(), "): resuming from ", root_,
                         " alone; uploads wait for the server"));
  }
}

TrainerCheckpoints::~TrainerCheckpoints() {
  // Every path that must keep its save waits for it first (wait()); reaching here with a save
  // in flight means the job is stopping on an error, and a peer that died will not arrive.
  if (barrier_) barrier_->abandon();
  // The uploads still queued get MESHTRAIN_S3_DRAIN_S to finish; what is left stays in the
  // local root, and the next run uploads its newest.
  if (mirror_ && !writer_->in_flight()) {
    try {
      const ckpt::MirrorStatus st = mirror_->status();
      if (st.pending > 0) {
        const double limit = env_real(Env::s3_drain_s).value_or(600);
        log_(detail::str_cat("waiting up to ", limit, " s for ", st.pending,
                             " checkpoint upload(s) to ", remote_->str()));
        if (!mirror_->drain(limit))
          log_(detail::str_cat(mirror_->status().pending, " checkpoint(s) not uploaded to ",
                               remote_->str(), "; they stay in ", root_,
                               " and the next run uploads the newest"));
      }
      const ckpt::MirrorStatus done = mirror_->status();
      if (done.uploaded > 0)
        log_(detail::str_cat("uploaded ", done.uploaded, " checkpoint(s) to ", remote_->str(),
                             " (newest: step ", done.newest_step, ")"));
    } catch (const std::exception& e) {
      log_(std::string("checkpoint uploads: ") + e.what());
    }
  }
}

int64_t TrainerCheckpoints::resume(parallel::TrainEngine& engine, data::PrefetchingLoader& loader) {
  std::string from = config_.ckpt.resume_from;
  ResumeFrom kind = resume_from_;
  // ckpt.resume_from names where the job starts; a restart inside the job (meshrun
  // --max-restarts, an elastic round) continues the job's own progress instead.
  if (kind != ResumeFrom::latest && restart_count_ > 0) {
    log_(detail::str_cat("restart ", restart_count_,
                         " of this job: continuing from the latest checkpoint",
                         " (ckpt.resume_from = ", from, " only applies to the job's first start)"));
    from = "latest";
    kind = ResumeFrom::latest;
  }
  sync_remote();
  if (kind != ResumeFrom::latest) {
    std::string dir;
    if (kind == ResumeFrom::best) {
      if (!std::filesystem::exists(root_)) return 0;  // a first run: nothing to continue yet
      const auto best = ckpt::read_best(root_);
      if (!best)
        MT_THROW(ValueError, "ckpt.resume_from = best: ", root_, "/", ckpt::kBestFile,
                 " is missing or names no step (ckpt.keep_best = true writes it); resume from "
                 "latest or name a step directory");
      dir = (std::filesystem::path(root_) / *best).string();
    } else if (ckpt::is_object_uri(from)) {
      dir = ckpt::materialize_remote_checkpoint(
          from, (std::filesystem::path(config_.train.out_dir) / "remote_cache").string());
    } else {
      dir = ckpt::resolve_checkpoint_dir(from);
    }
    const ckpt::Checkpoint c = ckpt::Checkpoint::open(dir);  // verified; IoError names the file
    restore(c, engine, loader);
    log_(detail::str_cat("resumed from ", c.dir(), " (step ", c.step(), " of ", config_.train.steps,
                         ", ckpt.resume_from = ", from, ")"));
    return c.step();
  }
  if (!std::filesystem::exists(root_)) return 0;
  ckpt::CheckpointLoader ckpt_loader(root_, {.remove_tmp_dirs = rank_ == 0});
  std::optional<ckpt::Checkpoint> c = ckpt_loader.load_latest();
  for (const std::string& line : ckpt_loader.rejections()) log_("checkpoint rejected: " + line);
  if (!c) {
    resume_failed_ = !ckpt_loader.rejections().empty();
    if (resume_failed_) log_("no usable checkpoint in " + root_ + "; starting from step 0");
    return 0;
  }
  restore(*c, engine, loader);
  log_(detail::str_cat("resumed from ", c->dir(), " (step ", c->step(), " of ", config_.train.steps,
                       ")"));
  return c->step();
}

void TrainerCheckpoints::arrive_for_predecessor(int64_t resumed, int64_t joined) {
  const int64_t every = config_.ckpt.interval;
  if (!barrier_ || every <= 0) return;
  for (int64_t step = (resumed / every + 1) * every; step <= joined; step += every) {
    // Where the step is uncommitted, its part is marked absent before the arrival, so that rank
    // 0 gives the step up with a warning rather than fail the run on a part that never comes.
    ckpt::mark_rank_absent(root_, step, rank_,
                           detail::str_cat("rank ", rank_, " died after step ", step,
                                           " was cut; its replacement joined after step ", joined));
    barrier_->arrive_for_predecessor(step);
  }
}

int64_t TrainerCheckpoints::rollback(int64_t before_step, comm::ProcessGroup* group,
                                     parallel::TrainEngine& engine,
                                     data::PrefetchingLoader& loader) {
  // The save in flight may be the newest good state; a failed one is simply not a candidate.
  try {
    writer_->wait();
  } catch (const IoError& e) {
    log_(std::string("checkpoint save failed before the rollback: ") + e.what());
  }
  // Rank 0 commits after the other ranks' writers are done: nobody looks before it has.
  if (group != nullptr) group->barrier()->wait();
  ckpt::CheckpointLoader ckpt_loader(root_, {.max_step = before_step});
  std::optional<ckpt::Checkpoint> c = ckpt_loader.load_latest();
  for (const std::string& line : ckpt_loader.rejections()) log_("checkpoint rejected: " + line);
  if (!c)
    MT_THROW(Error, "cannot roll back: no good checkpoint at or before step ", before_step, " in ",
             root_);
  restore(*c, engine, loader);
  check_same_resume_step(c->step(), group);
  return c->step();
}

namespace {

// "; the checkpoint was written with model.n_embd = 128 (now 64), ...: change them back or use a
// new train.out_dir", from the config saved in the checkpoint's train state; empty when it has
// none or the model keys agree.
std::string model_changes(const nlohmann::json& train_state, const TrainConfig& now) {
  if (!train_state.contains("meshtrain_config")) return "";
  const nlohmann::json saved = to_json(config_from_json(train_state.at("meshtrain_config")));
  const nlohmann::json current = to_json(now);
  std::string changes;
  if (!saved.contains("model") || !current.contains("model")) return "";
  for (const auto& [key, value] : saved.at("model").items()) {
    const auto it = current.at("model").find(key);
    if (it == current.at("model").end() || *it == value) continue;
    changes += detail::str_cat(changes.empty() ? "" : ", ", "model.", key, " = ", value.dump(),
                               " (now ", it->dump(), ")");
  }
  if (changes.empty()) return "";
  return "; the checkpoint was written with " + changes +
         ": change them back, or use a new train.out_dir to start another run";
}

}  // namespace

void TrainerCheckpoints::restore(const ckpt::Checkpoint& checkpoint, parallel::TrainEngine& engine,
                                 data::PrefetchingLoader& loader) {
  const ckpt::Checkpoint* c = &checkpoint;
  const nlohmann::json& st = c->train_state();
  try {
    engine.restore(*c, st.at("optimizer"));
  } catch (const ValueError& e) {
    // The usual cause: the model section of the config changed since the checkpoint was written.
    MT_THROW(ValueError, "cannot resume from ", c->dir(), " (step ", c->step(), "): ", e.what(),
             model_changes(st, config_));
  }
  parallel::CommHook* hook = engine.comm_hook();
  optim::LossScaler* scaler = engine.loss_scaler();
  loader.set_state(data::SamplerState::from_json(st.at("sampler")));
  // A checkpoint of an f32 or bf16 run has no scaler state: the scaler keeps its own.
  if (scaler != nullptr && st.contains("loss_scaler")) {
    const nlohmann::json& ls = st.at("loss_scaler");
    scaler->load_state({ls.at("scale").get<double>(), ls.at("growth_tracker").get<int64_t>()});
  }
  if (config_.train.device == "cpu" && st.contains("gemm")) {
    const std::string then = st.at("gemm").get<std::string>(), now = cpu::gemm_config();
    if (then != now)
      log_(detail::str_cat("the checkpoint's matrix products ran on ", then, ", this run's run on ",
                           now,
                           ": they round differently, so from here the run differs from an "
                           "uninterrupted one in the last bits (train.gemm chooses the library)"));
  }
  resumed_world_ = c->manifest().world.world_size;
  resumed_state_ = st;
  resumed_replicas_ = c->manifest().world.dp;
  // Checkpoints written before the global batch was recorded: the config they were saved with.
  if (st.contains("global_batch")) {
    resumed_global_batch_ = st.at("global_batch").get<int64_t>();
  } else {
    const TrainConfig saved =
        st.contains("meshtrain_config") ? config_from_json(st.at("meshtrain_config")) : config_;
    resumed_global_batch_ =
        saved.data.batch_size * saved.train.grad_accum_steps * resumed_replicas_;
  }
  if (hook != nullptr && resumed_world_ != world_)
    log_(detail::str_cat("comm hook state of ", resumed_world_, " ranks does not carry over to ",
                         world_, "; it starts afresh"));
  if (hook != nullptr && resumed_world_ == world_) {
    const std::string group = hook_group(rank_);
    const std::string prefix = group + ".";
    ckpt::NamedTensors state;
    for (auto& [name, t] : c->load_group(group)) state.emplace_back(name.substr(prefix.size()), t);
    if (!state.empty()) hook->load_state_dict(state);
  }
  last_saved_ = c->step();
}

void TrainerCheckpoints::save(int64_t step, parallel::TrainEngine& engine,
                              const data::PrefetchingLoader& loader, std::optional<float> val_loss,
                              bool best) {
  const parallel::CommHook* hook = engine.comm_hook();
  const optim::LossScaler* scaler = engine.loss_scaler();
  if (step == last_saved_) return;
  ckpt::RankShards shards;
  const data::SamplerState sampler = loader.state();
  nlohmann::json st = {
      {"step", step},
      {"epoch", sampler.epoch},
      {"sampler", sampler.to_json()},
      {"global_batch", config_.data.batch_size * config_.train.grad_accum_steps * replicas_},
      {"meshtrain_config", to_json(config_)}};
  if (val_loss) st["val_loss"] = *val_loss;
  if (best) st["best"] = true;
  // What ran the matrix products (library, version, kernels): a resume on another one is told.
  if (config_.train.device == "cpu") st["gemm"] = cpu::gemm_config();
  if (scaler != nullptr) {
    const optim::LossScalerState ls = scaler->state();
    st["loss_scaler"] = {{"scale", ls.scale}, {"growth_tracker", ls.growth_tracker}};
  }
  const nlohmann::json optimizer_scalars = engine.checkpoint_state(shards, rank_);
  if (rank_ == 0) st["optimizer"] = optimizer_scalars;
  if (hook != nullptr) {
    // A copy: a hook changes its state during the next backward, before the optimizer step.
    const std::string group = hook_group(rank_);
    for (const auto& [name, t] : hook->state_dict())
      shards.add_replicated(group, group + "." + name, t);
  }
  writer_->save(step, shards, st, best);
  last_saved_ = step;
}

double TrainerCheckpoints::wait_snapshot() {
  return writer_->wait_snapshot();
}

void TrainerCheckpoints::wait() {
  writer_->wait();
}

}  // namespace meshtrain::runtime
