// See run_observer.h.
#include "meshtrain/obs/run_observer.h"

#include <algorithm>

#include "meshtrain/obs/trace.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/log.h"

namespace meshtrain::obs {

std::string trace_path_for_rank(const std::string& path, int rank, int world_size) {
  std::string out = path;
  const std::string key = "{rank}";
  bool replaced = false;
  for (size_t pos; (pos = out.find(key)) != std::string::npos; replaced = true)
    out.replace(pos, key.size(), std::to_string(rank));
  if (replaced || world_size <= 1) return out;
  std::filesystem::path p(out);
  const std::string name =
      p.stem().string() + "_rank" + std::to_string(rank) + p.extension().string();
  return (p.parent_path() / name).string();
}

namespace {

Labels with_rank(Labels labels, int rank) {
  for (auto& [k, v] : labels)
    if (k == "rank") v = std::to_string(rank);
  return labels;
}

}  // namespace

RunObserver::RunObserver(Registry& registry, RunObserverOptions options)
    : options_(std::move(options)),
      metrics_(registry, options_.training),
      collectives_(registry),
      collective_hook_([this](const comm::CollectiveEvent& e) { on_collective(e); }) {
  const int rank = options_.training.rank;
  registry.set_const_labels(with_rank(registry.const_labels(), rank));
  if (!options_.trace_path.empty()) {
    trace_file_ = trace_path_for_rank(options_.trace_path, rank, options_.training.world_size);
    TraceRecorder::global().start(rank);
    TraceRecorder::global().set_thread_name("main");
  }
  if (options_.metrics) {
    try {
      server_ = std::make_unique<MetricsServer>(registry, *options_.metrics);
      MT_LOG_INFO("metrics", "rank ", rank, " serving ", server_->url());
    } catch (const Error& e) {
      MT_LOG_WARN("metrics", e.what(), "; training continues without the endpoint");
    }
  }
  if (options_.training.world_size > 1 && !options_.out_dir.empty()) {
    const auto path = options_.out_dir / ("metrics_rank" + std::to_string(rank) + ".jsonl");
    rank_log_.open(path, std::ios::trunc);
    if (!rank_log_) MT_LOG_WARN("metrics", "cannot write ", path.string());
  }
}

RunObserver::~RunObserver() {
  server_.reset();
  if (!trace_file_.empty()) write_trace();
  TraceRecorder::global().stop();
}

bool RunObserver::write_trace() {
  try {
    TraceRecorder::global().write(trace_file_);
    return true;
  } catch (const std::exception& e) {
    MT_LOG_WARN("trace", "cannot write ", trace_file_, ": ", e.what());
    return false;
  }
}

std::string RunObserver::metrics_url() const {
  return server_ ? server_->url() : std::string();
}

void RunObserver::on_step(const StepStats& stats, const PhaseClock& phases, nlohmann::json& row) {
  metrics_.on_step(stats, phases, row);
  TraceRecorder& rec = TraceRecorder::global();
  if (rec.enabled()) {
    TraceEvent e;
    e.name = "step";
    e.cat = "step";
    e.ts_us = phases.start_us();
    e.dur_us = phases.last_us() - phases.start_us();
    e.tid = TraceRecorder::thread_id();
    e.args = {{"step", static_cast<double>(stats.step)}, {"loss", stats.loss}};
    rec.record(std::move(e));
  }
  if (rank_log_.is_open()) {
    nlohmann::json r{
        {"step", stats.step}, {"rank", options_.training.rank}, {"step_s", stats.step_s}};
    for (const char* k : {"data_s", "forward_s", "backward_s", "comm_s", "optimizer_s"})
      if (row.contains(k)) r[k] = row[k];
    rank_log_ << r.dump() << "\n" << std::flush;
  }
}

void RunObserver::on_collective(const comm::CollectiveEvent& e) {
  collectives_.record(e.op, static_cast<int64_t>(e.bytes), e.seconds, e.ok);
  TraceRecorder& rec = TraceRecorder::global();
  if (!rec.enabled()) return;
  // Runs on the process group's thread: each collective (each gradient bucket's all-reduce
  // among them) becomes a span on that thread's track, beside the main thread's phases.
  thread_local bool named = false;
  if (!named) {
    rec.set_thread_name("comm");
    named = true;
  }
  TraceEvent t;
  t.name = e.op;
  t.cat = "comm";
  t.dur_us = static_cast<int64_t>(e.seconds * 1e6);
  t.ts_us = TraceRecorder::now_us() - t.dur_us;
  t.tid = TraceRecorder::thread_id();
  t.args = {{"bytes", static_cast<double>(e.bytes)}, {"ok", e.ok ? 1.0 : 0.0}};
  rec.record(std::move(t));
}

void RunObserver::on_rank_step_times(const std::vector<double>& step_s, nlohmann::json& row) {
  if (step_s.empty()) return;
  const auto straggler = metrics_.on_rank_step_times(step_s);
  row["slowest_rank"] = straggler.rank;
  row["rank_lag_s"] = straggler.lag_s;
  row["rank_step_s"] = step_s;
}

void RunObserver::on_eval(double val_loss, double seconds) {
  metrics_.on_eval(val_loss, seconds);
}

nlohmann::json RunObserver::on_checkpoint(int64_t step, double seconds, int64_t bytes, bool ok) {
  metrics_.on_checkpoint(seconds, bytes, ok);
  return nlohmann::json{{"event", "checkpoint"},
                        {"step", step},
                        {"duration_s", seconds},
                        {"bytes", bytes},
                        {"ok", ok}};
}

}  // namespace meshtrain::obs
