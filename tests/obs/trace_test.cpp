// Trace files: valid JSON in the Chrome trace format, the step's phase spans nested inside the
// step span on the training thread, spans from other threads on their own track, and merging
// per-rank files into one timeline with a track per rank.
#include "meshtrain/obs/trace.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <thread>

#include "meshtrain/obs/phase_clock.h"
#include "meshtrain/obs/run_observer.h"
#include "meshtrain/util/error.h"

namespace meshtrain::obs {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("mt_obs_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

nlohmann::json load(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);  // throws on invalid JSON
}

bool inside(const nlohmann::json& child, const nlohmann::json& parent) {
  const int64_t cs = child["ts"], ce = cs + child["dur"].get<int64_t>();
  const int64_t ps = parent["ts"], pe = ps + parent["dur"].get<int64_t>();
  return cs >= ps && ce <= pe;
}

// Runs `steps` instrumented steps through a RunObserver as rank `rank` and returns the trace.
fs::path run_steps(const fs::path& dir, int rank, int world, int steps) {
  RunObserverOptions o;
  o.out_dir = dir;
  o.trace_path = (dir / "trace.json").string();
  o.training.rank = rank;
  o.training.world_size = world;
  Registry reg;
  fs::path file;
  {
    RunObserver observer(reg, o);
    file = observer.trace_file();
    for (int s = 1; s <= steps; ++s) {
      PhaseClock phases;
      for (Phase p : {Phase::kData, Phase::kForward, Phase::kBackward}) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        phases.end(p);
      }
      // A reducer-like thread reports its bucket all-reduce while the main thread waits.
      std::thread bucket([] {
        TraceRecorder::global().set_thread_name("reducer");
        TraceSpan span("all_reduce bucket 0", "comm");
        span.arg("bytes", 4096);
        std::this_thread::sleep_for(std::chrono::microseconds(300));
      });
      bucket.join();
      phases.end(Phase::kComm);
      phases.end(Phase::kOptimizer);
      nlohmann::json row{{"step", s}};
      observer.on_step({.step = s, .loss = 1.0, .lr = 0.1, .grad_norm = 1, .step_s = 0.001}, phases,
                       row);
    }
    { TraceSpan eval("eval"); }
  }  // the destructor writes the trace
  return file;
}

TEST(TraceTest, StepPhasesAreNestedInsideTheirStep) {
  const auto dir = temp_dir("trace");
  const fs::path file = run_steps(dir, 0, 1, 3);
  EXPECT_EQ(file, dir / "trace.json");
  const auto doc = load(file);
  ASSERT_TRUE(doc["traceEvents"].is_array());
  std::vector<nlohmann::json> steps, phases, buckets;
  std::set<std::string> names;
  int main_tid = -1;
  for (const auto& e : doc["traceEvents"]) {
    ASSERT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("name"));
    if (e["ph"] != "X") continue;
    ASSERT_TRUE(e["ts"].is_number_integer() && e["dur"].is_number_integer());
    EXPECT_GE(e["dur"].get<int64_t>(), 0);
    EXPECT_EQ(e["pid"], 0);
    names.insert(e["name"]);
    if (e["name"] == "step") {
      steps.push_back(e);
      main_tid = e["tid"];
    } else if (e["cat"] == "step") {
      phases.push_back(e);
    } else if (e["cat"] == "comm") {
      buckets.push_back(e);
    }
  }
  for (const char* n : {"step", "data", "forward", "backward", "comm", "optimizer", "eval"})
    EXPECT_TRUE(names.count(n)) << n;
  ASSERT_EQ(steps.size(), 3u);
  ASSERT_EQ(phases.size(), 15u);
  ASSERT_EQ(buckets.size(), 3u);
  // Every phase lies inside exactly one step on the same thread; phases of a step do not overlap.
  for (const auto& p : phases) {
    EXPECT_EQ(p["tid"], main_tid);
    int parents = 0;
    for (const auto& s : steps) parents += inside(p, s) ? 1 : 0;
    EXPECT_EQ(parents, 1) << p.dump();
  }
  for (size_t i = 1; i < phases.size(); ++i)
    EXPECT_GE(phases[i]["ts"].get<int64_t>(),
              phases[i - 1]["ts"].get<int64_t>() + phases[i - 1]["dur"].get<int64_t>());
  // The bucket spans come from another thread, on their own named track, inside a step.
  for (const auto& b : buckets) {
    EXPECT_NE(b["tid"], main_tid);
    EXPECT_EQ(b["args"]["bytes"], 4096);
    int parents = 0;
    for (const auto& s : steps) parents += inside(b, s) ? 1 : 0;
    EXPECT_EQ(parents, 1);
  }
  bool named_reducer = false;
  for (const auto& e : doc["traceEvents"])
    named_reducer |= e["ph"] == "M" && e["name"] == "thread_name" && e["args"]["name"] == "reducer";
  EXPECT_TRUE(named_reducer);
  fs::remove_all(dir);
}

TEST(TraceTest, MergeGivesOneTrackPerRank) {
  const auto dir = temp_dir("merge");
  std::vector<fs::path> files;
  for (int r = 0; r < 2; ++r) files.push_back(run_steps(dir, r, 2, 2));
  EXPECT_EQ(files[0].filename(), "trace_rank0.json");
  EXPECT_EQ(files[1].filename(), "trace_rank1.json");
  // A third file that claims rank 0 again (a rerun) is moved to a free pid, not mixed in.
  fs::copy_file(files[0], dir / "again.json");
  files.push_back(dir / "again.json");
  const auto merged = merge_traces(files);
  std::map<int64_t, int> steps_per_pid;
  std::map<int64_t, std::string> names;
  for (const auto& e : merged["traceEvents"]) {
    if (e["ph"] == "X" && e["name"] == "step") ++steps_per_pid[e["pid"].get<int64_t>()];
    if (e["ph"] == "M" && e["name"] == "process_name")
      names[e["pid"].get<int64_t>()] = e["args"]["name"];
  }
  EXPECT_EQ(steps_per_pid, (std::map<int64_t, int>{{0, 2}, {1, 2}, {2, 2}}));
  EXPECT_EQ(names.size(), 3u);
  EXPECT_EQ(names[1], "rank 1");
  // Bad input names the file.
  std::ofstream(dir / "bad.json") << "{not json";
  try {
    merge_traces({dir / "bad.json"});
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos);
  }
  fs::remove_all(dir);
}

TEST(TraceTest, SpansCostNothingWhenTracingIsOff) {
  TraceRecorder rec;
  { TraceSpan s("x", "c", rec); }
  EXPECT_TRUE(rec.events().empty());
  rec.start(4, /*max_events=*/2);
  for (int i = 0; i < 5; ++i) TraceSpan s("x", "c", rec);
  EXPECT_EQ(rec.events().size(), 2u);
  EXPECT_EQ(rec.dropped(), 3u);
  EXPECT_EQ(rec.to_json()["traceEvents"][0]["pid"], 4);
}

TEST(TraceTest, TracePathPerRank) {
  EXPECT_EQ(trace_path_for_rank("t.json", 0, 1), "t.json");
  EXPECT_EQ(trace_path_for_rank("out/t.json", 3, 4), "out/t_rank3.json");
  EXPECT_EQ(trace_path_for_rank("t_{rank}.json", 2, 4), "t_2.json");
}

}  // namespace
}  // namespace meshtrain::obs
