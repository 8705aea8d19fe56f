// See trace.h. One mutex guards the event buffer: a step records a handful of spans (plus one per
// gradient bucket), far too few for contention to matter, and a disabled recorder is never locked.
#include "meshtrain/obs/trace.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "meshtrain/util/atomic_file.h"
#include "meshtrain/util/error.h"

namespace meshtrain::obs {

TraceRecorder& TraceRecorder::global() {
  static TraceRecorder recorder;
  return recorder;
}

int64_t TraceRecorder::now_us() {
  using namespace std::chrono;
  // One wall-clock anchor, advanced by the monotonic clock: aligned across processes, immune to
  // clock steps during the run.
  static const int64_t wall0 =
      duration_cast<microseconds>(system_clock::now().time_since_epoch()).count();
  static const steady_clock::time_point mono0 = steady_clock::now();
  return wall0 + duration_cast<microseconds>(steady_clock::now() - mono0).count();
}

int TraceRecorder::thread_id() {
  static std::atomic<int> next{1};
  static thread_local const int id = next.fetch_add(1);
  return id;
}

void TraceRecorder::start(int pid, size_t max_events) {
  std::lock_guard lock(mu_);
  pid_ = pid;
  max_events_ = max_events;
  dropped_ = 0;
  events_.clear();
  enabled_.store(true, std::memory_order_relaxed);
}

void TraceRecorder::stop() {
  enabled_.store(false, std::memory_order_relaxed);
}

void TraceRecorder::record(TraceEvent event) {
  if (!enabled()) return;
  std::lock_guard lock(mu_);
  if (events_.size() >= max_events_) {
    ++dropped_;
    return;
  }
  events_.push_back(std::move(event));
}

void TraceRecorder::set_thread_name(std::string name) {
  const int tid = thread_id();
  std::lock_guard lock(mu_);
  for (auto& [t, n] : thread_names_)
    if (t == tid) {
      n = std::move(name);
      return;
    }
  thread_names_.emplace_back(tid, std::move(name));
}

std::vector<TraceEvent> TraceRecorder::events() const {
  std::lock_guard lock(mu_);
  return events_;
}

size_t TraceRecorder::dropped() const {
  std::lock_guard lock(mu_);
  return dropped_;
}

nlohmann::json TraceRecorder::to_json() const {
  std::lock_guard lock(mu_);
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", pid_},
                    {"tid", 0},
                    {"args", {{"name", "rank " + std::to_string(pid_)}}}});
  events.push_back({{"name", "process_sort_index"},
                    {"ph", "M"},
                    {"pid", pid_},
                    {"tid", 0},
                    {"args", {{"sort_index", pid_}}}});
  for (const auto& [tid, name] : thread_names_)
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", pid_},
                      {"tid", tid},
                      {"args", {{"name", name}}}});
  // Parents before children: by start time, the longer span first when two start together.
  std::vector<const TraceEvent*> order;
  order.reserve(events_.size());
  for (const TraceEvent& e : events_) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(), [](const TraceEvent* a, const TraceEvent* b) {
    return a->ts_us != b->ts_us ? a->ts_us < b->ts_us : a->dur_us > b->dur_us;
  });
  for (const TraceEvent* ep : order) {
    const TraceEvent& e = *ep;
    nlohmann::json j{{"name", e.name}, {"cat", e.cat},  {"ph", "X"},      {"pid", pid_},
                     {"tid", e.tid},   {"ts", e.ts_us}, {"dur", e.dur_us}};
    if (!e.args.empty()) {
      nlohmann::json args = nlohmann::json::object();
      for (const auto& [k, v] : e.args) args[k] = v;
      j["args"] = std::move(args);
    }
    events.push_back(std::move(j));
  }
  nlohmann::json out{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  if (dropped_ > 0) out["otherData"] = {{"dropped_events", dropped_}};
  return out;
}

void TraceRecorder::write(const std::filesystem::path& path) const {
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  write_file_atomic(path.string(), to_json().dump());
}

TraceSpan::TraceSpan(std::string_view name, std::string_view cat, TraceRecorder& recorder)
    : recorder_(recorder.enabled() ? &recorder : nullptr) {
  if (recorder_ == nullptr) return;
  event_.name = std::string(name);
  event_.cat = std::string(cat);
  event_.tid = TraceRecorder::thread_id();
  event_.ts_us = TraceRecorder::now_us();
}

TraceSpan::~TraceSpan() {
  if (recorder_ == nullptr) return;
  event_.dur_us = TraceRecorder::now_us() - event_.ts_us;
  recorder_->record(std::move(event_));
}

void TraceSpan::arg(std::string_view key, double value) {
  if (recorder_ != nullptr) event_.args.emplace_back(std::string(key), value);
}

// ---- merging ----------------------------------------------------------------------------------

nlohmann::json merge_traces(const std::vector<std::filesystem::path>& inputs) {
  MT_CHECK(!inputs.empty(), "merge_traces: no input files");
  nlohmann::json merged = nlohmann::json::array();
  std::set<int64_t> used;
  std::vector<std::pair<std::string, nlohmann::json>> per_file;
  for (const auto& path : inputs) {
    std::ifstream in(path);
    if (!in) MT_THROW(IoError, "trace merge: cannot read ", path.string());
    nlohmann::json doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded()) MT_THROW(IoError, "trace merge: ", path.string(), " is not JSON");
    nlohmann::json events = doc.is_array() ? doc : doc.value("traceEvents", nlohmann::json());
    if (!events.is_array())
      MT_THROW(IoError, "trace merge: ", path.string(), " has no traceEvents array");
    per_file.emplace_back(path.string(), std::move(events));
  }
  // First pass: the pids each file uses; a pid already taken by an earlier file is remapped.
  std::vector<std::map<int64_t, int64_t>> remap(per_file.size());
  std::set<int64_t> all_pids;
  for (auto& [name, events] : per_file)
    for (auto& e : events)
      if (e.is_object() && e.contains("pid") && e["pid"].is_number_integer())
        all_pids.insert(e["pid"].get<int64_t>());
  int64_t next_free = all_pids.empty() ? 0 : *all_pids.rbegin() + 1;
  for (size_t f = 0; f < per_file.size(); ++f) {
    std::set<int64_t> mine;
    for (auto& e : per_file[f].second)
      if (e.is_object() && e.contains("pid") && e["pid"].is_number_integer())
        mine.insert(e["pid"].get<int64_t>());
    if (mine.empty()) mine.insert(static_cast<int64_t>(f));  // events without a pid
    for (int64_t p : mine) {
      const int64_t target = used.count(p) ? next_free++ : p;
      used.insert(target);
      remap[f][p] = target;
    }
  }
  std::set<int64_t> named;
  for (size_t f = 0; f < per_file.size(); ++f) {
    for (auto& e : per_file[f].second) {
      if (!e.is_object()) MT_THROW(IoError, "trace merge: ", per_file[f].first, ": bad event");
      int64_t pid = e.contains("pid") && e["pid"].is_number_integer() ? e["pid"].get<int64_t>()
                                                                      : remap[f].begin()->first;
      const int64_t target = remap[f][pid];
      e["pid"] = target;
      if (e.value("ph", "") == "M" &&
          (e.value("name", "") == "process_name" || e.value("name", "") == "process_sort_index"))
        continue;  // rewritten below so names follow the remapped pids
      merged.push_back(std::move(e));
    }
    for (const auto& [from, target] : remap[f]) {
      if (!named.insert(target).second) continue;
      merged.push_back({{"name", "process_name"},
                        {"ph", "M"},
                        {"pid", target},
                        {"tid", 0},
                        {"args", {{"name", "rank " + std::to_string(target)}}}});
      merged.push_back({{"name", "process_sort_index"},
                        {"ph", "M"},
                        {"pid", target},
                        {"tid", 0},
                        {"args", {{"sort_index", target}}}});
    }
  }
  // Viewers do not need order, but a sorted file is easier to read and diff.
  std::stable_sort(
      merged.begin(), merged.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
        const bool am = a.value("ph", "") == "M", bm = b.value("ph", "") == "M";
        if (am != bm) return am;
        const int64_t ta = a.value("ts", int64_t{0}), tb = b.value("ts", int64_t{0});
        return ta != tb ? ta < tb : a.value("dur", int64_t{0}) > b.value("dur", int64_t{0});
      });
  return nlohmann::json{{"traceEvents", std::move(merged)}, {"displayTimeUnit", "ms"}};
}

}  // namespace meshtrain::obs
