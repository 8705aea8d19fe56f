// A timeline of a run in the Chrome trace event format (JSON; opens in Perfetto and
// chrome://tracing): complete events ("ph":"X") with pid = rank, tid = a small per-thread number,
// and ts/dur in microseconds. Timestamps are wall-clock microseconds (advanced by a monotonic
// clock from one anchor), so the files of several ranks line up when merged.
//
// Any layer marks a region with an RAII TraceSpan from any thread; when tracing is off a span
// costs one relaxed atomic load. Events are kept in memory (bounded) and written at the end.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace meshtrain::obs {

struct TraceEvent {
  std::string name;
  std::string cat;
  int64_t ts_us = 0;
  int64_t dur_us = 0;
  int tid = 0;
  std::vector<std::pair<std::string, double>> args;
};

class TraceRecorder {
 public:
  static constexpr size_t kDefaultMaxEvents = 1'000'000;

  // The process-wide recorder that TraceSpan writes to.
  static TraceRecorder& global();

  // Starts recording (dropping earlier events); `pid` is the rank shown as the process.
  void start(int pid, size_t max_events = kDefaultMaxEvents);
  void stop();
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  void record(TraceEvent event);
  // Names the calling thread's track ("main", "reducer", ...).
  void set_thread_name(std::string name);

  // Microseconds on the trace clock.
  static int64_t now_us();
  // This thread's track number (1, 2, ... in order of first use).
  static int thread_id();

  std::vector<TraceEvent> events() const;
  size_t dropped() const;
  // {"traceEvents": [metadata..., events...], "displayTimeUnit": "ms"}
  nlohmann::json to_json() const;
  // Written to `path.tmp` and renamed, so a reader never sees half a file.
  void write(const std::filesystem::path& path) const;

 private:
  std::atomic<bool> enabled_{false};
  mutable std::mutex mu_;
  int pid_ = 0;
  size_t max_events_ = kDefaultMaxEvents;
  size_t dropped_ = 0;
  std::vector<TraceEvent> events_;
  std::vector<std::pair<int, std::string>> thread_names_;
};

class TraceSpan {
 public:
  explicit TraceSpan(std::string_view name, std::string_view cat = "train",
                     TraceRecorder& recorder = TraceRecorder::global());
  ~TraceSpan();
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

  // Shown in the event's "args" (step number, bytes, bucket index).
  void arg(std::string_view key, double value);

 private:
  TraceRecorder* recorder_;  // nullptr when tracing was off at construction
  TraceEvent event_;
};

// Merges per-rank trace files into one: every input's events keep their pid (the rank) unless two
// inputs claim the same pid, in which case later inputs are moved to unused pids; each pid gets a
// "rank N" process name and sort index so the viewer shows one track per rank in rank order.
// Inputs may be {"traceEvents": [...]} objects or bare arrays. Throws IoError on unreadable or
// malformed input, naming the file.
nlohmann::json merge_traces(const std::vector<std::filesystem::path>& inputs);

}  // namespace meshtrain::obs
