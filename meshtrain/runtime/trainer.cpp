#include "meshtrain/runtime/trainer.h"

#include "meshtrain/comm/tls.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>

#include "meshtrain/comm/comm_buffer.h"
#include "meshtrain/cuda/availability.h"
#include "meshtrain/cuda/batch_uploader.h"
#include "meshtrain/obs/job_metrics.h"
#include "meshtrain/obs/log_line.h"
#include "meshtrain/obs/metrics.h"
#include "meshtrain/obs/run_observer.h"
#include "meshtrain/obs/trace.h"
#include "meshtrain/optim/lr_schedule.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/runtime/bad_batch_skip.h"
#include "meshtrain/runtime/checkpoint_policy.h"
#include "meshtrain/runtime/checkpointing.h"
#include "meshtrain/runtime/engine_factory.h"
#include "meshtrain/runtime/final_weights.h"
#include "meshtrain/runtime/metrics_observer.h"
#include "meshtrain/runtime/preemption.h"
#include "meshtrain/runtime/progress_line.h"
#include "meshtrain/runtime/rollback.h"
#include "meshtrain/runtime/rollback_observer.h"
#include "meshtrain/runtime/run_dir_lock.h"
#include "meshtrain/runtime/sampling.h"
#include "meshtrain/runtime/spike_skip.h"
#include "meshtrain/runtime/step_observer.h"
#include "meshtrain/runtime/straggler_watch.h"
#include "meshtrain/runtime/task_factory.h"
#include "meshtrain/runtime/train_device.h"
#include "meshtrain/tensor/cpu/gemm.h"
#include "meshtrain/tensor/cpu/kernel_clock.h"
#include "meshtrain/util/log.h"

namespace meshtrain::runtime {

void set_num_threads(int64_t threads, int ranks_on_host) {
  // By default the host's cores are split evenly between the ranks that share it.
  const int n = threads > 0 ? static_cast<int>(threads)
                            : std::max(1, omp_get_num_procs() / std::max(1, ranks_on_host));
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

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

namespace {

// Observability settings of a run (metrics endpoint, trace, MFU inputs) from the config.
obs::RunObserverOptions observer_options(const TrainConfig& c, const ThroughputUnit& unit,
                                         const TrainerOptions& options, int rank, int world,
                                         int replicas, Device device) {
  obs::RunObserverOptions o;
  o.out_dir = c.train.out_dir;
  o.trace_path = c.train.trace;
  if (c.train.metrics_port >= 0) {
    obs::MetricsServerOptions m;
    m.host = c.train.metrics_host;
    m.port =
        c.train.metrics_port == 0 ? 0 : static_cast<int>(c.train.metrics_port) + options.local_rank;
    m.tls = comm::default_tls();
    o.metrics = m;
  } else {
    o.metrics = obs::metrics_server_options_from_env(options.local_rank);
  }
  const int64_t samples = c.data.batch_size * c.train.grad_accum_steps * replicas;
  o.training.rank = rank;
  o.training.world_size = world;
  o.training.samples_per_step = static_cast<double>(samples);
  o.training.tokens_per_step = static_cast<double>(samples * unit.per_sample);
  o.training.flops_per_token = unit.flops_per_unit;
  o.training.peak_flops = c.train.peak_flops;
  o.training.restart_count = options.restart_count;
  o.training.gpu_index = device.is_cpu() ? -1 : device.index;
  return o;
}

// The job-level indicators carry over attempts through a file beside the checkpoints; a run
// that does not resume starts a new job.
obs::JobMetricsOptions job_metrics_options(const TrainConfig& c, const ThroughputUnit& unit,
                                           int rank, int world) {
  obs::JobMetricsOptions o;
  o.rank = rank;
  if (c.ckpt.interval > 0)
    o.state_file = std::filesystem::path(checkpoint_root(c)) / "job_state.json";
  o.fresh = !c.ckpt.resume;
  o.tokens_per_step =
      static_cast<double>(c.data.batch_size * c.train.grad_accum_steps * world * unit.per_sample);
  return o;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The run's observers, built in this order (the best-so-far record is restored before
// metrics.jsonl is opened) and called in it.
class StepObservers {
 public:
  StepObservers(RunState& run, obs::RunObserverOptions metrics, NodePlace place)
      : rollback_(run.config.config, bad_batches_),
        spikes_(run.config.config),
        checkpoints_(run),
        stragglers_(run, place),
        metrics_(run, std::move(metrics)),
        weights_(metrics_) {}
  // The straggler watch asks for its checkpoint before the policy acts on the step's end,
  // waits for it after, and adds to the step's row before the metrics write it.
  std::array<StepObserver*, 9> all() {
    return {&bad_batches_, &rollback_, &spikes_,  &checkpoints_, &stragglers_,
            &metrics_,     &progress_, &weights_, &sampling_};
  }
  MetricsObserver& metrics() { return metrics_; }

 private:
  BadBatchSkip bad_batches_;
  RollbackObserver rollback_;
  SpikeSkip spikes_;
  CheckpointPolicy checkpoints_;
  StragglerWatch stragglers_;
  MetricsObserver metrics_;
  ProgressLine progress_;
  FinalWeights weights_;
  Sampling sampling_;
};

}  // namespace

struct Trainer::State {
  explicit State(ResolvedConfig r) : resolved(std::move(r)) {}
  // Rank 0's, for the whole run: declared first so that it is released last, after the
  // checkpoint writer's last file.
  std::unique_ptr<RunDirLock> run_dir_lock;
  ResolvedConfig resolved;  // the run's settings, parsed and checked once
  TrainConfig& config = resolved.config;
  TrainerOptions options;
  int rank = 0;
  int world = 1;
  // The data-parallel replicas (ranks that read different data): the world without a pipeline.
  int dp_rank = 0;
  int dp_world = 1;
  Device device;
  std::unique_ptr<cuda::BatchUploader> uploader;  // device training only
  std::unique_ptr<Task> task;
  ThroughputUnit unit;
  std::unique_ptr<parallel::TrainEngine> engine;
  // A background thread prepares the next batches so the training thread does not wait on I/O.
  std::unique_ptr<data::PrefetchingLoader> train_loader;
  optim::LrSchedule schedule;
  std::unique_ptr<TrainerCheckpoints> checkpoints;  // null when checkpoints are off
  std::vector<double> step_times;
  std::vector<parallel::Batch> requeued;  // the batches of a step whose gradient was left out

  // Progress lines carry time, rank and step (train.log_format = text), or are JSON lines with
  // `fields` merged in (json).
  int64_t log_step = -1;
  void log(const std::string& line, const nlohmann::json& fields = nullptr) {
    if (options.progress == nullptr || rank != 0) return;
    *options.progress << obs::format_log_line(resolved.log_format, rank, log_step, line, fields)
                      << std::endl;
  }
  void log_memory_at_rest(int64_t step);
  void log_config();
  void log_run();
  void configure_schedule();
  void adapt_to_resumed_world();
  int64_t start_checkpoints(const std::shared_ptr<obs::JobMetrics>& job_metrics);
  int64_t join_running_job(int64_t resumed);
  void begin(RunState& run, StepObservers& observers);
  void train_step(RunState& run, StepObservers& observers, StepContext& step);
  void account_step(RunState& run, StepContext& step, std::chrono::steady_clock::time_point start);
  // Global batch in samples, and in the task's units.
  int64_t samples_per_step() const {
    return config.data.batch_size * config.train.grad_accum_steps * dp_world;
  }
  int64_t units_per_step() const { return samples_per_step() * unit.per_sample; }

  // A loader's batch, on the training device.
  std::pair<Tensor, Tensor> on_device(std::pair<Tensor, Tensor> batch) {
    if (!uploader) return batch;
    return {uploader->upload(batch.first), uploader->upload(batch.second)};
  }

  // The validation loss and, for a classifier, its top-1 accuracy (-1 otherwise).
  struct Evaluation {
    float loss = 0;
    float accuracy = -1;
  };
  Evaluation evaluate() {
    obs::TraceSpan span("eval");
    std::vector<parallel::Batch> b;
    for (auto& batch : task->eval_batches()) {
      auto [x, y] = on_device(std::move(batch));
      b.push_back({x, y});
    }
    double accuracy = -1;
    float v[2] = {engine->evaluate(b, &accuracy), static_cast<float>(accuracy)};
    // Every rank takes rank 0's values: the ranks evaluate the same parameters on the same
    // batches, but a host with another thread count may round its GEMMs differently, and
    // decisions taken from the value (ckpt.keep_best saves) must be the same everywhere.
    // Replicas that step on their own each report their own evaluation instead of waiting.
    if (options.group && engine->lockstep()) options.group->broadcast(v, 2, DType::f32)->wait();
    return {v[0], v[1]};
  }
  // "val_loss 0.3120" and, for a classifier, " val_accuracy 0.8912".
  static void add_evaluation(const Evaluation& e, nlohmann::json& record) {
    record["val_loss"] = e.loss;
    if (e.accuracy >= 0) record["val_accuracy"] = e.accuracy;
  }
};

// What this rank holds between steps (parameters, gradients, optimizer state and the
// communication buffers), measured by the tensor allocator and the buffers' own count, so that
// users and the tests can hold the engine's memory formulas against it.
void Trainer::State::log_memory_at_rest(int64_t step) {
  const size_t tensors = host_tensor_bytes(), buffers = comm::CommBuffer::live_bytes();
  const auto mib = [](size_t b) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(2) << static_cast<double>(b) / 1048576.0;
    return os.str();
  };
  log(detail::str_cat("memory at rest after step ", step, ": ", mib(tensors + buffers),
                      " MiB per rank (host tensors ", mib(tensors), " MiB, communication buffers ",
                      mib(buffers), " MiB; host tensors peaked at ", mib(host_tensor_peak_bytes()),
                      " MiB)"),
      nlohmann::json{{"mem_at_rest_bytes", tensors + buffers},
                     {"mem_host_tensor_bytes", tensors},
                     {"mem_host_tensor_peak_bytes", host_tensor_peak_bytes()},
                     {"mem_comm_buffer_bytes", buffers},
                     {"mem_in_flight_bytes", engine->in_flight_bytes()}});
}

// Rank 0 states the effective configuration once, before the first step.
void Trainer::State::log_config() {
  if (options.progress == nullptr || rank != 0) return;
  if (resolved.log_format == obs::LogFormat::kJson)
    log("effective configuration", nlohmann::json{{"config", to_json(config)}});
  else
    *options.progress << obs::format_log_line(obs::LogFormat::kText, rank, -1,
                                              "effective configuration:")
                      << "\n"
                      << to_toml(config) << std::flush;
}

// The run's first line: the model and data (the task's words), the batch, the device.
void Trainer::State::log_run() {
  const TrainConfig& c = config;
  const int64_t accum = c.train.grad_accum_steps;
  log("meshtrain: " + task->describe(engine->num_parameters()) + "; " +
      std::to_string(units_per_step()) + " " + unit.name + " per step (global batch " +
      std::to_string(samples_per_step()) + " = micro-batch " + std::to_string(c.data.batch_size) +
      " x accumulation " + std::to_string(accum) +
      (dp_world == world ? " x ranks " : " x data-parallel replicas ") + std::to_string(dp_world) +
      "); device " + device.str() + "; threads " + std::to_string(omp_get_max_threads()) +
      " per rank" + (device.is_cpu() ? "; " + cpu::gemm_config() : std::string()) +
      (resolved.precision == DType::f32 ? "" : "; precision " + c.train.precision) +
      (c.model.activation_checkpointing == "none"
           ? ""
           : "; activation checkpointing " + c.model.activation_checkpointing) +
      (engine->describe().empty() ? "" : "; " + engine->describe()));
}

// The learning-rate schedule for the global batch this run trains with.
void Trainer::State::configure_schedule() {
  const TrainConfig& c = config;
  double lr = c.optim.lr;
  const int64_t global_batch = c.data.batch_size * c.train.grad_accum_steps * dp_world;
  if (resolved.choice.lr_scale_rule == LrScaleRule::linear)
    lr = optim::linear_scaled_lr(lr, global_batch, c.data.batch_size);
  if (resolved.choice.lr_scale_rule == LrScaleRule::sqrt)
    lr = optim::sqrt_scaled_lr(lr, global_batch, c.data.batch_size);
  schedule.lr = lr;
  schedule.min_lr = lr * c.optim.min_lr_ratio;
  schedule.warmup_steps = std::min(c.optim.warmup_steps, c.train.steps);
  schedule.total_steps = c.train.steps;
  schedule.decay = resolved.lr_decay;
  schedule.pct_start = c.optim.pct_start;
  schedule.validate();
}

// A checkpoint from another world size (an elastic restart): keep its global batch through the
// accumulation, or rescale the learning rate, as dist.elastic_batch says.
void Trainer::State::adapt_to_resumed_world() {
  const ElasticBatch plan = plan_elastic_batch(resolved, checkpoints->resumed_replicas(),
                                               checkpoints->resumed_global_batch(), dp_world);
  if (plan.message.empty()) return;
  config.train.grad_accum_steps = plan.grad_accum_steps;
  checkpoints->set_grad_accum_steps(plan.grad_accum_steps);
  configure_schedule();
  log(plan.message);
}

// Checkpoints on: the writer, and the step the run resumes from (0: a fresh start).
int64_t Trainer::State::start_checkpoints(const std::shared_ptr<obs::JobMetrics>& job_metrics) {
  const TrainConfig& c = config;
  if (c.ckpt.interval <= 0 && c.ckpt.interval_minutes <= 0) return 0;
  checkpoints = std::make_unique<TrainerCheckpoints>(
      resolved, rank, world, options.restart_count, options.store,
      [this](const std::string& line) { log(line); },
      // Runs on the checkpoint writer's thread, which reports every save's end.
      [job_metrics](int64_t step, double seconds, uint64_t bytes, bool ok) {
        job_metrics->on_checkpoint(step, seconds, bytes, ok);
      },
      options.faults);
  int64_t start_step = 0;
  if (c.ckpt.resume) start_step = checkpoints->resume(*engine, *train_loader);
  // A checkpoint at or past train.steps leaves nothing to train: the run changes nothing, not
  // even the job's resume count (run() stops before the first observer).
  if (c.ckpt.resume && start_step < c.train.steps)
    job_metrics->on_resume(start_step, checkpoints->resume_failed());
  if (start_step > 0) adapt_to_resumed_world();
  check_same_resume_step(start_step, options.group.get());
  return start_step;
}

// A process replacing an asynchronous parameter-server worker that failed, while the job went
// on: it takes the servers' parameters and continues after its predecessor's last step that
// every server applied, reading on from where that step's batches ended (through the batches
// since the checkpoint it resumed from, or since the start).
int64_t Trainer::State::join_running_job(int64_t resumed) {
  const std::optional<int64_t> joined = engine->join_running_job();
  MT_CHECK(joined.has_value(), "rank ", rank, " replaces a worker, but this job cannot be joined");
  if (*joined < resumed)
    MT_THROW(ValueError, "rank ", rank, " resumed step ", resumed,
             " from the checkpoints, but the servers applied this worker's steps only up to ",
             *joined, "; the checkpoint is not this job's (ckpt.dir)");
  if (checkpoints) checkpoints->arrive_for_predecessor(resumed, *joined);
  const int64_t batches = (*joined - resumed) * config.train.grad_accum_steps;
  for (int64_t b = 0; b < batches; ++b) (void)train_loader->next();
  if (options.progress != nullptr)
    *options.progress << obs::format_log_line(
                             resolved.log_format, rank, *joined,
                             detail::str_cat("rank ", rank,
                                             " replaces a worker that failed: joined the running "
                                             "job after its step ",
                                             *joined, " with the servers' parameters"))
                      << std::endl;
  return *joined;
}

// Before the first step: the observers start, and the model is evaluated once.
void Trainer::State::begin(RunState& run, StepObservers& observers) {
  for (StepObserver* o : observers.all()) o->on_start(run);
  const Evaluation initial = evaluate();
  run.result.val_losses.emplace_back(run.start_step, initial.loss);
  std::ostringstream os;
  os << "step " << run.start_step << "/" << config.train.steps << " val_loss " << std::fixed
     << std::setprecision(4) << initial.loss;
  if (initial.accuracy >= 0) os << " val_accuracy " << initial.accuracy;
  log(os.str());
  nlohmann::json record{{"step", run.start_step}};
  add_evaluation(initial, record);
  observers.metrics().write(record);
}

// One step: the observers shape it, the engine runs it, the observers record it.
void Trainer::State::train_step(RunState& run, StepObservers& observers, StepContext& step) {
  log_step = step.step;
  maybe_crash_for_test(step.step, rank, world, options.faults);
  const auto start = std::chrono::steady_clock::now();
  step.last = step.step == config.train.steps;
  step.lr = schedule.at(step.step - 1);
  parallel::StepOptions& so = step.options;
  so.step = step.step;
  so.grad_clip = config.optim.grad_clip;
  // Every rank must stop at the same step, so a signal seen by any rank stops them all (the
  // engine carries the flag on the step's own collective).
  so.stop_request = PreemptionGuard::requested() != 0;
  so.layer_norms = config.train.log_layer_norms;
  so.phases = &step.phases;
  for (StepObserver* o : observers.all()) o->before_step(run, step);
  so.lr = static_cast<float>(step.lr);
  so.poison_loss = inject_nan_for_test(step.step, rank, world, run.rollbacks, options.faults);
  so.scale_loss = inject_spike_for_test(step.step, rank, world, options.faults);
  // A slow node is slow inside its step: the engine stretches this rank's compute, which the
  // straggler watch then sees in rank_step_s (the wait after a 1 s step is F - 1 seconds).
  so.stall_compute = options.faults.slowdown_after(1.0, rank, step.step).count();
  std::vector<parallel::Batch> micro_batches = std::move(requeued);
  requeued.clear();
  for (int64_t a = static_cast<int64_t>(micro_batches.size()); a < config.train.grad_accum_steps;
       ++a) {
    auto [x, y] = on_device(train_loader->next());
    micro_batches.push_back({x, y});
  }
  step.outcome = engine->train_step(micro_batches, so);
  // A gradient left out of its step (a parameter server's backup workers): the same batches
  // train again in the next step, so no sample is lost.
  if (step.outcome.requeue) requeued = std::move(micro_batches);
  if (step.step == run.start_step + 1 && device.is_cpu()) log_memory_at_rest(step.step);
  account_step(run, step, start);
  for (StepObserver* o : observers.all()) o->after_step(run, step);
  run.result.last_step = step.step;
}

// The step's counters, its time and throughput, its metrics row, and the evaluation when due.
void Trainer::State::account_step(RunState& run, StepContext& step,
                                  std::chrono::steady_clock::time_point start) {
  const parallel::StepOutcome& out = step.outcome;
  TrainResult& result = run.result;
  if (out.skipped) ++result.skipped_steps;
  if (optim::LossScaler* scaler = engine->loss_scaler()) {
    if (out.overflow) ++result.overflow_steps;
    result.loss_scale = scaler->scale();
  }
  const int64_t check = config.dist.check_interval;
  if (options.group && check > 0 && step.step % check == 0) engine->check_in_sync(step.step);
  step.phases.end(obs::Phase::kOptimizer);
  step.step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  step_times.push_back(step.step_s);
  result.train_losses.push_back(out.loss);
  step.throughput = static_cast<double>(units_per_step()) / median(step_times);
  step.record = {{"step", step.step},     {"loss", out.loss},
                 {"lr", step.options.lr}, {"grad_norm", out.grad_norm},
                 {"step_s", step.step_s}, {unit.name + "_per_s", step.throughput},
                 {"skipped", out.skipped}};
  if (engine->loss_scaler()) step.record["loss_scale"] = out.loss_scale;
  const int64_t every = config.train.eval_interval;
  if ((every > 0 && step.step % every == 0) || step.last) {
    const Evaluation e = evaluate();
    result.val_losses.emplace_back(step.step, e.loss);
    add_evaluation(e, step.record);
    step.val_loss = e.loss;
  }
}

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
  // Before anything reads or writes the run directory: another job's ranks stop here.
  s_->run_dir_lock =
      lock_run_dir(s_->config.train.out_dir, options.job_id, s_->rank, options.store.get());
  const TrainConfig& c = s_->config;
  set_num_threads(c.train.threads, options.ranks_on_host);
  cpu::set_gemm_backend(s_->resolved.choice.gemm == GemmChoice::onednn
                            ? cpu::GemmBackend::onednn
                            : cpu::GemmBackend::openblas);
  s_->device = resolve_train_device(s_->resolved, options.local_rank);
  if (!s_->device.is_cpu()) {
    cuda::set_allow_tf32(c.train.tf32);
    s_->uploader = std::make_unique<cuda::BatchUploader>(s_->device);
  }
  s_->task = make_task(s_->resolved);
  s_->unit = s_->task->unit();
  s_->engine = make_engine(s_->resolved, options.group, options.store, options.device_group,
                           s_->device, options.ranks_on_host, options.param_server);
  s_->dp_rank = s_->engine->data_parallel_rank();
  s_->dp_world = s_->engine->data_parallel_size();
  // The ranks of one pipeline read the same batches (its first and last stage use them).
  s_->train_loader = std::make_unique<data::PrefetchingLoader>(
      s_->task->train_batches(s_->dp_world, s_->dp_rank, c.data.batch_size));
  s_->configure_schedule();
}

Trainer::~Trainer() = default;

nn::GPT& Trainer::model() {
  return dynamic_cast<nn::GPT&>(s_->engine->model());
}

TrainResult Trainer::run() {
  State& s = *s_;
  const TrainConfig& c = s.config;
  TrainResult result;
  result.throughput_unit = s.unit.name;
  std::filesystem::create_directories(c.train.out_dir);
  PreemptionGuard preemption;
  // Shared with the checkpoint writer's thread, which reports every save's end.
  auto job_metrics = std::make_shared<obs::JobMetrics>(
      obs::default_registry(), job_metrics_options(c, s.unit, s.rank, s.world));
  int64_t start_step = s.start_checkpoints(job_metrics);
  if (s.options.param_server && s.options.param_server->replacement)
    start_step = s.join_running_job(start_step);
  if (start_step > 0 && start_step >= c.train.steps) {
    // Every rank resumed the same step (start_checkpoints checks), so every rank stops here.
    result.resumed_step = start_step;
    result.last_step = start_step;
    result.nothing_to_do = true;
    s.log(detail::str_cat("nothing to do: the checkpoint resumed is at step ", start_step,
                          " and train.steps = ", c.train.steps,
                          "; raise train.steps to train further (nothing was changed)"));
    return result;
  }
  RunState run{.config = s.resolved,
               .rank = s.rank,
               .world = s.world,
               .dp_world = s.dp_world,
               .device = s.device,
               .engine = *s.engine,
               .loader = *s.train_loader,
               .task = *s.task,
               .group = s.options.group.get(),
               .checkpoints = s.checkpoints.get(),
               .job_metrics = *job_metrics,
               .log = [&s](const std::string& line, const nlohmann::json& f) { s.log(line, f); },
               .result = result,
               .start_step = start_step};
  // Process-wide (a kernel cannot know whose step it serves): on for this run when it asks.
  const cpu::KernelTimingScope kernel_timing(c.train.kernel_times);
  StepObservers observers(
      run, observer_options(c, s.unit, s.options, s.rank, s.world, s.dp_world, s.device),
      s.options.place);
  result.resumed_step = start_step;
  result.last_step = start_step;
  s.log_config();
  s.log_run();
  s.begin(run, observers);
  for (int64_t step = start_step + 1; step <= c.train.steps; ++step) {
    StepContext ctx;
    ctx.step = step;
    s.train_step(run, observers, ctx);
    for (StepObserver* o : observers.all()) {
      o->on_step_end(run, ctx);
      if (ctx.rewind_to || ctx.stop) break;
    }
    if (ctx.rewind_to) step = *ctx.rewind_to;  // the loop goes on with the step after it
    if (ctx.stop) break;
  }
  if (s.step_times.size() > 1) {
    const std::vector<double> rest(s.step_times.begin() + 1, s.step_times.end());
    result.throughput = static_cast<double>(s.units_per_step()) / median(rest);
  }
  for (StepObserver* o : observers.all()) o->on_end(run);
  return result;
}

}  // namespace meshtrain::runtime
