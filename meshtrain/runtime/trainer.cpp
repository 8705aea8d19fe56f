#include "meshtrain/runtime/trainer.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "meshtrain/autograd/autocast.h"
#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/grad_mode.h"
#include "meshtrain/ckpt/checkpoint_loader.h"
#include "meshtrain/ckpt/checkpoint_writer.h"
#include "meshtrain/ckpt/safetensors.h"
#include "meshtrain/ckpt/train_state.h"
#include "meshtrain/comm/comm_buffer.h"
#include "meshtrain/cuda/availability.h"
#include "meshtrain/cuda/batch_uploader.h"
#include "meshtrain/data/byte_tokenizer.h"
#include "meshtrain/data/data_loader.h"
#include "meshtrain/data/prefetch_loader.h"
#include "meshtrain/data/vocab_check.h"
#include "meshtrain/obs/job_metrics.h"
#include "meshtrain/obs/layer_norm_metrics.h"
#include "meshtrain/obs/log_line.h"
#include "meshtrain/obs/run_observer.h"
#include "meshtrain/obs/trace.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/optim/grad_clip.h"
#include "meshtrain/optim/loss_scaler.h"
#include "meshtrain/optim/lr_schedule.h"
#include "meshtrain/optim/sgd.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/runtime/best_checkpoint.h"
#include "meshtrain/runtime/checkpointing.h"
#include "meshtrain/runtime/config_choice.h"
#include "meshtrain/runtime/engine_factory.h"
#include "meshtrain/runtime/preemption.h"
#include "meshtrain/runtime/rollback.h"
#include "meshtrain/runtime/spike_detector.h"
#include "meshtrain/runtime/timed_checkpoints.h"
#include "meshtrain/runtime/train_device.h"
#include "meshtrain/tensor/cpu/gemm.h"
#include "meshtrain/util/hash.h"
#include "meshtrain/util/log.h"

namespace meshtrain::runtime {

nn::GPTConfig gpt_config(const ResolvedConfig& r) {
  const TrainConfig& c = r.config;
  nn::GPTConfig g;
  g.vocab_size = c.model.vocab_size;
  g.block_size = c.model.block_size;
  g.n_layer = c.model.n_layer;
  g.n_head = c.model.n_head;
  g.n_embd = c.model.n_embd;
  g.dropout = static_cast<float>(c.model.dropout);
  g.bias = c.model.bias;
  g.tie_embeddings = c.model.tie_embeddings;
  g.seed = static_cast<uint64_t>(c.train.seed);
  g.checkpointed_blocks = r.checkpointed_blocks;
  return g;
}

void set_num_threads(int64_t threads, int ranks_on_host) {
  // By default the host's cores are split evenly between the ranks that share it.
  const int n = threads > 0 ? static_cast<int>(threads)
                            : std::max(1, omp_get_num_procs() / std::max(1, ranks_on_host));
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

namespace {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  std::ostringstream os;
  if (s >= 3600)
    os << s / 3600 << "h" << std::setw(2) << std::setfill('0') << (s % 3600) / 60 << "m";
  else if (s >= 60)
    os << s / 60 << "m" << std::setw(2) << std::setfill('0') << s % 60 << "s";
  else
    os << s << "s";
  return os.str();
}

// Observability settings of a run (metrics endpoint, trace, MFU inputs) from the config.
obs::RunObserverOptions observer_options(const ResolvedConfig& r, int rank, int world, int replicas,
                                         int local_rank, int restart_count) {
  const TrainConfig& c = r.config;
  obs::RunObserverOptions o;
  o.out_dir = c.train.out_dir;
  o.trace_path = c.train.trace;
  if (c.train.metrics_port >= 0) {
    obs::MetricsServerOptions m;
    m.host = c.train.metrics_host;
    m.port = c.train.metrics_port == 0 ? 0 : static_cast<int>(c.train.metrics_port) + local_rank;
    o.metrics = m;
  } else {
    o.metrics = obs::metrics_server_options_from_env(local_rank);
  }
  const int64_t seqs = c.data.batch_size * c.train.grad_accum_steps * replicas;
  o.training.rank = rank;
  o.training.world_size = world;
  o.training.samples_per_step = static_cast<double>(seqs);
  o.training.tokens_per_step = static_cast<double>(seqs * c.model.block_size);
  o.training.flops_per_token = gpt_config(r).flops_per_token(c.model.block_size);
  o.training.peak_flops = c.train.peak_flops;
  o.training.restart_count = restart_count;
  return o;
}

// The job-level indicators carry over attempts through a file beside the checkpoints; a run
// that does not resume starts a new job.
obs::JobMetricsOptions job_metrics_options(const TrainConfig& c, int rank, int world) {
  obs::JobMetricsOptions o;
  o.rank = rank;
  if (c.ckpt.interval > 0)
    o.state_file = std::filesystem::path(checkpoint_root(c)) / "job_state.json";
  o.fresh = !c.ckpt.resume;
  o.tokens_per_step = static_cast<double>(c.data.batch_size * c.train.grad_accum_steps * world *
                                          c.model.block_size);
  return o;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

void check_config_matches(const TrainConfig& config, comm::Store& store, int rank) {
  const nlohmann::json mine = to_json(config);
  store.set_string("config/rank" + std::to_string(rank), mine.dump());
  if (rank == 0) return;
  const nlohmann::json theirs = nlohmann::json::parse(store.get_string("config/rank0"));
  for (const ConfigKey& key : config_schema()) {
    const auto& a = mine.at(std::string(key.section)).at(std::string(key.name));
    const auto& b = theirs.at(std::string(key.section)).at(std::string(key.name));
    if (a != b)
      MT_THROW(ValueError, "config key ", key.key, " differs between ranks: rank 0 has ", b.dump(),
               ", rank ", rank, " has ", a.dump(), "; start every rank with the same config");
  }
}

struct Trainer::State {
  explicit State(ResolvedConfig r) : resolved(std::move(r)) {}
  ResolvedConfig resolved;  // the run's settings, parsed and checked once
  TrainConfig& config = resolved.config;
  const ConfigChoices& choice = resolved.choice;
  TrainerOptions options;
  int rank = 0;
  int world = 1;
  // The data-parallel replicas (ranks that read different data): the world without a pipeline.
  int dp_rank = 0;
  int dp_world = 1;
  Device device;
  std::unique_ptr<cuda::BatchUploader> uploader;  // device training only
  std::unique_ptr<parallel::TrainEngine> engine;
  std::shared_ptr<const data::TokenDataset> train_data;
  std::shared_ptr<const data::TokenDataset> val_data;
  // A background thread prepares the next batches so the training thread does not wait on I/O.
  std::unique_ptr<data::PrefetchingLoader> train_loader;
  optim::LrSchedule schedule;
  std::ofstream metrics;
  std::unique_ptr<TrainerCheckpoints> checkpoints;  // null when checkpoints are off

  // Progress lines carry time, rank and step (train.log_format = text), or are JSON lines with
  // `fields` merged in (json).
  int64_t log_step = -1;
  void log(const std::string& line, const nlohmann::json& fields = nullptr) {
    if (options.progress == nullptr || rank != 0) return;
    *options.progress << obs::format_log_line(resolved.log_format, rank, log_step, line, fields)
                      << std::endl;
  }
  // What this rank holds between steps (parameters, gradients, optimizer state and the
  // communication buffers), measured by the tensor allocator and the buffers' own count, so
  // that users and the tests can hold the engine's memory formulas against it.
  void log_memory_at_rest(int64_t step) {
    const size_t tensors = host_tensor_bytes(), buffers = comm::CommBuffer::live_bytes();
    const auto mib = [](size_t b) {
      std::ostringstream os;
      os << std::fixed << std::setprecision(2) << static_cast<double>(b) / 1048576.0;
      return os.str();
    };
    log(detail::str_cat("memory at rest after step ", step, ": ", mib(tensors + buffers),
                        " MiB per rank (host tensors ", mib(tensors),
                        " MiB, communication buffers ", mib(buffers),
                        " MiB; host tensors peaked at ", mib(host_tensor_peak_bytes()), " MiB)"),
        nlohmann::json{{"mem_at_rest_bytes", tensors + buffers},
                       {"mem_host_tensor_bytes", tensors},
                       {"mem_host_tensor_peak_bytes", host_tensor_peak_bytes()},
                       {"mem_comm_buffer_bytes", buffers},
                       {"mem_in_flight_bytes", engine->in_flight_bytes()}});
  }
  // Rank 0 states the effective configuration once, before the first step.
  void log_config() {
    if (options.progress == nullptr || rank != 0) return;
    if (choice.log_format == LogFormatChoice::json)
      log("effective configuration", nlohmann::json{{"config", to_json(config)}});
    else
      *options.progress << obs::format_log_line(obs::LogFormat::kText, rank, -1,
                                                "effective configuration:")
                        << "\n"
                        << to_toml(config) << std::flush;
  }

  // The learning-rate schedule for the global batch this run trains with.
  void configure_schedule() {
    const TrainConfig& c = config;
    double lr = c.optim.lr;
    const int64_t global_batch = c.data.batch_size * c.train.grad_accum_steps * dp_world;
    if (choice.lr_scale_rule == LrScaleRule::linear)
      lr = optim::linear_scaled_lr(lr, global_batch, c.data.batch_size);
    if (choice.lr_scale_rule == LrScaleRule::sqrt)
      lr = optim::sqrt_scaled_lr(lr, global_batch, c.data.batch_size);
    schedule.lr = lr;
    schedule.min_lr = lr * c.optim.min_lr_ratio;
    schedule.warmup_steps = std::min(c.optim.warmup_steps, c.train.steps);
    schedule.total_steps = c.train.steps;
    schedule.decay = resolved.lr_decay;
    schedule.validate();
  }

  // A checkpoint from another world size (an elastic restart): keep its global batch through
  // the accumulation, or rescale the learning rate, as dist.elastic_batch says.
  void adapt_to_resumed_world() {
    const ElasticBatch plan = plan_elastic_batch(resolved, checkpoints->resumed_replicas(),
                                                 checkpoints->resumed_global_batch(), dp_world);
    if (plan.message.empty()) return;
    config.train.grad_accum_steps = plan.grad_accum_steps;
    checkpoints->set_grad_accum_steps(plan.grad_accum_steps);
    configure_schedule();
    log(plan.message);
  }

  // A failed save (a full disk, an I/O error) ends the run, or is reported and training goes
  // on, as ckpt.on_error says. The failure of an asynchronous save surfaces at the next save:
  // it is reported and this step's save is started in its place.
  void save_checkpoint(int64_t step, std::optional<float> val_loss = std::nullopt,
                       bool best = false) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      try {
        checkpoints->save(step, *engine, *train_loader, val_loss, best);
        return;
      } catch (const IoError& e) {
        if (choice.on_error != OnSaveError::continue_training) throw;
        checkpoint_failed(e);
      }
    }
  }
  void wait_checkpoint() {
    try {
      checkpoints->wait();
    } catch (const IoError& e) {
      if (choice.on_error != OnSaveError::continue_training) throw;
      checkpoint_failed(e);
    }
  }
  void checkpoint_failed(const IoError& e) {
    const std::string line =
        std::string(e.what()) + "; training continues (ckpt.on_error = continue)";
    if (rank == 0)
      log(line);
    else
      MT_LOG_WARN("ckpt", "rank ", rank, ": ", line);
  }

  // A loader's batch, on the training device.
  std::pair<Tensor, Tensor> on_device(std::pair<Tensor, Tensor> batch) {
    if (!uploader) return batch;
    return {uploader->upload(batch.first), uploader->upload(batch.second)};
  }

  float evaluate() {
    obs::TraceSpan span("eval");
    data::SamplerOptions so;
    so.shuffle = false;
    data::DataLoader loader(val_data, so, config.data.batch_size);
    const int64_t batches =
        std::min<int64_t>(config.data.val_batches,
                          std::max<int64_t>(1, val_data->num_windows() / config.data.batch_size));
    std::vector<parallel::Batch> b;
    for (int64_t i = 0; i < batches; ++i) {
      auto [x, y] = on_device(loader.next());
      b.push_back({x, y});
    }
    float v = engine->evaluate(b);
    // Every rank takes rank 0's value: the ranks evaluate the same parameters on the same
    // batches, but a host with another thread count may round its GEMMs differently, and
    // decisions taken from the value (ckpt.keep_best saves) must be the same everywhere.
    if (options.group) options.group->broadcast(&v, 1, DType::f32)->wait();
    return v;
  }
};

Trainer::Trainer(TrainConfig config, TrainerOptions options)
    : Trainer(resolve_config(config, options.group ? options.group->size() : 1), options) {}

Trainer::Trainer(ResolvedConfig config, TrainerOptions options)
    : s_(std::make_unique<State>(std::move(config))) {
  s_->options = options;
  if (options.group) {
    s_->rank = options.group->rank();
    s_->world = options.group->size();
    if (options.store) check_config_matches(s_->config, *options.store, s_->rank);
  }
  const TrainConfig& c = s_->config;
  set_num_threads(c.train.threads, options.ranks_on_host);
  s_->device = resolve_train_device(s_->resolved, options.local_rank);
  if (!s_->device.is_cpu()) {
    cuda::set_allow_tf32(c.train.tf32);
    s_->uploader = std::make_unique<cuda::BatchUploader>(s_->device);
  }

  s_->train_data = std::make_shared<data::TokenDataset>(
      data::TokenDataset::from_dir(c.data.dir, "train", c.model.block_size));
  s_->val_data = std::make_shared<data::TokenDataset>(
      data::TokenDataset::from_dir(c.data.dir, "val", c.model.block_size));
  data::check_vocab_fits({s_->train_data.get(), s_->val_data.get()}, c.model.vocab_size);
  s_->engine = make_engine(s_->resolved, options.group, options.store, options.device_group,
                           s_->device, options.ranks_on_host);
  s_->dp_rank = s_->engine->data_parallel_rank();
  s_->dp_world = s_->engine->data_parallel_size();
  // The ranks of one pipeline read the same batches (its first and last stage use them).
  data::SamplerOptions so;
  so.seed = static_cast<uint64_t>(c.data.seed);
  so.shuffle = true;
  so.num_replicas = s_->dp_world;
  so.rank = s_->dp_rank;
  s_->train_loader = std::make_unique<data::PrefetchingLoader>(
      data::DataLoader(s_->train_data, so, c.data.batch_size));
  s_->configure_schedule();
}

Trainer::~Trainer() = default;

nn::GPT& Trainer::model() {
  return s_->engine->model();
}

TrainResult Trainer::run() {
  State& s = *s_;
  const TrainConfig& c = s.config;
  TrainResult result;
  std::filesystem::create_directories(c.train.out_dir);
  PreemptionGuard preemption;
  int64_t start_step = 0;
  // Shared with the checkpoint writer's thread, which reports every save's end.
  auto job_metrics = std::make_shared<obs::JobMetrics>(obs::default_registry(),
                                                       job_metrics_options(c, s.rank, s.world));
  if (c.ckpt.interval > 0 || c.ckpt.interval_minutes > 0) {
    s.checkpoints = std::make_unique<TrainerCheckpoints>(
        s.resolved, s.rank, s.world, s.options.restart_count, s.options.store,
        [&s](const std::string& line) { s.log(line); },
        [job_metrics](int64_t step, double seconds, uint64_t bytes, bool ok) {
          job_metrics->on_checkpoint(step, seconds, bytes, ok);
        },
        s.options.faults);
    if (c.ckpt.resume) start_step = s.checkpoints->resume(*s.engine, *s.train_loader);
    if (c.ckpt.resume) job_metrics->on_resume(start_step, s.checkpoints->resume_failed());
    if (start_step > 0) s.adapt_to_resumed_world();
    check_same_resume_step(start_step, s.options.group.get());
  }
  // Only rank 0's clock decides (timed_checkpoints.h); the other ranks never read theirs.
  TimedCheckpoints timed(s.rank == 0 && s.checkpoints ? c.ckpt.interval_minutes : 0.0,
                         checkpoint_clock());
  BestCheckpoint best(c.ckpt.keep_best && s.checkpoints != nullptr);
  // A run that resumed nothing starts its own record, whatever an earlier run left in the root.
  if (best.enabled() && start_step > 0)
    best.restore(s.checkpoints->root(), start_step, s.checkpoints->resumed_state(), s.rank,
                 s.options.group.get(), [&s](const std::string& line) { s.log(line); });
  result.resumed_step = start_step;
  result.last_step = start_step;
  if (s.rank == 0) {
    // A resumed run appends to the history of the run it continues.
    s.metrics.open(std::filesystem::path(c.train.out_dir) / "metrics.jsonl",
                   start_step > 0 ? std::ios::app : std::ios::trunc);
    if (!s.metrics) MT_THROW(IoError, "cannot write ", c.train.out_dir, "/metrics.jsonl");
  }
  const int64_t accum = c.train.grad_accum_steps;
  const int64_t tokens_per_step = c.data.batch_size * c.model.block_size * accum * s.dp_world;
  s.log_config();
  s.log("meshtrain: GPT " + std::to_string(s.engine->num_parameters()) + " parameters, " +
        std::to_string(c.model.n_layer) + " layers, width " + std::to_string(c.model.n_embd) +
        "; " + std::to_string(s.train_data->num_tokens()) + " training tokens; " +
        std::to_string(tokens_per_step) + " tokens per step (global batch " +
        std::to_string(c.data.batch_size * accum * s.dp_world) + " = micro-batch " +
        std::to_string(c.data.batch_size) + " x accumulation " + std::to_string(accum) +
        (s.dp_world == s.world ? " x ranks " : " x data-parallel replicas ") +
        std::to_string(s.dp_world) + "); device " + s.device.str() + "; threads " +
        std::to_string(omp_get_max_threads()) + " per rank" +
        (s.device.is_cpu() ? "; BLAS " + cpu::blas_config() : std::string()) +
        (s.choice.precision == PrecisionChoice::f32 ? "" : "; precision " + c.train.precision) +
        (c.model.activation_checkpointing == "none"
             ? ""
             : "; activation checkpointing " + c.model.activation_checkpointing) +
        (s.engine->describe().empty() ? "" : "; " + s.engine->describe()));

  obs::RunObserver observer(obs::default_registry(),
                            observer_options(s.resolved, s.rank, s.world, s.dp_world,
                                             s.options.local_rank, s.options.restart_count));
  obs::LayerNormMetrics layer_norm_metrics(obs::default_registry());
  std::vector<double> step_times;
  const auto run_start = std::chrono::steady_clock::now();
  const float initial_val = s.evaluate();
  result.val_losses.emplace_back(start_step, initial_val);
  {
    std::ostringstream os;
    os << "step " << start_step << "/" << c.train.steps << " val_loss " << std::fixed
       << std::setprecision(4) << initial_val;
    s.log(os.str());
  }
  if (s.metrics.is_open())
    s.metrics << nlohmann::json{{"step", start_step}, {"val_loss", initial_val}}.dump() << "\n";

  RollbackPolicy rollback(c.train.rollback_after, c.train.max_rollbacks);
  SpikeDetector spikes(c.train.spike_zscore, static_cast<size_t>(c.train.spike_window));
  // After a rollback: the first bad step, and how many steps' batches to skip when it comes again.
  std::map<int64_t, int64_t> skip_at;
  std::string spike_why;
  for (int64_t step = start_step + 1; step <= c.train.steps; ++step) {
    s.log_step = step;
    maybe_crash_for_test(step, s.rank, s.world, s.options.faults);
    const auto t0 = std::chrono::steady_clock::now();
    obs::PhaseClock phases;  // data / forward / backward / comm / optimizer
    const float lr = static_cast<float>(
        s.schedule.at(step - 1) *
        std::pow(c.train.rollback_lr_factor, static_cast<double>(rollback.rollbacks())));
    if (auto it = skip_at.find(step); it != skip_at.end()) {
      // The batches that led to the rollback are not trained on again.
      const data::SamplerState from = s.train_loader->state();
      for (int64_t k = 0; k < it->second * accum; ++k) s.train_loader->next();
      const data::SamplerState to = s.train_loader->state();
      s.log(
          detail::str_cat("skipped the ", it->second * accum, " batches of steps ", step, "..",
                          step + it->second - 1,
                          " that preceded the rollback (data position epoch ", from.epoch,
                          " offset ", from.offset, " -> epoch ", to.epoch, " offset ", to.offset,
                          ")"),
          nlohmann::json{{"skipped_data_from", from.to_json()}, {"skipped_data_to", to.to_json()}});
      skip_at.erase(it);
    }
    std::vector<parallel::Batch> micro_batches;
    for (int64_t a = 0; a < accum; ++a) {
      auto [x, y] = s.on_device(s.train_loader->next());
      micro_batches.push_back({x, y});
    }
    parallel::StepOptions so;
    so.step = step;
    so.lr = lr;
    so.grad_clip = c.optim.grad_clip;
    // Every rank must stop at the same step, so a signal seen by any rank stops them all (the
    // engine carries the flag on the step's own collective).
    so.stop_request = PreemptionGuard::requested() != 0;
    so.save_request = timed.due();
    so.layer_norms = c.train.log_layer_norms;
    so.poison_loss =
        inject_nan_for_test(step, s.rank, s.world, rollback.rollbacks(), s.options.faults);
    so.scale_loss = inject_spike_for_test(step, s.rank, s.world, s.options.faults);
    if (spikes.enabled())
      so.skip_update = [&spikes, &spike_why](float l, double n) {
        return spikes.is_spike(l, n, &spike_why);
      };
    so.phases = &phases;
    // The previous step's checkpoint may still be copying the parameters and the optimizer state
    // (it overlaps this step's forward and backward); the update must not start before that.
    if (s.checkpoints) so.before_update = [&s]() { s.checkpoints->wait_snapshot(); };
    const parallel::StepOutcome out = s.engine->train_step(micro_batches, so);
    if (step == start_step + 1 && s.device.is_cpu()) s.log_memory_at_rest(step);
    const float loss_v = out.loss;
    const double norm = out.grad_norm;
    const bool skipped = out.skipped, overflow = out.overflow, stop = out.stop;
    const float loss_scale = out.loss_scale;
    const std::vector<double>& rank_step_s = out.rank_step_s;
    if (skipped) ++result.skipped_steps;
    if (!skipped) spikes.accept(loss_v, norm);
    if (optim::LossScaler* scaler = s.engine->loss_scaler()) {
      if (overflow) ++result.overflow_steps;
      result.loss_scale = scaler->scale();
    }
    if (s.options.group && c.dist.check_interval > 0 && step % c.dist.check_interval == 0)
      s.engine->check_in_sync(step);
    phases.end(obs::Phase::kOptimizer);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    step_times.push_back(dt);
    result.train_losses.push_back(loss_v);

    const bool last = step == c.train.steps;
    const double tok_s = static_cast<double>(tokens_per_step) / median(step_times);
    nlohmann::json m{{"step", step},      {"loss", loss_v}, {"lr", lr},
                     {"grad_norm", norm}, {"step_s", dt},   {"tokens_per_s", tok_s},
                     {"skipped", skipped}};
    if (out.spike) m["spike"] = spike_why;
    if (s.engine->loss_scaler()) m["loss_scale"] = loss_scale;
    std::optional<float> val_now;
    if ((c.train.eval_interval > 0 && step % c.train.eval_interval == 0) || last) {
      const float v = s.evaluate();
      result.val_losses.emplace_back(step, v);
      m["val_loss"] = v;
      val_now = v;
    }
    // The same on every rank: val_now is rank 0's value everywhere.
    const bool new_best = best.enabled() && val_now && best.improves(*val_now);
    if (new_best) m["best"] = true;
    observer.on_step({.step = step,
                      .loss = loss_v,
                      .lr = lr,
                      .grad_norm = norm,
                      .step_s = dt,
                      .skipped = skipped},
                     phases, m);
    observer.on_rank_step_times(rank_step_s, m);
    layer_norm_metrics.on_step(out.layer_grad_norms, m);
    if (const auto recover_s = job_metrics->on_step(step, dt)) {
      const obs::JobState js = job_metrics->state();
      const nlohmann::json event{{"event", "resume"},
                                 {"step", start_step},
                                 {"recover_s", *recover_s},
                                 {"resumes", js.resumes_success}};
      if (s.metrics.is_open()) s.metrics << event.dump() << "\n";
      std::ostringstream os;
      os << "recovered in " << std::fixed << std::setprecision(1) << *recover_s
         << " s (from the previous attempt's last step to this one; resume " << js.resumes_success
         << " of the job)";
      s.log(os.str(), event);
    }
    if (s.metrics.is_open()) s.metrics << m.dump() << "\n" << std::flush;
    if (step % std::max<int64_t>(1, c.train.log_interval) == 0 || last || m.contains("val_loss")) {
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
      const double eta = elapsed / static_cast<double>(step - start_step) *
                         static_cast<double>(c.train.steps - step);
      std::ostringstream os;
      os << "step " << step << "/" << c.train.steps << " loss " << std::fixed
         << std::setprecision(4) << loss_v;
      if (m.contains("val_loss")) os << " val_loss " << m["val_loss"].get<float>();
      os << " lr " << std::scientific << std::setprecision(2) << lr << std::fixed << " norm "
         << std::setprecision(2) << norm << " tok/s " << std::setprecision(0) << tok_s << " eta "
         << format_duration(eta);
      if (s.engine->loss_scaler()) os << " scale " << std::setprecision(0) << loss_scale;
      if (skipped && overflow && std::isfinite(loss_v))
        os << " (skipped: gradient overflow, loss scale -> " << std::setprecision(0)
           << s.engine->loss_scaler()->scale() << ")";
      else if (out.spike)
        os << " (skipped: spike, " << spike_why << ")";
      else if (skipped)
        os << " (skipped: non-finite)";
      s.log(os.str(), m);
    }
    result.last_step = step;
    // An f16 gradient overflow is the loss scaler's business (it backed off), not a bad state.
    // Nor is a spike: the step was skipped and the state is good.
    if (rollback.on_step(step, skipped && !out.spike && !(overflow && std::isfinite(loss_v)))) {
      const int64_t first_bad = rollback.first_bad_step(), bad = rollback.bad_steps();
      const int64_t to =
          s.checkpoints->rollback(first_bad - 1, s.options.group.get(), *s.engine, *s.train_loader);
      rollback.rolled_back();
      job_metrics->on_rollback();
      if (c.train.rollback_skip_data) skip_at[first_bad] = step - first_bad + 1;
      s.log(detail::str_cat("rolled back to the checkpoint of step ", to, " after ", bad,
                            " consecutive non-finite steps (", first_bad, "..", step,
                            "); rollback ", rollback.rollbacks(), " of ", c.train.max_rollbacks));
      ++result.rollbacks;
      step = to;  // the loop goes on with step to + 1
      continue;
    }
    const bool on_interval = c.ckpt.interval > 0 && step % c.ckpt.interval == 0;
    if (s.checkpoints && (on_interval || last || stop || new_best || out.save)) {
      if (out.save && !on_interval)
        s.log(detail::str_cat("checkpoint at step ", step, ": ckpt.interval_minutes = ",
                              c.ckpt.interval_minutes, " passed since the last one"));
      s.save_checkpoint(step, val_now, new_best);
      timed.saved();
    }
    if (new_best) {
      best.accept(step, *val_now);
      s.log(detail::str_cat("new best val_loss ", *val_now, " at step ", step, "; ",
                            s.checkpoints->root(), "/best will name it"));
    }
    if (stop && !last) {
      if (s.checkpoints) s.wait_checkpoint();
      result.preempted = true;
      s.log(preemption_message(step, s.checkpoints != nullptr));
      break;
    }
  }
  if (s.checkpoints) s.wait_checkpoint();
  if (!result.preempted && result.last_step == c.train.steps)
    job_metrics->on_completed(c.train.steps);
  if (step_times.size() > 1) {
    std::vector<double> rest(step_times.begin() + 1, step_times.end());
    result.tokens_per_s = static_cast<double>(tokens_per_step) / median(rest);
  }

  if (result.preempted) return result;
  // ZeRO-3: the final weights and the sample need the whole parameters, on rank 0 only (the
  // others would only add a whole model each to the job's peak memory).
  if (c.train.save_weights || c.train.sample_tokens > 0) s.engine->consolidate(0);
  if (s.rank == 0 && c.train.save_weights) {
    result.weights_path = (std::filesystem::path(c.train.out_dir) / "model.safetensors").string();
    const auto ckpt_start = std::chrono::steady_clock::now();
    {
      obs::TraceSpan span("checkpoint");
      ckpt::save_safetensors(result.weights_path, s.engine->model().state_dict(),
                             {{"format", "pt"}, {"meshtrain_config", to_json(c).dump()}});
    }
    const auto event = observer.on_checkpoint(
        c.train.steps,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - ckpt_start).count(),
        static_cast<int64_t>(std::filesystem::file_size(result.weights_path)), true);
    if (s.metrics.is_open()) s.metrics << event.dump() << "\n" << std::flush;
    s.log("saved weights to " + result.weights_path);
  }
  if (s.rank == 0 && c.train.sample_tokens > 0) {
    data::ByteTokenizer tok;
    Generator gen(static_cast<uint64_t>(c.train.seed));
    auto prompt = tok.encode("\n");
    auto out = s.engine->model().generate(prompt, c.train.sample_tokens, 0.8f, 40, gen);
    std::vector<int32_t> printable;
    for (int32_t t : out)
      if (t < 256) printable.push_back(t);
    result.sample = tok.decode(printable);
    s.log("sample:\n" + result.sample);
  }
  return result;
}

}  // namespace meshtrain::runtime
